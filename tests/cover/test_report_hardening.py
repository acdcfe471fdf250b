"""The report verbs against hostile or broken files: planted symlinks, fixed temp names, deep
nesting, wrong types, unknown schema versions, duplicate keys and records, run.json that is no
object.  Every failure is one line on stderr naming the file (and line), exit 2; no write follows
a link."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from mlaconf import verb_function
from mlaconf.reports import html, verbs
from mlaconf.reports.rundir import read_results, write_json, write_results
from mlaconf.reports.safeio import ReportFileError, atomic_write
from tests.runs import record, write_run_dir


def mlaconf(*argv: str) -> int:
    parser = argparse.ArgumentParser()
    verbs.register(parser.add_subparsers(dest="verb", required=True))
    args = parser.parse_args(argv)
    return int(verb_function(args.func)(args))


def one_error_line(capsys: pytest.CaptureFixture[str], *fragments: str) -> str:
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert all(f in lines[0] for f in fragments), (fragments, lines[0])
    assert "Traceback" not in err
    return lines[0]


@pytest.mark.parametrize("name", ["results.jsonl.tmp", "run.json.tmp", "report.html.tmp"])
def test_a_symlink_planted_at_the_old_temp_name_is_never_written(tmp_path: Path, name: str) -> None:
    victim = tmp_path / "victim"
    victim.write_text("precious\n")
    run = write_run_dir(tmp_path / "run", [record("a")])
    (run / name).symlink_to(victim)
    write_results(run / "results.jsonl", [record("a")])
    write_json(run / "run.json", json.loads((run / "run.json").read_text()))
    html.write_report(run, [record("a")], {})
    assert victim.read_text() == "precious\n" and (run / name).is_symlink()
    assert mlaconf("report", "html", str(run)) == 0
    assert victim.read_text() == "precious\n"
    assert not [p for p in run.iterdir() if p.name.endswith(".tmp") and not p.is_symlink()]  # no leftovers


@pytest.mark.parametrize("name", ["results.jsonl", "report.html"])
def test_a_symlink_at_the_final_name_is_refused(tmp_path: Path, name: str) -> None:
    victim = tmp_path / "victim"
    victim.write_text("precious\n")
    (tmp_path / name).symlink_to(victim)
    with pytest.raises(ReportFileError, match="symbolic link"):
        atomic_write(tmp_path / name, "new")
    assert victim.read_text() == "precious\n"


def test_diff_refuses_a_symlink_planted_in_its_output(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    victim = tmp_path / "victim"
    victim.write_text("precious\n")
    base, cand = write_run_dir(tmp_path / "a", [record("a")]), write_run_dir(tmp_path / "b", [record("a")])
    (cand / "diff").mkdir()
    (cand / "diff" / "diff.md").symlink_to(victim)
    assert mlaconf("report", "diff", str(base), str(cand)) == 0  # the earlier diff/ moved aside, link and all
    assert f"held an earlier diff: moved to {cand / 'diff.previous-1'}" in capsys.readouterr().out
    assert (cand / "diff.previous-1" / "diff.md").is_symlink() and not (cand / "diff" / "diff.md").is_symlink()
    assert victim.read_text() == "precious\n"
    (cand / "diff-link").symlink_to(tmp_path / "elsewhere", target_is_directory=True)
    assert mlaconf("report", "diff", str(base), str(cand), "--out", str(cand / "diff-link")) == 2
    one_error_line(capsys, "diff-link", "symbolic link")


def test_temp_files_are_unique_per_write(tmp_path: Path) -> None:
    """Two writers finishing together never share a temporary file: a file at the old fixed temp
    name (another run's half-written one) is left alone."""
    other = tmp_path / "results.jsonl.tmp"
    other.write_text("another run's half-written file\n")
    write_results(tmp_path / "results.jsonl", [record("a")])
    assert other.read_text() == "another run's half-written file\n"
    assert [r["case_id"] for r in read_results(tmp_path / "results.jsonl")] == ["a"]


def deep(levels: int) -> str:
    return "[" * levels + "]" * levels


BROKEN_LINES = {
    "deep": ('{"case_id": "x", "backend": "cpu", "verdict": "passed", "n": ' + deep(20000) + "}", "nested deeper"),
    "schema 99": (json.dumps(record("x", schema_version=99)), "schema_version"),
    "schema as text": (json.dumps(record("x", schema_version="2")), "schema_version"),
    "schema as float": (json.dumps(record("x", schema_version=2.0)), "schema_version"),
    "slack as text": (json.dumps(record("x", worst_slack="high")), "worst_slack"),
    "checks not a list": (json.dumps(record("x", checks={"rule": "atb"})), "checks"),
    "check slack as text": (json.dumps(record("x", checks=[{"rule": "atb", "slack": "1"}])), "checks[0].slack"),
    "metrics as list": (json.dumps(record("x", metrics=[1, 2])), "metrics"),
    "backend as number": (json.dumps(record("x", backend=3)), "backend"),
    "duplicate key": ('{"case_id": "x", "backend": "cpu", "verdict": "passed", "verdict": "failed"}', "duplicate key"),
    "not an object": ("[1, 2]", "JSON object"),
}


@pytest.mark.parametrize("verb", ["diff", "merge", "html"])
@pytest.mark.parametrize("case", sorted(BROKEN_LINES))
def test_a_broken_record_is_one_line_naming_file_and_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], verb: str, case: str
) -> None:
    line, fragment = BROKEN_LINES[case]
    good = write_run_dir(tmp_path / "good", [record("a")])
    bad = write_run_dir(tmp_path / "bad", [record("a"), record("b")])
    results = bad / "results.jsonl"
    results.write_text(results.read_text().splitlines()[0] + "\n" + line + "\n")
    argv = {
        "diff": ["diff", str(good), str(bad), "--allow-incomplete"],
        "merge": ["merge", str(tmp_path / "m"), str(good), str(bad), "--allow-incomplete"],
        "html": ["html", str(bad), "--allow-incomplete"],
    }[verb]
    assert mlaconf("report", *argv) == 2
    one_error_line(capsys, f"{results}:2:", fragment)


