"""A run keeps every finished test's record however it stops: results.jsonl is a journal appended as
tests end and synced within seconds, a reader drops a torn last line and says so, ``mlaconf run``
ends a run whose pytest died (from the journal), gives pytest back the Ctrl-C a background job
inherits ignored, and says "stopped by" only when a signal stopped the run; ``--resume`` repeats
the run's own arguments.  The real stops: tests/nocover/test_run_lifecycle.py."""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import cast

import pytest

from mlaconf.reports import rundir
from mlaconf.reports.records import dumps
from mlaconf.runner.recording import RecordGatherer
from mlaconf.runner.run_directory import ReportState, Run, comparable_args, first_difference, is_never_ran
from mlaconf.tools import run as run_verb
from mlaconf.tools.run import PytestExit, launch, named_run_dir
from tests.machine import HANG_S
from tests.runs import record

RECORDS = [record(f"c{i}") for i in range(3)]


def cases(path: Path) -> list[str]:
    return [str(r["case_id"]) for r in rundir.read_results(path)]


def journal_of(path: Path, tail: str = "") -> Path:
    path.write_text("".join(dumps(r) + "\n" for r in RECORDS) + tail)
    return path


def test_a_torn_last_line_is_dropped_and_said(tmp_path: Path) -> None:
    said: list[str] = []
    path = journal_of(tmp_path / "results.jsonl", '{"schema_version": 2, "suite": "confor')
    assert rundir.read_results(path, torn=said.append) == rundir.read_results(journal_of(tmp_path / "whole.jsonl"))
    assert len(said) == 1 and f"{path}:4: dropped a torn last line" in said[0]


def test_a_whole_last_line_without_newline_is_kept_and_a_bad_line_inside_still_refused(tmp_path: Path) -> None:
    said: list[str] = []
    path = journal_of(tmp_path / "results.jsonl", dumps(record("c9")))
    assert len(rundir.read_results(path, torn=said.append)) == 4 and not said
    path.write_text('{"torn\n' + "".join(dumps(r) + "\n" for r in RECORDS))
    with pytest.raises(ValueError, match=r"results.jsonl:1: not JSON"):
        rundir.read_results(path, torn=said.append)
    path.write_text("".join(dumps(r) + "\n" for r in RECORDS) + '{"torn\n')  # ends with its newline: not torn
    with pytest.raises(ValueError, match=r"results.jsonl:4: not JSON"):
        rundir.read_results(path, torn=said.append)


