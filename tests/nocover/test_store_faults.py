"""Golden store under faults, in real processes: random byte flips in real smoke goldens are detected
and rebuilt; regen workers die with a SIGKILLed parent; one Ctrl-C stops ``regen -j 2`` cleanly; a
full disk ends ``mlaconf regen`` with a message and exit status 1.

Child processes run ``python -m mlaconf.golden.maintain regen --builder test_store_faults:<builder>`` with this
directory on PYTHONPATH.
"""

from __future__ import annotations

import contextlib
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

from mlaconf.golden.building.cost import stored_bytes
from mlaconf.golden.building.regen import regen
from mlaconf.golden.specs.spec import CaseSpec
from mlaconf.golden.specs.spec_build import build_case
from mlaconf.golden.specs.suites import load_suite, load_suites
from mlaconf.golden.specs.types import GoldenCase
from mlaconf.golden.store.directory import GoldenStore
from tests import flips
from tests.machine import HANG_S, within

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
PID_LOG = "MLA_TEST_PID_LOG"
FLIPS, FLIP_BUDGET_S = 400, 240.0
#: Smoke goldens the flips land in: the smallest (9.5 MB in all; both dtypes, every mask).
FLIP_CASES = 24


def _env(**extra: str) -> dict[str, str]:
    env = dict(os.environ, **extra)
    env["PYTHONPATH"] = os.pathsep.join([str(HERE), str(REPO), env.get("PYTHONPATH", "")])
    env.pop("MLA_GOLDEN_DIR", None)
    return env


def sleeping_builder(spec: CaseSpec, *, threads: int = 1) -> GoldenCase:
    """Logs the worker's pid, then outlives any test (a worker left behind would show)."""
    with open(os.environ[PID_LOG], "a") as fh:
        fh.write(f"{os.getpid()}\n")
    time.sleep(600)
    raise AssertionError(f"{spec.case_id}: the sleeping builder was not killed")


def napping_builder(spec: CaseSpec, *, threads: int = 1) -> GoldenCase:
    """The real builder, two seconds late (a regen slow enough to interrupt); logs the worker's pid."""
    from mlaconf.golden.building.generate import build_golden

    with open(os.environ[PID_LOG], "a") as fh:
        fh.write(f"{os.getpid()}\n")
    time.sleep(2.0)
    return build_golden(spec, threads=threads)


