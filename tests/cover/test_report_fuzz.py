"""Every report verb against every kind of damage to run.json and results.jsonl: a malformed file is one
line on stderr naming the file (and the field or line), exit 2, no traceback, with or without
``--allow-incomplete`` (which admits an incomplete run, never a malformed one).  A table names the damages a
user meets; a hypothesis search puts arbitrary JSON values into every field and asserts that whatever a
verb does, it never raises."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mlaconf.reports import cli, safeio
from tests.runs import record, write_run_dir

REPO = Path(__file__).resolve().parents[2]
VERBS = ("diff", "merge", "html")


def rec(case: str, **extra: Any) -> dict[str, Any]:
    return record(case, timing={"latency_ms_median": 1.5, "repeats": 2, "latencies_ms": [1.5, 1.5]}, **extra)


def mlaconf(*argv: str) -> int:
    parser = argparse.ArgumentParser()
    cli.register(parser.add_subparsers(dest="verb", required=True))
    args = parser.parse_args(argv)
    return int(args.func(args))


def verb_argv(verb: str, good: Path, bad: Path, out: Path) -> list[str]:
    return {
        "diff": ["diff", str(good), str(bad), "--out", str(out)],
        "merge": ["merge", str(out), str(good), str(bad)],
        "html": ["html", str(bad)],
    }[verb]


def pair(root: Path) -> tuple[Path, Path]:
    good = write_run_dir(root / "good", [rec("a"), rec("b")], run_id="good")
    bad = write_run_dir(root / "bad", [rec("a"), rec("b")], run_id="bad")
    return good, bad


def edit_run(change: Callable[[dict[str, Any]], None]) -> Callable[[Path], None]:
    def damage(run_dir: Path) -> None:
        run = json.loads((run_dir / "run.json").read_text())
        change(run)
        (run_dir / "run.json").write_text(json.dumps(run))

    return damage


def edit_record(change: Callable[[dict[str, Any]], None]) -> Callable[[Path], None]:
    def damage(run_dir: Path) -> None:
        path = run_dir / "results.jsonl"
        first, second = path.read_text().splitlines()
        record = json.loads(second)
        change(record)
        path.write_text(f"{first}\n{json.dumps(record)}\n")

    return damage


def text(name: str, content: str | bytes) -> Callable[[Path], None]:
    def damage(run_dir: Path) -> None:
        (run_dir / name).unlink()
        if isinstance(content, bytes):
            (run_dir / name).write_bytes(content)
        else:
            (run_dir / name).write_text(content)

    return damage


def directory(name: str) -> Callable[[Path], None]:
    def damage(run_dir: Path) -> None:
        (run_dir / name).unlink()
        (run_dir / name).mkdir()

    return damage


def symlinked(name: str) -> Callable[[Path], None]:
    """The file moved beside the run and linked back: same content, but a reader must not follow."""

    def damage(run_dir: Path) -> None:
        elsewhere = run_dir.parent / f"elsewhere-{name}"
        (run_dir / name).rename(elsewhere)
        (run_dir / name).symlink_to(elsewhere)

    return damage


def set_field(name: str, value: Any) -> Callable[[dict[str, Any]], None]:
    def change(data: dict[str, Any]) -> None:
        *parents, leaf = name.split(".")
        for parent in parents:
            data = data[parent]
        data[leaf] = value

    return change


#: run.json damages: (damage, a fragment the one error line must hold besides the file's path).
RUN_DAMAGES: dict[str, tuple[Callable[[Path], None], str]] = {
    "environment a list": (edit_run(set_field("environment", ["host"])), "'environment'"),
    "environment a string": (edit_run(set_field("environment", "linux")), "'environment'"),
    "problems not strings": (edit_run(set_field("problems", [1])), "'problems'"),
    "problems an object": (edit_run(set_field("problems", {})), "'problems'"),
    "status unknown": (edit_run(set_field("status", "done")), "'status'"),
    "status a number": (edit_run(set_field("status", 3)), "'status'"),
    "counts a list": (edit_run(set_field("counts", [2, 2, 2])), "'counts'"),
    "count negative": (edit_run(set_field("counts.selected", -1)), "counts.selected"),
    "count a float": (edit_run(set_field("counts.run", 2.5)), "counts.run"),
    "count a string": (edit_run(set_field("counts.recorded", "2")), "counts.recorded"),
    "count Infinity": (text("run.json", '{"status": "complete", "counts": {"selected": Infinity}}'), "counts"),
    "records Infinity": (edit_run(set_field("records", float("inf"))), "'records'"),
    "records a boolean": (edit_run(set_field("records", True)), "'records'"),
    "run_id a number": (edit_run(set_field("run_id", 7)), "'run_id'"),
    "backends an object": (edit_run(set_field("backends", {"cpu": 1})), "'backends'"),
    "schema_version 99": (edit_run(set_field("schema_version", 99)), "schema_version"),
    "bare Infinity": (text("run.json", "Infinity"), "JSON object"),
    "bare NaN": (text("run.json", "NaN"), "JSON object"),
    "truncated": (text("run.json", '{"status": "compl'), "not JSON"),
    "empty": (text("run.json", ""), "not JSON"),
    "not UTF-8": (text("run.json", b'{"run_name": "\xff\xfe"}'), "UTF-8"),
    "symlinked": (symlinked("run.json"), "symbolic link"),
    "a directory": (directory("run.json"), "not a regular file"),
}

#: results.jsonl damages, all on its line 2 unless the whole file is damaged.
RESULT_DAMAGES: dict[str, tuple[Callable[[Path], None], str]] = {
    "digest not hex": (edit_record(set_field("output_sha256", "z" * 64)), "output_sha256"),
    "digest short": (edit_record(set_field("output_sha256", "ab" * 8)), "output_sha256"),
    "digest upper case": (edit_record(set_field("output_sha256", "AB" * 32)), "output_sha256"),
    "digest a number": (edit_record(set_field("output_sha256", 12)), "output_sha256"),
    "NaN latency": (edit_record(set_field("timing.latencies_ms", [1.5, float("nan")])), "timing.latencies_ms[1]"),
    "Infinity median": (edit_record(set_field("timing.latency_ms_median", float("inf"))), "timing.latency_ms_median"),
    "negative latency": (edit_record(set_field("timing.latencies_ms", [-1.0])), "timing.latencies_ms[0]"),
    "latency a string": (edit_record(set_field("timing.latency_ms_median", "1.5")), "timing.latency_ms_median"),
    "verdict unknown": (edit_record(set_field("verdict", "great")), "'verdict'"),
    "suite unknown": (edit_record(set_field("suite", "vibes")), "'suite'"),
    "backend empty": (edit_record(set_field("backend", "")), "'backend'"),
    "no case or relation": (edit_record(lambda r: r.pop("case_id")), "case_id"),
    "check not an object": (edit_record(set_field("checks", [3])), "checks[0]"),
    "check passed a string": (edit_record(set_field("checks", [{"rule": "atb", "passed": "yes"}])), "checks[0].passed"),
    "slack a string": (edit_record(set_field("worst_slack", "low")), "worst_slack"),
    "metrics a list": (edit_record(set_field("metrics", [1])), "'metrics'"),
    "line break in a name": (edit_record(set_field("timing", {"a\u2028b\rc": "x"})), "timing.a\\u2028b\\rc"),
    "schema_version 99": (edit_record(set_field("schema_version", 99)), "schema_version"),
    "bare Infinity line": (text("results.jsonl", json.dumps(rec("a")) + "\nInfinity\n"), "JSON object"),
    "truncated line": (text("results.jsonl", json.dumps(rec("a")) + '\n{"case_id": "b", "ba\n'), "not JSON"),
    "not UTF-8": (text("results.jsonl", b'{"case_id": "\xff"}\n'), "UTF-8"),
    "symlinked": (symlinked("results.jsonl"), "symbolic link"),
    "a directory": (directory("results.jsonl"), "not a regular file"),
    "dangling symlink": (
        lambda d: ((d / "results.jsonl").unlink(), (d / "results.jsonl").symlink_to(d / "gone")),
        "symbolic link",
    ),
}


def one_error_line(err: str, *fragments: str) -> None:
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert "Traceback" not in err
    assert all(f in lines[0] for f in fragments), (fragments, lines[0])


DAMAGES = [
    (name, file)
    for file, table in (("run.json", RUN_DAMAGES), ("results.jsonl", RESULT_DAMAGES))
    for name in sorted(table)
]


@pytest.mark.parametrize("allow_incomplete", [False, True], ids=["strict", "allow-incomplete"])
@pytest.mark.parametrize("verb", VERBS)
@pytest.mark.parametrize(("damage", "damaged_file"), DAMAGES, ids=[f"{file}:{name}" for name, file in DAMAGES])
def test_every_damage_is_one_line_in_every_verb(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    damage: str,
    damaged_file: str,
    verb: str,
    allow_incomplete: bool,
) -> None:
    good, bad = pair(tmp_path)
    apply, fragment = (RUN_DAMAGES if damaged_file == "run.json" else RESULT_DAMAGES)[damage]
    apply(bad)
    extra = ["--allow-incomplete"] if allow_incomplete else []
    assert mlaconf("report", *verb_argv(verb, good, bad, tmp_path / "out"), *extra) == 2
    one_error_line(capsys.readouterr().err, str(bad / damaged_file), fragment)
    assert not (tmp_path / "out").exists() and not (bad / "report.html").exists()  # nothing written


def test_a_file_too_large_for_available_memory_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    _, bad = pair(tmp_path)
    size = (bad / "results.jsonl").stat().st_size
    monkeypatch.setattr(safeio, "available_memory", lambda: size * safeio.PARSED_BYTES_PER_BYTE - 1)
    assert mlaconf("report", "html", str(bad)) == 2
    one_error_line(capsys.readouterr().err, str(bad / "results.jsonl"), "memory available")
    monkeypatch.setattr(safeio, "available_memory", lambda: size * safeio.PARSED_BYTES_PER_BYTE * 4)
    assert mlaconf("report", "html", str(bad)) == 0


def test_available_memory_is_what_the_kernel_reports() -> None:
    free = safeio.available_memory()
    assert free is not None and 0 < free <= os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


@pytest.mark.parametrize("verb", VERBS)
def test_report_files_are_readable_like_the_goldens(tmp_path: Path, verb: str) -> None:
    good, bad = pair(tmp_path)
    assert mlaconf("report", *verb_argv(verb, good, bad, tmp_path / "out")) in (0, 1)
    written = [bad / "report.html"] if verb == "html" else [p for p in (tmp_path / "out").iterdir() if p.is_file()]
    assert written
    for path in written:
        assert path.stat().st_mode & 0o777 == 0o644 & ~_umask(), path  # what the golden store's open() gives


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers(-3, 3) | st.floats() | st.text(max_size=6),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=3),
    max_leaves=6,
)
RUN_FIELDS = ("status", "counts", "environment", "problems", "records", "run_id", "backends", "schema_version")
RECORD_FIELDS = (*rec("a"), "checks", "metrics", "relation", "failing", "error", "likely_cause")


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    verb=st.sampled_from(VERBS),
    target=st.sampled_from(["run.json", "results.jsonl"]),
    run_field=st.sampled_from(RUN_FIELDS),
    record_field=st.sampled_from(RECORD_FIELDS),
    value=JSON_VALUES,
    allow_incomplete=st.booleans(),
)
def test_any_value_in_any_field_never_raises(
    capsys: pytest.CaptureFixture[str],
    verb: str,
    target: str,
    run_field: str,
    record_field: str,
    value: Any,
    allow_incomplete: bool,
) -> None:
    """Whatever a field holds, a verb succeeds, fails the gate, or refuses the file in one line naming
    it; it never raises (a traceback) and never admits a NaN/Inf where the schema wants a count."""
    with tempfile.TemporaryDirectory() as tmp:
        good, bad = pair(Path(tmp))
        damage = (
            edit_run(set_field(run_field, value))
            if target == "run.json"
            else edit_record(set_field(record_field, value))
        )
        damage(bad)
        extra = ["--allow-incomplete"] if allow_incomplete else []
        capsys.readouterr()
        status = mlaconf("report", *verb_argv(verb, good, bad, Path(tmp) / "out"), *extra)
        err = capsys.readouterr().err
        assert status in (0, 1, 2)
        assert "Traceback" not in err
        if status == 2:
            lines = err.strip().splitlines()
            assert len(lines) == 1 and str(bad) in lines[0], err


@pytest.mark.parametrize(
    ("verb", "damage"),
    [("merge", "environment a list"), ("diff", "symlinked"), ("html", "bare Infinity")],
)
def test_the_installed_command_prints_one_line_without_a_traceback(tmp_path: Path, verb: str, damage: str) -> None:
    """The same through ``python -m mlaconf`` as a user runs it (the in-process tests above cover the table)."""
    good, bad = pair(tmp_path)
    apply, fragment = RUN_DAMAGES[damage]
    apply(bad)
    argv = [
        sys.executable,
        "-m",
        "mlaconf",
        "report",
        *verb_argv(verb, good, bad, tmp_path / "out"),
        "--allow-incomplete",
    ]
    done = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert done.returncode == 2, done.stderr
    one_error_line(done.stderr, str(bad / "run.json"), fragment)
