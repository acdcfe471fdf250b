"""Terminal summary: group table and worst cases, laid out to fit 80 columns, coloured by markup.

On a terminal, labels that still do not fit are cut (``~``); piped or redirected output keeps
full lines, since nothing cuts it there and a truncated case id or check is useless in a log.

Tables are built as rows of (text, markup) cells so tests can read the plain text while the
terminal reporter colours it (pytest decides whether the terminal supports colour).
"""

from __future__ import annotations

import math
import textwrap
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mlaconf.facts.versions import release_unknown_line
from mlaconf.reports.aggregate import (
    GROUP_FIELDS,
    case_records,
    failing_summary,
    fmt,
    fmt_slack,
    group_stats,
    number,
    slack,
    suite_counts,
    verdict,
    worst_cases,
)
from mlaconf.reports.records import Record, goldens_rebuilt

Markup = dict[str, bool]
Cell = tuple[str, Markup]
WIDTH = 80


@dataclass(frozen=True)
class Column:
    header: str
    right: bool = False  # numbers align right
    shrink: bool = False  # labels may be truncated to fit the width


def _slack_markup(value: float | None) -> Markup:
    if value is None:
        return {}
    if value > 1.0:
        return {"red": True, "bold": True}
    return {"yellow": True} if value > 0.5 else {"green": True}


def _count(n: int, colour: str) -> Cell:
    return (str(n), {colour: True} if n else {})


_VERDICT_COLOUR = {
    "passed": "green",
    "failed": "red",
    "error": "red",
    "xpassed": "yellow",
    "xfailed": "yellow",
    "skipped": "yellow",
}


def layout(
    columns: Sequence[Column], rows: Sequence[Sequence[Cell]], width: int = WIDTH, truncate: bool = True
) -> list[list[Cell]]:
    """Pad cells to column widths, truncating shrinkable columns until the line fits ``width``
    (only if ``truncate``: otherwise lines keep every character)."""
    widths = [max([len(c.header)] + [len(row[i][0]) for row in rows]) for i, c in enumerate(columns)]
    floor = [max(len(c.header), 4) for c in columns]
    while truncate and sum(widths) + len(widths) - 1 > width:
        candidates = [i for i, c in enumerate(columns) if c.shrink and widths[i] > floor[i]]
        if not candidates:
            break
        widths[max(candidates, key=lambda i: widths[i])] -= 1

    def cell(text: str, i: int, markup: Markup) -> Cell:
        if len(text) > widths[i]:
            text = text[: widths[i] - 1] + "~"
        if columns[i].right:
            text = text.rjust(widths[i])
        elif i < len(columns) - 1:
            text = text.ljust(widths[i])
        return (text if i == len(columns) - 1 else text + " ", markup)

    header = [cell(c.header, i, {"bold": True}) for i, c in enumerate(columns)]
    return [header] + [[cell(t, i, m) for i, (t, m) in enumerate(row)] for row in rows]


