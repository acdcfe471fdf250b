"""run.json's status and counts decide whether the report verbs may use a run: a run in progress
(or SIGKILLed: still marked so), interrupted, crashed, from before statuses, or whose counts
disagree with results.jsonl is refused with one line (exit 2) unless --allow-incomplete; the diff
gate fails on a candidate that ran fewer tests than it selected."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import pytest

from mlaconf import verb_function
from mlaconf.reports import diff
from mlaconf.reports import verbs as report_verbs
from mlaconf.reports.records import RecordError
from mlaconf.reports.rundir import RunState
from tests.runs import record, write_run_dir


def mlaconf(*argv: str) -> int:
    parser = argparse.ArgumentParser()
    report_verbs.register(parser.add_subparsers(dest="verb", required=True))
    args = parser.parse_args(argv)
    return int(verb_function(args.func)(args))


RECORDS = [record(f"c{i}") for i in range(47)]


def set_run(directory: Path, **fields: Any) -> None:
    path = directory / "run.json"
    run = json.loads(path.read_text()) | fields
    path.write_text(json.dumps({k: v for k, v in run.items() if v is not None}))


def refused(capsys: pytest.CaptureFixture[str], *fragments: str) -> None:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--allow-incomplete" in err[0], err
    assert all(f in err[0] for f in fragments), (fragments, err)


def verbs(tmp_path: Path, base: Path, cand: Path) -> dict[str, list[str]]:
    return {
        "diff": ["diff", str(base), str(cand), "--out", str(tmp_path / "d")],
        "merge": ["merge", str(tmp_path / "m"), str(cand)],
        "html": ["html", str(cand)],
    }


def test_a_killed_run_over_an_old_one_fails_the_gate(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """SIGKILL after the run marked its directory in progress: the old complete results.jsonl is
    still there, but the diff must not say "identical: 47" and pass."""
    old = write_run_dir(tmp_path / "old", RECORDS)
    killed = write_run_dir(tmp_path / "dir", RECORDS)
    set_run(killed, status="in_progress", counts={"selected": 47, "run": 0, "recorded": 0})
    assert mlaconf("report", "diff", str(old), str(killed)) == 2
    refused(capsys, str(killed / "run.json"), "still in progress, or was killed")
    # told to use it anyway, the gate still fails: the candidate ran 0 of 47 selected tests
    assert mlaconf("report", "diff", str(old), str(killed), "--allow-incomplete", "--out", str(tmp_path / "d")) == 1
    assert "GATE FAILS: the candidate run ran 0 of 47 selected tests" in capsys.readouterr().out


@pytest.mark.parametrize("verb", ["diff", "merge", "html"])
@pytest.mark.parametrize(
    ("fields", "fragment"),
    [
        ({"status": "in_progress", "counts": {"selected": 47, "run": 12, "recorded": 12}}, "still in progress"),
        ({"status": "interrupted", "counts": {"selected": 123, "run": 115, "recorded": 47}}, "interrupted after 115"),
        ({"status": "crashed", "counts": {"selected": 47, "run": 40, "recorded": 47}}, "crashed after 40 of 47"),
        ({"counts": {"selected": 47, "run": 47, "recorded": 50}}, "says 50 records but results.jsonl holds 47"),
        ({"status": None}, "has no 'status'"),
    ],
)
def test_incomplete_or_inconsistent_runs_are_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], verb: str, fields: dict[str, Any], fragment: str
) -> None:
    base = write_run_dir(tmp_path / "base", RECORDS)
    cand = write_run_dir(tmp_path / "cand", RECORDS)
    set_run(cand, **fields)
    argv = verbs(tmp_path, base, cand)[verb]
    assert mlaconf("report", *argv) == 2
    refused(capsys, str(cand / "run.json"), fragment)
    assert not (tmp_path / "m").exists() and not (tmp_path / "d").exists()  # nothing written
    admitted = mlaconf("report", *argv, "--allow-incomplete")  # told otherwise: it is used
    assert admitted == 0 if verb == "html" else admitted in (0, 1)  # the page of passing records renders


@pytest.mark.parametrize("verb", ["diff", "merge", "html"])
@pytest.mark.parametrize(
    ("fields", "fragment"),
    [
        ({"status": "complete", "counts": None}, "'counts' must be an object"),
        ({"status": "done"}, "'status': 'done' is not one of"),
        ({"counts": {"selected": 4, "run": 47, "recorded": 47}}, "47 tests ran but only 4 were selected"),
        ({"counts": {"selected": 47, "run": "47", "recorded": 47}}, "'counts.run'"),
        ({"environment": ["host"]}, "'environment': expected an object"),
        ({"problems": "none"}, "'problems': expected an array"),
        ({"run_id": 7}, "'run_id': expected a string"),
    ],
)
def test_a_malformed_run_json_is_refused_even_when_incomplete_runs_are_allowed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], verb: str, fields: dict[str, Any], fragment: str
) -> None:
    """Incomplete is not malformed: --allow-incomplete admits the one, never the other (one line)."""
    base = write_run_dir(tmp_path / "base", RECORDS)
    cand = write_run_dir(tmp_path / "cand", RECORDS)
    set_run(cand, **fields)
    argv = verbs(tmp_path, base, cand)[verb]
    for extra in ([], ["--allow-incomplete"]):
        assert mlaconf("report", *argv, *extra) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and str(cand / "run.json") in err[0] and fragment in err[0], err
        assert "Traceback" not in err[0]
    assert not (tmp_path / "m").exists() and not (tmp_path / "d").exists()  # nothing written


def test_a_run_without_run_json_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    base = write_run_dir(tmp_path / "base", RECORDS)
    cand = write_run_dir(tmp_path / "cand", RECORDS)
    (cand / "run.json").unlink()
    assert mlaconf("report", "diff", str(base), str(cand)) == 2
    refused(capsys, "run.json: missing")


def test_an_old_run_is_used_when_allowed_and_the_diff_says_so(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    base = write_run_dir(tmp_path / "base", RECORDS)
    cand = write_run_dir(tmp_path / "cand", RECORDS)
    set_run(cand, status=None, counts=None)
    assert mlaconf("report", "diff", str(base), str(cand), "--allow-incomplete") == 0
    out = capsys.readouterr().out
    assert "identical: 47" in out and "the candidate run's run.json has no status" in out


def test_the_gate_fails_on_a_candidate_that_ran_fewer_tests_than_it_selected(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Tests that never ran (xdist gave up restarting workers) fail the gate even when every
    record that exists is identical."""
    base = write_run_dir(tmp_path / "base", RECORDS)
    cand = write_run_dir(tmp_path / "cand", RECORDS)
    set_run(cand, counts={"selected": 51, "run": 47, "recorded": 47})
    result = diff.diff_dirs(base, cand)
    assert result.counts()["identical"] == 47 and not result.regressions()
    assert result.gate_failures == ["the candidate run ran 47 of 51 selected tests"]
    assert result.exit_status(fail_on_perf=False, allow_missing=True) == 1
    assert mlaconf("report", "diff", str(base), str(cand)) == 1
    assert "GATE FAILS" in capsys.readouterr().out
    set_run(base, counts={"selected": 51, "run": 47, "recorded": 47})  # a short base: noted, not gating
    set_run(cand, counts={"selected": 47, "run": 47, "recorded": 47})
    result = diff.diff_dirs(base, cand)
    assert result.exit_status(False) == 0 and "the base run ran 47 of 51 selected tests" in result.notes