def test_the_journal_holds_each_record_as_it_is_appended_and_syncs_it_soon(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    synced: list[int] = []
    real_fsync = os.fsync
    monkeypatch.setattr(rundir, "SYNC_S", 0.2)
    monkeypatch.setattr(rundir.os, "fsync", lambda fd: (synced.append(fd), real_fsync(fd)))
    path = tmp_path / "results.jsonl"
    path.write_text("")
    journal = rundir.Journal(path)
    journal.append(RECORDS[0])
    assert cases(path) == ["c0"] and not synced  # readable at once: a kill keeps it
    deadline = time.monotonic() + 5
    while not synced and time.monotonic() < deadline:
        time.sleep(0.05)
    assert synced, "a record appended was never synced to disk"
    journal.append(RECORDS[1])
    journal.close()
    assert len(synced) >= 2 and cases(path) == ["c0", "c1"]


def in_progress(directory: Path, pid: int, selected: int = 6, status: str = "in_progress") -> Path:
    directory.mkdir()
    state = rundir.RunState.build(status, selected=selected, run=0, recorded=0)
    rundir.write_json(directory / "run.json", {"run_name": "r", "pid": pid, "problems": [], **state.to_dict()})
    not_run = record("c9", verdict="error", failure={"kind": "not_run", "message": "never ran"})
    (directory / "results.jsonl").write_text("".join(dumps(r) + "\n" for r in [*RECORDS, not_run]) + '{"to')
    return directory


def test_a_run_whose_pytest_died_is_ended_from_its_journal(tmp_path: Path) -> None:
    directory = in_progress(tmp_path / "run", pid=4242)
    state = rundir.end_abandoned(directory, 4242, "killed", "pytest was killed")
    assert state is not None and state.status == "killed"
    assert rundir.RunState.from_run(rundir.read_run(directory)) == state
    assert (state.counts.selected, state.counts.run, state.counts.recorded) == (6, 3, 4)  # not_run: no test run
    assert len(rundir.read_results(directory / "results.jsonl", torn=pytest.fail)) == 4  # rewritten whole
    assert "pytest was killed" in rundir.read_run(directory)["problems"]


@pytest.mark.parametrize("pid, status", [(4243, "in_progress"), (4242, "interrupted")])
def test_a_run_another_pytest_owns_or_that_ended_is_left_alone(tmp_path: Path, pid: int, status: str) -> None:
    directory = in_progress(tmp_path / "run", pid=pid, status=status)
    before = {p.name: p.read_bytes() for p in directory.iterdir()}
    assert rundir.end_abandoned(directory, 4242, "killed", "x") is None
    assert {p.name: p.read_bytes() for p in directory.iterdir()} == before


@pytest.mark.parametrize(
    "exited, stopped",
    [
        (PytestExit(2, signal.SIGINT, False), True),  # pytest's own Ctrl-C end
        (PytestExit(-signal.SIGKILL, signal.SIGTERM, True), True),  # the grace ran out
        (PytestExit(0, signal.SIGINT, False), False),  # the signal came after the run had ended
        (PytestExit(1, signal.SIGHUP, False), False),
        (PytestExit(2, None, False), False),  # no signal came to mlaconf
    ],
)
def test_stopped_by_is_said_only_when_a_signal_stopped_the_run(exited: PytestExit, stopped: bool) -> None:
    assert exited.stopped is stopped


def test_pytest_gets_ctrl_c_back_when_mlaconf_run_inherited_it_ignored(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    probe = [sys.executable, "-c", "import signal; print(signal.getsignal(signal.SIGINT))"]
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)  # a background job of a non-interactive shell
    try:
        assert launch(probe, tmp_path, None) == 0
    finally:
        signal.signal(signal.SIGINT, previous)
    out = capfd.readouterr().out
    assert "default_int_handler" in out and "SIG_IGN" not in out, out


@pytest.mark.parametrize(
    "end, code", [("os.kill(os.getpid(), signal.SIGKILL)", 128 + signal.SIGKILL), ("os._exit(7)", 7)]
)
def test_a_pytest_gone_without_ending_its_run_has_it_ended_killed(
    tmp_path: Path, capfd: pytest.CaptureFixture[str], end: str, code: int
) -> None:
    report = tmp_path / "report"
    script = (
        "import json, os, pathlib, signal; d = pathlib.Path('report'); d.mkdir();"
        "(d / 'results.jsonl').write_text('');"
        "(d / 'run.json').write_text(json.dumps({'status': 'in_progress', 'pid': os.getpid(),"
        " 'counts': {'selected': 2, 'run': 0, 'recorded': 0}}));" + end
    )
    status = launch(
        [sys.executable, "-c", script, "--mla-report-dir", str(report)],
        tmp_path,
        named_run_dir(["--mla-report-dir", str(report)]),
    )
    assert status == code
    doc = rundir.read_run(report)
    assert doc["status"] == "killed" and doc["counts"] == {"selected": 2, "run": 0, "recorded": 0}, doc
    err = capfd.readouterr().err
    assert "ended killed" in err and f"--resume {report}" in err and "stopped by" not in err, err


def test_the_run_directory_is_found_as_the_plugin_names_it(tmp_path: Path) -> None:
    assert named_run_dir(["--mla-run-name", "a", "--mla-report-dir", str(tmp_path)]) == tmp_path.resolve()
    assert named_run_dir(["--mla-run-name=b"]) == (rundir.REPORTS_DIR / "b").resolve()
    assert named_run_dir(["-k", "x"]) is None


def test_resume_compares_the_arguments_less_where_the_run_goes() -> None:
    earlier = ["cases", "-n", "2", "--mla-report-dir", "a", "-k", "h1"]
    assert comparable_args(earlier) == comparable_args([*earlier, "--mla-report-dir=/b", "--mla-resume"])
    assert comparable_args(earlier) != comparable_args(["cases", "-n", "2", "-k", "h2"])
    assert first_difference({"packages": {"torch": "2.13.0"}}, {"packages": {"torch": "2.14.0"}}, "environment") == (
        'environment.packages.torch: "2.13.0" -> "2.14.0"'
    )
    assert first_difference({"a": [1]}, {"a": [1]}, "x") is None


def resume_args(directory: Path, **given: object) -> argparse.Namespace:
    values: dict[str, object] = dict.fromkeys(run_verb.RESUME_REPEATS) | {"jobs": "auto", "pytest_args": []}
    return argparse.Namespace(**values | {"resume": str(directory)} | given)


@pytest.mark.parametrize(
    "given, says",
    [
        ({"suite": ["smoke"]}, "drop --suite"),
        ({"jobs": "4"}, "drop --jobs"),
        ({}, "missing; is"),  # no run.json
    ],
)
def test_resume_refuses_in_one_line_what_it_cannot_repeat(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], given: dict[str, object], says: str
) -> None:
    assert run_verb.run(resume_args(tmp_path, **given)) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and says in err[0], err


