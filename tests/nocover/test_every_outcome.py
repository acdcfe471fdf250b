"""Every outcome is a record: a backend that raises, returns garbage, hangs on one case and crashes
its xdist worker on another, and passes the rest, gives a report whose counts are pytest's."""

from __future__ import annotations

import json
import re
import textwrap
from collections import Counter
from pathlib import Path

import pytest

from mlaconf.reports.records import ResultRecord
from mlaconf.reports.rundir import read_results
from tests.machine import HANG_S
from tests.pytest_runs import PytestRun, run_pytest

TIMEOUT_S = 10

#: One case per behaviour, told apart by head_num (what the backend sees of the case).
CASES = textwrap.dedent("""
    [suite]
    name = "outcomes"

    [defaults]
    q_seqlen = [8, 5]
    dtype = "fp16"

    [[matrix]]
    head_num = [1, 2, 3, 4, 5, 6, 7, 8]
""")


def pytest_counts(stdout: str) -> Counter[str]:
    """pytest's own summary line ('5 failed, 2 passed in 3.1s') as counts in record vocabulary."""
    line = next(line for line in reversed(stdout.splitlines()) if re.search(r"\d+ (passed|failed)", line))
    words = {
        "passed": "passed",
        "failed": "failed",
        "skipped": "skipped",
        "xfailed": "xfailed",
        "xpassed": "xpassed",
        "error": "error",
        "errors": "error",
    }
    counts: Counter[str] = Counter()
    for number, word in re.findall(r"(\d+) (\w+)", line):
        if word in words:
            counts[words[word]] += int(number)
    return counts


@pytest.mark.timeout(4 * HANG_S)
def test_report_counts_equal_pytests_whatever_the_backend_does(tmp_path: Path) -> None:
    result = run_misbehaving(tmp_path, "-n", "2", "--mla-timeout", str(TIMEOUT_S))
    report = tmp_path / "report"
    out = result.stdout + result.stderr
    assert result.returncode == 1, out[-4000:]
    expected = Counter({"failed": 6, "passed": 2})
    assert pytest_counts(result.stdout) == expected, out[-4000:]

    records = read_results(report / "results.jsonl")
    assert Counter(r["verdict"] for r in records) == expected
    run = json.loads((report / "run.json").read_text())
    assert {k: v for k, v in run["verdicts"].items() if v} == dict(expected)
    assert "8 records, 6 failed" in result.stdout

    by_heads = {r["spec"]["head_num"]: ResultRecord.from_dict(r) for r in records if r.get("spec")}
    crashed = [ResultRecord.from_dict(r) for r in records if not r.get("spec")]
    raised = by_heads[1]
    assert raised.failure is not None and raised.failure.kind == "exception"
    assert raised.failure.type == "RuntimeError" and raised.failure.where == "backend.run"
    assert "out of descriptors" in raised.message and raised.backend == "misbehaving"
    for heads, kind in ((2, "NoneType"), (3, "ndarray"), (4, "list")):
        assert f"backend.run returned {kind}, expected a torch.Tensor" in by_heads[heads].message
    hung = by_heads[5]
    assert hung.failure is not None and hung.failure.kind == "timeout"
    assert f"timed out after {TIMEOUT_S} s in backend.run" in hung.message
    crash = by_heads.get(6) or crashed[0]
    assert crash.failure is not None and crash.failure.kind == "crash", crash
    assert "crashed" in crash.message and crash.case_id.startswith("fp16-undefined-krope_ctkv-b2-s8-h6")
    assert all(by_heads[h].verdict == "passed" for h in (7, 8))


def run_misbehaving(tmp_path: Path, *args: str, paths: tuple[str, ...] = ("cases/test_conformance.py",)) -> PytestRun:
    (tmp_path / "outcomes.toml").write_text(CASES)
    return run_pytest(
        *paths,
        "--mla-cases",
        str(tmp_path / "outcomes.toml"),
        "--mla-backend",
        "tests.plugin_backends:misbehaving",
        "--mla-golden-dir",
        str(tmp_path / "golden"),
        "--mla-report-dir",
        str(tmp_path / "report"),
        *args,
        timeout=HANG_S,
    )


@pytest.mark.timeout(4 * HANG_S)
def test_thread_method_timeout_kills_the_worker_and_says_so(tmp_path: Path) -> None:
    """A hang inside C code needs pytest-timeout's thread method, which kills the xdist worker:
    the record still says the test timed out, and the run goes on with a new worker."""
    result = run_misbehaving(tmp_path, "-n", "1", "--timeout-method", "thread", "--mla-timeout", "5", "-k", "h5 or h7")
    assert result.returncode == 1, result.stdout[-3000:]
    assert pytest_counts(result.stdout) == Counter({"failed": 1, "passed": 1}), result.stdout[-3000:]
    records = {r["spec"]["head_num"]: r for r in read_results(tmp_path / "report" / "results.jsonl")}
    hung = ResultRecord.from_dict(records[5])
    assert hung.failure is not None and hung.failure.kind == "timeout" and hung.failure.timeout_s == 5
    assert "timed out after 5 s" in hung.message and "thread method killed the worker" in hung.message
    assert records[7]["verdict"] == "passed"


#: Fails every bf16 case by a wide margin (fp16 is computed right): hypothesis must shrink to bf16.


@pytest.mark.timeout(4 * HANG_S)
def test_a_worker_that_exits_is_a_crash_with_its_status_beside_a_timeout(tmp_path: Path) -> None:
    """Two workers: one gets the hang and then h7 (three tests on two workers go round-robin), the other the
    backend's ``os._exit(3)``: a crash, with its exit status, and the run, out of restarts, stops; the hang runs
    on until pytest-timeout's thread method kills its worker (a timeout), h7 never runs, and the run ends
    ``crashed``: the exit is never taken for a timeout because another test timed out."""
    extra = ("-n", "2", "--max-worker-restart", "0", "--timeout-method", "thread", "--mla-timeout", "5")
    result = run_misbehaving(tmp_path, *extra, "-k", "h5 or h6 or h7")
    assert result.returncode == 1, result.output
    records = {
        int(r["case_id"].split("-h")[1].split("-")[0]): r for r in read_results(tmp_path / "report" / "results.jsonl")
    }
    hung, exited = ResultRecord.from_dict(records[5]), ResultRecord.from_dict(records[6])
    assert hung.failure is not None and hung.failure.kind == "timeout", hung
    assert exited.failure is not None and exited.failure.kind == "crash" and exited.failure.exit_status == 3, exited
    assert "exited with status 3" in exited.message and "timed out" not in exited.message, exited.message
    assert (records[7].get("failure") or {}).get("kind") == "not_run", records[7]
    run = json.loads((tmp_path / "report" / "run.json").read_text())
    assert run["status"] == "crashed", run
