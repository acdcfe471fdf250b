"""Result records: the one contract between the suites and everything in ``reports``.

Every outcome of a test of the four MLA suites (conformance, error contract, metamorphic,
property) becomes exactly one :class:`ResultRecord`, whether the test reached a verdict or died
on the way (an exception outside the verdict path, a crashed xdist worker, a timeout).  Records
are written to ``results.jsonl`` as flat JSON objects (:meth:`ResultRecord.to_dict`); the
readers in ``reports`` work on those dicts (:data:`Record`), so a record from an older run
(schema 1, conformance only, no ``schema_version``) is read through :func:`upgrade`.

The fields one by one: docs/reports.md, "The record schema" (that table's one home).

Keys a record does not know are kept as they are (:attr:`ResultRecord.extra`), so the suites can
add information without a schema change; a field's meaning never changes without a new
``schema_version``.

This module is the schema alone (fields, validation, upgrade, identity, evidence); the run
directory's files are :mod:`mlaconf.reports.rundir`, the numbers the tables show
:mod:`mlaconf.reports.aggregate`."""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, fields
from typing import Any

from mlaconf.reports.values import is_number, value_problem

Record = dict[str, Any]

SCHEMA_VERSION = 2
#: Schema versions this reader understands (1: conformance records before the four suites).
KNOWN_SCHEMAS = (1, 2)
#: The suites that attach records.
SUITES = ("conformance", "error_contract", "metamorphic", "property")
#: Verdicts in display order; ``error`` covers setup/backend errors.
VERDICTS = ("passed", "failed", "xfailed", "xpassed", "skipped", "error")
#: Verdicts that count as "the case conforms" when diffing runs.
PASSING = frozenset({"passed", "xpassed"})
#: Kinds of :class:`Failure`.
FAILURE_KINDS = ("exception", "crash", "timeout", "not_run")
#: Keys that depend on the machine's speed or on which run wrote the record (and what its store held), never
#: on the computation.
VOLATILE_KEYS = ("timing", "run_id", "golden_rebuilt")

#: user_properties name under which a record travels from xdist workers to the controller.
PROPERTY_NAME = "mla_result"


class RecordError(ValueError):
    """A record that does not follow the schema (names the field)."""


@dataclass(frozen=True)
class ErrorEvidence:
    """What the error contract expected and what the backend did (observed None: accepted)."""

    expected_status: str | None = None
    expected_stage: str | None = None
    observed_status: str | None = None
    observed_stage: str | None = None

    @property
    def accepted(self) -> bool:
        return self.observed_status is None


@dataclass(frozen=True)
class RelationEvidence:
    """A metamorphic relation's evidence: its kind, the largest difference, every problem."""

    kind: str = "exact"  # exact | tolerance
    max_abs_diff: float | None = None
    differing: int | None = None
    problems: tuple[str, ...] = ()


@dataclass(frozen=True)
class Failure:
    """A test that ended outside its verdict path: an exception, a crashed worker, a timeout."""

    kind: str  # FAILURE_KINDS
    type: str = ""
    message: str = ""
    where: str = ""
    timeout_s: float | None = None
    #: A crashed worker's exit status (negative: the signal that killed it), None where unknown.
    exit_status: int | None = None

    def text(self) -> str:
        if self.kind == "timeout":
            seconds = f"{self.timeout_s:g} s" if self.timeout_s is not None else "the limit"
            return f"timed out after {seconds} in {self.where or 'the test'}"
        if self.kind == "crash":
            return f"crashed: {self.message}" if self.message else "crashed"
        where = f" in {self.where}" if self.where else ""
        return f"{self.type}{where}: {self.message}" if self.type else self.message


def _sub(cls: type, value: Any, name: str) -> Any:
    if value is None:
        return None
    if isinstance(value, cls):
        return value
    if not isinstance(value, Mapping):
        raise RecordError(f"record field {name!r}: expected an object, got {type(value).__name__}")
    known = {f.name for f in fields(cls)}
    data = {k: v for k, v in value.items() if k in known}
    if "problems" in data:
        data["problems"] = tuple(str(p) for p in data["problems"] or ())
    try:
        return cls(**data)
    except TypeError as exc:
        raise RecordError(f"record field {name!r}: {exc}") from exc


