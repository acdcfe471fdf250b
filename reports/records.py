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
``schema_version``."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import statistics
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from mlaconf.reports import safeio
from mlaconf.reports.values import value_problem

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
#: Keys that depend on the machine's speed, never on the computation.
VOLATILE_KEYS = ("timing",)

RESULTS_FILE = "results.jsonl"
RUN_FILE = "run.json"
HTML_FILE = "report.html"

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
            "error_map",
            "shrunk",
            "likely_cause",
            "timing",
            "output_sha256",
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
)
_OBJECT_FIELDS = (
    "backend_versions",
    "spec",
    "metrics",
    "error_map",
    "error",
    "difference",
    "shrunk",
    "likely_cause",
    "failure",
    "timing",
)
_LIST_FIELDS = ("checks", "failing", "overrides")


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _type_name(value: Any) -> str:
    names = {dict: "an object", list: "an array", str: "a string", bool: "a boolean", type(None): "null"}
    return names.get(type(value), "a number")


def validate_types(data: Mapping[str, Any]) -> None:
    """Raise RecordError naming the first field whose JSON type is wrong (a string where a number
    belongs, an array where an object belongs ...)."""
    for name in _TEXT_FIELDS:
        if data.get(name) is not None and not isinstance(data[name], str):
            raise RecordError(f"record field {name!r}: expected a string, got {_type_name(data[name])}")
    for name in _OBJECT_FIELDS:
        value = data.get(name)
        if value is not None and not isinstance(value, Mapping | ErrorEvidence | RelationEvidence | Failure):
            raise RecordError(f"record field {name!r}: expected an object, got {_type_name(data[name])}")
    for name in _LIST_FIELDS:
        if data.get(name) is not None and not isinstance(data[name], list | tuple):
            raise RecordError(f"record field {name!r}: expected an array, got {_type_name(data[name])}")
    if data.get("worst_slack") is not None and not _is_number(data["worst_slack"]):
        raise RecordError(f"record field 'worst_slack': expected a number, got {_type_name(data['worst_slack'])}")
    for n, check in enumerate(data.get("checks") or ()):
        if not isinstance(check, Mapping):
            raise RecordError(f"record field 'checks[{n}]': expected an object, got {_type_name(check)}")
        for key in ("value", "bound", "slack"):
            if check.get(key) is not None and not _is_number(check[key]):
                raise RecordError(f"record field 'checks[{n}].{key}': expected a number, got {_type_name(check[key])}")
        for key in ("passed", "decisive"):
            if check.get(key) is not None and not isinstance(check[key], bool):
                raise RecordError(f"record field 'checks[{n}].{key}': expected a boolean, got {_type_name(check[key])}")
    for name, value in (data.get("metrics") or {}).items():
        if isinstance(value, Mapping | list):
            raise RecordError(f"record field 'metrics.{name}': expected a number, got {_type_name(value)}")
    for name, value in (data.get("timing") or {}).items():
        numbers = value if name == "latencies_ms" and isinstance(value, list) else [value]
        if not all(v is None or _is_number(v) for v in numbers):
            raise RecordError(f"record field 'timing.{name}': expected numbers, got {_type_name(value)}")
    if problem := value_problem(data):
        raise RecordError(problem)


def _plain(value: Any) -> Any:
    if isinstance(value, tuple):
        return [_plain(v) for v in value]
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    return value


def upgrade(data: Mapping[str, Any]) -> Record:
    """A record of any schema version as a schema-2 dict (old conformance records, schema 1:
    ``suite`` was the case's TOML suite, ``nodeid`` the test, ``error`` held ``{status, name,
    stage}``)."""
    out = dict(data)
    version = out.get("schema_version", 1)
    if not isinstance(version, int) or isinstance(version, bool):
        raise RecordError(f"record field 'schema_version': expected an integer, got {version!r}")
    if version not in KNOWN_SCHEMAS:
        raise RecordError(
            f"record field 'schema_version': {version} is not a known version "
            f"({', '.join(map(str, KNOWN_SCHEMAS))}); written by a newer mlaconf?"
        )
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


