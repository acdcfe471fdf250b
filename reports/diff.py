"""Diff two runs (e.g. old vs new CANN toolkit): what is identical, moved, regressed or fixed.

Records are matched by what they are about (:func:`mlaconf.reports.records.record_key`: the case for
conformance and error-contract records, the relation and case for metamorphic ones, the property)
and backend, or, with ``base_backend``/``cand_backend``, across two backends case by case.
Every pair falls in one class (:data:`CATEGORIES`; :data:`HEADINGS` in words, docs/reports.md "The
diff" in full).  ``not_applicable``: skipped on both sides because the backend's own declarations
rule the test out (:func:`mlaconf.reports.records.not_applicable`: no error contract,
``Unsupported``, not deterministic): never compared, never failing, listed last and folded away.

The six regression classes fail the gate, as do pairs not run (unless ``skips_expected``), missing
cases (unless allowed), a candidate that ran fewer tests than it selected or has problems, a diff
that compared fewer pairs than ``min_compared`` of the baseline, and one run on both sides.
Two records are ``identical`` when their outputs' digests match (conformance, metamorphic
relations, properties: bit-identical outputs), or, without digests, when their verdict and evidence
match (:func:`mlaconf.reports.records.evidence_sha256`); the verdict says which (:data:`SAMENESS`).
A ``changed`` pair says by how much: the largest change of a deciding check's slack, and the largest
error against the golden in ulp of the output's scale (:func:`scale_ulps`) on each side.

Latency is compared by :mod:`mlaconf.reports.latency`; it gates only when asked (``--fail-on-perf``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mlaconf.facts.versions import release_unknown_line
from mlaconf.reports import env, html
from mlaconf.reports.aggregate import (
    ULP_UNIT,
    check_map,
    decisive,
    failing_metrics,
    failure_kind,
    fmt_slack,
    number,
    observed,
    record_metrics,
    scale_ulps,
    slack,
    verdict,
)
from mlaconf.reports.latency import (
    MIN_REPEATS,
    HostShift,
    LatencyTest,
    PerfDiff,
    judge_latency,
    latency_test,
)
from mlaconf.reports.records import (
    EVIDENCE_KEYS,
    PASSING,
    Record,
    evidence,
    evidence_sha256,
    failure_text,
    not_applicable,
    record_id,
    record_key,
    upgrade,
)
from mlaconf.reports.relations import relation_broken, relation_reason
from mlaconf.reports.rundir import RunState, load_run_dir

CATEGORIES = (
    "regressed",
    "status_changed",
    "relation_broken",
    "determinism_lost",
    "crashed",
    "timed_out",
    "not_run",
    "missing",
    "fixed",
    "changed",
    "added",
    "identical",
    "not_applicable",
)
#: Classes that are regressions: each fails the gate.
REGRESSIONS = ("regressed", "status_changed", "relation_broken", "determinism_lost", "crashed", "timed_out")
#: Headings, in the order they are listed: what fails the gate, then what changed, then (folded
#: away) what does not apply to the backend.
HEADINGS = {
    "regressed": "Regressed",
    "status_changed": "Error status or stage changed",
    "relation_broken": "Metamorphic relations broken",
    "determinism_lost": "Determinism lost",
    "crashed": "Crashes",
    "timed_out": "Timeouts",
    "not_run": "Not run (skipped on both sides, or never run in the candidate)",
    "missing": "Missing",
    "fixed": "Fixed",
    "changed": "Changed",
    "added": "Added",
    "not_applicable": "Not applicable (ruled out by the backend's declarations on both sides)",
}
LISTED = tuple(HEADINGS)
#: Classes of pairs the gate has no comparison for.
UNCOMPARED = ("not_run", "added", "missing", "not_applicable")
#: Series colours of the diff scatter: every class that fails the gate is drawn red.
CATEGORY_COLOURS = {
    **dict.fromkeys(REGRESSIONS, "#b00020"),
    "fixed": "#176b1d",
    "changed": "#0072b2",
    "identical": "#999999",
}
#: What an identical pair rests on, in the words the verdict uses.
SAMENESS = {
    "bit": "bit-identical",
    "evidence": "same verdict and evidence, no output digest",
    "random": "property held on both sides over random examples",
}
#: The gate's flags: (fail_on_perf, allow_missing, skips_expected).
Gate = tuple[bool, bool, bool]


@dataclass
class CaseDiff:
    case_id: str
    backend: str
    category: str
    base_verdict: str | None
    cand_verdict: str | None
    base_slack: float | None
    cand_slack: float | None
    reasons: list[str] = field(default_factory=list)
    metric_deltas: dict[str, tuple[float | None, float | None]] = field(default_factory=dict)
    #: Metrics whose deciding check fails in either run (their deltas are always shown).
    failing_metrics: list[str] = field(default_factory=list)
    suite: str = "conformance"
    #: Slack of every check, ``rule:metric`` -> (base, candidate).
    check_deltas: dict[str, tuple[float | None, float | None]] = field(default_factory=dict)
    #: The checks that decide the verdict: failing deciding checks, else the tightest deciding one.
    deciding: list[str] = field(default_factory=list)
    #: Checks recorded as evidence only on every side that has them (never deciding, never failing).
    evidence_checks: list[str] = field(default_factory=list)
    #: Checks deciding on one side and evidence only on the other -> which way, in words.
    role_changes: dict[str, str] = field(default_factory=dict)
    #: What the latency comparison found: "not compared (...)", "unchanged (...)", "slower ...".
    latency: str = ""
    #: Candidate / base median latency, where compared.
    latency_ratio: float | None = None
    #: The candidate's likely cause (judge.causes: the known mistake its output matches), if judged.
    likely_cause: str = ""
    #: Commands that shrink the failing candidate case and write its repro (conformance and
    #: metamorphic tests, what ``mlaconf shrink`` takes; empty unless the candidate fails).
    next_commands: list[str] = field(default_factory=list)
    #: What "identical" rests on (:data:`SAMENESS`), for identical pairs.
    sameness: str = ""
    #: Changed pairs: the largest change of a deciding check's slack (candidate - base) and its check.
    slack_change: float | None = None
    slack_change_check: str = ""
    #: Changed pairs: the largest error against the golden in ulp of the output's scale (:func:`scale_ulps`),
    #: (base, candidate).
    ulp: tuple[float | None, float | None] = (None, None)


@dataclass
class DiffResult:
    base: str
    cand: str
    cases: list[CaseDiff]
    perf: list[PerfDiff]
    notes: list[str]
    env_changes: list[tuple[str, str, str]]
    #: Why the candidate cannot pass whatever its records say (it ran fewer tests than it selected,
    #: it has problems, both sides are one run).
    gate_failures: list[str] = field(default_factory=list)
    #: Records of the baseline (of ``base_backend`` when given) that apply to its backend: what a
    #: full comparison pairs.
    baseline: int = 0
    #: Share of the baseline that must be compared (both sides ran); None: every pair no flag excused.
    min_compared: float | None = None
    #: A kernel slowdown across the board (:meth:`HostShift.across_the_board`), "" if none.
    perf_across: str = ""

    def compared(self) -> int:
        """Pairs where both sides ran the test: the evidence the gate stands on."""
        return sum(c.category not in UNCOMPARED for c in self.cases)

    def coverage_reason(self) -> str | None:
        """Why too little was compared (None: enough): no pair at all, or fewer than a stated
        ``min_compared`` share of the baseline.  Without a stated share every baseline pair must
        be compared or excused, which the not-run and missing classes already gate."""
        compared = self.compared()
        if compared == 0:
            return f"nothing compared: no pair ran on both sides (baseline {self.baseline} records)"
        if self.min_compared is not None and compared < self.min_compared * self.baseline:
            return f"compared {compared} of {self.baseline} baseline pairs, below --min-compared {self.min_compared:g}"
        return None

    def by_category(self, category: str) -> list[CaseDiff]:
        return [c for c in self.cases if c.category == category]

    def counts(self) -> dict[str, int]:
        return {c: len(self.by_category(c)) for c in CATEGORIES}

    def regressions(self) -> list[CaseDiff]:
        return [c for c in self.cases if c.category in REGRESSIONS]

    def not_compared(self) -> int:
        """Pairs whose latency was not compared for too few timed calls on a side (a noisy host apart)."""
        return sum(c.latency.startswith("not compared (") for c in self.cases)

    def host_noisy(self) -> int:
        """Pairs whose latency was not compared because the host was too noisy to say."""
        return sum(c.latency.startswith("not compared: host noisy") for c in self.cases)

    def gate_reasons(
        self, fail_on_perf: bool = False, allow_missing: bool = False, skips_expected: bool = False
    ) -> list[str]:
        """Why the gate fails (empty: it passes): the run-level failures first (one run on both
        sides, candidate problems or short), pairs with no evidence unless skips are expected,
        regressions (any class of :data:`REGRESSIONS`), cases missing or no longer run (a backend
        that became unavailable must not pass an upgrade gate) unless allowed, too little
        compared, perf if asked."""
        reasons = list(self.gate_failures)
        if self.by_category("not_run") and not skips_expected:
            reasons.append(f"{len(self.by_category('not_run'))} not run (no evidence; --skips-expected if meant)")
        reasons += [f"{len(self.by_category(c))} {HEADINGS[c].lower()}" for c in REGRESSIONS if self.by_category(c)]
        if self.by_category("missing") and not allow_missing:
            reasons.append(f"{len(self.by_category('missing'))} missing")
        coverage = self.coverage_reason()
        if coverage:
            reasons.append(coverage)
        if fail_on_perf and self.perf:
            reasons.append(f"{len(self.perf)} perf regressions")
        if fail_on_perf and self.perf_across:
            reasons.append("kernels slower across the board")
        return reasons

    def exit_status(self, fail_on_perf: bool, allow_missing: bool = False, skips_expected: bool = False) -> int:
        """1 when the gate fails (:meth:`gate_reasons`), else 0."""
        return 1 if self.gate_reasons(fail_on_perf, allow_missing, skips_expected) else 0

    def verdict(self, fail_on_perf: bool = False, allow_missing: bool = False, skips_expected: bool = False) -> str:
        """The gate's verdict in one line (a pass says how much it stands on, and what was excused)."""
        reasons = self.gate_reasons(fail_on_perf, allow_missing, skips_expected)
        if reasons:
            return "GATE FAILS: " + "; ".join(reasons)
        counts = self.counts()
        excused = [f"{counts['not_run']} not run (expected)"] if counts["not_run"] else []
        excused += [f"{counts['missing']} missing (allowed)"] if counts["missing"] else []
        if counts["not_applicable"]:
            excused.append(f"{counts['not_applicable']} not applicable (declared by the backend on both sides)")
        improved = [f"{counts[c]} {c}" for c in ("fixed", "added") if counts[c]]
        return (
            f"GATE PASSES: {''.join(f'{i}, ' for i in improved)}{self.identical_text()}, {self.changed_text()}, "
            f"{self.compared()} of {self.baseline} baseline pairs compared" + "".join(f", {e}" for e in excused)
        )

    def identical_text(self) -> str:
        """How many pairs are identical and what that rests on: ``104 identical (bit-identical)``
        when every one has equal output digests, else how many rest on what (:data:`SAMENESS`)."""
        pairs = self.by_category("identical")
        kinds = {k: sum(d.sameness == k for d in pairs) for k in SAMENESS}
        if not pairs:
            return "0 identical"
        if kinds["bit"] == len(pairs):
            return f"{len(pairs)} identical (bit-identical)"
        parts = [f"{n} {SAMENESS[k]}" for k, n in kinds.items() if n]
        return f"{len(pairs)} identical ({', '.join(parts)})"

    def changed_text(self) -> str:
        """How many pairs changed within tolerance and by how much at most: the largest change of a
        deciding check's slack, and the largest error against the golden in ulp on each side."""
        pairs = self.by_category("changed")
        text = f"{len(pairs)} changed within tolerance"
        moves = [d for d in pairs if d.slack_change is not None]
        if not moves:
            return text
        worst = max(moves, key=lambda d: abs(d.slack_change or 0.0))
        parts = [f"largest slack change {worst.slack_change:+.3g} ({worst.slack_change_check}, {worst.case_id})"]
        ulps = [d.ulp for d in pairs if None not in d.ulp]
        if ulps:
            base_ulp = max(u[0] for u in ulps if u[0] is not None)
            cand_ulp = max(u[1] for u in ulps if u[1] is not None)
            parts.append(f"largest error vs golden {base_ulp:.3g} -> {cand_ulp:.3g} {ULP_UNIT}")
        return f"{text} ({'; '.join(parts)})"