@dataclass(frozen=True)
class ResultRecord:
    """One test outcome; see the module docstring for every field."""

    suite: str
    test: str
    backend: str
    verdict: str
    case_id: str = ""
    relation: str = ""
    message: str = ""
    device: str = ""
    backend_versions: Mapping[str, str] = field(default_factory=dict)
    case_suite: str = ""
    spec: Mapping[str, Any] | None = None
    dtype: str = "?"
    mask: str = "?"
    cache: str = "?"
    policy: str | None = None
    deviation: str | None = None
    checks: tuple[Mapping[str, Any], ...] = ()
    metrics: Mapping[str, Any] = field(default_factory=dict)
    worst_slack: float | None = None
    #: The one element the verdict names (judge.metrics.Element.to_dict), the failure text's and repro's.
    worst_element: Mapping[str, Any] | None = None
    failing: tuple[str, ...] = ()
    overrides: tuple[Mapping[str, Any], ...] = ()
    error_map: Mapping[str, Any] | None = None
    error: ErrorEvidence | None = None
    difference: RelationEvidence | None = None
    shrunk: Mapping[str, Any] | None = None
    #: A failing output a catalogued mistake explains (judge.causes.Cause.to_dict), else None.
    likely_cause: Mapping[str, Any] | None = None
    failure: Failure | None = None
    timing: Mapping[str, Any] | None = None
    output_sha256: str | None = None
    #: Why the backend's own declarations rule the test out (a skip that is no missing evidence).
    not_applicable: str | None = None
    #: The run that wrote the record (run.json's ``run_id``): ``--mla-resume`` keeps only its own run's records.
    run_id: str | None = None
    #: Goldens the test found damaged or stale in the store and rebuilt: case id -> why (the store's words).
    golden_rebuilt: Mapping[str, str] | None = None
    extra: Mapping[str, Any] = field(default_factory=dict)
    schema_version: int = SCHEMA_VERSION

    def __post_init__(self) -> None:
        if self.suite not in SUITES:
            raise RecordError(f"record field 'suite': {self.suite!r} is not one of {', '.join(SUITES)}")
        if self.verdict not in VERDICTS:
            raise RecordError(f"record field 'verdict': {self.verdict!r} is not one of {', '.join(VERDICTS)}")
        if not self.backend:
            raise RecordError("record field 'backend' is empty")
        if not (self.case_id or self.relation):
            raise RecordError("a record needs a 'case_id' or a 'relation'")
        if self.failure is not None and self.failure.kind not in FAILURE_KINDS:
            raise RecordError(
                f"record field 'failure.kind': {self.failure.kind!r} is not one of {', '.join(FAILURE_KINDS)}"
            )

    def to_dict(self) -> Record:
        """The flat JSON object written to results.jsonl (unknown ``extra`` keys kept)."""
        out: Record = dict(self.extra)
        for f in fields(self):
            if f.name == "extra":
                continue
            value = getattr(self, f.name)
            if isinstance(value, ErrorEvidence | RelationEvidence | Failure):
                value = {g.name: _plain(getattr(value, g.name)) for g in fields(value)}
            out[f.name] = _plain(value)
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ResultRecord:
        """Build (and validate) a record from its JSON form, any known schema version; a field of
        the wrong type raises RecordError naming it."""
        data = upgrade(data)
        validate_types(data)
        known = {f.name for f in fields(cls)}
        args: dict[str, Any] = {k: v for k, v in data.items() if k in known and k != "extra" and v is not None}
        args["extra"] = {k: v for k, v in data.items() if k not in known}
        for name in ("checks", "overrides", "failing"):
            if name in args:
                args[name] = tuple(args[name])
        for name in (
            "spec",
            "policy",
            "deviation",
            "worst_slack",
            "worst_element",
            "error_map",
            "shrunk",
            "likely_cause",
            "timing",
            "output_sha256",
            "not_applicable",
            "run_id",
            "golden_rebuilt",
        ):
            args.setdefault(name, None)
        args["error"] = _sub(ErrorEvidence, args.get("error"), "error")
        args["difference"] = _sub(RelationEvidence, args.get("difference"), "difference")
        args["failure"] = _sub(Failure, args.get("failure"), "failure")
        missing = [n for n in ("suite", "test", "backend", "verdict") if n not in args]
        if missing:
            raise RecordError(f"record lacks {', '.join(repr(m) for m in missing)}")
        try:
            return cls(**args)
        except TypeError as exc:
            raise RecordError(str(exc)) from exc


def make_record(ident: Mapping[str, Any], **values: Any) -> ResultRecord:
    """The one way a record is built: a test's identity fields plus ``values`` (verdict, message,
    evidence ...), which win; validated as a record read back from results.jsonl would be."""
    return ResultRecord.from_dict({"schema_version": SCHEMA_VERSION, **ident, **values})


