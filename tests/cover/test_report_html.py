"""report.html and its inline SVG: self-contained, escaped, complete; group aggregates correct."""

from __future__ import annotations

import argparse
import math
import re
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

from mlaconf import verb_function
from mlaconf.reports import html, summary, svg, verbs
from mlaconf.reports.aggregate import group_stats
from tests.runs import record, write_run_dir


def rec(i: int, backend: str = "npu", verdict: str = "passed", **extra: Any) -> dict[str, Any]:
    slack = 0.1 * (i % 12)
    fields: dict[str, Any] = {
        "backend": backend,
        "dtype": ("fp16", "bf16")[i % 2],
        "mask": ("causal", "mask_free")[i % 2],
        "cache": "krope_ctkv",
        "verdict": verdict,
        "worst_slack": slack,
        "policy": "atb",
        "spec": {"q_seqlen": [8 << (i % 5)], "kv_seqlen": [8 << (i % 5)]},
        "metrics": {"max_rel_err": 1e-4 * (1 + i), "rmse": 1e-5 * (1 + i)},
        "checks": [
            {
                "rule": "atb",
                "metric": "max_rel_err",
                "value": 1e-4,
                "bound": 1e-3,
                "slack": slack,
                "passed": slack <= 1,
            }
        ],
        "failing": [],
        "message": "",
        "output_sha256": f"{i:064x}",
        "timing": {"latency_ms_median": 0.5 + i, "repeats": 3, "tflops": 2.0},
    }
    return record(f"case{i:03d}", **fields | extra)


def records() -> list[dict[str, Any]]:
    out = [rec(i) for i in range(40)] + [rec(i, backend="cpu") for i in range(10)]
    out.append(
        rec(
            99,
            verdict="failed",
            worst_slack=float("nan"),
            failing=["atb:max_rel_err"],
            metrics={"max_rel_err": float("nan"), "rmse": float("inf")},
            message="NaN in <output> & friends",
        )
    )
    out.append(rec(98, case_id="<script>alert(1)</script>", verdict="failed", worst_slack=3.0, failing=["atb:rmse"]))
    return out