def _state(record: Record) -> str:
    """'pass' | 'fail' | 'skip': what a verdict means for an upgrade (xfailed = known failure)."""
    v = verdict(record)
    return "pass" if v in PASSING else "skip" if v == "skipped" else "fail"


def deciding_checks(base: Record, cand: Record) -> list[str]:
    """The deciding checks of a pair: those failing in either run, else the tightest in the candidate."""
    checks = [(n, c) for record in (cand, base) for n, c in check_map(record).items() if decisive(c)]
    failing = sorted({n for n, c in checks if c.get("passed") is False})
    if failing:
        return failing
    tightest = max(checks, key=lambda nc: number(nc[1].get("slack")) or -1.0, default=None)
    return [tightest[0]] if tightest else []


def _evidence_reason(base: Record, cand: Record) -> str:
    """What differs between two records that carry no output digest."""
    b, c = evidence(base), evidence(cand)
    differ = [k for k in (*EVIDENCE_KEYS, "failure") if b.get(k) != c.get(k)]
    return "evidence differs: " + ", ".join(differ) if differ else ""


def _digests(base: Record, cand: Record) -> tuple[str | None, str | None]:
    return base.get("output_sha256") or None, cand.get("output_sha256") or None


def _random_examples(record: Record) -> bool:
    """A property record whose examples were drawn at random (not derandomized)."""
    examples = record.get("examples")
    return isinstance(examples, Mapping) and examples.get("derandomized") is False