#: JSON types of the record fields (null is always allowed and means "absent").
_TEXT_FIELDS = (
    "suite",
    "test",
    "backend",
    "verdict",
    "case_id",
    "relation",
    "message",
    "device",
    "case_suite",
    "dtype",
    "mask",
    "cache",
    "policy",
    "deviation",
    "output_sha256",
    "not_applicable",
    "run_id",
)
_OBJECT_FIELDS = (
    "backend_versions",
    "spec",
    "metrics",
    "worst_element",
    "error_map",
    "error",
    "difference",
    "shrunk",
    "likely_cause",
    "failure",
    "timing",
    "golden_rebuilt",
)
_LIST_FIELDS = ("checks", "failing", "overrides")


def json_type_name(value: Any) -> str:
    names = {dict: "an object", list: "an array", str: "a string", bool: "a boolean", type(None): "null"}
    return names.get(type(value), "a number")


def validate_types(data: Mapping[str, Any]) -> None:
    """Raise RecordError naming the first field whose JSON type is wrong (a string where a number
    belongs, an array where an object belongs ...)."""
    for name in _TEXT_FIELDS:
        if data.get(name) is not None and not isinstance(data[name], str):
            raise RecordError(f"record field {name!r}: expected a string, got {json_type_name(data[name])}")
    for name in _OBJECT_FIELDS:
        value = data.get(name)
        if value is not None and not isinstance(value, Mapping | ErrorEvidence | RelationEvidence | Failure):
            raise RecordError(f"record field {name!r}: expected an object, got {json_type_name(data[name])}")
    for name in _LIST_FIELDS:
        if data.get(name) is not None and not isinstance(data[name], list | tuple):
            raise RecordError(f"record field {name!r}: expected an array, got {json_type_name(data[name])}")
    if data.get("worst_slack") is not None and not is_number(data["worst_slack"]):
        raise RecordError(f"record field 'worst_slack': expected a number, got {json_type_name(data['worst_slack'])}")
    for n, check in enumerate(data.get("checks") or ()):
        if not isinstance(check, Mapping):
            raise RecordError(f"record field 'checks[{n}]': expected an object, got {json_type_name(check)}")
        for key in ("value", "bound", "slack"):
            if check.get(key) is not None and not is_number(check[key]):
                raise RecordError(
                    f"record field 'checks[{n}].{key}': expected a number, got {json_type_name(check[key])}"
                )
        for key in ("passed", "decisive"):
            if check.get(key) is not None and not isinstance(check[key], bool):
                raise RecordError(
                    f"record field 'checks[{n}].{key}': expected a boolean, got {json_type_name(check[key])}"
                )
    for name, value in (data.get("metrics") or {}).items():
        if isinstance(value, Mapping | list):
            raise RecordError(f"record field 'metrics.{name}': expected a number, got {json_type_name(value)}")
    for name, value in (data.get("timing") or {}).items():
        numbers = value if name in ("latencies_ms", "calibration_ms") and isinstance(value, list) else [value]
        if not all(v is None or is_number(v) for v in numbers):
            raise RecordError(f"record field 'timing.{name}': expected numbers, got {json_type_name(value)}")
    if problem := value_problem(data):
        raise RecordError(problem)


def _plain(value: Any) -> Any:
    if isinstance(value, tuple):
        return [_plain(v) for v in value]
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    return value


#: Skip messages of the declarations a record states in ``not_applicable`` since that field
#: exists, as runs before it wrote them (cases/test_error_contract.py, cases/test_metamorphic.py,
#: runner/execution.py): their records diff as not applicable too.
_DECLARED_SKIPS = re.compile(
    r"backend \S+ (declares no error contract \(error_contract = False\)|declares deterministic = False$"
    r"|cannot express case \S+: )"
)


def upgrade(data: Mapping[str, Any]) -> Record:
    """A record of any schema version as a schema-2 dict (old conformance records, schema 1:
    ``suite`` was the case's TOML suite, ``nodeid`` the test, ``error`` held ``{status, name,
    stage}``; a skip a backend's declaration called for, written before ``not_applicable``, gets
    that field from its message)."""
    out = dict(data)
    version = out.get("schema_version", 1)
    if not isinstance(version, int) or isinstance(version, bool):
        raise RecordError(f"record field 'schema_version': expected an integer, got {version!r}")
    if version not in KNOWN_SCHEMAS:
        raise RecordError(
            f"record field 'schema_version': {version} is not a known version "
            f"({', '.join(map(str, KNOWN_SCHEMAS))}); written by a newer mlaconf?"
        )
    message = str(out.get("message") or "")
    if "not_applicable" not in out and out.get("verdict") == "skipped" and _DECLARED_SKIPS.match(message):
        out["not_applicable"] = message  # written before the field: the declaration's skip message
    if version >= SCHEMA_VERSION:
        return out
    out["schema_version"] = SCHEMA_VERSION
    out["case_suite"] = str(out.pop("suite", "") or "")
    out["suite"] = "conformance"
    out.setdefault("test", str(out.pop("nodeid", "") or ""))
    out.pop("nodeid", None)
    out.setdefault("verdict", "error")
    old_error = out.get("error")
    if isinstance(old_error, Mapping) and "name" in old_error:
        out["error"] = {"observed_status": old_error.get("name"), "observed_stage": old_error.get("stage")}
    return out