def sort_records(records: Iterable[Record]) -> list[Record]:
    """Deterministic order (key, then full content) so runs compare as files."""
    return sorted(records, key=lambda r: (record_key(r), dumps(r)))


def dumps(record: Mapping[str, Any]) -> str:
    """Canonical one-line JSON (sorted keys; NaN/Inf kept as Python's json writes them)."""
    return json.dumps(record, sort_keys=True, default=str)


def without_volatile(record: Mapping[str, Any]) -> Record:
    """The record minus timing, for comparing runs made on different schedules."""
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


def write_results(path: Path, records: Iterable[Record]) -> None:
    """Write sorted records as JSON lines, atomically (:func:`safeio.atomic_write`)."""
    safeio.atomic_write(path, "".join(dumps(r) + "\n" for r in sort_records(records)))


def read_results(path: Path) -> list[Record]:
    """Read a results.jsonl (any known schema version, upgraded to the current one).  A malformed
    line (not JSON, too deep, a duplicate key, a field of the wrong type, an unknown schema
    version) or a record repeated on two lines raises ValueError naming the file and line."""
    records: list[Record] = []
    first_line: dict[tuple[str, str], int] = {}
    for lineno, line in enumerate(safeio.read_text(path).splitlines(), 1):
        if not line.strip():
            continue
        value = safeio.loads(line, f"{path}:{lineno}")
        if not isinstance(value, dict):
            raise ValueError(f"{path}:{lineno}: a record must be a JSON object, got {_type_name(value)}")
        try:
            record = ResultRecord.from_dict(value).to_dict()
        except RecordError as exc:
            raise ValueError(f"{path}:{lineno}: {exc}") from exc
        key = record_key(record)
        if key in first_line and not str(record.get("test", "")).endswith("@teardown"):
            raise ValueError(
                f"{path}:{lineno}: duplicate record of {key[0]} [{key[1]}] (first on line {first_line[key]})"
            )
        first_line.setdefault(key, lineno)
        records.append(record)
    return records


def write_json(path: Path, value: Any) -> None:
    """Pretty JSON, atomically."""
    safeio.atomic_write(path, json.dumps(value, indent=2, sort_keys=True, default=str) + "\n")


# ---- run.json: the run's status and counts -------------------------------------------------------

#: ``run.json["status"]``: written ``in_progress`` before the first test, then one of the others.
RUN_STATUSES = (
    "in_progress",
    "complete",
    "interrupted",
    "crashed",
    "timed_out",
    "no_tests",
    "usage_error",
    "collection_error",
    "internal_error",
)
#: Statuses a report verb accepts without ``--allow-incomplete``.
FINISHED = "complete"


class IncompleteRun(ValueError):
    """A run directory that must not be diffed, merged or rendered as if it were complete."""