def same_result(base: Record, cand: Record) -> bool:
    """Identical for the gate: equal output digests where both have one, else equal evidence; a
    property that held on both sides over randomly drawn examples is identical too (its examples
    differ by design)."""
    b_sha, c_sha = _digests(base, cand)
    if b_sha and c_sha:
        if b_sha == c_sha:
            return True
        return _state(base) == _state(cand) == "pass" and (_random_examples(base) or _random_examples(cand))
    return evidence_sha256(base) == evidence_sha256(cand)


def sameness(base: Record, cand: Record) -> str:
    """What makes an identical pair identical (a key of :data:`SAMENESS`)."""
    b_sha, c_sha = _digests(base, cand)
    if b_sha and c_sha:
        return "bit" if b_sha == c_sha else "random"
    return "evidence"


def _slack_change(d: CaseDiff) -> None:
    """Set how much a changed pair moved: the deciding (else any) check whose slack moved most."""
    moved = {n: c - b for n, (b, c) in d.check_deltas.items() if b is not None and c is not None}
    deciding = {n: v for n, v in moved.items() if n not in d.evidence_checks}
    pool = deciding or moved
    if pool:
        d.slack_change_check = max(pool, key=lambda n: abs(pool[n]))
        d.slack_change = pool[d.slack_change_check]


