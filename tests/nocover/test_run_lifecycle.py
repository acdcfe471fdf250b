"""A run owns its report directory from its first test to its end, and accounts for every test.

run.json says ``in_progress`` before the first test and ``complete``, ``interrupted`` or ``crashed`` at the
end, with the selected, run and recorded counts; a killed run is never mistaken for its predecessor, an
earlier run is moved aside (never overwritten, never silently reused), and a test that never ran gets a
record saying so and fails the run."""

from __future__ import annotations

import contextlib
import json
import math
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from mlaconf.reports.rundir import read_results
from tests.machine import HANG_S, within
from tests.pytest_runs import child_env, pytest_argv

REPO = Path(__file__).resolve().parents[2]
CASES = textwrap.dedent("""
    [suite]
    name = "lifecycle"

    [defaults]
    q_seqlen = [8, 5]
    dtype = "fp16"

    [[matrix]]
    head_num = [1, 2, 3, 4, 5, 6]
""")


def command(work: Path, report: Path, *extra: str) -> list[str]:
    return pytest_argv(
        "cases/test_conformance.py",
        "-q",
        "--mla-cases",
        str(work / "lifecycle.toml"),
        "--mla-backend",
        "tests.plugin_backends:slow",
        "--mla-golden-dir",
        str(work / "golden"),
        "--mla-report-dir",
        str(report),
        *extra,
    )


def environment(work: Path, **extra: str) -> dict[str, str]:
    """The child's environment; pytest's numbered temporary folders under the test's own folder, so that a
    stopped run's exit is never spent removing other sessions' old ones from a shared ``/tmp/pytest-of-USER``
    (pytest does at exit, keeping 3: up to the grace on a machine whose test runs left gigabytes there)."""
    return child_env(paths=[work], extra={"PYTEST_DEBUG_TEMPROOT": str(work), **extra})


@pytest.fixture
def work(tmp_path: Path) -> Path:
    (tmp_path / "lifecycle.toml").write_text(CASES)
    return tmp_path


def run(work: Path, report: Path, *extra: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        command(work, report, *extra),
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=HANG_S,
        env=environment(work, **env),
    )


def mlaconf(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "mlaconf", *args], capture_output=True, text=True, timeout=HANG_S)