@pytest.mark.parametrize("verb", ["diff", "html"])
def test_a_duplicated_record_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str], verb: str) -> None:
    good = write_run_dir(tmp_path / "good", [record("a")])
    bad = write_run_dir(tmp_path / "bad", [record("a"), record("b")])
    results = bad / "results.jsonl"
    first = results.read_text().splitlines()[0]
    results.write_text(f"{first}\n{first}\n")
    argv = ["diff", str(good), str(bad)] if verb == "diff" else ["html", str(bad)]
    assert mlaconf("report", *argv, "--allow-incomplete") == 2
    one_error_line(capsys, f"{results}:2:", "duplicate record of a [cpu]", "line 1")


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("[]", "must be a JSON object, got an array"),
        ("null", "must be a JSON object, got null"),
        ('{"schema_version": 99}', "'schema_version' 99"),
        ('{"schema_version": "2"}', "'schema_version' '2'"),
        ('{"status": "complete", "status": "crashed"}', "duplicate key 'status'"),
        ('{"a": ' + deep(5000) + "}", "nested deeper"),
    ],
)
@pytest.mark.parametrize("verb", ["diff", "merge", "html"])
def test_a_broken_run_json_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], verb: str, text: str, fragment: str
) -> None:
    good = write_run_dir(tmp_path / "good", [record("a")])
    bad = write_run_dir(tmp_path / "bad", [record("a")])
    (bad / "run.json").write_text(text)
    argv = {
        "diff": ["diff", str(good), str(bad)],
        "merge": ["merge", str(tmp_path / "m"), str(good), str(bad)],
        "html": ["html", str(bad)],
    }[verb]
    for extra in ([], ["--allow-incomplete"]):  # malformed is never "incomplete": no flag lets it through
        assert mlaconf("report", *argv, *extra) == 2
        one_error_line(capsys, str(bad / "run.json"), fragment)