def _changed_reason(base: Record, cand: Record) -> str:
    b_sha, c_sha = _digests(base, cand)
    if b_sha and c_sha and b_sha != c_sha:
        return f"output differs (sha256 {b_sha[:8]} -> {c_sha[:8]})"
    if bool(b_sha) != bool(c_sha):
        return "output digest only in the " + ("base" if b_sha else "candidate")
    return _evidence_reason(base, cand) or "records differ"


def classify(base: Record, cand: Record, slack_threshold: float, cand_run: Mapping[str, Any] | None = None) -> CaseDiff:
    """One matched pair: its class (:data:`CATEGORIES`) with the reasons."""
    base, cand = upgrade(base), upgrade(cand)
    bs, cs = slack(base), slack(cand)
    suite = str(cand.get("suite") or "conformance")
    d = CaseDiff(
        record_id(base), str(base.get("backend")), "changed", verdict(base), verdict(cand), bs, cs, suite=suite
    )
    b_state, c_state = _state(base), _state(cand)
    b_kind, c_kind = failure_kind(base), failure_kind(cand)
    if base.get("policy") and cand.get("policy") and base.get("policy") != cand.get("policy"):
        d.reasons.append(f"policy {base.get('policy')} -> {cand.get('policy')}")
    moved = f"{verdict(base)} -> {verdict(cand)}"
    b_na, c_na = not_applicable(base), not_applicable(cand)
    if b_na and c_na:
        d.category = "not_applicable"  # both backends say the test does not apply: nothing to compare
        d.reasons.append(c_na if b_na == c_na else f"base: {b_na}; candidate: {c_na}")
    elif c_kind == "not_run" or (c_state == "skip" and (b_state == "skip" or b_kind == "not_run")):
        d.category = "not_run"  # no evidence on the candidate's side: neither identical nor regressed
        d.reasons.append(failure_text(cand) or str(cand.get("message") or "skipped on both sides"))
    elif b_kind == "not_run":
        d.category = "added"  # the base has no evidence to compare with
        d.reasons.append(f"{moved} (never ran in the base)")
    elif c_state == "fail" and c_kind in ("crash", "timeout") and b_kind != c_kind:
        d.category = "crashed" if c_kind == "crash" else "timed_out"
        d.reasons += [moved, failure_text(cand)]
    elif suite == "error_contract" and b_state != "skip" and c_state != "skip" and observed(base) != observed(cand):
        d.category = "fixed" if c_state == "pass" else "status_changed"
        d.reasons += [moved, f"{observed(base)} -> {observed(cand)}"]
    elif suite == "metamorphic" and b_state == "pass" and c_state == "fail" and relation_broken(cand):
        d.category = "determinism_lost" if str(cand.get("relation")) == "determinism" else "relation_broken"
        d.reasons += [moved, relation_reason(cand)]
    elif suite == "metamorphic" and b_state == "pass" and c_state == "fail":
        d.category = "regressed"  # a side fails its golden: the conformance failure, not a second bug
        d.reasons += [moved, relation_reason(cand)]
    elif (b_state == "pass" and c_state == "fail") or (verdict(base) == "xfailed" and verdict(cand) == "failed"):
        d.category = "regressed"  # incl. a known deviation that now misbehaves differently
        d.reasons.append(moved)
        if c_kind is not None:
            d.reasons.append(failure_text(cand))
    elif b_state == "fail" and c_state == "pass":
        d.category = "fixed"
        d.reasons.append(moved)
    elif b_state != c_state:
        d.category = "missing" if c_state == "skip" else "added"
        d.reasons.append(f"{moved} (not comparable)")
        skipped = base if b_state == "skip" else cand
        d.reasons.append(str(skipped.get("message") or ""))
    elif verdict(base) == verdict(cand) and same_result(base, cand):
        d.category = "identical"
    elif b_state == "pass" and cs is not None and cs > 0.5 and (bs is None or bs <= 0 or cs > slack_threshold * bs):
        d.category = "regressed"
        d.reasons.append(f"slack {fmt_slack(bs)} -> {fmt_slack(cs)} (threshold {slack_threshold:g}x)")
    if d.category == "changed":
        d.reasons.append(moved if verdict(base) != verdict(cand) else _changed_reason(base, cand))
        if suite == "metamorphic":
            d.reasons.append(relation_reason(cand))
    if d.category not in (*UNCOMPARED, "identical"):
        bm, cm = record_metrics(base), record_metrics(cand)
        d.failing_metrics = sorted(set(failing_metrics(base)) | set(failing_metrics(cand)))
        d.metric_deltas = {k: (bm.get(k), cm.get(k)) for k in sorted(bm.keys() | cm.keys())}
        b_checks, c_checks = check_map(base), check_map(cand)
        d.check_deltas = {
            n: (number((b_checks.get(n) or {}).get("slack")), number((c_checks.get(n) or {}).get("slack")))
            for n in sorted(b_checks.keys() | c_checks.keys())
        }
        # each side's role read from its own record: the base's failing deciding check of a fixed
        # pair is no evidence-only check because the candidate records it as evidence
        b_ev = {n for n, c in b_checks.items() if not decisive(c)}
        c_ev = {n for n, c in c_checks.items() if not decisive(c)}
        d.evidence_checks = sorted(
            n
            for n in b_checks.keys() | c_checks.keys()
            if (n in b_ev or n not in b_checks) and (n in c_ev or n not in c_checks)
        )
        d.role_changes = {
            n: "deciding in the base, evidence in the candidate" for n in sorted(c_ev & b_checks.keys() - b_ev)
        }
        d.role_changes |= {
            n: "evidence in the base, deciding in the candidate" for n in sorted(b_ev & c_checks.keys() - c_ev)
        }
        d.deciding = deciding_checks(base, cand)
    if d.category == "identical":
        d.sameness = sameness(base, cand)
    if d.category == "changed":
        _slack_change(d)
        if d.slack_change is not None:
            d.reasons.append(f"largest slack change {d.slack_change:+.3g} ({d.slack_change_check})")
        ulp = (scale_ulps(base), scale_ulps(cand))
        if None not in ulp:
            d.ulp = ulp
            d.reasons.append(f"largest error vs golden {ulp[0]:.3g} -> {ulp[1]:.3g} {ULP_UNIT}")
    if d.category == "changed" and b_state == "fail":
        d.reasons.append("still failing")
    if c_state == "fail" and d.category not in ("not_run", "fixed") and suite in ("conformance", "metamorphic"):
        cause = cand.get("likely_cause")
        d.likely_cause = str(cause.get("text") or "") if isinstance(cause, Mapping) else ""
        d.next_commands = html.repro_commands(cand, cand_run)
    return d