def group_table(records: Sequence[Record], width: int = WIDTH, truncate: bool = True) -> list[list[Cell]]:
    """backend x dtype x mask x cache: verdict counts, worst slack, max rel err, median RMSE.

    A label shared by every group (prefill has one valid cache mode) is moved to a caption line
    when the table would otherwise need truncated labels to fit ``width``.
    """
    stats = group_stats(records)
    counts = [
        ("pass", "passed", "green"),
        ("fail", "failed", "red"),
        ("xf", "xfailed", "yellow"),
        ("xp", "xpassed", "yellow"),
        ("skip", "skipped", "yellow"),
        ("err", "error", "red"),
    ]
    columns = [Column(name, shrink=True) for name in GROUP_FIELDS]
    columns += [Column(head, True) for head, _, _ in counts]
    columns += [Column("slack", True), Column("max_rel", True), Column("med_rmse", True)]
    rows: list[list[Cell]] = [
        [(label, {}) for label in g.key]
        + [_count(g.counts[verdict_name], colour) for _, verdict_name, colour in counts]
        + [
            (fmt_slack(g.worst_slack), _slack_markup(g.worst_slack)),
            (fmt(g.max_rel_err, ".1e"), {}),
            (fmt(g.median_rmse, ".1e"), {}),
        ]
        for g in stats
    ]
    natural = sum(max([len(c.header)] + [len(r[i][0]) for r in rows]) + 1 for i, c in enumerate(columns))
    constant = [i for i in range(len(GROUP_FIELDS)) if len({g.key[i] for g in stats}) == 1]
    if natural - 1 <= width or len(stats) < 2 or not constant:
        return layout(columns, rows, width, truncate)
    shared = "all groups: " + ", ".join(f"{GROUP_FIELDS[i]}={stats[0].key[i]}" for i in constant)
    caption: list[list[Cell]] = [[(line, {})] for line in textwrap.wrap(shared, width, subsequent_indent="  ")]
    keep = [i for i in range(len(columns)) if i not in constant]
    return caption + layout([columns[i] for i in keep], [[r[i] for i in keep] for r in rows], width, truncate)


def _check_slack(check: Mapping[str, Any]) -> float:
    value = number(check.get("slack"))
    return math.inf if value is None or math.isnan(value) else value


def worst_check(record: Record) -> str:
    """The check the record's worst slack comes from ('rule:metric'), and how many others failed;
    without checks (a backend error, a broken contract) the failure itself.  Evidence-only checks
    (``decisive`` false) never stand for the verdict, as in the worst slack itself."""
    checks = [c for c in record.get("checks") or [] if isinstance(c, Mapping) and c.get("decisive", True)]
    if not checks:
        return failing_summary(record)
    worst = max(checks, key=_check_slack)
    others = sum(not c.get("passed") for c in checks if c is not worst)
    return f"{worst.get('rule', '?')}:{worst.get('metric', '?')}" + (f" (+{others} more failing)" if others else "")


def worst_table(
    records: Sequence[Record], count: int = 10, width: int = WIDTH, truncate: bool = True
) -> list[list[Cell]]:
    """The cases closest to (or furthest past) their bounds, with the check their slack comes from.

    Case ids are long (readable name + hash), so each gets its own line under its row rather
    than a truncated column.
    """
    columns = [
        Column("#", True),
        Column("slack", True),
        Column("verdict"),
        Column("backend", shrink=True),
        Column("failing / closest check", shrink=True),
    ]
    ranked = worst_cases(records, count)
    rows: list[list[Cell]] = [
        [
            (str(n), {}),
            (fmt_slack(slack(r)), _slack_markup(slack(r))),
            (verdict(r), {_VERDICT_COLOUR[verdict(r)]: True}),
            (str(r.get("backend", "?")), {}),
            (worst_check(r), {}),
        ]
        for n, r in enumerate(ranked, 1)
    ]
    header, *body = layout(columns, rows, width, truncate)
    indent = " " * (len(header[0][0]) + 1)
    out = [header]
    for row, r in zip(body, ranked, strict=True):
        case = indent + str(r.get("case_id", "?"))
        out += [row, [(case if len(case) <= width or not truncate else case[: width - 1] + "~", {})]]
    return out


def timing_table(records: Sequence[Record], width: int = WIDTH, truncate: bool = True) -> list[list[Cell]]:
    """Median latency and TFLOP/s per group; informational, never part of a verdict."""
    columns = [
        Column("backend", shrink=True),
        Column("dtype", shrink=True),
        Column("mask", shrink=True),
        Column("cache", shrink=True),
        Column("med_ms", True),
        Column("med_TFLOP/s", True),
    ]
    rows: list[list[Cell]] = [
        [
            (g.key[0], {}),
            (g.key[1], {}),
            (g.key[2], {}),
            (g.key[3], {}),
            (fmt(g.median_latency_ms), {}),
            (fmt(g.median_tflops), {}),
        ]
        for g in group_stats(records)
        if g.median_latency_ms is not None
    ]
    return layout(columns, rows, width, truncate) if rows else []


