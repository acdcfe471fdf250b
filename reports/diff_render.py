"""Rendering a run diff (:mod:`mlaconf.reports.diff`) for people and machines: one line per changed
pair on the terminal, diff.md, diff.html (with the before/after slack chart) and diff.json.

A failing candidate case shows its likely cause and the commands that shrink it and write its
repro; a class with more than :data:`ROWS_SHOWN` pairs shows the first ones and collapses the rest,
so a diff with hundreds of regressions keeps its summary and headings readable.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import asdict
from html import escape
from pathlib import Path

from mlaconf.reports import html, safeio, svg
from mlaconf.reports.aggregate import fmt, fmt_slack
from mlaconf.reports.diff import (
    CATEGORIES,
    CATEGORY_COLOURS,
    HEADINGS,
    LISTED,
    REGRESSIONS,
    CaseDiff,
    DiffResult,
    Gate,
)
from mlaconf.reports.latency import ALPHA, MIN_REPEATS

#: Pairs of a class shown in the page's table before the rest collapse under "N more".
ROWS_SHOWN = 10


def _value(value: float | None, spec: str) -> str:
    """A metric as its own type: counts (ints in the record) as integers, the rest by ``spec``."""
    if isinstance(value, int):
        return format(value, "+d" if spec.startswith("+") else "d")
    return fmt(value, spec)


def _check_text(d: CaseDiff, name: str) -> str:
    """A check's slack before and after, with its role (evidence only, or a role that changed) and
    whether it fails now (FAILING) or failed in the base only (FAILED in the base)."""
    b, c = d.check_deltas.get(name, (None, None))
    role = " (evidence)" if name in d.evidence_checks else ""
    role = f" ({d.role_changes[name]})" if name in d.role_changes else role
    deciding = name in d.deciding
    mark = " FAILING" if deciding and c is not None and c > 1.0 else ""
    if deciding and not mark and b is not None and b > 1.0:
        mark = " FAILED in the base"
    return f"{name}{role}{mark} slack {fmt_slack(b)}->{fmt_slack(c)}"


def _deltas(d: CaseDiff) -> str:
    """The deciding check's slack first, then every other check and metric that moved (a failing
    deciding check's metric always)."""
    parts = [_check_text(d, n) for n in d.deciding]
    parts += [_check_text(d, n) for n, (b, c) in d.check_deltas.items() if n not in d.deciding and b != c]
    for name in [*d.failing_metrics, *(n for n in d.metric_deltas if n not in d.failing_metrics)]:
        if name not in d.metric_deltas:
            continue
        b, c = d.metric_deltas[name]
        if b == c and name not in d.failing_metrics:
            continue  # unchanged: nothing to say
        delta = _value(c - b, "+.2e") if b is not None and c is not None else "n/a"
        parts.append(f"{name} {_value(b, '.2e')}->{_value(c, '.2e')} ({delta})")
    return "; ".join(parts)


def _why(d: CaseDiff) -> str:
    """The pair's reasons, then the candidate's likely cause when one was found."""
    cause = [f"likely cause: {d.likely_cause}"] if d.likely_cause else []
    return "; ".join(r for r in [*d.reasons, *cause] if r)


def _rows(result: DiffResult, category: str) -> list[list[str]]:
    return [
        [
            d.case_id,
            d.backend,
            f"{d.base_verdict or '-'} -> {d.cand_verdict or '-'}",
            f"{fmt_slack(d.base_slack)} -> {fmt_slack(d.cand_slack)}",
            _why(d),
            _deltas(d),
        ]
        for d in result.by_category(category)
    ]


HEADERS = ["case", "backend", "verdict", "slack", "why", "deciding check, then other deltas (base->cand)"]
PERF_HEADERS = ["case", "backend", "base ms", "cand ms", "ratio", "p (Mann-Whitney U)", "timed calls", "compared"]


def _ms(value: float) -> str:
    """A latency: 3 significant digits, whole milliseconds from 1000 on (never 1e+03)."""
    return f"{value:.0f}" if value >= 1000 else fmt(value)


def _perf_rows(result: DiffResult) -> list[list[str]]:
    return [
        [
            p.case_id,
            p.backend,
            _ms(p.base_ms),
            _ms(p.cand_ms),
            f"{p.ratio:.2f}x",
            fmt(p.p_value, ".2g"),
            f"{p.repeats[0]} / {p.repeats[1]}",
            p.basis,
        ]
        for p in result.perf
    ]


def folded_reasons(result: DiffResult) -> list[tuple[int, str]]:
    """The not-applicable pairs as (count, reason), most frequent first: one line per declaration
    instead of a row per test."""
    counts: dict[str, int] = {}
    for d in result.by_category("not_applicable"):
        # the reason names the case it rules out; fold "cannot express case X: why" by its why
        reason = _fold_key(_why(d), d.case_id)
        counts[reason] = counts.get(reason, 0) + 1
    return sorted(((n, r) for r, n in counts.items()), key=lambda nr: (-nr[0], nr[1]))