def diff_records(
    base: Sequence[Record],
    cand: Sequence[Record],
    *,
    slack_threshold: float = 1.5,
    latency_threshold: float = 1.2,
    base_backend: str | None = None,
    cand_backend: str | None = None,
) -> tuple[list[CaseDiff], list[PerfDiff]]:
    """Pair records by subject and backend; with ``base_backend`` and ``cand_backend``, pair the
    base run's records of one backend with the candidate's of another, subject by subject (e.g.
    ATB against a GPU kernel on the same goldens)."""
    cases, perf, _ = compare_records(
        base,
        cand,
        slack_threshold=slack_threshold,
        latency_threshold=latency_threshold,
        base_backend=base_backend,
        cand_backend=cand_backend,
    )
    return cases, perf


def compare_records(
    base: Sequence[Record],
    cand: Sequence[Record],
    *,
    slack_threshold: float = 1.5,
    latency_threshold: float = 1.2,
    base_backend: str | None = None,
    cand_backend: str | None = None,
    cand_run: Mapping[str, Any] | None = None,
) -> tuple[list[CaseDiff], list[PerfDiff], HostShift | None]:
    """:func:`diff_records`, and what the latencies say about the two runs as a whole (``cand_run``: the
    candidate's run.json, which names its plug-in backends for the repro commands)."""
    base = [upgrade(r) for r in base]
    cand = [upgrade(r) for r in cand]
    across = base_backend is not None or cand_backend is not None

    def keyed(records: Sequence[Record], backend: str | None) -> dict[tuple[str, str], Record]:
        if not across:
            return {record_key(r): r for r in records}
        label = f"{base_backend or '*'} -> {cand_backend or '*'}"
        return {(record_id(r), label): r for r in records if backend is None or r.get("backend") == backend}

    base_by, cand_by = keyed(base, base_backend), keyed(cand, cand_backend)
    cases: list[CaseDiff] = []
    timed: list[tuple[CaseDiff, LatencyTest]] = []
    for key in sorted(base_by.keys() | cand_by.keys()):
        b, c = base_by.get(key), cand_by.get(key)
        if b is None or c is None:
            present = c if b is None else b
            assert present is not None
            cases.append(
                CaseDiff(
                    key[0],
                    key[1],
                    "added" if b is None else "missing",
                    None if b is None else verdict(b),
                    None if c is None else verdict(c),
                    None if b is None else slack(b),
                    None if c is None else slack(c),
                    ["only in the " + ("candidate" if b is None else "base")],
                    suite=str(present.get("suite") or "conformance"),
                )
            )
            continue
        d = classify(b, c, slack_threshold, cand_run)
        d.backend = key[1]
        test = latency_test(b, c)
        if isinstance(test, LatencyTest):
            timed.append((d, test))
        else:
            d.latency = test
        cases.append(d)
    perf, shift = judge_latency(timed, latency_threshold)
    perf.sort(key=lambda p: -p.ratio)
    return cases, perf, shift


