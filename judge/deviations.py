"""Known deviations as data: which backend/version/case combinations are expected to misbehave.

Entries live in ``judge/known_deviations.toml`` (its comments document every field).  A run asks
:meth:`DeviationSet.match` per case; a matched case that behaves correctly is an *unexpected pass*
(:meth:`Deviation.classify`), and ``mlaconf.runner.selection.unmatched_deviations`` lists entries no
selected case matched, so a session can warn about stale data.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from fnmatch import fnmatchcase
from pathlib import Path
from typing import Any, Literal

from mlaconf.facts.operator import padded_kv_misread, scores_in_fp16
from mlaconf.facts.releases import in_range, parse_range
from mlaconf.facts.status import STATUS_CODES
from mlaconf.facts.versions import RELEASE_UNKNOWN
from mlaconf.golden.specs.spec import CaseSpec
from mlaconf.golden.specs.suites import read_toml

DEFAULT_PATH = Path(__file__).resolve().parent / "known_deviations.toml"

#: What a known deviation predicts the backend does: reject the case (error) or answer wrongly (fail);
#: a test's outcome is :data:`mlaconf.judge.verdict.Outcome`.
Misbehaviour = Literal["error", "fail"]
Classification = Literal["expected", "unexpected_pass", "different"]

_PATTERN_SELECTORS = ("dtype", "mask", "kv_layout", "case", "mask_fill")
_BOOL_SELECTORS = ("ragged", "causal_prefix_mod128", "over_capacity", "padded_kv_misread", "fp16_raw_overflow")
_FIELDS = (
    "id",
    "backend",
    "versions",
    "outcome",
    "error_status",
    "stage",
    "status",
    "reason",
    "reference",
    "source_commit",
    "select",
)


class DeviationError(ValueError):
    """The deviations file is malformed; names the file, the entry and the field."""

    def __init__(self, source: str, entry: str, field_name: str, message: str) -> None:
        self.source, self.entry, self.field_name = source, entry, field_name
        super().__init__(f"{source}: deviation {entry!r}: field {field_name!r}: {message}")


# -- case selectors ------------------------------------------------------------------------------


def is_ragged(spec: CaseSpec) -> bool:
    """kv lengths differ within the batch (padded layouts then need per-batch offsets)."""
    return len(set(spec.kv_seqlen)) > 1


def has_prefix_not_mod128(spec: CaseSpec) -> bool:
    """Some batch with query rows has a cached prefix ``kv - q`` that is not a multiple of 128."""
    return any(q > 0 and (kv - q) % 128 != 0 for q, kv in zip(spec.q_seqlen, spec.kv_seqlen, strict=False))


def fp16_raw_overflow(spec: CaseSpec) -> bool:
    """The case's raw products q.k are aimed past fp16's largest value on the fp16 score path (fp16, maskType 0/2),
    which stores them as fp16 before scaling (facts/branches.toml scores-fp16)."""
    return scores_in_fp16(spec.dtype, spec.mask_type) and spec.raw_scores_past_fp16


def _case_fields(spec: CaseSpec) -> dict[str, str | bool]:
    return dict(
        dtype=spec.dtype,
        mask=spec.mask_name,
        kv_layout=spec.kv_layout,
        case=spec.case_id,
        ragged=is_ragged(spec),
        causal_prefix_mod128=has_prefix_not_mod128(spec),
        over_capacity=spec.kv_layout == "padded" and spec.padded_rows > spec.max_kv,
        padded_kv_misread=spec.kv_layout == "padded"
        and padded_kv_misread(spec.q_seqlen, spec.kv_seqlen, spec.padded_rows),
        mask_fill=spec.mask_fill_name or "none",
        fp16_raw_overflow=fp16_raw_overflow(spec),
    )


@dataclass(frozen=True)
class Deviation:
    """One known deviation (see ``known_deviations.toml`` for the meaning of each field)."""

    id: str
    backend: str
    versions: str
    outcome: Misbehaviour
    error_status: str | None
    stage: str | None
    status: str
    reason: str
    reference: str
    select: dict[str, str | bool] = field(default_factory=dict)
    #: The upstream commit whose source the entry was reviewed against ("" if never reviewed).
    source_commit: str = ""

    def selects(self, backend: str, version: str | None, spec: CaseSpec, any_release: bool = False) -> bool:
        """Whether this entry covers the case on ``backend`` at ``version``; ``any_release``: at some
        release its range names (for a backend whose release is unknown)."""
        if not fnmatchcase(backend, self.backend):
            return False
        if self.versions and not any_release:
            if version is None:
                return False  # unknown version: do not excuse, report loudly
            try:
                if not in_range(version, parse_range(self.versions)):
                    return False
            except ValueError:
                return False  # an unparsable backend version cannot be placed in the range
        values = _case_fields(spec)
        for key, wanted in self.select.items():
            got = values[key]
            if isinstance(wanted, bool):
                if got is not wanted:
                    return False
            elif not fnmatchcase(str(got), wanted):
                return False
        return True

    def classify(self, conforms: bool, observed_status: str | None) -> Classification:
        """Compare what happened with what this entry expects.

        ``conforms``: the documented behaviour happened (a numeric pass, a relation that holds, the
        documented rejection); ``observed_status``: the status name the backend raised, or None
        (it returned an output, or accepted an invalid call).  Conforming is ``unexpected_pass``
        (the deviation may be fixed); the predicted misbehaviour is ``expected``; anything else is
        ``different``.
        """
        if conforms:
            return "unexpected_pass"
        if self.outcome == "error":
            return "expected" if observed_status == self.error_status else "different"
        return "expected" if observed_status is None else "different"

    def describe(self) -> str:
        what = f"error {self.error_status}" if self.outcome == "error" else "numeric failure"
        at = f" @ {self.source_commit[:12]}" if self.source_commit else ""
        return f"{self.id} ({self.status}): {what} expected: {self.reason} [{self.reference}{at}]"


@dataclass
class DeviationSet:
    """Every deviation of a file."""

    source: str
    entries: list[Deviation]

    def __repr__(self) -> str:
        """Short: test reports (hypothesis's failing-example line, in CI) print fixtures by repr."""
        return f"DeviationSet({self.source!r}: {len(self.entries)} entries)"

    def _repr_pretty_(self, printer: Any, cycle: bool) -> None:
        """The same short text for pretty-printers (hypothesis's), which would list every field."""
        printer.text(repr(self))

    def match(self, backend: str, version: str | None, spec: CaseSpec) -> Deviation | None:
        """The first entry (file order) covering this case."""
        return next((d for d in self.entries if d.selects(backend, version, spec)), None)

    def unanswered(self, backend: str, spec: CaseSpec) -> Deviation | None:
        """The first entry by which ``backend`` gives this case no verdict of the contract at some release the entry
        names (a refusal, or a numeric failure it predicts), None when the backend is expected to answer it and be
        judged: what ``mlaconf coverage --backend`` counts."""
        return next(iter(self.candidates(backend, None, spec)), None)

    def candidates(self, backend: str, version: str | None, spec: CaseSpec) -> list[Deviation]:
        """The entries that may cover this case, in file order: every match at a known version (two may
        predict different misbehaviours of one call, e.g. an early rejection that hides a later
        acceptance); with the release unknown, every entry covering it at some release it names. Each
        is judged against what was seen (:func:`explaining`)."""
        return [d for d in self.entries if d.selects(backend, version, spec, any_release=version is None)]


def release_note(version: str | None, deviation: Deviation | None) -> str:
    """``"; ATB release unknown ...; <id> (<range>) ..."`` when a release-bound entry was chosen without a release."""
    if version is not None or deviation is None or not deviation.versions:
        return ""
    return (
        f"; {RELEASE_UNKNOWN}; judged against every release the known deviations name: "
        f"{deviation.id} ({deviation.versions}) is the one that explains it"
    )


def explaining(candidates: list[Deviation], conforms: bool, observed_status: str | None) -> Deviation | None:
    """Of the candidate entries, the first whose prediction is what was seen, else the first (None if none)."""
    for entry in candidates:
        if entry.classify(conforms, observed_status) == "expected":
            return entry
    return candidates[0] if candidates else None


def _entry(raw: Any, index: int, source: str) -> Deviation:
    label = str(raw.get("id", f"#{index}")) if isinstance(raw, dict) else f"#{index}"

    def fail(name: str, message: str) -> DeviationError:
        return DeviationError(source, label, name, message)

    if not isinstance(raw, dict):
        raise fail("<table>", "must be a table ([[deviation]])")
    extra = set(raw) - set(_FIELDS)
    if extra:
        raise fail(sorted(extra)[0], f"unknown field; known fields: {list(_FIELDS)}")
    text: dict[str, str] = {}
    for name in ("id", "backend", "outcome", "status", "reason", "reference"):
        value = raw.get(name)
        if not isinstance(value, str) or not value.strip():
            raise fail(name, "is required (a non-empty string)")
        text[name] = value.strip()
    versions = raw.get("versions", "")
    if not isinstance(versions, str):
        raise fail("versions", f"must be a string such as '>=8.2.RC1,<9', got {versions!r}")
    if versions.strip():
        try:
            parse_range(versions)
        except ValueError as exc:
            raise fail("versions", str(exc)) from exc
    commit = raw.get("source_commit", "")
    if not isinstance(commit, str) or (commit and not re.fullmatch(r"[0-9a-f]{40}", commit)):
        raise fail("source_commit", f"must be a full 40-hex-digit commit, got {commit!r}")
    if text["status"] not in ("unconfirmed", "confirmed"):
        raise fail("status", f"must be 'unconfirmed' or 'confirmed', got {text['status']!r}")
    outcome = text["outcome"]
    error_status, stage = raw.get("error_status"), raw.get("stage")
    if outcome == "error":
        if error_status not in STATUS_CODES:
            raise fail("error_status", f"outcome 'error' needs an ATB status name, got {error_status!r}")
        if stage not in (None, "create", "setup", "execute"):
            raise fail("stage", f"must be 'create', 'setup' or 'execute', got {stage!r}")
    elif outcome == "fail":
        if error_status is not None or stage is not None:
            name = "error_status" if error_status is not None else "stage"
            raise fail(name, "only allowed with outcome 'error'")
    else:
        raise fail("outcome", f"must be 'error' or 'fail', got {outcome!r}")
    select = raw.get("select", {})
    if not isinstance(select, dict):
        raise fail("select", "must be a table")
    for key, value in select.items():
        if key in _PATTERN_SELECTORS:
            if not isinstance(value, str):
                raise fail(f"select.{key}", f"must be a string pattern, got {value!r}")
        elif key in _BOOL_SELECTORS:
            if not isinstance(value, bool):
                raise fail(f"select.{key}", f"must be true or false, got {value!r}")
        else:
            raise fail(f"select.{key}", f"unknown selector; known: {[*_PATTERN_SELECTORS, *_BOOL_SELECTORS]}")
    return Deviation(
        id=text["id"],
        backend=text["backend"],
        versions=versions.strip(),
        outcome="error" if outcome == "error" else "fail",
        error_status=error_status,
        stage=stage,
        status=text["status"],
        reason=text["reason"],
        reference=text["reference"],
        select=dict(select),
        source_commit=commit,
    )


def load_deviations(path: Path | None = None) -> DeviationSet:
    """Load and validate a deviations file (default: ``judge/known_deviations.toml``)."""
    path = path or DEFAULT_PATH
    source = str(path)
    data = read_toml(path, lambda name, message: DeviationError(source, "<file>", name, message))
    unknown = set(data) - {"deviation"}
    if unknown:
        raise DeviationError(source, "<file>", sorted(unknown)[0], "unknown top-level key; expected [[deviation]]")
    raw_entries = data.get("deviation", [])
    if not isinstance(raw_entries, list):
        raise DeviationError(source, "<file>", "deviation", "must be an array of tables ([[deviation]])")
    entries = [_entry(raw, index, source) for index, raw in enumerate(raw_entries)]
    seen: set[str] = set()
    for entry in entries:
        if entry.id in seen:
            raise DeviationError(source, entry.id, "id", "duplicate id")
        seen.add(entry.id)
    return DeviationSet(source, entries)
