"""Diff two runs (e.g. old vs new CANN toolkit): what is identical, moved, regressed or fixed.

Records are matched by what they are about (:func:`mlaconf.reports.records.record_key`: the case for
conformance and error-contract records, the relation and case for metamorphic ones, the property)
and backend, or, with ``base_backend``/``cand_backend``, across two backends case by case.
Every pair falls in one class (:data:`CATEGORIES`, each under its own heading):

``regressed``         a numeric or property check that passed and now fails, a known deviation
                      that now fails differently, or worst slack grown past the threshold
``status_changed``    an error-contract case whose observed status or stage changed (and that
                      does not now meet the contract)
``relation_broken``   a metamorphic relation that held and now breaks
``determinism_lost``  the determinism relation (bit-identical reruns) that held and now breaks
``crashed``           a test whose xdist worker now dies under it
``timed_out``         a test that now runs past its timeout
``fixed`` ``changed`` ``identical`` ``added`` ``missing``  as before

The six first classes are regressions: they fail the gate, as do missing cases (unless allowed).
Latency is listed separately and gates only when asked (``--fail-on-perf``), since timing is noisy.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from html import escape
from pathlib import Path
from typing import Any

from mlaconf.reports import html, svg
from mlaconf.reports.records import (
    PASSING,
    RESULTS_FILE,
    Record,
    failure_text,
    fmt,
    fmt_slack,
    read_results,
    read_run,
    record_id,
    record_key,
    slack,
    timing_value,
    upgrade,
    verdict,
)

CATEGORIES = (
    "regressed",
    "status_changed",
    "relation_broken",
    "determinism_lost",
    "crashed",
    "timed_out",
    "fixed",
    "changed",
    "identical",
    "added",
    "missing",
)
#: Classes that are regressions: each fails the gate.
REGRESSIONS = ("regressed", "status_changed", "relation_broken", "determinism_lost", "crashed", "timed_out")
#: Headings, in the order they are listed.
HEADINGS = {
    "regressed": "Regressed",
    "status_changed": "Error status or stage changed",
    "relation_broken": "Metamorphic relations broken",
    "determinism_lost": "Determinism lost",
    "crashed": "Crashes",
    "timed_out": "Timeouts",
    "fixed": "Fixed",
    "changed": "Changed",
    "added": "Added",
    "missing": "Missing",
}
LISTED = tuple(HEADINGS)
#: Series colours of the diff scatter: every class that fails the gate is drawn red.
CATEGORY_COLOURS = {
    **dict.fromkeys(REGRESSIONS, "#b00020"),
    "fixed": "#176b1d",
    "changed": "#0072b2",
    "identical": "#999999",
}
#: Environment entries worth naming when they differ between the runs.
ENV_KEYS = (
    "environment.ascend.cann_toolkit.version",
    "environment.ascend.atb.version",
    "environment.ascend.driver.version",
    "environment.packages.torch",
    "environment.packages.torch_npu",
    "environment.packages.numpy",
    "environment.host",
    "environment.git.revision",
)


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
    #: Metrics whose check fails in either run (their deltas are always shown).
    failing_metrics: list[str] = field(default_factory=list)
    suite: str = "conformance"


@dataclass
class PerfDiff:
    case_id: str
    backend: str
    base_ms: float
    cand_ms: float

    @property
    def ratio(self) -> float:
        return self.cand_ms / self.base_ms


@dataclass
class DiffResult:
    base: str
    cand: str
    cases: list[CaseDiff]
    perf: list[PerfDiff]
    notes: list[str]
    env_changes: list[tuple[str, str, str]]

    def by_category(self, category: str) -> list[CaseDiff]:
        return [c for c in self.cases if c.category == category]

    def counts(self) -> dict[str, int]:
        return {c: len(self.by_category(c)) for c in CATEGORIES}

    def regressions(self) -> list[CaseDiff]:
        return [c for c in self.cases if c.category in REGRESSIONS]

    def exit_status(self, fail_on_perf: bool, allow_missing: bool = False) -> int:
        """1 when anything regressed (any class of :data:`REGRESSIONS`), when a compared case is
        missing or no longer runs (a backend that became unavailable must not pass an upgrade gate)
        unless allowed, or on perf if asked."""
        missing = bool(self.by_category("missing")) and not allow_missing
        return 1 if self.regressions() or missing or (fail_on_perf and self.perf) else 0


def _state(record: Record) -> str:
    """'pass' | 'fail' | 'skip': what a verdict means for an upgrade (xfailed = known failure)."""
    v = verdict(record)
    return "pass" if v in PASSING else "skip" if v == "skipped" else "fail"


def _metrics(record: Record) -> dict[str, float]:
    m = record.get("metrics")
    if not isinstance(m, Mapping):
        return {}
    # integers (counts) stay integers, so they print as such; an integral float stays a float
    return {
        k: v if isinstance(v, int) else float(v)
        for k, v in m.items()
        if isinstance(v, int | float) and not isinstance(v, bool)
    }


def _failure_kind(record: Record) -> str | None:
    failure = record.get("failure")
    return str(failure.get("kind")) if isinstance(failure, Mapping) else None


def _observed(record: Record) -> str:
    """What an error-contract record saw: 'STATUS at stage' or 'accepted'."""
    error = record.get("error")
    if not isinstance(error, Mapping) or not error.get("observed_status"):
        return "accepted"
    return f"{error.get('observed_status')} at {error.get('observed_stage') or '?'}"


def _failing_metrics(record: Record) -> list[str]:
    checks = [c for c in record.get("checks") or [] if isinstance(c, Mapping)]
    return [str(c.get("metric")) for c in checks if c.get("passed") is False and c.get("metric")]


def _relation_reason(record: Record) -> str:
    difference = record.get("difference")
    if not isinstance(difference, Mapping):
        return str(record.get("message") or "")
    gap = difference.get("max_abs_diff")
    parts = [f"max |diff| {fmt(float(gap), '.4g')}" if isinstance(gap, int | float) else ""]
    parts += [str(p) for p in difference.get("problems") or []]
    return "; ".join(p for p in parts if p)


def classify(base: Record, cand: Record, slack_threshold: float) -> CaseDiff:
    """One matched pair: its class (:data:`CATEGORIES`) with the reasons."""
    base, cand = upgrade(base), upgrade(cand)
    bs, cs = slack(base), slack(cand)
    suite = str(cand.get("suite") or "conformance")
    d = CaseDiff(
        record_id(base), str(base.get("backend")), "changed", verdict(base), verdict(cand), bs, cs, suite=suite
    )
    b_state, c_state = _state(base), _state(cand)
    b_kind, c_kind = _failure_kind(base), _failure_kind(cand)
    if base.get("policy") and cand.get("policy") and base.get("policy") != cand.get("policy"):
        d.reasons.append(f"policy {base.get('policy')} -> {cand.get('policy')}")
    same_output = bool(base.get("output_sha256")) and base.get("output_sha256") == cand.get("output_sha256")
    moved = f"{verdict(base)} -> {verdict(cand)}"
    if c_state == "fail" and c_kind in ("crash", "timeout") and b_kind != c_kind:
        d.category = "crashed" if c_kind == "crash" else "timed_out"
        d.reasons += [moved, failure_text(cand)]
    elif suite == "error_contract" and b_state != "skip" and c_state != "skip" and _observed(base) != _observed(cand):
        d.category = "fixed" if c_state == "pass" else "status_changed"
        d.reasons += [moved, f"{_observed(base)} -> {_observed(cand)}"]
    elif suite == "metamorphic" and b_state == "pass" and c_state == "fail":
        d.category = "determinism_lost" if str(cand.get("relation")) == "determinism" else "relation_broken"
        d.reasons += [moved, _relation_reason(cand)]
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
    elif same_output or (b_state == c_state == "skip"):
        d.category = "identical"
    elif b_state == "pass" and cs is not None and cs > 0.5 and (bs is None or bs <= 0 or cs > slack_threshold * bs):
        d.category = "regressed"
        d.reasons.append(f"slack {fmt_slack(bs)} -> {fmt_slack(cs)} (threshold {slack_threshold:g}x)")
    if d.category not in ("identical", "added", "missing"):
        bm, cm = _metrics(base), _metrics(cand)
        d.failing_metrics = sorted(set(_failing_metrics(base)) | set(_failing_metrics(cand)))
        d.metric_deltas = {k: (bm.get(k), cm.get(k)) for k in sorted(bm.keys() | cm.keys())}
    if d.category == "changed" and b_state == "fail":
        d.reasons.append("still failing")
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
    perf: list[PerfDiff] = []
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
                    suite=str(present.get("suite") or "conformance"),
                )
            )
            continue
        d = classify(b, c, slack_threshold)
        d.backend = key[1]
        cases.append(d)
        b_ms, c_ms = timing_value(b, "latency_ms_median"), timing_value(c, "latency_ms_median")
        if b_ms and c_ms and b_ms > 0 and c_ms / b_ms > latency_threshold:
            perf.append(PerfDiff(key[0], key[1], b_ms, c_ms))
    perf.sort(key=lambda p: -p.ratio)
    return cases, perf


def _run_notes(base_run: Mapping[str, Any], cand_run: Mapping[str, Any], cases: Sequence[CaseDiff]) -> list[str]:
    notes: list[str] = []
    added = sum(c.category == "added" for c in cases)
    missing = sum(c.category == "missing" for c in cases)
    if added or missing:
        notes.append(f"case sets differ: {added} added, {missing} missing (or skipped on one side)")
    bp = base_run.get("policies") or base_run.get("policy")  # policies: what the records were judged by
    cp = cand_run.get("policies") or cand_run.get("policy")
    if bp != cp:
        notes.append(f"policies differ: base {bp}, candidate {cp}; verdicts were judged by different rules")
    return notes


def _env_changes(base_run: Mapping[str, Any], cand_run: Mapping[str, Any]) -> list[tuple[str, str, str]]:
    b, c = dict(html.flatten(dict(base_run))), dict(html.flatten(dict(cand_run)))
    return [(k, b.get(k, "-"), c.get(k, "-")) for k in ENV_KEYS if b.get(k) != c.get(k)]


def diff_dirs(
    base: Path,
    cand: Path,
    *,
    slack_threshold: float = 1.5,
    latency_threshold: float = 1.2,
    base_backend: str | None = None,
    cand_backend: str | None = None,
) -> DiffResult:
    base_records, cand_records = read_results(base / RESULTS_FILE), read_results(cand / RESULTS_FILE)
    notes: list[str] = []
    for side, records, backend in (("base", base_records, base_backend), ("candidate", cand_records, cand_backend)):
        if backend is not None and not any(r.get("backend") == backend for r in records):
            have = sorted({str(r.get("backend")) for r in records})
            notes.append(f"the {side} run has no records of backend {backend!r} (it has {', '.join(have) or 'none'})")
    cases, perf = diff_records(
        base_records,
        cand_records,
        slack_threshold=slack_threshold,
        latency_threshold=latency_threshold,
        base_backend=base_backend,
        cand_backend=cand_backend,
    )
    base_run, cand_run = read_run(base), read_run(cand)
    if base_backend is not None or cand_backend is not None:
        notes.append(
            f"comparing backend {base_backend or '(all)'} of the base with {cand_backend or '(all)'} "
            "of the candidate, case by case"
        )
    return DiffResult(
        str(base),
        str(cand),
        cases,
        perf,
        notes + _run_notes(base_run, cand_run, cases),
        _env_changes(base_run, cand_run),
    )


# ---- rendering -------------------------------------------------------------------------------


def _value(value: float | None, spec: str) -> str:
    """A metric as its own type: counts (ints in the record) as integers, the rest by ``spec``."""
    if isinstance(value, int):
        return format(value, "+d" if spec.startswith("+") else "d")
    return fmt(value, spec)


def _deltas(d: CaseDiff, only_failing: bool = False) -> str:
    """Metric deltas, failing metrics first; every failing metric always, the rest unless asked."""
    names = [*d.failing_metrics, *(n for n in d.metric_deltas if n not in d.failing_metrics)]
    if only_failing:
        names = list(d.failing_metrics)
    parts = []
    for name in names:
        if name not in d.metric_deltas:
            continue
        b, c = d.metric_deltas[name]
        mark = " FAILING" if name in d.failing_metrics else ""
        if b == c and not mark:
            continue  # unchanged: nothing to say
        delta = _value(c - b, "+.2e") if b is not None and c is not None else "n/a"
        parts.append(f"{name}{mark} {_value(b, '.2e')}->{_value(c, '.2e')} ({delta})")
    return "; ".join(parts)


def _rows(result: DiffResult, category: str) -> list[list[str]]:
    return [
        [
            d.case_id,
            d.backend,
            f"{d.base_verdict or '-'} -> {d.cand_verdict or '-'}",
            f"{fmt_slack(d.base_slack)} -> {fmt_slack(d.cand_slack)}",
            "; ".join(r for r in d.reasons if r),
            _deltas(d),
        ]
        for d in result.by_category(category)
    ]


HEADERS = ["case", "backend", "verdict", "slack", "why", "metric deltas (base->cand)"]
PERF_HEADERS = ["case", "backend", "base ms", "cand ms", "ratio"]


def _ms(value: float) -> str:
    """A latency: 3 significant digits, whole milliseconds from 1000 on (never 1e+03)."""
    return f"{value:.0f}" if value >= 1000 else fmt(value)


def _perf_rows(result: DiffResult) -> list[list[str]]:
    return [[p.case_id, p.backend, _ms(p.base_ms), _ms(p.cand_ms), f"{p.ratio:.2f}x"] for p in result.perf]


def _heading(category: str, count: int) -> str:
    gate = " (fails the gate)" if category in REGRESSIONS else ""
    return f"{HEADINGS[category]} ({count}){gate}"


def terminal(result: DiffResult, width: int | None = None) -> str:
    """Plain text: counts, notes, then every non-identical case on one line, under its class's
    heading, cut to ``width`` (a terminal's) when given; whole lines otherwise (piped output is
    meant for CI logs and grep)."""
    counts = result.counts()
    lines = [
        f"diff {result.base} -> {result.cand}",
        "  " + "  ".join(f"{k}: {v}" for k, v in counts.items()) + f"  perf: {len(result.perf)}",
    ]
    lines += [f"  NOTE: {n}" for n in result.notes]
    lines += [f"  env {k}: {b} -> {c}" for k, b, c in result.env_changes]
    for category in LISTED:
        found = result.by_category(category)
        if not found:
            continue
        lines.append(f"-- {_heading(category, len(found))}")
        for d in found:
            why = "; ".join(r for r in d.reasons if r)
            failing = _deltas(d, only_failing=True) or ("" if why else _deltas(d))
            slacks = (
                f" slack {fmt_slack(d.base_slack)}->{fmt_slack(d.cand_slack)}"
                if d.base_slack is not None or d.cand_slack is not None
                else ""
            )
            line = (
                f"{category.upper():9} {d.case_id} [{d.backend}] {d.base_verdict or '-'}->{d.cand_verdict or '-'}"
                + slacks
                + (f" {why}" if why else "")
                + (f" | {failing}" if failing else "")
            )
            lines.append(line if width is None or len(line) <= width else line[: width - 1] + "~")
    if result.perf:
        lines.append(f"-- Perf regressions ({len(result.perf)})")
    lines += [
        f"PERF      {p.case_id} [{p.backend}] {_ms(p.base_ms)} ms -> {_ms(p.cand_ms)} ms ({p.ratio:.2f}x)"
        for p in result.perf
    ]
    return "\n".join(lines)


def _md_table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    def esc(s: str) -> str:
        return s.replace("|", "\\|").replace("\n", " ")

    out = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    out += ["| " + " | ".join(esc(c) for c in row) + " |" for row in rows]
    return "\n".join(out)


def markdown(result: DiffResult) -> str:
    parts = [
        f"# Run diff\n\nbase `{result.base}` → candidate `{result.cand}`\n",
        _md_table([*result.counts(), "perf"], [[str(v) for v in result.counts().values()] + [str(len(result.perf))]]),
    ]
    parts += [f"\n> **Note:** {n}" for n in result.notes]
    if result.env_changes:
        parts.append("\n## Environment changes\n\n" + _md_table(["key", "base", "candidate"], result.env_changes))
    for category in LISTED:
        rows = _rows(result, category)
        if rows:
            parts.append(f"\n## {_heading(category, len(rows))}\n\n" + _md_table(HEADERS, rows))
    if result.perf:
        parts.append(f"\n## Perf regressions ({len(result.perf)})\n\n" + _md_table(PERF_HEADERS, _perf_rows(result)))
    return "\n".join(parts) + "\n"


def slack_chart(result: DiffResult) -> str:
    """Worst slack before (x) against after (y), one point per case measured in both runs; points
    above the diagonal got worse, beyond the dashed lines fail; regressions are ringed."""
    series: dict[str, list[svg.Point]] = {}
    for d in result.cases:
        if d.base_slack is None or d.cand_slack is None:
            continue
        label = f"{d.case_id} [{d.backend}] {d.category}: slack {fmt_slack(d.base_slack)} -> {fmt_slack(d.cand_slack)}"
        series.setdefault(d.category, []).append(
            svg.Point(d.base_slack, d.cand_slack, label, d.category in REGRESSIONS)
        )
    if not series:
        return ""
    ordered = {c: series[c] for c in CATEGORIES if c in series}
    return svg.scatter(
        ordered,
        "worst slack: base against candidate (ringed: fails the gate)",
        "base worst slack",
        "candidate worst slack",
        marker=1.0,
        diagonal=True,
        colours=CATEGORY_COLOURS,
    )


def render_html(result: DiffResult) -> str:
    counts = result.counts()
    sections = [
        html.table(
            [*counts, "perf"],
            [[html.tag("span", str(v), k) for k, v in counts.items()] + [str(len(result.perf))]],
        ),
        f"<p>base <code>{escape(result.base)}</code> → candidate <code>{escape(result.cand)}</code></p>",
    ]
    sections += [f'<p class="note">Note: {escape(n)}</p>' for n in result.notes]
    chart = slack_chart(result)
    if chart:
        sections.append(f'<h2>Base and candidate side by side</h2><div class="plots">{chart}</div>')
    if result.env_changes:
        sections.append("<h2>Environment changes</h2>" + html.table(["key", "base", "candidate"], result.env_changes))
    for category in LISTED:
        rows = _rows(result, category)
        if rows:
            cls = "regressed" if category in REGRESSIONS else category
            sections.append(
                f'<h2 class="{cls}" id="{category}">{escape(_heading(category, len(rows)))}</h2>'
                + html.table(HEADERS, rows)
            )
    if result.perf:
        sections.append(
            f"<h2>Perf regressions ({len(result.perf)})</h2>" + html.table(PERF_HEADERS, _perf_rows(result))
        )
    return html.page("MLA prefill run diff", sections)


def write_outputs(result: DiffResult, out: Path) -> list[Path]:
    """diff.md, diff.html and diff.json (machine-readable) under ``out``."""
    out.mkdir(parents=True, exist_ok=True)
    files = {
        "diff.md": markdown(result),
        "diff.html": render_html(result),
        "diff.json": json.dumps(
            {
                "counts": result.counts(),
                "notes": result.notes,
                "gate_failing_classes": list(REGRESSIONS),
                "regressions": len(result.regressions()),
                "categories": {category: [asdict(c) for c in result.by_category(category)] for category in LISTED},
                "cases": [asdict(c) for c in result.cases if c.category != "identical"],
                "perf": [asdict(p) | {"ratio": p.ratio} for p in result.perf],
                "env_changes": result.env_changes,
            },
            indent=1,
            default=str,
        ),
    }
    for name, text in files.items():
        (out / name).write_text(text, encoding="utf-8")
    return [out / name for name in files]