def _backends(records: Sequence[Record]) -> list[str]:
    return sorted({str(r.get("backend")) for r in records})


def _run_notes(
    base_run: Mapping[str, Any],
    cand_run: Mapping[str, Any],
    cases: Sequence[CaseDiff],
    backends: tuple[list[str], list[str]] = ([], []),
) -> list[str]:
    notes: list[str] = []
    added = sum(c.category == "added" for c in cases)
    missing = sum(c.category == "missing" for c in cases)
    if added or missing:
        notes.append(f"case sets differ: {added} added, {missing} missing (or skipped on one side)")
    base_b, cand_b = backends
    paired = any(c.category not in ("added", "missing") for c in cases)
    if base_b and cand_b and not paired and not set(base_b) & set(cand_b):
        notes.append(
            f"no record paired: the base ran backend {', '.join(base_b)}, the candidate {', '.join(cand_b)}; "
            f"compare them case by case with --base-backend {base_b[0]} --cand-backend {cand_b[0]}"
        )
    bp = base_run.get("policies") or base_run.get("policy")  # policies: what the records were judged by
    cp = cand_run.get("policies") or cand_run.get("policy")
    if bp != cp:
        notes.append(f"policies differ: base {bp}, candidate {cp}; verdicts were judged by different rules")
    return notes


