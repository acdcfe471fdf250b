"""Diff two runs (e.g. old vs new CANN toolkit): what is identical, moved, regressed or fixed.

Cases are matched by (case_id, backend).  Accuracy decides the exit status; latency is listed
separately and gates only when asked (``--fail-on-perf``), since timing is noisy by nature.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from html import escape
from pathlib import Path
from typing import Any

from reports import html, svg
from reports.records import (
    PASSING,
    RESULTS_FILE,
    Record,
    fmt,
    fmt_slack,
    read_results,
    read_run,
    record_key,
    slack,
    timing_value,
    verdict,
)

CATEGORIES = ("regressed", "fixed", "changed", "identical", "added", "missing")
CATEGORY_COLOURS = {"regressed": "#b00020", "fixed": "#176b1d", "changed": "#0072b2", "identical": "#999999"}
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

    def exit_status(self, fail_on_perf: bool, allow_missing: bool = False) -> int:
        """1 when anything regressed, when a compared case is missing or no longer runs (a backend
        that became unavailable must not pass an upgrade gate) unless allowed, or on perf if asked."""
        missing = bool(self.by_category("missing")) and not allow_missing
        return 1 if self.by_category("regressed") or missing or (fail_on_perf and self.perf) else 0


def _state(record: Record) -> str:
    """'pass' | 'fail' | 'skip': what a verdict means for an upgrade (xfailed = known failure)."""
    v = verdict(record)
    return "pass" if v in PASSING else "skip" if v == "skipped" else "fail"


def _metrics(record: Record) -> dict[str, float]:
    m = record.get("metrics")
    if not isinstance(m, Mapping):
        return {}
    return {k: float(v) for k, v in m.items() if isinstance(v, int | float) and not isinstance(v, bool)}


def classify(base: Record, cand: Record, slack_threshold: float) -> CaseDiff:
    """One matched case: regressed / fixed / identical / changed, with the reasons."""
    bs, cs = slack(base), slack(cand)
    d = CaseDiff(str(base.get("case_id")), str(base.get("backend")), "changed", verdict(base), verdict(cand), bs, cs)
    b_state, c_state = _state(base), _state(cand)
    if base.get("policy") != cand.get("policy"):
        d.reasons.append(f"policy {base.get('policy')} -> {cand.get('policy')}")
    same_output = bool(base.get("output_sha256")) and base.get("output_sha256") == cand.get("output_sha256")
    if (b_state == "pass" and c_state == "fail") or (verdict(base) == "xfailed" and verdict(cand) == "failed"):
        d.category = "regressed"  # incl. a known deviation that now misbehaves differently
        d.reasons.append(f"{verdict(base)} -> {verdict(cand)}")
    elif b_state == "fail" and c_state == "pass":
        d.category = "fixed"
        d.reasons.append(f"{verdict(base)} -> {verdict(cand)}")
    elif b_state != c_state:
        d.category = "missing" if c_state == "skip" else "added"
        d.reasons.append(f"{verdict(base)} -> {verdict(cand)} (not comparable)")
    elif same_output or (b_state == c_state == "skip"):
        d.category = "identical"
    elif b_state == "pass" and cs is not None and cs > 0.5 and (bs is None or bs <= 0 or cs > slack_threshold * bs):
        d.category = "regressed"
        d.reasons.append(f"slack {fmt_slack(bs)} -> {fmt_slack(cs)} (threshold {slack_threshold:g}x)")
    if d.category in ("changed", "regressed", "fixed"):
        bm, cm = _metrics(base), _metrics(cand)
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
) -> tuple[list[CaseDiff], list[PerfDiff]]:
    base_by = {record_key(r): r for r in base}
    cand_by = {record_key(r): r for r in cand}
    cases: list[CaseDiff] = []
    perf: list[PerfDiff] = []
    for key in sorted(base_by.keys() | cand_by.keys()):
        b, c = base_by.get(key), cand_by.get(key)
        if b is None or c is None:
            cases.append(
                CaseDiff(
                    key[0],
                    key[1],
                    "added" if b is None else "missing",
                    None if b is None else verdict(b),
                    None if c is None else verdict(c),
                    None if b is None else slack(b),
                    None if c is None else slack(c),
                )
            )
            continue
        cases.append(classify(b, c, slack_threshold))
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
    bp = base_run.get("policy", base_run.get("policies"))
    cp = cand_run.get("policy", cand_run.get("policies"))
    if bp != cp:
        notes.append(f"policies differ: base {bp}, candidate {cp}; verdicts were judged by different rules")
    return notes


def _env_changes(base_run: Mapping[str, Any], cand_run: Mapping[str, Any]) -> list[tuple[str, str, str]]:
    b, c = dict(html.flatten(dict(base_run))), dict(html.flatten(dict(cand_run)))
    return [(k, b.get(k, "-"), c.get(k, "-")) for k in ENV_KEYS if b.get(k) != c.get(k)]


def diff_dirs(base: Path, cand: Path, *, slack_threshold: float = 1.5, latency_threshold: float = 1.2) -> DiffResult:
    cases, perf = diff_records(
        read_results(base / RESULTS_FILE),
        read_results(cand / RESULTS_FILE),
        slack_threshold=slack_threshold,
        latency_threshold=latency_threshold,
    )
    base_run, cand_run = read_run(base), read_run(cand)
    return DiffResult(
        str(base),
        str(cand),
        cases,
        perf,
        _run_notes(base_run, cand_run, cases),
        _env_changes(base_run, cand_run),
    )


# ---- rendering -------------------------------------------------------------------------------


def _value(value: float | None, spec: str) -> str:
    """A metric as its own type: counts (integral values) as integers, the rest by ``spec``."""
    if value is not None and math.isfinite(value) and value.is_integer() and abs(value) < 1e15:
        return format(int(value), "+d" if spec.startswith("+") else "d")
    return fmt(value, spec)


def _deltas(d: CaseDiff, limit: int = 4) -> str:
    parts = []
    for name, (b, c) in list(d.metric_deltas.items())[:limit]:
        delta = _value(c - b, "+.2e") if b is not None and c is not None else "n/a"
        parts.append(f"{name} {_value(b, '.2e')}->{_value(c, '.2e')} ({delta})")
    return "; ".join(parts)


def _rows(result: DiffResult, category: str) -> list[list[str]]:
    return [
        [
            d.case_id,
            d.backend,
            f"{d.base_verdict or '-'} -> {d.cand_verdict or '-'}",
            f"{fmt_slack(d.base_slack)} -> {fmt_slack(d.cand_slack)}",
            "; ".join(d.reasons),
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


def terminal(result: DiffResult, width: int | None = None) -> str:
    """Plain text: counts, notes, then every non-identical case on one line, cut to ``width``
    (a terminal's) when given; full lines otherwise (piped output, CI logs)."""
    counts = result.counts()
    lines = [
        f"diff {result.base} -> {result.cand}",
        "  " + "  ".join(f"{k}: {v}" for k, v in counts.items()) + f"  perf: {len(result.perf)}",
    ]
    lines += [f"  NOTE: {n}" for n in result.notes]
    lines += [f"  env {k}: {b} -> {c}" for k, b, c in result.env_changes]
    for category in ("regressed", "fixed", "changed", "added", "missing"):
        for d in result.by_category(category):
            why = "; ".join(d.reasons) or _deltas(d, 2)
            line = (
                f"{category.upper():9} {d.case_id} [{d.backend}] {d.base_verdict or '-'}->"
                f"{d.cand_verdict or '-'} slack {fmt_slack(d.base_slack)}->{fmt_slack(d.cand_slack)} {why}"
            )
            lines.append(line if width is None or len(line) <= width else line[: width - 1] + "~")
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
    for category in ("regressed", "fixed", "changed", "added", "missing"):
        rows = _rows(result, category)
        if rows:
            parts.append(f"\n## {category.capitalize()} ({len(rows)})\n\n" + _md_table(HEADERS, rows))
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
        label = (f"{d.case_id} [{d.backend}] {d.category}: slack {fmt_slack(d.base_slack)} -> "
                 f"{fmt_slack(d.cand_slack)}")
        series.setdefault(d.category, []).append(
            svg.Point(d.base_slack, d.cand_slack, label, d.category == "regressed"))
    if not series:
        return ""
    ordered = {c: series[c] for c in CATEGORIES if c in series}
    return svg.scatter(ordered, "worst slack: base against candidate (ringed: regressed)",
                       "base worst slack", "candidate worst slack", marker=1.0, diagonal=True,
                       colours=CATEGORY_COLOURS)


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
    for category in ("regressed", "fixed", "changed", "added", "missing"):
        rows = _rows(result, category)
        if rows:
            sections.append(
                f'<h2 class="{category}">{category.capitalize()} ({len(rows)})</h2>' + html.table(HEADERS, rows)
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