class Counter(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.tags: dict[str, int] = {}
        self.open: list[str] = []
        self.external: list[str] = []
        self.links: list[str] = []
        self.ids: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags[tag] = self.tags.get(tag, 0) + 1
        self.external += [v for k, v in attrs if k in ("src", "href") and v and not v.startswith("#")]
        self.links += [v[1:] for k, v in attrs if k == "href" and v and v.startswith("#")]
        self.ids += [v for k, v in attrs if k == "id" and v]


def test_report_is_self_contained_and_complete() -> None:
    text = html.render(records(), {"run_name": "r1", "policies": ["atb"], "environment": {"host": "h"}})
    parser = Counter()
    parser.feed(text)
    assert parser.external == [] and "script" not in parser.tags  # the injected case id is escaped
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in text
    assert parser.tags["table"] >= 6
    # two charts across groups per backend (the specs give no layouts to break down by), two per group:
    # npu x2, cpu x2
    assert parser.tags["svg"] == 2 * 2 + 2 * 4
    assert "worst slack against kv length: npu (1 NaN/inf: far edge)" in text  # the NaN case is drawn
    assert parser.tags["rect"] > 20 and parser.tags["circle"] > 20
    assert "NaN in &lt;output&gt; &amp; friends" in text and "1 non-finite" in text
    assert "environment.host" in text and "median TFLOP/s" in text


def test_group_aggregates() -> None:
    groups = {g.key: g for g in group_stats(records())}
    npu_bf16 = groups[("npu", "bf16", "mask_free", "krope_ctkv")]
    assert npu_bf16.counts["passed"] == 20 and npu_bf16.counts["failed"] == 1  # case099 is odd: bf16
    assert math.isinf(npu_bf16.worst_slack or 0) and math.isinf(npu_bf16.max_rel_err or 0)  # NaN is worst
    assert npu_bf16.median_rmse is not None and npu_bf16.median_rmse < 1e-3  # inf excluded from median
    cpu_fp16 = groups[("cpu", "fp16", "causal", "krope_ctkv")]
    assert cpu_fp16.worst_slack == 0.8 and cpu_fp16.median_latency_ms == 4.5


def test_terminal_tables_fit_80_columns() -> None:
    long = [
        rec(i, backend="a_really_long_backend_name_for_testing", mask="bottom_right_causal_prefix") for i in range(4)
    ]
    lines = summary.group_table(long) + summary.worst_table(long) + summary.timing_table(long)
    assert all(len(line) <= 80 for line in summary.plain(lines).splitlines())
    assert "a_really" in summary.plain(lines)


def test_histogram_counts_dropped_values() -> None:
    out = svg.histogram([1e-3, 2e-3, 0.0, float("nan")], "t", "x", log10=True)
    assert "(2 non-finite or zero)" in out and out.count("<rect") >= 1
    assert "no data" in svg.histogram([], "t", "x") and "no data" in svg.strip([], "t", "x")


def test_html_verb_rerenders(tmp_path: Path) -> None:
    write_run_dir(tmp_path, [rec(i) for i in range(11)], run_name="again")  # slack <= 1: passing as they say
    parser = argparse.ArgumentParser()
    verbs.register(parser.add_subparsers(dest="verb", required=True))
    args = parser.parse_args(["report", "html", str(tmp_path)])
    assert verb_function(args.func)(args) == 0
    assert "MLA prefill conformance: again" in (tmp_path / "report.html").read_text()


class SvgText(HTMLParser):
    """The <text> elements of each <svg>: (x, y, text-anchor, content)."""

    def __init__(self) -> None:
        super().__init__()
        self.charts: list[list[tuple[str, str, str, str]]] = []
        self.current: dict[str, str | None] | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "svg":
            self.charts.append([])
        elif tag == "text":
            self.current = dict(attrs)

    def handle_data(self, data: str) -> None:
        if self.current is not None:
            a = self.current
            self.charts[-1].append((a.get("x") or "", a.get("y") or "", a.get("text-anchor") or "", data))
            self.current = None


def duplicate_ticks(page: str) -> list[str]:
    """Labels repeated along one axis: texts sharing a baseline (x ticks) or a right edge (y ticks)."""
    parser = SvgText()
    parser.feed(page)
    duplicates = []
    for texts in parser.charts:
        rows: dict[str, list[str]] = {}
        cols: dict[str, list[str]] = {}
        for x, y, anchor, text in texts:
            rows.setdefault(y, []).append(text)
            if anchor == "end":
                cols.setdefault(x, []).append(text)
        duplicates += [t for labels in (*rows.values(), *cols.values()) for t in set(labels) if labels.count(t) > 1]
    return duplicates


def realistic(i: int) -> dict[str, Any]:
    """A correct bf16/fp16 kernel: max rel err about 2^-8 (bf16) apart only in the fifth digit."""
    dtype = ("bf16", "fp16")[i % 2]
    kv = 16 << (i % 5)
    return rec(
        i,
        dtype=dtype,
        mask="causal",
        worst_slack=0.2495 + 1e-5 * i,
        metrics={
            "max_rel_err": (0.0038910 if dtype == "bf16" else 0.000534) * (1 + 1e-5 * i),
            "rmse": 7.6e-05 * (1 + 1e-4 * i),
            "n_rows": 129,
        },
        spec={
            "q_seqlen": [kv],
            "kv_seqlen": [kv],
            "head_num": 4,
            "kv_head_num": (4, 2, 1)[i % 3],
            "q_layout": ("3d", "2d")[i % 2],
            "kv_layout": "padded",
            "distribution": "uniform",
        },
    )


def test_every_chart_labels_its_ticks_distinctly() -> None:
    page = html.render([realistic(i) for i in range(30)], {"run_name": "ticks"})
    assert page.count("<svg") >= 6
    assert duplicate_ticks(page) == []


def test_tick_labels_are_distinct_engineering_notation() -> None:
    assert svg.tick_labels([0.0038910, 0.0038911, 0.0038912]) == ["3.8910e-3", "3.8911e-3", "3.8912e-3"]
    assert svg.tick_labels([0.000534, 0.0005341]) == ["534.0e-6", "534.1e-6"]
    assert svg.tick_labels([0.0, 1.0, 2.0]) == ["0", "1", "2"]
    assert svg.tick_labels([1e-5, 1e-4, 1e-3], log=True) == ["10e-6", "100e-6", "1e-3"]
    axis = svg.Axis.fit([0.0038910, 0.0038914])
    ticks = axis.ticks()
    assert len(ticks) >= 3 and all(axis.lo <= t <= axis.hi for t in ticks)
    assert len(set(svg.tick_labels(ticks))) == len(ticks)


def test_statistics_print_in_their_own_type() -> None:
    failed = rec(
        1,
        verdict="failed",
        worst_slack=2.0,
        failing=["atb:rmse"],
        metrics={"n_elements": 66048, "nan_positions_match": True, "rmse": 1.5e-3},
    )
    page = html.render([failed], {})
    assert ">66048<" in page and ">True<" in page and ">1.5000e-03<" in page and "e+0" not in page
    digest = failed["output_sha256"]
    assert f'title="{digest}"' in page and f">{digest}<" not in page  # abbreviated, full value on hover


def test_failing_case_shows_its_error_map() -> None:
    values = [[0.1, 0.2], [0.3, 5.0], [None, None]]
    emap = {"values": values, "row_stride": 64, "q_seqlen": [150, 42], "bound": 0.004}
    failed = rec(1, verdict="failed", worst_slack=5.0, failing=["atb:x"], error_map=emap)
    page = html.render([failed, rec(2)], {})
    assert page.count('class="plot errmap"') == 1 and re.search(r'<details class="case" id="[^"]+" open>', page)
    assert 'class="batch"' in page and 'class="tile"' in page  # batch 2 starts at row 150; a tile at 128
    assert "head 1: max 5" in page and "not checked" in page
    assert html.render([rec(1, verdict="failed", error_map={"values": "garbage"})], {}).count("plot errmap") == 0


def test_worst_case_row_names_the_check_its_slack_comes_from() -> None:
    checks = [
        {"rule": "atb", "metric": "atb_max_scaled_err", "value": 1.2, "bound": 1.0, "slack": 1.2, "passed": False},
        {"rule": "benchmark", "metric": "mere_ratio", "value": 6.8, "bound": 2.0, "slack": 3.4, "passed": False},
        {"rule": "benchmark", "metric": "rmse_ratio", "value": 0.2, "bound": 2.0, "slack": 0.1, "passed": True},
    ]
    failing = rec(
        1,
        verdict="failed",
        worst_slack=3.4,
        checks=checks,
        failing=["atb: atb_max_scaled_err = 1.2 vs bound 1 (slack 1.2)", "benchmark: ..."],
    )
    row = summary.plain(summary.worst_table([failing])).splitlines()[1].split()
    assert row[:4] == ["1", "3.400", "failed", "npu"]
    assert " ".join(row[4:]) == "benchmark:mere_ratio (+1 more failing)"


def test_worst_case_row_ignores_evidence_only_checks() -> None:
    checks = [
        {"rule": "model", "metric": "max_err_over_bound", "value": 79.0, "bound": 1.0, "slack": 79.0, "passed": False},
        {
            "rule": "benchmark",
            "metric": "mere_ratio",
            "value": 1322.0,
            "bound": 2.0,
            "slack": 661.0,
            "passed": False,
            "decisive": False,
        },
    ]
    failing = rec(1, verdict="failed", worst_slack=79.0, checks=checks, failing=["model: ..."])
    row = summary.plain(summary.worst_table([failing])).splitlines()[1].split()
    assert row[1] == "79.000" and " ".join(row[4:]) == "model:max_err_over_bound"


def test_piped_terminal_tables_keep_full_labels() -> None:
    long = [rec(i, backend="a_really_long_backend_name_for_testing_" * 2, case_id="c" * 90) for i in range(4)]
    piped = summary.plain(summary.group_table(long, truncate=False) + summary.worst_table(long, truncate=False))
    assert "~" not in piped and "a_really_long_backend_name_for_testing_" * 2 in piped and "c" * 90 in piped
    tty = summary.plain(summary.group_table(long) + summary.worst_table(long))
    assert "~" in tty and all(len(line) <= 80 for line in tty.splitlines())


def failing_run() -> list[dict[str, Any]]:
    """20 passing records and 3 failures, two in one group, the worst one with an error map."""
    emap = {"values": [[0.5, 6.4]], "row_stride": 1, "q_seqlen": [1], "bound": 1.0, "rule": "model:max_err_over_bound"}
    bad = [
        rec(100, verdict="failed", worst_slack=6.4, error_map=emap, failing=["model: ..."]),
        rec(102, verdict="failed", worst_slack=1.5, failing=["model: ..."]),  # the same group (even: fp16)
        rec(101, backend="cpu", verdict="error", failing=["boom"]),
    ]
    return [rec(i) for i in range(20)] + bad


def test_page_says_the_verdict_first_with_coloured_counts_and_contents() -> None:
    page = html.render(failing_run(), {"run_name": "r", "status": "complete"})
    body = page.split("<body>", 1)[1]
    assert body.index('class="banner fail"') < body.index("<table")  # the verdict before any table
    assert "FAIL: 3 of 23 tests failed" in page
    assert '<span class="failed">2 failed</span>' in page and '<span class="error">1 error</span>' in page
    parser = Counter()
    parser.feed(page)
    assert parser.links and set(parser.links) <= set(parser.ids)  # every in-page link lands somewhere
    toc = page.split('id="contents"', 1)[1].split("</nav>", 1)[0]
    assert toc.index("#failures") < toc.index("#groups") < toc.index("#environment")
    assert body.index('id="failures"') < body.index('id="suites"') < body.index('id="groups"')  # failures first
    # worst failure first and open; each failure is expandable
    first, second = re.findall(r'<details class="case" id="([^"]+)"', page)[:2]
    assert "case100" in first and "case102" in second
    assert page.count('<details class="case"') == 3


def test_failing_groups_link_to_their_cases() -> None:
    page = html.render(failing_run(), {"status": "complete"})
    groups = page.split('id="groups"', 1)[1].split("</table>", 1)[0]
    links = re.findall(r'<a class="(failed|error)" href="#([^"]+)">(\d+)</a>', groups)
    assert sorted((cls, n) for cls, _, n in links) == [("error", "1"), ("failed", "2")]
    for _, target, _ in links:
        section = page.split(f'id="{target}"', 1)[1].split("<h3", 1)[0]
        assert '<details class="case"' in section  # the group's heading is followed by its cases


def test_banner_of_incomplete_passing_and_unknown_runs() -> None:
    passing = [rec(i) for i in range(3)]
    assert "PASS: 3 tests conform" in html.render(passing, {"status": "complete"})
    ruled_out = record("na", verdict="skipped", not_applicable="backend cpu declares no error contract")
    assert "PASS: 3 tests conform; 1 not applicable (ruled out by the backend&#x27;s own declarations)" in html.render(
        [*passing, ruled_out], {"status": "complete"}
    )
    interrupted = {"status": "interrupted", "counts": {"selected": 9, "run": 3, "recorded": 3}}
    assert "INCOMPLETE: the run is interrupted after 3 of 9 selected tests" in html.render(passing, interrupted)
    short = {"status": "complete", "counts": {"selected": 9, "run": 3, "recorded": 3}}
    assert "INCOMPLETE: 6 of 9 selected tests never ran" in html.render(passing, short)
    assert "completeness unknown" in html.render(passing, {})
    skipped = [rec(i, verdict="skipped") for i in range(2)]
    assert "NOTHING TESTED" in html.render(skipped, {"status": "complete"})


def test_error_map_legend_names_the_deciding_rule_and_titles_fit() -> None:
    (bad,) = [r for r in failing_run() if r.get("error_map")]
    bad["case_id"] = "bf16-causal-krope_ctkv-b4-s1024-kv1152-h16-g4-q3d-padded-large_logits-3fa2c1d0"
    chart = html.error_map_chart(bad)
    assert "slack of the deciding check" in chart and "model:max_err_over_bound" in chart
    width = float(re.search(r'<svg class="plot errmap" width="(\d+)"', chart).group(1))  # type: ignore[union-attr]
    title = re.search(r'class="t">([^<]+)</text>', chart).group(1)  # type: ignore[union-attr]
    assert svg.title_width(title) <= width  # the visible title fits its chart
    assert bad["case_id"] in chart  # the full title is the chart's <title>
    assert svg.map_colour(6.4) != svg.map_colour(0.5) and svg.map_colour(6.4) in chart  # 6.4 is red


def test_a_failing_case_shows_its_likely_cause_and_the_commands_that_shrink_and_reproduce_it() -> None:
    cause = {"name": "causal_top_left", "text": "output matches the golden with a top-left causal mask"}
    failed = rec(1, verdict="failed", suite="conformance", test="test_conformance[case001-x:y]", likely_cause=cause)
    page = html.case_details(failed)
    assert "likely cause:</b> output matches the golden with a top-left causal mask" in page
    assert "mlaconf shrink &#x27;test_conformance[case001-x:y]&#x27;" in page
    assert "mlaconf repro &#x27;test_conformance[case001-x:y]&#x27; --out repro-case001" in page
    assert "likely cause" not in html.case_details(rec(2, verdict="failed", suite="conformance"))
    assert "mlaconf shrink" not in html.case_details(rec(3, verdict="passed", suite="conformance"))


def test_a_plug_in_backends_commands_name_it_as_the_run_did() -> None:
    """A test id carries a plug-in's label only: the commands add the import path the run's run.json holds."""
    failed = rec(1, verdict="failed", suite="conformance", test="test_conformance[case001-mine]", backend="mine")
    run = {"backends": [{"name": "my_kernels:factory", "label": "mine", "explicit": True}]}
    assert html.repro_commands(failed, run) == [
        "mlaconf shrink 'test_conformance[case001-mine]' --backend my_kernels:factory",
        "mlaconf repro 'test_conformance[case001-mine]' --backend my_kernels:factory --out repro-case001",
    ]
    assert "--backend my_kernels:factory" in html.render([failed], run | {"status": "complete"})
    assert "--backend" not in " ".join(html.repro_commands(failed, {}))  # a built-in: the id says it all


def test_a_scatter_legend_counts_what_its_table_counts() -> None:
    points = {"unchanged": [svg.Point(1.0, 1.0, "a"), svg.Point(0.5, 0.6, "b")]}
    assert "unchanged (2)</text>" in svg.scatter(points, "t", "x", "y", totals={"unchanged": 2})
    assert "unchanged (5, 2 plotted)</text>" in svg.scatter(points, "t", "x", "y", totals={"unchanged": 5})


class _Terminal:
    """Just what summary.write_terminal calls of pytest's TerminalReporter."""

    def __init__(self) -> None:
        self.lines: list[str] = []
        self.isatty = False
        self._tw = argparse.Namespace(fullwidth=120)

    def write_sep(self, sep: str, title: str) -> None:
        self.lines.append(title)

    def write(self, text: str, **markup: Any) -> None:
        self.lines.append(text)

    def ensure_newline(self) -> None:
        return None

    def write_line(self, text: str, **markup: Any) -> None:
        self.lines.append(text)


def test_the_summary_line_counts_errors_as_errors(tmp_path: Path) -> None:
    terminal = _Terminal()
    summary.write_terminal(terminal, [rec(1, verdict="failed"), rec(2, verdict="error"), rec(3)], tmp_path)
    assert f"3 records, 1 failed, 1 errors; report: {tmp_path}" in terminal.lines


def test_many_failures_open_only_the_first_few_and_keep_the_summary() -> None:
    """41 failures, each with an error map: the verdict and contents come first, the worst few are
    open, the rest collapsed but each one still listed and linked."""
    emap = {"values": [[0.5, 6.4]], "row_stride": 1, "q_seqlen": [1], "bound": 1.0, "rule": "model:max_err_over_bound"}
    bad = [rec(100 + i, verdict="failed", worst_slack=2.0 + i, error_map=emap) for i in range(41)]
    page = html.render([rec(i) for i in range(5)] + bad, {"status": "complete"})
    details = re.findall(r'<details class="case" id="([^"]+)"( open)?>', page)
    assert len(details) == 41
    assert [bool(o) for _, o in details] == [True] * html.OPEN_DETAILS + [False] * (41 - html.OPEN_DETAILS)
    assert html.OPEN_DETAILS <= 5  # "the first few"
    assert "case140" in details[0][0]  # the worst first
    body = page.split("<body>", 1)[1]
    assert body.index('class="banner fail"') < body.index('id="contents"') < body.index('id="failures"')