def _state_notes(side: str, state: RunState | None) -> tuple[list[str], list[str]]:
    """Notes on a side's run state, and (candidate only) why the gate fails regardless."""
    if state is None:
        return [f"the {side} run's run.json has no status: whether it completed is unknown"], []
    notes = [] if state.status == "complete" else [f"the {side} run is {state.status} (--allow-incomplete)"]
    if state.short <= 0:
        return notes, []
    short = f"the {side} run ran {state.counts.run} of {state.counts.selected} selected tests"
    return (notes, [short]) if side == "candidate" else ([*notes, short], [])


def _problems(run: Mapping[str, Any]) -> list[str]:
    """The run's own ``problems`` (run.json): why it said it cannot pass."""
    problems = run.get("problems")
    return [str(p) for p in problems] if isinstance(problems, list) else []


def _same_run(base: Path, cand: Path, base_run: Mapping[str, Any], cand_run: Mapping[str, Any]) -> str:
    """Why base and candidate are one run ("" when they are two): one directory, or one run id."""
    if base.resolve() == cand.resolve():
        return f"one directory, {base.resolve()}"
    run_id = base_run.get("run_id")
    if isinstance(run_id, str) and run_id and run_id == cand_run.get("run_id"):
        return f"run_id {run_id} on both sides"
    return ""