def _fold_key(reason: str, case_id: str) -> str:
    subject = case_id.rpartition(":")[2]
    return reason.replace(f" {subject}:", ":") if subject else reason


def _heading(category: str, count: int) -> str:
    gate = " (fails the gate)" if category in REGRESSIONS else ""
    return f"{HEADINGS[category]} ({count}){gate}"


def terminal(result: DiffResult, width: int | None = None, gate: Gate = (False, False, False)) -> str:
    """Plain text: counts, notes, then every non-identical case on one line, under its class's
    heading, cut to ``width`` (a terminal's) when given; whole lines otherwise (piped output is
    meant for CI logs and grep).  ``gate``: :data:`Gate`, for the verdict line."""
    counts = result.counts()
    lines = [
        f"diff {result.base} -> {result.cand}",
        "  " + "  ".join(f"{k}: {v}" for k, v in counts.items()) + f"  perf: {len(result.perf)}",
    ]
    lines.append(f"  {result.verdict(*gate)}")
    lines += [f"  env {k}: {b} -> {c}" for k, b, c in result.env_changes]  # what the verdicts depend on
    lines += [f"  NOTE: {n}" for n in result.notes]
    for category in LISTED:
        found = result.by_category(category)
        if not found:
            continue
        lines.append(f"-- {_heading(category, len(found))}")
        if category == "not_applicable":  # folded: one line per declaration
            lines += [f"NOT_APPL  {n} x {reason}" for n, reason in folded_reasons(result)]
            continue
        for d in found:
            why = _why(d)
            failing = _deltas(d)
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
            lines.append(line)
    if result.perf or result.perf_across:
        lines.append(f"-- Perf regressions ({len(result.perf) + bool(result.perf_across)})")
    if result.perf_across:
        lines.append(f"PERF      across the board: {result.perf_across}")
    lines += [
        f"PERF      {p.case_id} [{p.backend}] {_ms(p.base_ms)} ms -> {_ms(p.cand_ms)} ms ({p.ratio:.2f}x, "
        f"Mann-Whitney U p = {fmt(p.p_value, '.2g')}, {p.basis or f'{p.repeats[0]} / {p.repeats[1]} timed calls'})"
        for p in result.perf
    ]
    if width is not None:  # every line after the counts, notes too, cut to the terminal
        lines[2:] = [line if len(line) <= width else line[: width - 1] + "~" for line in lines[2:]]
    return "\n".join(lines)


def _md_table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    def esc(s: str) -> str:
        return s.replace("|", "\\|").replace("\n", " ")

    out = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    out += ["| " + " | ".join(esc(c) for c in row) + " |" for row in rows]
    return "\n".join(out)


def markdown(result: DiffResult, gate: Gate = (False, False, False)) -> str:
    parts = [
        f"# Run diff\n\nbase `{result.base}` → candidate `{result.cand}`\n",
        _md_table([*result.counts(), "perf"], [[str(v) for v in result.counts().values()] + [str(len(result.perf))]]),
    ]
    parts.append(f"\n**{result.verdict(*gate)}**")
    if result.env_changes:
        parts.append("\n## Environment changes\n\n" + _md_table(["key", "base", "candidate"], result.env_changes))
    parts += [f"\n> **Note:** {n}" for n in result.notes]
    for category in LISTED:
        rows = _rows(result, category)
        if rows and category == "not_applicable":
            folded = _md_table(["tests", "reason"], [[str(n), r] for n, r in folded_reasons(result)])
            parts.append(f"\n## {_heading(category, len(rows))}\n\n" + folded)
        elif rows:
            parts.append(f"\n## {_heading(category, len(rows))}\n\n" + _md_table(HEADERS, rows))
            commands = [c for d in result.by_category(category) for c in d.next_commands]
            if commands:
                parts.append("\nShrink each failing case and write its repro:\n\n```\n" + "\n".join(commands) + "\n```")
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
        totals=result.counts(),
    )


def _collapsed_table(rows: Sequence[Sequence[str]]) -> str:
    """The first :data:`ROWS_SHOWN` rows as a table, the rest under a closed "N more"."""
    table = html.table(HEADERS, rows[:ROWS_SHOWN])
    rest = rows[ROWS_SHOWN:]
    if rest:
        table += f"<details><summary>{len(rest)} more</summary>{html.table(HEADERS, rest)}</details>"
    return table