def test_resume_of_a_run_that_names_no_arguments_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    counts = {"selected": 2, "run": 1, "recorded": 1}
    (tmp_path / "run.json").write_text(json.dumps({"status": "interrupted", "counts": counts}))
    assert run_verb.run(resume_args(tmp_path)) == 2
    assert "names no arguments" in capsys.readouterr().err


def test_a_journal_survives_its_writer_killed(tmp_path: Path) -> None:
    path = tmp_path / "results.jsonl"
    path.write_text("")
    lines = "".join(f"j.append({record(f'c{i}')!r})\n" for i in range(3))
    script = f"import os, signal\nfrom mlaconf.reports.rundir import Journal\nj = Journal({str(path)!r})\n{lines}"
    script += "os.kill(os.getpid(), signal.SIGKILL)\n"
    done = subprocess.run([sys.executable, "-c", script], timeout=HANG_S, check=False)
    assert done.returncode == -signal.SIGKILL
    assert len(rundir.read_results(path, torn=pytest.fail)) == 3


def test_a_ray_shard_is_kept_as_it_arrives(tmp_path: Path) -> None:
    from mlaconf.tools.ray_run import ShardResult, keep_shard

    (tmp_path / "results.jsonl").write_text("")
    journal = rundir.Journal(tmp_path / "results.jsonl")
    files = {"results.jsonl": "".join(dumps(r) + "\n" for r in RECORDS).encode()}
    keep_shard(tmp_path, ShardResult("1/2", 0, files, "host", 1.0, ""), journal)
    # before any other shard or the driver's end: the run's journal and the shard's own files hold it
    assert cases(tmp_path / "results.jsonl") == ["c0", "c1", "c2"]
    assert cases(tmp_path / "shards" / "1-of-2" / "results.jsonl") == ["c0", "c1", "c2"]
    journal.close()


@pytest.mark.parametrize(
    ("verdict", "said"), [("passed", "MLA run: PASS; report: "), ("failed", "MLA run: FAIL; report: ")]
)
def test_a_ray_run_ends_like_a_plain_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], verdict: str, said: str
) -> None:
    """The merged shards' last word is a local run's: PASS or FAIL and the page, after the tables."""
    from mlaconf.tools.ray_run import ShardResult, _gather
    from tests.runs import write_run_dir

    results = {}
    for k, records in enumerate(
        ([record("a")], [record("b", verdict=verdict, worst_slack=2.0 if verdict == "failed" else 0.25)])
    ):
        shard = write_run_dir(tmp_path / f"shard{k}", records, run_id=f"s{k}")
        files = {name: (shard / name).read_bytes() for name in ("results.jsonl", "run.json")}
        results[f"{k + 1}/2"] = ShardResult(
            f"{k + 1}/2", 0 if verdict == "passed" or k == 0 else 1, files, "host", 1.0, ""
        )
    out = tmp_path / "out"
    out.mkdir()
    code = _gather(out, ["1/2", "2/2"], results, {}, [], False, set())
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert (code == 0) == (verdict == "passed") and said + str(out / "report.html") in last, last