def started(work: Path, report: Path, *extra: str, **env: str) -> subprocess.Popen[str]:
    """A run that has written its in-progress run.json and is into its tests (goldens being made)."""
    child = subprocess.Popen(
        command(work, report, *extra),
        cwd=REPO,
        env=environment(work, **env),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    deadline = time.monotonic() + HANG_S
    while time.monotonic() < deadline:
        run_json = report / "run.json"
        in_progress = run_json.exists() and json.loads(run_json.read_text()).get("status") == "in_progress"
        if in_progress and len(list((work / "golden").glob("*.h5"))) >= 2:
            time.sleep(1)
            return child
        time.sleep(0.2)
    child.kill()
    pytest.fail("the run never wrote its in-progress run.json")


def test_a_complete_run_says_so_and_an_earlier_run_is_moved_aside(work: Path) -> None:
    report = work / "report"
    first = run(work, report)
    assert first.returncode == 0, first.stdout[-3000:]
    doc = json.loads((report / "run.json").read_text())
    assert doc["status"] == "complete" and doc["counts"] == {"selected": 6, "run": 6, "recorded": 6}
    second = run(work, report, "-k", "h1 or h2")
    assert second.returncode == 0, second.stdout[-3000:]
    assert f"{report} held an earlier run (complete" in second.stdout
    aside = work / "report.previous-1"
    assert json.loads((aside / "run.json").read_text())["counts"]["recorded"] == 6  # kept whole
    assert len(read_results(aside / "results.jsonl")) == 6
    assert json.loads((report / "run.json").read_text())["counts"] == {"selected": 2, "run": 2, "recorded": 2}


def test_a_sigkilled_run_is_never_mistaken_for_the_run_before_it(work: Path) -> None:
    base, report = work / "base", work / "report"
    assert run(work, base).returncode == 0
    assert run(work, report).returncode == 0
    assert mlaconf("report", "diff", str(base), str(report), "--out", str(work / "d1")).returncode == 0
    child = started(work, report, SLOW_S="2")
    os.killpg(child.pid, signal.SIGKILL)
    child.wait()
    diff = mlaconf("report", "diff", str(base), str(report), "--out", str(work / "d2"))
    assert diff.returncode != 0, diff.stdout
    assert "in progress" in diff.stderr and "Traceback" not in diff.stderr


def test_one_ctrl_c_gives_an_interrupted_report_with_every_test_accounted_for(work: Path) -> None:
    report = work / "report"
    child = started(work, report, "-n", "2", SLOW_S="2")
    os.killpg(child.pid, signal.SIGINT)  # what a terminal's Ctrl-C does: the whole process group
    out, _ = child.communicate(timeout=HANG_S)
    assert child.returncode == 2, out[-3000:]  # pytest's "interrupted"
    assert "Traceback" not in out and "crashed" not in out and "Segmentation" not in out, out[-3000:]
    doc = json.loads((report / "run.json").read_text())
    counts = doc["counts"]
    assert doc["status"] == "interrupted" and counts["selected"] == 6 and counts["run"] < 6, doc
    records = read_results(report / "results.jsonl")
    assert len(records) == counts["recorded"] == 6
    never = [r for r in records if (r.get("failure") or {}).get("kind") == "not_run"]
    assert len(never) == 6 - counts["run"] and all(r["verdict"] == "error" for r in never)
    assert mlaconf("report", "html", str(report)).returncode == 2  # an interrupted run is not rendered as done


def test_tests_left_by_crashed_workers_get_records_and_fail_the_run(work: Path) -> None:
    report = work / "report"
    result = run(work, report, "-n", "2", "--max-worker-restart", "0", EXIT_HEADS="3")
    assert result.returncode == 1, result.stdout[-3000:]
    doc = json.loads((report / "run.json").read_text())
    assert doc["status"] == "crashed" and doc["counts"]["selected"] == 6, doc
    records = read_results(report / "results.jsonl")
    assert {r["case_id"].split("-h")[1][0] for r in records} == set("123456")  # every test has its record
    assert "never ran" in result.stdout


def test_a_directory_a_live_run_is_writing_is_refused(work: Path) -> None:
    report = work / "report"
    report.mkdir()
    live = {
        "status": "in_progress",
        "pid": os.getpid(),
        "run_name": "other",
        "environment": {"host": socket.gethostname()},
    }
    (report / "run.json").write_text(json.dumps(live))
    result = run(work, report)
    assert result.returncode == 4, result.stdout[-2000:] + result.stderr[-2000:]
    assert "is still writing there" in result.stdout + result.stderr
    assert json.loads((report / "run.json").read_text()) == live


def test_a_link_planted_in_the_run_directory_is_refused_not_followed(work: Path) -> None:
    report, target = work / "report", work / "precious.txt"
    target.write_text("keep me")
    child = started(work, report, SLOW_S="1")
    (report / "report.html").symlink_to(target)
    out, _ = child.communicate(timeout=HANG_S)
    assert child.returncode == 1, out[-3000:]
    assert "the report could not be written" in out and "symbolic link" in out and "Traceback" not in out
    assert target.read_text() == "keep me" and (report / "report.html").is_symlink()


def survivors(mark: str) -> list[int]:
    """Pids of this user's processes whose environment carries ``mark`` (the run's, and only the run's)."""
    found = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                if f"MLA_LIFECYCLE_MARK={mark}".encode() in (proc / "environ").read_bytes().split(b"\0"):
                    found.append(int(proc.name))
            except OSError:
                continue
    return found


def in_background(work: Path, report: Path, mark: str, **env: str) -> tuple[subprocess.Popen[str], int]:
    """``mlaconf run`` (6 conformance tests, ``-n 2``) as a CI script starts it: a background job of
    ``bash -c`` (SIGINT inherited ignored), in a session of its own; returned once two tests have
    recorded and the next ones are half-way through their backend call, with the mlaconf pid."""
    cli = [sys.executable, "-m", "mlaconf", "run", "--backend", "tests.plugin_backends:slow", "-n", "2"]
    cli += ["--golden-dir", str(work / "golden"), "--report-dir", str(report)]
    cli += ["--", "-p", "no:cacheprovider", "--mla-cases", str(work / "lifecycle.toml"), "-k", "test_conformance"]
    pidfile = work / "mlaconf.pid"
    shell = subprocess.Popen(
        ["bash", "-c", '"$@" & echo $! > "$PIDFILE"; wait $!', "bash", *cli],
        cwd=work,
        env=environment(work, MLA_LIFECYCLE_MARK=mark, PIDFILE=str(pidfile), DONE_FILE=str(work / "done"), **env),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    deadline = time.monotonic() + HANG_S
    while time.monotonic() < deadline:
        journal = report / "results.jsonl"
        if journal.exists() and len(journal.read_text().splitlines()) >= 2:
            time.sleep(float(env.get("SLOW_S", "0")) / 2)
            return shell, int(pidfile.read_text())
        if shell.poll() is not None:
            break
        time.sleep(0.1)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(shell.pid, signal.SIGKILL)
    pytest.fail(f"the run never recorded two tests: {shell.communicate()[0][-3000:]}")


def finished_and_recorded(work: Path, report: Path, before: float = math.inf) -> tuple[set[str], set[str]]:
    """The cases whose backend call returned (``before`` then), and the cases results.jsonl holds a
    record of a run for."""
    lines = (work / "done").read_text().splitlines() if (work / "done").exists() else []
    done = {case for case, at in (line.split() for line in lines) if float(at) < before}
    kept = [r for r in read_results(report / "results.jsonl") if (r.get("failure") or {}).get("kind") != "not_run"]
    return done, {str(r["case_id"]).split("-h")[1].split("-")[0] for r in kept}


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
@pytest.mark.parametrize("stop", [signal.SIGTERM, signal.SIGHUP, signal.SIGINT], ids=lambda s: s.name)
def test_a_stop_signal_to_a_background_mlaconf_run_stops_it_keeping_every_finished_test(
    work: Path, stop: signal.Signals
) -> None:
    report, mark = work / "report", f"{os.getpid()}-{stop.name}"
    shell, pid = in_background(work, report, mark, SLOW_S="2")
    try:
        sent, stopped_at = time.monotonic(), time.time()
        os.kill(pid, stop)
        out, _ = shell.communicate(timeout=HANG_S)
        took = time.monotonic() - sent
        # about a second on a quiet 2-core machine: its workers are ended at once, not waited for (12.7-15.6 s when
        # xdist's teardown waited for the tests in flight, near mlaconf run's 15 s grace)
        assert took < within(4), f"the run took {took:.1f} s to stop"
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(shell.pid, signal.SIGKILL)
    assert shell.returncode == 128 + stop, out[-3000:]
    assert f"stopped by {stop.name}" in out and "Traceback" not in out, out[-3000:]
    doc = json.loads((report / "run.json").read_text())
    counts = doc["counts"]
    assert doc["status"] == "interrupted" and 2 <= counts["run"] < counts["selected"] == 6, doc
    assert len(read_results(report / "results.jsonl")) == counts["recorded"] == counts["selected"]
    done, recorded = finished_and_recorded(work, report, before=stopped_at)
    assert recorded == done and len(recorded) == counts["run"], (done, recorded)  # the tests in flight: not_run
    time.sleep(1)
    assert survivors(mark) == [], "a process of the run outlived mlaconf"


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_a_sigkilled_run_keeps_its_finished_tests_and_resumes_to_a_run_identical_to_an_uninterrupted_one(
    work: Path,
) -> None:
    report, mark = work / "report", f"{os.getpid()}-KILL"
    shell, _ = in_background(work, report, mark, SLOW_S="2")
    killed_at = time.time()
    os.killpg(shell.pid, signal.SIGKILL)  # bash and mlaconf; pytest and its workers die with their parents
    shell.communicate(timeout=HANG_S)
    time.sleep(1)
    assert survivors(mark) == [], "a process of the run outlived the kill"
    doc = json.loads((report / "run.json").read_text())
    assert doc["status"] == "in_progress", doc
    done, recorded = finished_and_recorded(work, report, before=killed_at)
    assert recorded == done and 2 <= len(recorded) < 6, (done, recorded)
    resume = [sys.executable, "-m", "mlaconf", "run", "--resume", str(report)]
    saved = (report / "run.json").read_bytes()
    plants = {
        "environment": lambda doc: doc["environment"]["packages"].update(torch="0.0.1"),  # an upgrade
        "goldens": lambda doc: doc["goldens"].update(generator="0.1"),  # goldens of another generator
    }
    for field, plant in plants.items():
        changed = json.loads(saved)
        plant(changed)
        (report / "run.json").write_text(json.dumps(changed))
        refused = subprocess.run(
            resume, cwd=work, env=environment(work), capture_output=True, text=True, timeout=HANG_S
        )
        assert refused.returncode == 4, refused.stdout[-3000:] + refused.stderr[-3000:]
        lines = [line for line in (refused.stdout + refused.stderr).splitlines() if "cannot resume" in line]
        assert len(lines) == 1 and f"{field}." in lines[0], refused.stdout[-3000:]
        assert finished_and_recorded(work, report)[1] == recorded  # the run is left as it was
        (report / "run.json").write_bytes(saved)
    env = environment(work, DONE_FILE=str(work / "done"))
    done_resume = subprocess.run(resume, cwd=work, env=env, capture_output=True, text=True, timeout=HANG_S)
    assert done_resume.returncode == 0, done_resume.stdout[-3000:] + done_resume.stderr[-3000:]
    assert f"{len(recorded)} tests recorded earlier are not rerun" in done_resume.stdout
    doc = json.loads((report / "run.json").read_text())
    assert doc["status"] == "complete" and doc["counts"] == {"selected": 6, "run": 6, "recorded": 6}, doc
    assert doc["resumed"][0]["kept"] == len(recorded) and doc["run_id"] == json.loads(saved)["run_id"]
    calls = sorted(line.split()[0] for line in (work / "done").read_text().splitlines())
    assert calls == sorted("123456"), calls  # each test ran once: none recorded earlier ran again
    base = work / "base"
    cli = [sys.executable, "-m", "mlaconf", "run", "--backend", "tests.plugin_backends:slow", "-n", "2", "--golden-dir"]
    cli += [str(work / "golden"), "--report-dir", str(base), "--", "-p", "no:cacheprovider"]
    cli += ["--mla-cases", str(work / "lifecycle.toml"), "-k", "test_conformance"]
    assert subprocess.run(cli, cwd=work, env=environment(work), capture_output=True, timeout=HANG_S).returncode == 0
    diff = mlaconf("report", "diff", str(base), str(report), "--out", str(work / "diff"))
    assert diff.returncode == 0, diff.stdout[-3000:] + diff.stderr[-3000:]
    assert "identical: 6" in diff.stdout and "GATE PASSES" in diff.stdout, diff.stdout


EARLIER_RUN = {"status": "complete", "counts": {"selected": 1, "run": 1}}


def mlaconf_run(work: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """``mlaconf run`` on torch-cpu into ``work/report``, which holds a complete earlier run."""
    report = work / "report"
    report.mkdir(exist_ok=True)
    (report / "run.json").write_text(json.dumps(EARLIER_RUN))
    cli = [sys.executable, "-m", "mlaconf", "run", "--backend", "torch-cpu", "-n", "0", "--report-dir", str(report)]
    cli += ["--golden-dir", str(work / "golden"), *args]
    return subprocess.run(cli, cwd=work, env=environment(work), capture_output=True, text=True, timeout=HANG_S)


def ended(work: Path, *args: str) -> tuple[subprocess.CompletedProcess[str], dict[str, object]]:
    """:func:`mlaconf_run` once pytest has started: the earlier run moved aside, the new run.json."""
    done = mlaconf_run(work, *args)
    assert json.loads((work / "report.previous-1" / "run.json").read_text())["status"] == "complete"  # moved aside
    return done, json.loads((work / "report" / "run.json").read_text())


def test_a_policy_typo_is_refused_before_the_named_directory_is_touched(work: Path) -> None:
    done = mlaconf_run(work, "--policy", "no-such-policy")
    assert done.returncode == 2 and "--policy 'no-such-policy': no such policy" in done.stderr, done.stderr
    assert json.loads((work / "report" / "run.json").read_text()) == EARLIER_RUN
    assert not (work / "report.previous-1").exists()


def test_a_usage_error_ends_the_named_directory_usage_error(work: Path) -> None:
    done, doc = ended(work, "--", "--mla-policy", "no-such-policy")
    assert done.returncode == 4 and "--mla-policy 'no-such-policy': no such policy" in done.stdout + done.stderr
    assert doc["status"] == "usage_error" and "no-such-policy" in str(doc["problems"]), doc


def test_a_collection_error_ends_the_run_collection_error(work: Path) -> None:
    (work / "test_broken.py").write_text("import no_such_module_anywhere\n")
    done, doc = ended(work, "--", "-p", "no:cacheprovider", "test_broken.py")
    assert done.returncode != 0 and "no_such_module_anywhere" in done.stdout
    assert doc["status"] == "collection_error", doc


def test_an_internal_error_ends_the_run_internal_error(work: Path) -> None:
    (work / "boom.py").write_text("def pytest_runtestloop(session):\n    raise RuntimeError('boom')\n")
    done, doc = ended(work, "--", "-p", "no:cacheprovider", "-p", "boom", "--mla-cases", str(work / "lifecycle.toml"))
    assert done.returncode == 3 and "INTERNALERROR" in done.stdout
    assert doc["status"] == "internal_error" and doc["counts"]["run"] == 0, doc


def test_a_run_stopped_by_per_test_timeouts_ends_timed_out_not_interrupted(work: Path) -> None:
    report = work / "report"
    extra = ("-n", "2", "--max-worker-restart", "0", "--timeout", "4", "--timeout-method", "thread")
    result = run(work, report, *extra, SLOW_S="30")
    assert result.returncode == 1, result.stdout[-3000:]
    doc = json.loads((report / "run.json").read_text())
    assert doc["status"] == "timed_out", doc
    kinds = {(r.get("failure") or {}).get("kind") for r in read_results(report / "results.jsonl")}
    assert "timeout" in kinds, kinds