@dataclass(frozen=True)
class RunCounts:
    """How many tests the run selected (after -k/-m/--deselect), ran, and recorded (lines of
    results.jsonl, one per test outcome pytest counts, incl. tests that never ran)."""

    selected: int
    run: int
    recorded: int

    def __post_init__(self) -> None:
        for name in ("selected", "run", "recorded"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise RecordError(f"'counts.{name}': expected a count (an integer >= 0), got {value!r}")
        if self.run > self.selected:
            raise RecordError(f"'counts': {self.run} tests ran but only {self.selected} were selected")


@dataclass(frozen=True)
class RunState:
    """The part of run.json that says whether the run finished: ``status`` (:data:`RUN_STATUSES`)
    and ``counts``.  The run side writes ``RunState(...).to_dict()`` into run.json (before the
    first test with ``in_progress``, at the end with the final status); readers build it with
    :meth:`from_run` and ask :meth:`problem`."""

    status: str
    counts: RunCounts

    def __post_init__(self) -> None:
        if self.status not in RUN_STATUSES:
            raise RecordError(f"'status': {self.status!r} is not one of {', '.join(RUN_STATUSES)}")

    @classmethod
    def build(cls, status: str, *, selected: int, run: int, recorded: int) -> RunState:
        """Validated state for the writer (raises RecordError on a bad status or counts)."""
        return cls(status, RunCounts(selected, run, recorded))

    def to_dict(self) -> dict[str, Any]:
        """The run.json keys: ``{"status": ..., "counts": {"selected", "run", "recorded"}}``."""
        return {"status": self.status, "counts": dataclasses.asdict(self.counts)}

    @classmethod
    def from_run(cls, run: Mapping[str, Any]) -> RunState:
        """Read status and counts from a run.json; raises RecordError saying what is missing or wrong."""
        if "status" not in run:
            raise RecordError(
                "has no 'status' (written by an mlaconf from before run statuses, or not by a run at all)"
            )
        counts = run.get("counts")
        if not isinstance(counts, Mapping) or not all(k in counts for k in ("selected", "run", "recorded")):
            raise RecordError("'counts' must be an object with 'selected', 'run' and 'recorded'")
        status = run["status"]
        if not isinstance(status, str):
            raise RecordError(f"'status': expected a string, got {status!r}")
        return cls(status, RunCounts(counts["selected"], counts["run"], counts["recorded"]))

    def problem(self, records: int) -> str | None:
        """Why this run is not a complete one whose results.jsonl holds ``records`` records, or None."""
        c = self.counts
        if self.status == "in_progress":
            return f"is still in progress, or was killed (ran {c.run} of {c.selected} tests so far)"
        if self.status == "no_tests":
            return "selected no test (no_tests): it tested nothing"
        if self.status != FINISHED:
            return f"was {self.status} after {c.run} of {c.selected} selected tests"
        if c.recorded != records:
            return f"says {c.recorded} records but results.jsonl holds {records}"
        return None

    @property
    def short(self) -> int:
        """Selected tests that never ran (0 for a run that ran everything)."""
        return self.counts.selected - self.counts.run


#: run.json's top-level fields a reader relies on, and the JSON type each must have.
RUN_FIELD_TYPES: dict[str, type] = {
    "run_id": str,
    "run_name": str,
    "environment": dict,
    "problems": list,
    "backends": list,
    "policies": list,
    "devices_seen": list,
    "args": list,
    "shards": list,
    "verdicts": dict,
    "counts_by_suite": dict,
    "records": int,
}


def _check_run_fields(path: Path, value: Mapping[str, Any]) -> None:
    """Malformed, not incomplete: a field of the wrong type, problems that are not strings, or a
    status/counts that are present but wrong (no flag admits these)."""
    for name, kind in RUN_FIELD_TYPES.items():
        item = value.get(name)
        if item is not None and (not isinstance(item, kind) or isinstance(item, bool)):
            raise ValueError(f"{path}: {name!r}: expected {_json_kind(kind)}, got {_type_name(item)}")
    if not all(isinstance(p, str) for p in value.get("problems") or []):
        raise ValueError(f"{path}: 'problems': expected an array of strings")
    if "status" in value:
        try:
            RunState.from_run(value)
        except RecordError as exc:
            raise ValueError(f"{path}: {exc}") from exc


def _json_kind(kind: type) -> str:
    return {str: "a string", dict: "an object", list: "an array", int: "an integer"}.get(kind, kind.__name__)


def read_run(directory: Path, *, required: bool = False) -> dict[str, Any]:
    """run.json of a report directory, validated as an object with a known schema version and
    fields of their types; {} when absent and not ``required``."""
    path = directory / RUN_FILE
    if not path.exists() and not path.is_symlink():
        if required:
            raise IncompleteRun(f"{path}: missing; is {directory} a run directory?")
        return {}
    value = safeio.loads(safeio.read_text(path), str(path))
    if not isinstance(value, dict):
        raise ValueError(
            f"{path}: run.json must be a JSON object, got {'null' if value is None else _type_name(value)}"
        )
    version = value.get("schema_version")
    if version is not None and (
        not isinstance(version, int) or isinstance(version, bool) or version not in KNOWN_SCHEMAS
    ):
        raise ValueError(
            f"{path}: 'schema_version' {version!r} is not a known version ({', '.join(map(str, KNOWN_SCHEMAS))})"
        )
    _check_run_fields(path, value)
    return value


def run_state(directory: Path, run: Mapping[str, Any]) -> RunState:
    """The run's :class:`RunState`; an old or malformed run.json raises IncompleteRun naming it."""
    try:
        return RunState.from_run(run)
    except RecordError as exc:
        raise IncompleteRun(f"{directory / RUN_FILE}: {exc}") from exc


def check_complete(directory: Path, run: Mapping[str, Any], records: int) -> RunState:
    """The run's state, or IncompleteRun (one line naming run.json) for a run in progress,
    interrupted, crashed, old (no status) or inconsistent with its results.jsonl."""
    state = run_state(directory, run)
    problem = state.problem(records)
    if problem:
        raise IncompleteRun(f"{directory / RUN_FILE}: the run {problem}")
    return state


def load_run_dir(
    directory: Path, *, allow_incomplete: bool = False
) -> tuple[list[Record], dict[str, Any], RunState | None]:
    """A run directory's records, run.json and state.  Unless ``allow_incomplete``, a run that is
    not complete and consistent raises IncompleteRun; with it, the state is None when run.json
    cannot say (missing, old)."""
    records = read_results(directory / RESULTS_FILE)
    run = read_run(directory, required=not allow_incomplete)
    if not allow_incomplete:
        return records, run, check_complete(directory, run, len(records))
    try:
        return records, run, run_state(directory, run)
    except IncompleteRun:
        return records, run, None


def number(value: Any) -> float | None:
    """A finite-or-not float from a record field, None when absent or not numeric."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value)


def metric(record: Mapping[str, Any], name: str) -> float | None:
    """``record['metrics'][name]`` as a float, tolerant of missing pieces."""
    metrics = record.get("metrics")
    return number(metrics.get(name)) if isinstance(metrics, Mapping) else None


def slack(record: Mapping[str, Any]) -> float | None:
    """Worst slack (measured / allowed; > 1 fails).  NaN counts as infinitely bad."""
    value = number(record.get("worst_slack"))
    return math.inf if value is not None and math.isnan(value) else value


def verdict(record: Mapping[str, Any]) -> str:
    value = str(record.get("verdict", "error"))
    return value if value in VERDICTS else "error"


def failure_text(record: Mapping[str, Any]) -> str:
    """The record's failure outside the verdict path in a few words, or ``""``."""
    failure = record.get("failure")
    if not isinstance(failure, Mapping):
        return ""
    try:
        return _sub(Failure, failure, "failure").text()  # type: ignore[no-any-return]
    except RecordError:
        return str(failure)


def failing_summary(record: Mapping[str, Any]) -> str:
    """The failing metric(s) in a few words, else the check closest to its bound."""
    if text := failure_text(record):
        return text
    failing = record.get("failing")
    if isinstance(failing, list) and failing:
        return ", ".join(str(f) for f in failing)
    checks = [c for c in record.get("checks") or [] if isinstance(c, Mapping) and c.get("decisive", True)]
    if checks:  # evidence-only checks (decisive false) never stand for the verdict
        worst = max(checks, key=lambda c: number(c.get("slack")) or -math.inf)
        return f"{worst.get('rule', '?')}:{worst.get('metric', '?')}"
    return str(record.get("message") or "")


GroupKey = tuple[str, str, str, str]
GROUP_FIELDS = ("backend", "dtype", "mask", "cache")


def group_key(record: Mapping[str, Any]) -> GroupKey:
    b, d, m, c = (str(record.get(name, "?")) for name in GROUP_FIELDS)
    return b, d, m, c


def finite(values: Iterable[float | None]) -> list[float]:
    return [v for v in values if v is not None and math.isfinite(v)]


def worst(values: Iterable[float | None]) -> float | None:
    """Largest value where NaN/Inf dominate (a NaN error is the worst possible)."""
    present = [math.inf if math.isnan(v) else v for v in values if v is not None]
    return max(present) if present else None


@dataclass
class GroupStats:
    """Aggregates of one backend x dtype x mask x cache group."""

    key: GroupKey
    counts: dict[str, int] = field(default_factory=lambda: dict.fromkeys(VERDICTS, 0))
    worst_slack: float | None = None
    max_rel_err: float | None = None
    median_rmse: float | None = None
    median_latency_ms: float | None = None
    median_tflops: float | None = None
    records: list[Record] = field(default_factory=list)

    @property
    def total(self) -> int:
        return sum(self.counts.values())


def timing_value(record: Mapping[str, Any], name: str) -> float | None:
    timing = record.get("timing")
    return number(timing.get(name)) if isinstance(timing, Mapping) else None


def _median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def group_stats(records: Iterable[Record]) -> list[GroupStats]:
    """Per-group counts and error aggregates, sorted by group key."""
    groups: dict[GroupKey, GroupStats] = {}
    for record in records:
        key = group_key(record)
        stats = groups.setdefault(key, GroupStats(key))
        stats.counts[verdict(record)] += 1
        stats.records.append(record)
    for stats in groups.values():
        rs = stats.records
        stats.worst_slack = worst(slack(r) for r in rs if verdict(r) != "skipped")
        stats.max_rel_err = worst(metric(r, "max_rel_err") for r in rs)
        stats.median_rmse = _median(finite(metric(r, "rmse") for r in rs))
        stats.median_latency_ms = _median(finite(timing_value(r, "latency_ms_median") for r in rs))
        stats.median_tflops = _median(finite(timing_value(r, "tflops") for r in rs))
    return [groups[k] for k in sorted(groups)]


def case_records(records: Iterable[Record]) -> list[Record]:
    """The conformance records (what the backend x dtype x mask x cache tables are about)."""
    return [r for r in records if str(r.get("suite") or "conformance") not in SUITES[1:]]


def suite_counts(records: Iterable[Record]) -> list[tuple[str, str, dict[str, int]]]:
    """Verdict counts per suite and backend, in :data:`SUITES` order."""
    counts: dict[tuple[str, str], dict[str, int]] = {}
    for record in records:
        suite = str(record.get("suite") or "conformance")
        key = (suite, str(record.get("backend", "?")))
        counts.setdefault(key, dict.fromkeys(VERDICTS, 0))[verdict(record)] += 1
    order = {name: i for i, name in enumerate(SUITES)}
    return [(s, b, c) for (s, b), c in sorted(counts.items(), key=lambda kv: (order.get(kv[0][0], 9), kv[0]))]


def worst_cases(records: Iterable[Record], count: int = 10) -> list[Record]:
    """The ``count`` measured records with the largest worst_slack (skipped ones never rank)."""
    ranked = [r for r in records if slack(r) is not None and verdict(r) != "skipped"]
    ranked.sort(key=lambda r: (-(slack(r) or 0.0), record_key(r)))
    return ranked[:count]


def fmt_slack(value: float | None) -> str:
    """Slack with fixed decimals (1.000 is the bound) unless it is huge."""
    return fmt(value, ".3f" if value is not None and abs(value) < 1000 else ".2e")


def fmt(value: float | None, spec: str = ".3g") -> str:
    """Number for a table cell; '-' when absent."""
    if value is None:
        return "-"
    if math.isnan(value):
        return "nan"
    if math.isinf(value):
        return "inf" if value > 0 else "-inf"
    return format(value, spec)