def test_a_pytest_that_ignores_the_stop_is_killed_after_the_grace_and_its_run_ended_interrupted(
    tmp_path: Path, capfd: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(run_verb, "STOP_GRACE_S", 0.5)
    report = tmp_path / "report"
    script = (
        "import json, os, pathlib, signal, time; signal.signal(signal.SIGINT, signal.SIG_IGN);"
        "d = pathlib.Path('report'); d.mkdir(); (d / 'results.jsonl').write_text('');"
        "(d / 'run.json').write_text(json.dumps({'status': 'in_progress', 'pid': os.getpid(),"
        " 'counts': {'selected': 2, 'run': 0, 'recorded': 0}})); pathlib.Path('ready').touch(); time.sleep(60)"
    )

    def stop_when_ready() -> None:
        deadline = time.monotonic() + 30
        while not (tmp_path / "ready").exists() and time.monotonic() < deadline:
            time.sleep(0.02)
        os.kill(os.getpid(), signal.SIGTERM)

    threading.Thread(target=stop_when_ready, daemon=True).start()
    started = time.monotonic()
    status = launch([sys.executable, "-c", script], tmp_path, report)
    assert status == 128 + signal.SIGTERM and time.monotonic() - started < 20
    assert rundir.read_run(report)["status"] == "interrupted"
    err = capfd.readouterr().err
    assert "ended interrupted" in err and "stopped by SIGTERM" in err, err


def _gatherer(selected: list[str]) -> RecordGatherer:
    """A gatherer's accounting alone: no pytest session behind it, and a run that claimed no directory
    (the RecordGatherer's accounting is under test, not the file)."""
    gatherer = RecordGatherer.__new__(RecordGatherer)
    gatherer.state = ReportState(report_dir=Path("report"), run_name="r", save_outputs=False, shard=None)
    gatherer.state.selected = {nodeid: None for nodeid in selected}
    gatherer.run = Run(cast(pytest.Config, None), gatherer.state)
    return gatherer


def test_a_stop_never_gives_a_recorded_test_a_never_ran_record_beside_its_own() -> None:
    """A stop under xdist can account for a test before its report arrives, or after its record came without
    its count: either way the run holds one record per test, the test's own (a resume reads it back)."""
    late, recorded = "cases/test_m.py::test_a[x]", "cases/test_m.py::test_b[y]"
    gatherer = _gatherer([late, recorded])
    gatherer._keep({**record("case-b"), "test": recorded})
    assert gatherer.account_for_unrun(pytest.ExitCode.INTERRUPTED) == "interrupted"
    assert [r["test"] for r in gatherer.state.records if is_never_ran(r)] == [late]  # not the recorded one
    gatherer._keep({**record("case-a"), "test": late})  # its report comes after the accounting
    tests = [r["test"] for r in gatherer.state.records]
    assert sorted(tests) == sorted([late, recorded]) and not any(map(is_never_ran, gatherer.state.records))


def test_the_console_script_runs_in_a_thread(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Only the main thread may set signal handlers: a verb called from another thread (a test, an embedding
    program) runs without them instead of failing with 'signal only works in main thread'."""
    import mlaconf

    statuses: list[int] = []
    argv = ["verify", "--golden-dir", str(tmp_path / "nowhere")]
    worker = threading.Thread(target=lambda: statuses.append(mlaconf.main(argv)))
    worker.start()
    worker.join(timeout=HANG_S)
    assert statuses == [1], capsys.readouterr().err  # the verb's own answer: no store there
