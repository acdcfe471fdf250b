"""The real smoke suites (conformance, metamorphic, property, error contract) on torch-cpu-strict, run under
xdist and serially as three shards: the merged shards (every test once, each in a serial run) hold the parallel
run's records, and the serial run they make diffed against the parallel one says nothing changed (0 changed,
0 perf: identical, deterministic runs make a silent gate; one timed call per case is never a perf verdict).
Hypothesis runs derandomized (the same examples every time); the heaviest smoke cases (a long kv, 128 heads)
are left out, which the claims about the runner do not need."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from mlaconf import verb_function
from mlaconf.reports import verbs
from mlaconf.reports.records import Record, without_volatile
from mlaconf.reports.rundir import read_results
from tests.machine import HANG_S
from tests.pytest_runs import run_pytest

#: The smoke suites without their heaviest cases, so the runs stay short.
SELECT = "not kv16384 and not h128 and not s1100"
SUITES = {"conformance", "metamorphic", "property", "error_contract"}


def smoke(root: Path, golden: Path, name: str, *args: str) -> Path:
    report = root / name
    result = run_pytest(
        "cases",
        "--mla-suite",
        "smoke",
        "--mla-suite",
        "metamorphic",
        "--mla-backend",
        "torch-cpu-strict",  # declares the error contract, so all four suites run
        "--hypothesis-profile",
        "ci",  # derandomized: the same examples every time
        "-k",
        SELECT,
        *args,
        golden=golden,
        report=report,
        timeout=HANG_S,
        inherit=True,
    )
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
    return report


def records(directory: Path) -> list[Record]:
    return [without_volatile(r) for r in read_results(directory / "results.jsonl")]


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory, shared_golden: Path) -> dict[str, Path]:
    """The parallel run, three serial shards and their merge (the serial run of every test), by name."""
    root = tmp_path_factory.mktemp("smoke-runs")
    made = {"parallel": smoke(root, shared_golden, "parallel", "-n", "2")}
    for k in (1, 2, 3):
        made[f"shard{k}"] = smoke(root, shared_golden, f"shard{k}", "-n", "0", "--mla-shard", f"{k}/3")
    made["serial"] = root / "serial"
    assert mlaconf("report", "merge", str(made["serial"]), *(str(made[f"shard{k}"]) for k in (1, 2, 3))) == 0
    return made


def mlaconf(*argv: str) -> int:
    parser = argparse.ArgumentParser()
    verbs.register(parser.add_subparsers(dest="verb", required=True))
    args = parser.parse_args(argv)
    return int(verb_function(args.func)(args))


def test_serial_parallel_and_sharded_runs_agree(runs: dict[str, Path]) -> None:
    parallel = records(runs["parallel"])
    assert {r["suite"] for r in parallel} == SUITES and all(r["verdict"] == "passed" for r in parallel)
    assert all(0 < len(records(runs[f"shard{k}"])) < len(parallel) for k in (1, 2, 3))
    assert records(runs["serial"]) == parallel


def test_two_identical_smoke_runs_diff_to_nothing(runs: dict[str, Path], capsys: pytest.CaptureFixture[str]) -> None:
    base, cand = runs["serial"], runs["parallel"]
    found = read_results(cand / "results.jsonl")
    assert all(r["output_sha256"] for r in found if r["suite"] in ("metamorphic", "property"))
    assert all(r["examples"]["derandomized"] for r in found if r["suite"] == "property")
    run = json.loads((cand / "run.json").read_text())
    assert run["status"] == "complete" and run["counts"]["recorded"] == len(found)

    assert mlaconf("report", "diff", str(base), str(cand)) == 0
    out = capsys.readouterr().out
    assert "changed: 0" in out and f"identical: {len(found)}" in out and "perf: 0" in out
    with_output = sum(bool(r.get("output_sha256")) for r in found)  # error-contract tests have none
    sameness = f"{with_output} bit-identical, {len(found) - with_output} same verdict and evidence, no output digest"
    assert f"GATE PASSES: {len(found)} identical ({sameness})" in out
    assert "latency not compared" in out  # one timed call per case: never a perf verdict
    data = json.loads((cand / "diff" / "diff.json").read_text())
    assert data["regressions"] == 0 and data["perf"] == [] and data["cases"] == []
