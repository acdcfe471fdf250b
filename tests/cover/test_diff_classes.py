"""`report diff`: two backends compared case by case with every failing metric, whole lines when
piped (the run-and-rerun proof of the new diff classes is tests/nocover/test_diff_rerun.py)."""

from __future__ import annotations

import argparse
import hashlib
import os
import subprocess
import sys
from pathlib import Path

import pytest

from mlaconf import verb_function
from mlaconf.reports import diff, verbs
from mlaconf.reports.records import ResultRecord
from mlaconf.reports.rundir import read_results
from tests.machine import HANG_S
from tests.runs import write_run_dir

REPO = Path(__file__).resolve().parents[2]


def mlaconf(*argv: str) -> int:
    parser = argparse.ArgumentParser()
    verbs.register(parser.add_subparsers(dest="verb", required=True))
    args = parser.parse_args(argv)
    return int(verb_function(args.func)(args))


def record(case: str, backend: str, verdict: str = "passed", **extra: object) -> dict[str, object]:
    checks = [
        {"rule": "atb", "metric": m, "value": v, "bound": 1.0, "slack": v, "passed": v <= 1}
        for m, v in extra.pop("values", {"max_rel_err": 0.2}).items()
    ]  # type: ignore[attr-defined]
    return ResultRecord(
        suite="conformance",
        test=f"t[{case}]",
        backend=backend,
        verdict=verdict,
        case_id=case,
        checks=tuple(checks),
        metrics={c["metric"]: c["value"] for c in checks},
        worst_slack=max(c["value"] for c in checks),
        output_sha256=hashlib.sha256(f"{case}{backend}{verdict}".encode()).hexdigest(),
        **extra,
    ).to_dict()  # type: ignore[arg-type]


def test_two_backends_case_by_case_with_every_failing_metric(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    names = ["a_metric", "b_metric", "c_metric", "d_metric", "e_metric", "z_metric"]
    run = write_run_dir(
        tmp_path / "run",
        [
            record("case-1", "atb"),
            record("case-2", "atb"),
            record("case-1", "torch-cuda", "failed", values=dict.fromkeys(names, 1.5)),
            record("case-2", "torch-cuda"),
        ],
    )
    assert (
        mlaconf(
            "report",
            "diff",
            str(run),
            str(run),
            "--base-backend",
            "atb",
            "--cand-backend",
            "torch-cuda",
            "--out",
            str(tmp_path / "d"),
        )
        == 1
    )
    out = capsys.readouterr().out
    line = next(line for line in out.splitlines() if line.startswith("REGRESSED"))
    assert "case-1 [atb -> torch-cuda]" in line and all(f"atb:{n} FAILING" in line for n in names)  # all six, z too
    assert "comparing backend atb of the base with torch-cuda of the candidate" in out
    cases, _ = diff.diff_records(
        read_results(run / "results.jsonl"),
        read_results(run / "results.jsonl"),
        base_backend="atb",
        cand_backend="torch-cuda",
    )
    assert sorted((c.case_id, c.category) for c in cases) == [("case-1", "regressed"), ("case-2", "changed")]


def test_piped_diff_prints_whole_lines(tmp_path: Path) -> None:
    base, cand = tmp_path / "b", tmp_path / "c"
    long_case = "bf16-causal-krope_ctkv-b4-s1024-kv1152-h16-g4-q3d-padded-large_logits-3fa2c1d0"
    for directory, verdict in ((base, "passed"), (cand, "failed")):
        write_run_dir(
            directory,
            [record(long_case, "torch-cpu", verdict, values={"max_rel_err": 0.2 if verdict == "passed" else 3.0})],
        )
    result = subprocess.run(
        [sys.executable, "-m", "mlaconf", "report", "diff", str(base), str(cand)],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=HANG_S,
        env=dict(os.environ, PYTHONPATH=str(REPO), COLUMNS="60"),
    )
    assert result.returncode == 1
    line = next(line for line in result.stdout.splitlines() if line.startswith("REGRESSED"))
    assert long_case in line and "atb:max_rel_err FAILING slack 0.200->3.000" in line and not line.endswith("~")
    assert "; max_rel_err 2.00e-01->3.00e+00" in line
