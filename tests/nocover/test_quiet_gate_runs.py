"""Two identical, deterministic runs of the smoke suites (conformance, metamorphic, property, error
contract) diff to 0 changed and 0 perf: today's diff said "changed: 26" (every metamorphic and the
property record) and "perf: 15" from one timed call per case."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from mlaconf import verb_function
from mlaconf.reports import verbs
from mlaconf.reports.rundir import read_results
from tests.machine import HANG_S
from tests.pytest_runs import run_pytest

#: The smoke suites without their heaviest cases (a long kv, 128 heads), so two runs stay short.
SELECT = "not kv16384 and not h128 and not s1100"


def smoke(tmp_path: Path, golden: Path, name: str) -> Path:
    report = tmp_path / name
    result = run_pytest(
        "cases",
        "-n",
        "2",
        "--mla-suite",
        "smoke",
        "--mla-suite",
        "metamorphic",
        "--mla-backend",
        "torch-cpu-strict",  # declares the error contract, so all four suites run
        "--hypothesis-profile",
        "ci",  # derandomized: the same examples both times
        "--mla-golden-dir",
        str(golden),
        "--mla-report-dir",
        str(report),
        "-k",
        SELECT,
        timeout=HANG_S,
        inherit=True,
    )
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
    return report


def mlaconf(*argv: str) -> int:
    parser = argparse.ArgumentParser()
    verbs.register(parser.add_subparsers(dest="verb", required=True))
    args = parser.parse_args(argv)
    return int(verb_function(args.func)(args))


@pytest.mark.timeout(4 * HANG_S)
def test_two_identical_smoke_runs_diff_to_nothing(
    tmp_path: Path, shared_golden: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    base, cand = smoke(tmp_path, shared_golden, "base"), smoke(tmp_path, shared_golden, "cand")
    records = read_results(cand / "results.jsonl")
    suites = {r["suite"] for r in records}
    assert suites == {"conformance", "metamorphic", "property", "error_contract"}
    assert all(r["output_sha256"] for r in records if r["suite"] in ("metamorphic", "property"))
    assert all(r["examples"]["derandomized"] for r in records if r["suite"] == "property")
    run = json.loads((cand / "run.json").read_text())
    assert run["status"] == "complete" and run["counts"]["recorded"] == len(records)

    assert mlaconf("report", "diff", str(base), str(cand)) == 0
    out = capsys.readouterr().out
    assert "changed: 0" in out and f"identical: {len(records)}" in out and "perf: 0" in out
    with_output = sum(bool(r.get("output_sha256")) for r in records)  # error-contract tests have none
    sameness = f"{with_output} bit-identical, {len(records) - with_output} same verdict and evidence, no output digest"
    assert f"GATE PASSES: {len(records)} identical ({sameness})" in out
    assert "latency not compared" in out  # one timed call per case: never a perf verdict
    data = json.loads((cand / "diff" / "diff.json").read_text())
    assert data["regressions"] == 0 and data["perf"] == [] and data["cases"] == []