def diff_dirs(
    base: Path,
    cand: Path,
    *,
    slack_threshold: float = 1.5,
    latency_threshold: float = 1.2,
    base_backend: str | None = None,
    cand_backend: str | None = None,
    allow_incomplete: bool = False,
    min_compared: float | None = None,
) -> DiffResult:
    """Diff two run directories; a run that is not complete and consistent raises
    IncompleteRun unless ``allow_incomplete``."""
    base_records, base_run, base_state = load_run_dir(base, allow_incomplete=allow_incomplete)
    cand_records, cand_run, cand_state = load_run_dir(cand, allow_incomplete=allow_incomplete)
    notes: list[str] = []
    gate_failures: list[str] = []
    across = base_backend is not None or cand_backend is not None
    same = _same_run(base, cand, base_run, cand_run)
    if same and not across:  # one run against itself proves nothing about an upgrade
        gate_failures.append(f"base and candidate are the same run ({same})")
    for side, run in (("base", base_run), ("candidate", cand_run)):
        problems = _problems(run)
        notes += [f"the {side} run's problem: {p}" for p in problems]
        if problems and side == "candidate":
            gate_failures.append(f"the candidate run has {len(problems)} problem(s): {problems[0]}")
    for side, records in (("base", base_records), ("candidate", cand_records)):
        unknown = release_unknown_line(str(r.get("message") or "") for r in records)
        if unknown and side == "candidate":  # release-bound expectations: neither regressions nor passes
            gate_failures.append(f"the candidate run: {unknown}")
        elif unknown:
            notes.append(f"the base run: {unknown}")
    for side, state in (("base", base_state), ("candidate", cand_state)):
        more, failing = _state_notes(side, state)
        notes += more
        gate_failures += failing
    for side, records, backend in (("base", base_records, base_backend), ("candidate", cand_records, cand_backend)):
        if backend is not None and not any(r.get("backend") == backend for r in records):
            have = _backends(records)
            notes.append(f"the {side} run has no records of backend {backend!r} (it has {', '.join(have) or 'none'})")
    cases, perf, shift = compare_records(
        base_records,
        cand_records,
        slack_threshold=slack_threshold,
        latency_threshold=latency_threshold,
        base_backend=base_backend,
        cand_backend=cand_backend,
        cand_run=cand_run,
    )
    if base_backend is not None or cand_backend is not None:
        notes.append(
            f"comparing backend {base_backend or '(all)'} of the base with {cand_backend or '(all)'} "
            "of the candidate, case by case"
        )
    backends = ([], []) if base_backend or cand_backend else (_backends(base_records), _backends(cand_records))
    result = DiffResult(
        str(base),
        str(cand),
        cases,
        perf,
        notes + _run_notes(base_run, cand_run, cases, backends),
        env.changes(base_run, cand_run),
        gate_failures,
        baseline=sum(
            (base_backend is None or r.get("backend") == base_backend) and not not_applicable(r) for r in base_records
        ),
        min_compared=min_compared,
    )
    if shift is not None:
        result.notes += shift.notes(latency_threshold)
        result.perf_across = shift.across_the_board(latency_threshold)
        if result.perf_across:
            result.notes.append(result.perf_across + " (a perf regression: --fail-on-perf gates it)")
    if result.host_noisy():
        result.notes.append(
            f"latency not compared for {result.host_noisy()} pairs: their host was too noisy (calibrations or "
            "calls spread beyond what a figure can stand on); rerun both on a quiet host"
        )
    if result.not_compared():
        result.notes.append(
            f"latency not compared for {result.not_compared()} pairs: fewer than {MIN_REPEATS} timed calls "
            "on a side (--mla-timing-repeats)"
        )
    return result
