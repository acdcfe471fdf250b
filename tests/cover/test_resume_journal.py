"""``--resume`` keeps only what its own run wrote: every record carries its run's id, and a record of another
run (failed or passed), one without an id, a damaged line or a test recorded twice is not kept, so its test
runs again; the resume says so in one line per kind."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from mlaconf.reports.rundir import RESULTS_FILE, ResultRecord
from mlaconf.runner.run_directory import own_records, recorded_tests, resumable
from tests.runs import record, write_run_dir

OURS, THEIRS = "a" * 32, "b" * 32


def ours(case: str, **fields: Any) -> dict[str, Any]:
    return record(case, run_id=OURS, **fields)


def killed_run(directory: Path, lines: list[str]) -> Path:
    """A run killed mid-way: run.json in progress (our run id), its journal as given."""
    write_run_dir(directory, [], status="in_progress", run_id=OURS)
    (directory / RESULTS_FILE).write_text("".join(f"{line}\n" for line in lines))
    return directory


def test_a_record_carries_its_run_id_through_the_schema() -> None:
    assert ResultRecord.from_dict(ours("c")).to_dict()["run_id"] == OURS
    assert ResultRecord.from_dict(record("c")).to_dict()["run_id"] is None


def test_foreign_damaged_and_doubled_records_are_not_kept(tmp_path: Path) -> None:
    lines = [
        json.dumps(ours("kept")),
        json.dumps(record("foreign-failed", run_id=THEIRS, verdict="failed", worst_slack=3.0)),
        json.dumps(record("foreign-passed", run_id=THEIRS)),  # would hide a failing test
        json.dumps(record("no-id")),
        '{"case_id": "damaged", "verdict": ',
        json.dumps(ours("twice")),
        json.dumps(ours("twice", verdict="failed", worst_slack=2.0)),
        json.dumps(ours("last")),
    ]
    run = killed_run(tmp_path / "run", lines)
    kept, notes = own_records(run, {"run_id": OURS})
    assert [r["case_id"] for r in kept] == ["kept", "last"]
    assert len(notes) == 3, notes
    assert f"{RESULTS_FILE}:5: not JSON" in notes[0] and notes[0].endswith("not kept, its test runs again")
    assert notes[1].startswith(f"3 records not written by run {OURS}") and "their tests run again" in notes[1]
    assert notes[2].startswith("1 tests recorded more than once (first t[twice])")
    # every process deselects only what the controller keeps: the others run again
    assert recorded_tests(run) == {"t[kept]", "t[last]"}


def test_the_resume_line_says_what_was_not_kept(tmp_path: Path) -> None:
    run = killed_run(tmp_path / "run", [json.dumps(ours("kept")), json.dumps(record("x", run_id=THEIRS))])
    earlier = json.loads((run / "run.json").read_text())
    _, kept, notes = resumable(run, earlier)
    assert [r["case_id"] for r in kept] == ["kept"] and len(notes) == 1 and "not written by run" in notes[0]


def test_a_journal_of_before_run_ids_is_run_again_whole(tmp_path: Path) -> None:
    run = killed_run(tmp_path / "run", [json.dumps(record("a")), json.dumps(record("b"))])
    kept, notes = own_records(run, {"run_id": OURS})
    assert kept == [] and notes == [
        f"2 records not written by run {OURS} (another run's, or from before records carried their run) are not "
        "kept: their tests run again"
    ]


def test_an_unreadable_journal_still_refuses_the_resume(tmp_path: Path) -> None:
    run = killed_run(tmp_path / "run", [])
    (run / RESULTS_FILE).unlink()
    (run / RESULTS_FILE).mkdir()
    with pytest.raises(pytest.UsageError, match="cannot resume"):
        resumable(run, json.loads((run / "run.json").read_text()))