def record_id(record: Mapping[str, Any]) -> str:
    """What a record is about, stable across runs: the case id for conformance (so runs from
    before schema 2 still match), ``suite:case`` for error-contract cases,
    ``metamorphic:relation:case`` for relations, ``property:name`` for properties."""
    suite = str(record.get("suite") or "conformance")
    case_id = str(record.get("case_id") or "")
    relation = str(record.get("relation") or "")
    if suite == "metamorphic":
        return f"metamorphic:{relation}:{case_id}"
    if suite == "property":
        return f"property:{relation}"
    if suite == "conformance" or suite not in SUITES:  # an unknown suite is a schema-1 case suite
        return case_id
    return f"{suite}:{case_id}"


def record_key(record: Mapping[str, Any]) -> tuple[str, str]:
    """Identity of a record across runs: one record per subject (:func:`record_id`) and backend."""
    return record_id(record), str(record.get("backend", ""))


def goldens_rebuilt(records: Iterable[Record]) -> list[dict[str, str]]:
    """Every golden a run found damaged or stale and rebuilt, with why and the test that found it (run.json's
    ``goldens_rebuilt``, the terminal summary's lines), in the records' order."""
    found = []
    for record in records:
        rebuilt = record.get("golden_rebuilt")
        if isinstance(rebuilt, Mapping):
            found += [
                {"case_id": str(case), "why": str(why), "test": str(record.get("test"))}
                for case, why in rebuilt.items()
            ]
    return found


def sort_records(records: Iterable[Record]) -> list[Record]:
    """Deterministic order (key, then full content) so runs compare as files."""
    return sorted(records, key=lambda r: (record_key(r), dumps(r)))


def dumps(record: Mapping[str, Any]) -> str:
    """Canonical one-line JSON (sorted keys; NaN/Inf kept as Python's json writes them)."""
    return json.dumps(record, sort_keys=True, default=str)


def without_volatile(record: Mapping[str, Any]) -> Record:
    """The record minus timing and the id of the run that wrote it, for comparing runs made on different
    schedules (shards, reruns)."""
    return {k: v for k, v in record.items() if k not in VOLATILE_KEYS}


#: What two records must share to be "identical" when they carry no output digest (metamorphic
#: relations of old runs, error-contract cases, properties): the verdict and all evidence, never
#: timing, messages (they name workers and paths) or the node id.
EVIDENCE_KEYS = (
    "verdict",
    "output_sha256",
    "checks",
    "metrics",
    "worst_slack",
    "failing",
    "error",
    "difference",
    "shrunk",
    "likely_cause",
    "spec",
    "deviation",
    "policy",
)


def evidence(record: Mapping[str, Any]) -> Record:
    """The record's verdict and evidence (:data:`EVIDENCE_KEYS`; of a failure its kind, type and place)."""
    out = {k: record.get(k) for k in EVIDENCE_KEYS}
    failure = record.get("failure")
    if isinstance(failure, Mapping):
        out["failure"] = {k: failure.get(k) for k in ("kind", "type", "where")}
    return out


def evidence_sha256(record: Mapping[str, Any]) -> str:
    """SHA-256 of :func:`evidence`: equal digests = the same verdict on the same evidence."""
    return hashlib.sha256(dumps(evidence(record)).encode()).hexdigest()


def not_applicable(record: Mapping[str, Any]) -> str | None:
    """Why the backend's declarations rule the record's (skipped) test out, or None."""
    reason = record.get("not_applicable")
    return reason if record.get("verdict") == "skipped" and isinstance(reason, str) and reason else None


def failure_text(record: Mapping[str, Any]) -> str:
    """The record's failure outside the verdict path in a few words, or ``""``."""
    failure = record.get("failure")
    if not isinstance(failure, Mapping):
        return ""
    try:
        return _sub(Failure, failure, "failure").text()  # type: ignore[no-any-return]
    except RecordError:
        return str(failure)