def suite_table(records: Sequence[Record], width: int = WIDTH, truncate: bool = True) -> list[list[Cell]]:
    """Verdict counts per suite and backend (the group table holds the conformance cases)."""
    heads = [
        ("pass", "passed", "green"),
        ("fail", "failed", "red"),
        ("xf", "xfailed", "yellow"),
        ("xp", "xpassed", "yellow"),
        ("skip", "skipped", "yellow"),
        ("err", "error", "red"),
    ]
    columns = [Column("suite", shrink=True), Column("backend", shrink=True)]
    columns += [Column(head, True) for head, _, _ in heads]
    rows: list[list[Cell]] = [
        [(suite, {}), (backend, {})] + [_count(counts[name], colour) for _, name, colour in heads]
        for suite, backend, counts in suite_counts(records)
    ]
    return layout(columns, rows, width, truncate)


def plain(lines: Sequence[Sequence[Cell]]) -> str:
    """The table as plain text (no colour)."""
    return "\n".join("".join(text for text, _ in line).rstrip() for line in lines)


def write_terminal(tr: Any, records: Sequence[Record], report_dir: Path) -> None:
    """Print the summary through pytest's TerminalReporter (which handles colour); lines are cut
    to fit only on a terminal."""
    width = min(WIDTH, getattr(tr._tw, "fullwidth", WIDTH))
    truncate = bool(getattr(tr, "isatty", False))

    def emit(lines: Sequence[Sequence[Cell]]) -> None:
        for line in lines:
            tr.ensure_newline()
            for text, markup in line:
                tr.write(text, **markup)
            tr.write("\n")

    cases = case_records(records) or list(records)
    tr.write_sep("=", "MLA conformance: groups")
    emit(group_table(cases, width, truncate))
    if len({str(r.get("suite") or "conformance") for r in records}) > 1:
        tr.write_sep("-", "suites")
        emit(suite_table(records, width, truncate))
    tr.write_sep("-", "worst cases by slack (measured / allowed)")
    emit(worst_table(records, 10, width, truncate))
    timing = timing_table(cases, width, truncate)
    if timing:
        tr.write_sep("-", "timing (median over cases; not part of verdicts)")
        emit(timing)
    unknown = release_unknown_line(str(r.get("message") or "") for r in records)
    if unknown:
        tr.write_line(unknown, yellow=True)
    rebuilt = goldens_rebuilt(records)
    if rebuilt:
        tr.write_sep("-", f"goldens rebuilt during this run ({len(rebuilt)}): damaged or stale in the store")
        for entry in rebuilt:
            tr.write_line(rebuilt_line(entry), yellow=True)
    failed = sum(verdict(r) == "failed" for r in records)
    errors = sum(verdict(r) == "error" for r in records)  # an interrupted or crashed test is an error, not a failure
    suites = sorted({str(r.get("suite") or "conformance") for r in records})
    per_suite = (
        (
            " ("
            + ", ".join(f"{s} {sum(str(r.get('suite') or 'conformance') == s for r in records)}" for s in suites)
            + ")"
        )
        if len(suites) > 1
        else ""
    )
    tr.write_line(
        f"{len(records)} records{per_suite}, {failed} failed, {errors} errors; report: {report_dir}",
        red=bool(failed or errors),
        green=not (failed or errors),
    )


def rebuilt_line(entry: Mapping[str, str]) -> str:
    """One golden the run rebuilt, in one line: the case, why, and the test that found it."""
    return f"golden rebuilt: {entry['case_id']}: {entry['why']} (found by {entry['test']})"


def run_verdict(passed: bool, directory: Path) -> str:
    """The run's last word, a local run's and a ``run --ray`` run's alike: PASS or FAIL, and its page."""
    html = directory / "report.html"
    return f"MLA run: {'PASS' if passed else 'FAIL'}; {f'report: {html}' if html.is_file() else 'no report written'}"