def _gone(pid: int) -> bool:
    """Dead (a zombie counts: it runs nothing, only its exit status waits for a reaper)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return True
    except OSError:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        return False
    return stat.rsplit(")", 1)[1].split()[0] in ("Z", "X")


def _wait_gone(pids: list[int], seconds: float) -> list[int]:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and not all(_gone(pid) for pid in pids):
        time.sleep(0.05)
    return [pid for pid in pids if not _gone(pid)]


def _kill(pids: list[int]) -> None:
    """Clean-up of the processes this test started, if still alive."""
    for pid in pids:
        if not _gone(pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def test_regen_workers_die_with_their_sigkilled_parent(tmp_path: Path) -> None:
    suite = tmp_path / "suite.toml"
    suite.write_text("[[matrix]]\nhead_num = 1\nq_seqlen = [[4]]\nseed = [1, 2, 3, 4]\n")
    log = tmp_path / "pids.log"
    command = [
        sys.executable,
        "-m",
        "mlaconf.golden.maintain",
        "regen",
        "--cases",
        str(suite),
        "--out",
        str(tmp_path / "store"),
        "-j",
        "2",
        "--builder",
        "test_store_faults:sleeping_builder",
    ]
    parent = subprocess.Popen(
        command, env=_env(**{PID_LOG: str(log)}), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    workers: list[int] = []
    try:
        deadline = time.monotonic() + HANG_S
        while len(workers) < 2 and time.monotonic() < deadline and parent.poll() is None:
            time.sleep(0.1)
            workers = [int(line) for line in log.read_text().split()] if log.exists() else []
        assert len(workers) == 2, f"workers did not start (parent exit status {parent.poll()})"
        parent.kill()
        parent.wait()
        left = _wait_gone(workers, 3.0)
        assert not left, f"workers {left} outlived their SIGKILLed parent by 3 s"
    finally:
        parent.kill()
        _kill(workers)


def test_one_ctrl_c_stops_regen_jobs_2_keeping_finished_files(tmp_path: Path) -> None:
    """SIGINT to the whole process group (what a terminal's Ctrl-C does) once two files exist: queued
    cases are cancelled, workers stop, finished files verify, no partial file, exit 130 with a summary."""
    suite = tmp_path / "suite.toml"
    suite.write_text("[[matrix]]\nhead_num = 1\nq_seqlen = [[4]]\nseed = [1, 2, 3, 4, 5, 6, 7, 8, 9, 10]\n")
    store, log = tmp_path / "store", tmp_path / "pids.log"
    command = [sys.executable, "-m", "mlaconf.golden.maintain", "regen", "--cases", str(suite), "--out", str(store)]
    command += ["-j", "2", "--builder", "test_store_faults:napping_builder"]
    parent = subprocess.Popen(
        command,
        env=_env(**{PID_LOG: str(log)}),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # its own process group, as a terminal's foreground job
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    workers: list[int] = []
    try:
        deadline = time.monotonic() + HANG_S
        while len(list(store.glob("*.h5"))) < 2 and time.monotonic() < deadline and parent.poll() is None:
            time.sleep(0.05)
        assert parent.poll() is None, f"regen ended before the interrupt: {parent.communicate()}"
        assert len(list(store.glob("*.h5"))) >= 2, "no two files before the hang limit"
        sent = time.monotonic()
        os.killpg(parent.pid, signal.SIGINT)
        out, err = parent.communicate(timeout=HANG_S)
        took = time.monotonic() - sent
        workers = [int(line) for line in log.read_text().split()]
        assert parent.returncode == 130, (parent.returncode, out, err[-2000:])
        assert took < within(10), f"exit {took:.1f}s after one Ctrl-C"
        assert "Traceback" not in err and "KeyboardInterrupt" not in err, err[-3000:]
        summary = out.strip().splitlines()[-1]
        assert summary.startswith("regen: interrupted: "), out
        generated = int(summary.split("interrupted: ")[1].split(" generated")[0])
        cancelled = int(summary.split(" failed, ")[1].split(" cancelled")[0])
        assert generated + cancelled == 10 and cancelled >= 1, summary
        assert not _wait_gone(workers, 3.0), "workers outlived the interrupted regen"
        time.sleep(2.5)  # a queued case that still started would have written by now
        files = sorted(store.glob("*.h5"))
        assert len(files) == generated, (summary, [p.name for p in files])
        assert not list(store.glob(".*.tmp")), "a temp file was left behind"
        golden = GoldenStore(store)
        for spec in load_suite(suite):
            if golden.path_for(spec).exists():
                golden.load(spec)  # every file under a final name is complete and verifies
    finally:
        if parent.poll() is None:
            os.killpg(parent.pid, signal.SIGKILL)
        _kill(workers)


WATCHED_CHILD = """
import sys, threading, time
from pathlib import Path
from mlaconf.golden.building.regen import watch_parent
if sys.argv[1] == "watch":
    threading.Thread(target=watch_parent, args=(int(sys.argv[2]), 0.1), daemon=True).start()
Path(sys.argv[3]).write_text("ready")
time.sleep(600)
"""
PARENT = """
import os, subprocess, sys, time
for mode in ("watch", "control"):
    child = subprocess.Popen([sys.executable, "-c", sys.argv[1], mode, str(os.getpid()), sys.argv[2] + mode])
    print(child.pid, flush=True)
time.sleep(600)
"""


def test_the_parent_watcher_alone_ends_an_orphaned_worker(tmp_path: Path) -> None:
    """The fallback behind PR_SET_PDEATHSIG; a child without the watcher is the control."""
    ready = tmp_path / "ready-"
    parent = subprocess.Popen(
        [sys.executable, "-c", PARENT, WATCHED_CHILD, str(ready)], env=_env(), stdout=subprocess.PIPE, text=True
    )
    assert parent.stdout is not None
    watched, control = int(parent.stdout.readline()), int(parent.stdout.readline())
    try:
        deadline = time.monotonic() + HANG_S
        while not all(Path(f"{ready}{m}").exists() for m in ("watch", "control")) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not _gone(watched) and not _gone(control)
        parent.kill()
        parent.wait()
        assert _wait_gone([watched], 3.0) == [], "the watched child outlived its parent"
        assert not _gone(control), "control: an unwatched child survives its parent"
    finally:
        parent.kill()
        _kill([watched, control])


def test_random_byte_flips_in_smoke_goldens_are_detected_and_rebuilt(tmp_path: Path) -> None:
    """Each flip judged in a worker subprocess (a segfault or hang is counted, not fatal).  The goldens are
    smoke's :data:`FLIP_CASES` smallest (every file has the three regions; a flip copies its file first, so
    smoke's 1.3 GB would cost time and disk, not cases)."""
    store = tmp_path / "smoke"
    specs = sorted((c for c in load_suites(["smoke"]) if c.expect_error is None), key=stored_bytes)
    summary = regen(specs[:FLIP_CASES], GoldenStore(store))
    assert not summary.count("failed"), summary.format()
    seed = random.randrange(2**32)
    tally = flips.run(
        store, tmp_path / "work", "smoke", flips.plan(store, FLIPS, seed), timeout=HANG_S, budget=FLIP_BUDGET_S
    )
    report = "\n".join([f"seed {seed}", *tally.lines(), *tally.examples])
    assert tally.bad() == 0, report
    assert tally.done >= 100, f"too few flips judged within {FLIP_BUDGET_S:g}s\n{report}"
    judged = {region for region, _ in tally.outcomes}
    assert judged == set(flips.REGIONS), report


def test_regen_on_a_full_disk_reports_the_case_and_exits_1(tiny_tmpfs: Path, tmp_path: Path) -> None:
    suite = tmp_path / "suite.toml"
    suite.write_text("[[case]]\nq_seqlen = [3, 0, 5]\nhead_num = 2\n[[case]]\nq_seqlen = [1024]\nhead_num = 2\n")
    big = build_case({"q_seqlen": [1024], "head_num": 2}, source="t")  # 4.5 MB > 2 MiB
    small = build_case({"q_seqlen": [3, 0, 5], "head_num": 2}, source="t")
    command = [
        sys.executable,
        "-m",
        "mlaconf.golden.maintain",
        "regen",
        "--cases",
        str(suite),
        "--out",
        str(tiny_tmpfs),
    ]
    refused = subprocess.run(command, capture_output=True, text=True, env=_env(), cwd=REPO, timeout=HANG_S)
    assert refused.returncode == 2, (refused.returncode, refused.stderr[-2000:])  # the estimate sees it first
    assert f"error: case {big.case_id}: its file ~" in refused.stderr and "free disk" in refused.stderr
    assert not [p for p in tiny_tmpfs.rglob("*") if p.is_file() and ".locks" not in p.parts]
    # forced past the estimate, the writer meets the full disk itself
    done = subprocess.run(
        [*command, "--allow-oversize"], capture_output=True, text=True, env=_env(), cwd=REPO, timeout=HANG_S
    )
    assert done.returncode == 1, (done.returncode, done.stderr[-2000:])
    assert f"failed {big.case_id}: GoldenWriteError: " in done.stdout
    assert f"cannot write case {big.case_id!r} into store {tiny_tmpfs}" in done.stdout
    assert "No space left on device" in done.stdout and "1 generated" in done.stdout
    assert "Traceback" not in done.stderr
    store = GoldenStore(tiny_tmpfs)
    assert [p for p in tiny_tmpfs.rglob("*") if p.is_file() and ".locks" not in p.parts] == [store.path_for(small)]
    store.load(small)