def _next_steps(pairs: Sequence[CaseDiff]) -> str:
    """Per failing candidate case: its likely cause and the shrink and repro commands (collapsed
    beyond the first :data:`ROWS_SHOWN`)."""
    items = [
        f'<li id="next-{html.anchor(d.case_id, d.backend)}"><b>{escape(d.case_id)} [{escape(d.backend)}]</b>'
        + (f" likely cause: {escape(d.likely_cause)}" if d.likely_cause else "")
        + f'<pre class="next">{escape(chr(10).join(d.next_commands))}</pre></li>'
        for d in pairs
        if d.next_commands
    ]
    if not items:
        return ""
    shown = "".join(items[:ROWS_SHOWN])
    rest = f"<details><summary>{len(items) - ROWS_SHOWN} more</summary><ul>{''.join(items[ROWS_SHOWN:])}</ul></details>"
    return (
        f'<details class="next" open><summary>shrink and repro ({len(items)})</summary><ul>{shown}</ul>'
        + (rest if len(items) > ROWS_SHOWN else "")
        + "</details>"
    )


def render_html(result: DiffResult, gate: Gate = (False, False, False)) -> str:
    counts = result.counts()
    sections = [
        html.table(
            [*counts, "perf"],
            [[html.tag("span", str(v), k) for k, v in counts.items()] + [str(len(result.perf))]],
        ),
        f"<p>base <code>{escape(result.base)}</code> → candidate <code>{escape(result.cand)}</code></p>",
    ]
    sections.insert(
        0,
        f'<div class="banner {"fail" if result.gate_reasons(*gate) else "pass"}" id="verdict">'
        f"{escape(result.verdict(*gate))}</div>",
    )
    if result.env_changes:
        sections.append(
            f'<h2 id="environment">Environment changes ({len(result.env_changes)})</h2>'
            + html.table(["key", "base", "candidate"], result.env_changes)
        )
    sections += [f'<p class="note">Note: {escape(n)}</p>' for n in result.notes]
    chart = slack_chart(result)
    if chart:
        sections.append(f'<h2>Base and candidate side by side</h2><div class="plots">{chart}</div>')
    for category in LISTED:
        rows = _rows(result, category)
        if rows and category == "not_applicable":  # folded away: they neither changed nor fail
            folded = html.table(["tests", "reason"], [[str(n), r] for n, r in folded_reasons(result)])
            sections.append(
                f'<details id="{category}"><summary>{escape(_heading(category, len(rows)))}</summary>'
                f"{folded}{_collapsed_table(rows)}</details>"
            )
        elif rows:
            cls = "regressed" if category in REGRESSIONS else category
            sections.append(
                f'<h2 class="{cls}" id="{category}">{escape(_heading(category, len(rows)))}</h2>'
                + _collapsed_table(rows)
                + _next_steps(result.by_category(category))
            )
    if result.perf:
        sections.append(
            f"<h2>Perf regressions ({len(result.perf)})</h2>" + html.table(PERF_HEADERS, _perf_rows(result))
        )
    return html.page("MLA prefill run diff", sections)


def write_outputs(result: DiffResult, out: Path, gate: Gate = (False, False, False)) -> list[Path]:
    """diff.md, diff.html and diff.json (machine-readable) under ``out``, each written atomically
    (a symlink planted at any of them, or at ``out``, is refused)."""
    safeio.safe_dir(out)
    files = {
        "diff.md": markdown(result, gate),
        "diff.html": render_html(result, gate),
        "diff.json": json.dumps(
            {
                "counts": result.counts(),
                "notes": result.notes,
                "gate": result.verdict(*gate),
                "gate_failures": result.gate_reasons(*gate),
                "compared": result.compared(),
                "baseline": result.baseline,
                "min_compared": result.min_compared,
                "latency_not_compared": result.not_compared(),
                "latency_test": {
                    "test": "Mann-Whitney U, one-sided (candidate slower), Holm-Bonferroni over the compared pairs",
                    "alpha": ALPHA,
                    "min_repeats": MIN_REPEATS,
                    "effect": "the fastest calls (a quarter, at least 3) and the median both slower by more than "
                    "the latency threshold, each call over the host calibration timed before it where both sides "
                    "have one; uncalibrated pairs against the run-wide ratio when the whole run moved",
                },
                "gate_failing_classes": list(REGRESSIONS),
                "regressions": len(result.regressions()),
                "categories": {category: [asdict(c) for c in result.by_category(category)] for category in LISTED},
                "cases": [asdict(c) for c in result.cases if c.category != "identical"],
                "perf": [asdict(p) | {"ratio": p.ratio} for p in result.perf],
                "perf_across_the_board": result.perf_across,
                "env_changes": result.env_changes,
            },
            indent=1,
            default=str,
        ),
    }
    for name, text in files.items():
        safeio.atomic_write(out / name, text)
    return [out / name for name in files]
