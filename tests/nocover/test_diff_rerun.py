"""`report diff` on a real run and rerun of all kinds of records: an error case whose stage changed,
a metamorphic relation and determinism that broke, a case that timed out; each is listed under its own
heading in the terminal, diff.md, diff.html and diff.json, and the gate fails."""

from __future__ import annotations

import argparse
import json
import textwrap
from pathlib import Path

import pytest

from mlaconf import verb_function
from mlaconf.reports import verbs
from mlaconf.reports.rundir import read_results
from tests.machine import HANG_S
from tests.pytest_runs import run_pytest

CASES = textwrap.dedent("""
    [suite]
    name = "rerun"

    [defaults]
    q_seqlen = [8, 5]
    dtype = "fp16"

    [[case]]
    head_num = 1

    [[case]]
    head_num = 3

    [[case]]
    name = "cache-mode-kvcache"
    head_num = 2
    cache_mode = 0
    expect_error = "ERROR_INVALID_PARAM"
    expect_stage = "create"
""")

SELECT = "test_conformance or test_error_contract or (fp16-undefined-krope_ctkv-b3 and (q_layout or determinism))"


def run_suites(tmp_path: Path, name: str, mode: str) -> Path:
    report = tmp_path / name
    result = run_pytest(
        "cases/test_conformance.py",
        "cases/test_error_contract.py",
        "cases/test_metamorphic.py",
        "-n",
        "0",
        "--mla-cases",
        str(tmp_path / "rerun.toml"),
        "--mla-suite",
        "metamorphic",  # beside a suite file of one's own only when named
        "--mla-backend",
        "tests.plugin_backends:upgraded",
        "--mla-golden-dir",
        str(tmp_path / "golden"),
        "--mla-report-dir",
        str(report),
        "--mla-timeout",
        "6",
        "-k",
        SELECT,
        timeout=HANG_S,
        env={"MODE": mode},
    )
    assert result.returncode == (0 if mode == "base" else 1), result.stdout[-4000:] + result.stderr[-2000:]
    return report


@pytest.mark.timeout(4 * HANG_S)
def test_rerun_diff_lists_each_new_kind_under_its_heading(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "rerun.toml").write_text(CASES)
    base = run_suites(tmp_path, "base", "base")
    cand = run_suites(tmp_path, "cand", "rerun")
    suites = {r["suite"] for r in read_results(base / "results.jsonl")}
    assert suites == {"conformance", "error_contract", "metamorphic"}  # --mla-cases reached the error suite

    assert mlaconf("report", "diff", str(base), str(cand)) == 1
    out = capsys.readouterr().out
    heads = [line for line in out.splitlines() if line.startswith("-- ")]
    for heading in (
        "Error status or stage changed (1)",
        "Metamorphic relations broken (1)",
        "Determinism lost (1)",
        "Timeouts (1)",
    ):
        assert any(heading in h and "fails the gate" in h for h in heads), (heading, out)
    assert "ERROR_INVALID_PARAM at create -> ERROR_INVALID_PARAM at execute" in out
    assert "timed out after 6 s in backend.run" in out
    assert not any(line.endswith("~") for line in out.splitlines())

    data = json.loads((cand / "diff" / "diff.json").read_text())
    for category in ("status_changed", "relation_broken", "determinism_lost", "timed_out"):
        assert len(data["categories"][category]) == 1, category
    md = (cand / "diff" / "diff.md").read_text()
    page = (cand / "diff" / "diff.html").read_text()
    for heading in ("Error status or stage changed", "Metamorphic relations broken", "Determinism lost", "Timeouts"):
        assert f"## {heading} (1)" in md and heading in page


def mlaconf(*argv: str) -> int:
    parser = argparse.ArgumentParser()
    verbs.register(parser.add_subparsers(dest="verb", required=True))
    args = parser.parse_args(argv)
    return int(verb_function(args.func)(args))
