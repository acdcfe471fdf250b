"""`mlaconf report diff` on two synthetic runs where one backend was perturbed."""

from __future__ import annotations

import argparse
import hashlib
from pathlib import Path
from typing import Any

import pytest

from mlaconf import verb_function
from mlaconf.reports import diff, diff_render, latency, verbs
from tests.runs import record, write_run_dir


def rec(
    case: str,
    backend: str,
    *,
    verdict: str = "passed",
    slack: float = 0.2,
    digest: str = "a",
    latency: float = 1.0,
    policy: str = "atb",
) -> dict[str, Any]:
    return record(
        case,
        backend=backend,
        dtype="fp16",
        mask="causal",
        cache="krope_ctkv",
        verdict=verdict,
        worst_slack=slack,
        policy=policy,
        metrics={"max_rel_err": slack * 1e-3, "rmse": slack * 1e-4},
        output_sha256=hashlib.sha256(f"{case}{backend}{digest}".encode()).hexdigest(),
        timing={"latency_ms_median": latency, "repeats": 12, "tflops": 1.0, "latencies_ms": calls(latency)},
    )


def calls(median: float, n: int = 12) -> list[float]:
    """Per-call latencies around ``median`` with 2 % spread (timing noise)."""
    return [median * (1 + 0.02 * ((k * 3) % n - n // 2) / n) for k in range(n)]


BASE = [
    rec("identical", "npu"),
    rec("changed", "npu", slack=0.3),
    rec("regressed_verdict", "npu"),
    rec("regressed_slack", "npu", slack=0.3),
    rec("small_growth", "npu", slack=0.1),
    rec("fixed", "npu", verdict="failed", slack=1.4),
    rec("slower", "npu", latency=1.0),
    rec("missing", "npu"),
    *(rec(f"c{i}", "cpu") for i in range(5)),
]
CAND = [
    rec("identical", "npu", latency=1.1),  # timing noise must not matter
    rec("changed", "npu", slack=0.35, digest="b"),
    rec("regressed_verdict", "npu", verdict="failed", slack=1.2, digest="b"),
    rec("regressed_slack", "npu", slack=0.8, digest="b"),
    rec("small_growth", "npu", slack=0.4, digest="b"),  # 4x but still below 0.5: not a regression
    rec("fixed", "npu", slack=0.6, digest="b"),
    rec("slower", "npu", latency=2.0),
    rec("added", "npu"),
    *(rec(f"c{i}", "cpu") for i in range(5)),
]
EXPECTED = {
    "identical": "identical",
    "changed": "changed",
    "regressed_verdict": "regressed",
    "regressed_slack": "regressed",
    "small_growth": "changed",
    "fixed": "fixed",
    "slower": "identical",
    "missing": "missing",
    "added": "added",
}


def write_run(directory: Path, records: list[dict[str, Any]], policy: str = "atb") -> Path:
    return write_run_dir(directory, records, policy=policy, environment={"packages": {"torch_npu": directory.name}})


def mlaconf(*argv: str) -> int:
    parser = argparse.ArgumentParser()
    verbs.register(parser.add_subparsers(dest="verb", required=True))
    args = parser.parse_args(argv)
    return int(verb_function(args.func)(args))


def test_classification() -> None:
    cases, perf = diff.diff_records(BASE, CAND)
    got = {(c.case_id, c.backend): c.category for c in cases}
    assert {k[0]: v for k, v in got.items() if k[1] == "npu"} == EXPECTED
    assert all(v == "identical" for k, v in got.items() if k[1] == "cpu")
    assert [(p.case_id, p.ratio) for p in perf] == [("slower", 2.0)]
    changed = next(c for c in cases if c.case_id == "changed")
    assert changed.metric_deltas["max_rel_err"] == pytest.approx((0.3e-3, 0.35e-3))
    slack_reg = next(c for c in cases if c.case_id == "regressed_slack")
    assert "slack 0.300 -> 0.800" in slack_reg.reasons[0]


def test_slack_threshold_is_configurable() -> None:
    cases, _ = diff.diff_records(BASE, CAND, slack_threshold=3.0)
    assert next(c for c in cases if c.case_id == "regressed_slack").category == "changed"


def test_cli_outputs_and_exit_status(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    base = write_run(tmp_path / "old", BASE)
    cand = write_run(tmp_path / "new", CAND, policy="benchmark")
    assert mlaconf("report", "diff", str(base), str(cand)) == 1
    out = capsys.readouterr().out
    assert "regressed: 2" in out and "fixed: 1" in out and "added: 1" in out and "missing: 1" in out
    assert "case sets differ: 1 added, 1 missing" in out and "policies differ" in out
    assert "environment.packages.torch_npu: old -> new" in out
    assert "PERF      slower [npu]" in out
    md = (cand / "diff" / "diff.md").read_text()
    assert "## Regressed (2)" in md and "regressed_verdict" in md and "## Perf regressions (1)" in md
    page = (cand / "diff" / "diff.html").read_text()
    assert page.count("<table") >= 4 and "regressed_slack" in page and "http" not in page.lower()


def test_no_regression_exits_zero_unless_perf_gates(tmp_path: Path) -> None:
    base = write_run(tmp_path / "a", [rec("x", "npu", latency=1.0)])
    cand = write_run(tmp_path / "b", [rec("x", "npu", latency=1.5, digest="b", slack=0.25)])
    out = tmp_path / "out"
    assert mlaconf("report", "diff", str(base), str(cand), "--out", str(out)) == 0
    assert (out / "diff.md").exists()
    assert mlaconf("report", "diff", str(base), str(cand), "--out", str(out), "--fail-on-perf") == 1
    assert (
        mlaconf(
            "report",
            "diff",
            str(base),
            str(cand),
            "--out",
            str(out),
            "--fail-on-perf",
            "--latency-threshold",
            "2",
        )
        == 0
    )


def test_missing_results_is_a_usage_error(tmp_path: Path) -> None:
    with pytest.raises(SystemExit):
        mlaconf("report", "diff", str(tmp_path), str(tmp_path))


def test_missing_or_newly_skipped_cases_fail_the_gate_unless_allowed(tmp_path: Path) -> None:
    base = write_run(tmp_path / "a", [rec("x", "npu"), rec("y", "npu"), rec("z", "npu")])
    # backend unavailable for x, y gone; z compared (a diff that compared nothing never passes)
    cand = write_run(tmp_path / "b", [rec("x", "npu", verdict="skipped"), rec("z", "npu")])
    assert diff.diff_dirs(base, cand).exit_status(False) == 1
    assert diff.diff_dirs(base, cand).exit_status(False, allow_missing=True) == 0
    assert mlaconf("report", "diff", str(base), str(cand), "--out", str(tmp_path / "o")) == 1
    assert mlaconf("report", "diff", str(base), str(cand), "--out", str(tmp_path / "o"), "--allow-missing") == 0
    cases, _ = diff.diff_records([rec("x", "npu"), rec("y", "npu")], [rec("x", "npu", verdict="skipped")])
    assert sorted(c.category for c in cases) == ["missing", "missing"]
    assert (
        diff.diff_dirs(base, write_run(tmp_path / "c", [rec("x", "npu", verdict="skipped")])).exit_status(
            False, allow_missing=True
        )
        == 1
    )  # nothing compared


def test_known_deviation_that_now_fails_differently_regresses() -> None:
    cases, _ = diff.diff_records([rec("x", "npu", verdict="xfailed")], [rec("x", "npu", verdict="failed", digest="b")])
    assert [c.category for c in cases] == ["regressed"]


def test_piped_terminal_output_keeps_full_lines(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    long = "bf16-causal-krope_ctkv-b1-s129-kv300-h16-g2-q3d-padded-2122cd9a"
    base = write_run(tmp_path / "old", [rec(long, "my_kernels.module:factory")])
    cand = write_run(
        tmp_path / "new", [rec(long, "my_kernels.module:factory", verdict="failed", slack=1.5, digest="b")]
    )
    assert mlaconf("report", "diff", str(base), str(cand)) == 1  # capsys: stdout is not a terminal
    line = next(x for x in capsys.readouterr().out.splitlines() if x.startswith("REGRESSED"))
    assert "slack 0.200->1.500 passed -> failed" in line and "~" not in line and len(line) > 100
    result = diff.diff_dirs(base, cand)
    assert all(len(x) <= 80 for x in diff_render.terminal(result, 80).splitlines()[2:])  # a terminal's width


def test_diff_page_plots_base_against_candidate_slack() -> None:
    cases, perf = diff.diff_records(BASE, CAND)
    page = diff_render.render_html(diff.DiffResult("a", "b", cases, perf, [], []))
    assert page.count("<svg") == 1 and "base worst slack" in page
    assert page.count('stroke="#b00020" stroke-width="2"') == 2  # the two regressions are ringed
    assert "regressed_slack [npu] regressed: slack 0.300 -&gt; 0.800" in page  # hover text per point
    assert "added [npu]" not in page.split("<svg")[1]  # measured on one side only: no point


def test_integer_metric_deltas_print_as_integers() -> None:
    b, c = rec("x", "npu"), rec("x", "npu", digest="b")
    b["metrics"] = {"n_rows": 129, "rmse": 1e-4}
    c["metrics"] = {"n_rows": 130, "rmse": 2e-4}
    cases, _ = diff.diff_records([b], [c])
    text = diff_render.markdown(diff.DiffResult("a", "b", cases, [], [], []))
    assert "n_rows 129->130 (+1)" in text and "rmse 1.00e-04->2.00e-04 (+1.00e-04)" in text
    slow = diff.DiffResult("a", "b", [], [latency.PerfDiff("x", "npu", 625.0, 1250.0)], [], [])
    assert "625 ms -> 1250 ms (2.00x," in diff_render.terminal(slow)