def test_merge_of_complete_shards_is_complete_with_summed_counts(tmp_path: Path) -> None:
    a = write_run_dir(tmp_path / "a", RECORDS[:20], shard="1/2")
    b = write_run_dir(tmp_path / "b", RECORDS[20:], shard="2/2")
    assert mlaconf("report", "merge", str(tmp_path / "m"), str(a), str(b)) == 0
    run = json.loads((tmp_path / "m" / "run.json").read_text())
    assert run["status"] == "complete" and run["counts"] == {"selected": 47, "run": 47, "recorded": 47}
    assert run["verdicts"]["passed"] == 47
    assert mlaconf("report", "html", str(tmp_path / "m")) == 0  # the merged run is a complete run


def test_merge_of_an_interrupted_shard_when_allowed_stays_interrupted(tmp_path: Path) -> None:
    a = write_run_dir(tmp_path / "a", RECORDS[:20], shard="1/2")
    b = write_run_dir(tmp_path / "b", RECORDS[20:], shard="2/2")
    set_run(b, status="interrupted", counts={"selected": 30, "run": 27, "recorded": 27})
    assert mlaconf("report", "merge", str(tmp_path / "m"), str(a), str(b), "--allow-incomplete") == 0
    run = json.loads((tmp_path / "m" / "run.json").read_text())
    assert run["status"] == "interrupted" and run["counts"] == {"selected": 50, "run": 47, "recorded": 47}
    assert mlaconf("report", "html", str(tmp_path / "m")) == 2


def test_run_state_is_what_the_run_side_writes() -> None:
    state = RunState.build("in_progress", selected=23, run=0, recorded=0)
    assert state.to_dict() == {"status": "in_progress", "counts": {"selected": 23, "run": 0, "recorded": 0}}
    assert RunState.from_run(state.to_dict()) == state
    assert RunState.build("complete", selected=23, run=23, recorded=23).problem(23) is None
    assert RunState.build("complete", selected=23, run=19, recorded=23).short == 4
    for bad in (
        {"status": "finished", "selected": 1, "run": 1, "recorded": 1},
        {"status": "complete", "selected": -1, "run": 0, "recorded": 0},
        {"status": "complete", "selected": 1, "run": 2, "recorded": 2},
        {"status": "complete", "selected": True, "run": 1, "recorded": 1},
    ):
        with pytest.raises(RecordError):
            RunState.build(bad.pop("status"), **bad)  # type: ignore[arg-type]


def test_merge_of_an_old_shard_when_allowed_has_no_status(tmp_path: Path) -> None:
    a = write_run_dir(tmp_path / "a", RECORDS[:20], shard="1/2")
    b = write_run_dir(tmp_path / "b", RECORDS[20:], shard="2/2")
    set_run(b, status=None, counts=None)
    assert mlaconf("report", "merge", str(tmp_path / "m"), str(a), str(b), "--allow-incomplete") == 0
    run = json.loads((tmp_path / "m" / "run.json").read_text())
    assert "status" not in run and "counts" not in run  # completeness unknown, as in the old shard
    assert mlaconf("report", "html", str(tmp_path / "m")) == 2
