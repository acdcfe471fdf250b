"""The upgrade gate passes only on evidence: runs that tested nothing, compared nothing,
are one run twice, or say they have problems never pass ``mlaconf report diff``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from tests.machine import HANG_S
from tests.runs import record, write_run_dir

REPO = Path(__file__).resolve().parents[2]


def rec(case: str, verdict: str = "passed", backend: str = "atb", **extra: Any) -> dict[str, Any]:
    return record(case, verdict=verdict, backend=backend, **extra)


def diff(base: Path, cand: Path, *flags: str) -> tuple[int, str]:
    """``mlaconf report diff`` as a user runs it: exit status and the verdict line."""
    env = dict(os.environ, PYTHONPATH=str(REPO))
    argv = [sys.executable, "-m", "mlaconf", "report", "diff", str(base), str(cand), "--out", str(cand / "d"), *flags]
    done = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=HANG_S, check=False)
    assert "Traceback" not in done.stderr, done.stderr
    verdict = next((line.strip() for line in done.stdout.splitlines() if "GATE " in line), done.stderr.strip())
    return done.returncode, verdict


UNAVAILABLE = "backend atb was named explicitly but is unavailable here"


def test_two_runs_that_skipped_everything_never_pass(tmp_path: Path) -> None:
    skipped = [rec(f"c{i}", "skipped") for i in range(5)]
    a = write_run_dir(tmp_path / "a1", skipped, problems=[UNAVAILABLE], run_id="a1")
    b = write_run_dir(tmp_path / "a2", skipped, problems=[UNAVAILABLE], run_id="a2")
    status, verdict = diff(a, b)
    assert status == 1
    assert verdict.startswith("GATE FAILS: the candidate run has 1 problem(s): " + UNAVAILABLE), verdict
    assert "5 not run (no evidence" in verdict and "nothing compared" in verdict
    page = json.loads((b / "d" / "diff.json").read_text())
    listed = list(page["categories"])  # what fails the gate is listed before what changed within it
    assert listed.index("not_run") < listed.index("fixed") and len(page["categories"]["not_run"]) == 5
    # without problems, still no evidence: the flag that says skips are expected cannot make nothing pass
    a = write_run_dir(tmp_path / "s1", skipped, run_id="s1")
    b = write_run_dir(tmp_path / "s2", skipped, run_id="s2")
    assert diff(a, b, "--skips-expected")[0] == 1


def test_expected_skips_pass_and_the_verdict_says_how_many(tmp_path: Path) -> None:
    records = [rec("x"), rec("y"), rec("z", "skipped")]
    a = write_run_dir(tmp_path / "a", records, run_id="a")
    b = write_run_dir(tmp_path / "b", records, run_id="b")
    assert diff(a, b) == (1, "GATE FAILS: 1 not run (no evidence; --skips-expected if meant)")
    assert diff(a, b, "--skips-expected") == (
        0,
        "GATE PASSES: 2 identical (bit-identical), 0 changed within tolerance, 2 of 3 baseline pairs compared, "
        "1 not run (expected)",
    )
    assert diff(a, b, "--skips-expected", "--min-compared", "0.9")[0] == 1  # a stated share not met


def test_a_diff_that_compared_nothing_fails(tmp_path: Path) -> None:
    a = write_run_dir(tmp_path / "cpu", [rec(f"c{i}", backend="torch-cpu") for i in range(4)], run_id="a")
    b = write_run_dir(tmp_path / "strict", [rec(f"c{i}", backend="torch-cpu-strict") for i in range(4)], run_id="b")
    status, verdict = diff(a, b, "--allow-missing")
    assert status == 1 and "nothing compared: no pair ran on both sides (baseline 4 records)" in verdict


def test_one_run_on_both_sides_fails(tmp_path: Path) -> None:
    a = write_run_dir(tmp_path / "r1", [rec("x")], run_id="same")
    assert diff(a, a) == (1, f"GATE FAILS: base and candidate are the same run (one directory, {a.resolve()})")
    copy = write_run_dir(tmp_path / "copy", [rec("x")], run_id="same")
    assert diff(a, copy) == (1, "GATE FAILS: base and candidate are the same run (run_id same on both sides)")
    # two backends of one run, case by case, is a comparison the flags ask for
    both = write_run_dir(tmp_path / "both", [rec("x"), rec("x", backend="torch-cpu")], run_id="both")
    assert diff(both, both, "--base-backend", "atb", "--cand-backend", "torch-cpu")[0] == 0


def test_tests_that_never_ran_in_the_candidate_are_their_own_class(tmp_path: Path) -> None:
    never = {"kind": "not_run", "message": "never ran: the session was interrupted or stopped before it ran"}
    a = write_run_dir(tmp_path / "a", [rec("x"), rec("y")], run_id="a")
    b = write_run_dir(tmp_path / "b", [rec("x"), rec("y", "error", failure=never)], run_id="b")
    status, verdict = diff(a, b)
    assert status == 1 and verdict == "GATE FAILS: 1 not run (no evidence; --skips-expected if meant)"
    page = json.loads((b / "d" / "diff.json").read_text())
    assert page["counts"]["not_run"] == 1 and page["counts"]["regressed"] == 0
