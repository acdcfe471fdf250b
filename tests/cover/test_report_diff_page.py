"""The diff page: each failing candidate case shows its likely cause and the
commands that shrink it and write its repro; a class with many pairs keeps its heading and first
rows and collapses the rest; the chart's legend counts what the table counts."""

from __future__ import annotations

import hashlib
import re
from pathlib import Path
from typing import Any

from mlaconf.reports import diff, diff_render
from tests.runs import record, write_run_dir

CAUSE = {"name": "causal_top_left", "text": "output matches the golden with a top-left causal mask"}


def rec(case: str, verdict: str = "passed", slack: float = 0.2, **extra: Any) -> dict[str, Any]:
    return record(
        case,
        test=f"cases/test_conformance.py::test_conformance[{case}-torch-cpu]",
        backend="torch-cpu",
        verdict=verdict,
        worst_slack=slack,
        output_sha256=hashlib.sha256(f"{case}{verdict}".encode()).hexdigest(),
        **extra,
    )


def diffed(tmp_path: Path, failing: int) -> diff.DiffResult:
    base = [rec(f"c{i:03d}") for i in range(failing + 3)]
    cand = [rec(f"c{i:03d}", "failed", 4.0, likely_cause=CAUSE) for i in range(failing)] + base[failing:]
    a = write_run_dir(tmp_path / "a", base, run_id="a")
    b = write_run_dir(tmp_path / "b", cand, run_id="b")
    return diff.diff_dirs(a, b, slack_threshold=1.5, latency_threshold=1.2)


def test_a_regression_shows_its_likely_cause_and_next_commands_everywhere(tmp_path: Path) -> None:
    result = diffed(tmp_path, 1)
    (d,) = result.regressions()
    assert d.likely_cause == CAUSE["text"]
    node = "'cases/test_conformance.py::test_conformance[c000-torch-cpu]'"
    assert d.next_commands == [f"mlaconf shrink {node}", f"mlaconf repro {node} --out repro-c000"]
    page = diff_render.render_html(result)
    assert f"likely cause: {CAUSE['text']}" in page
    assert "mlaconf shrink &#x27;cases/test_conformance.py::test_conformance[c000-torch-cpu]&#x27;" in page
    assert "--out repro-c000" in page
    md = diff_render.markdown(result)
    assert f"likely cause: {CAUSE['text']}" in md and f"mlaconf repro {node} --out repro-c000" in md
    assert f"likely cause: {CAUSE['text']}" in diff_render.terminal(result)
    identical = [c for c in result.cases if c.category == "identical"]
    assert identical and all(not c.next_commands and not c.likely_cause for c in identical)


def test_many_regressions_collapse_beyond_the_first_rows(tmp_path: Path) -> None:
    result = diffed(tmp_path, 41)
    page = diff_render.render_html(result)
    section = page.split('id="regressed"', 1)[1]
    shown, rest = section.split("<details><summary>", 1)
    assert shown.count("<tr>") - 1 == diff_render.ROWS_SHOWN  # header row + the first rows, open
    assert rest.startswith(f"{41 - diff_render.ROWS_SHOWN} more</summary>")
    assert f"{diff.HEADINGS['regressed']} (41)" in section.split("</h2>", 1)[0]  # the heading counts them all
    assert page.index('id="verdict"') < page.index('id="regressed"')  # the summary stays first
    commands = page.split('<details class="next" open>', 1)[1]
    assert commands.count('<li id="next-') == 41
    assert f"{41 - diff_render.ROWS_SHOWN} more</summary><ul>" in commands


def test_the_charts_legend_counts_equal_the_tables(tmp_path: Path) -> None:
    result = diffed(tmp_path, 4)
    chart = diff_render.slack_chart(result)
    legend = dict(re.findall(r'class="l">(\w+) \((\d+)[^)]*\)</text>', chart))
    assert legend == {k: str(v) for k, v in result.counts().items() if k in legend}
    assert legend["regressed"] == "4" and legend["identical"] == "3"
