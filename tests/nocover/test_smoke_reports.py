"""The real smoke suite on torch-cpu: -n 0, -n 2 and three merged shards write the same records."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from mlaconf.golden.specs.suites import load_suites
from mlaconf.reports.records import without_volatile
from mlaconf.reports.rundir import read_results
from tests.machine import HANG_S
from tests.pytest_runs import run_pytest

REPO = Path(__file__).resolve().parents[2]


def conformance(tmp_path: Path, golden: Path, name: str, *args: str) -> Path:
    out = tmp_path / name
    done = run_pytest(
        "cases/test_conformance.py",
        "-q",
        "--mla-backend",
        "torch-cpu",
        "--mla-golden-dir",
        str(golden),
        "--mla-report-dir",
        str(out),
        *args,
        timeout=HANG_S,
        inherit=True,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    return out


def records(directory: Path) -> list[dict[str, object]]:
    return [without_volatile(r) for r in read_results(directory / "results.jsonl")]


def test_serial_parallel_and_sharded_runs_agree(tmp_path: Path, shared_golden: Path) -> None:
    serial = records(conformance(tmp_path, shared_golden, "serial", "-n", "0"))
    assert len(serial) == len(load_suites(["smoke"])) and all(r["verdict"] == "passed" for r in serial)
    assert records(conformance(tmp_path, shared_golden, "parallel", "-n", "2")) == serial
    shards = [conformance(tmp_path, shared_golden, f"shard{k}", "-n", "0", "--mla-shard", f"{k}/3") for k in (1, 2, 3)]
    assert all(0 < len(records(s)) < len(serial) for s in shards)
    merged = tmp_path / "merged"
    done = subprocess.run(
        [sys.executable, "-m", "mlaconf", "report", "merge", str(merged), *map(str, shards)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=HANG_S,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert records(merged) == serial
