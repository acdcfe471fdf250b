"""The run directory a pytest session owns: claimed before its first test, journaled as tests end,
written whole at the end, or resumed.

Apart from :mod:`mlaconf.runner.collect` (which gathers the records) because owning a directory
is its own concern: never reuse one silently (an earlier run is moved aside, a live one refused),
keep every finished test's record on disk as it arrives (:class:`mlaconf.reports.rundir.Journal`),
and continue an interrupted run only where nothing that decides its verdicts has changed.
docs/reports.md, "Stopping and resuming", says what each way of stopping leaves behind."""

from __future__ import annotations

import json
import os
import socket
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest

try:
    import fcntl
except ImportError:  # not POSIX: the plugin still loads; report-directory claims go unserialised
    fcntl = None  # type: ignore[assignment]

from mlaconf.facts.processes import process_alive
from mlaconf.reports import records, rundir, safeio
from mlaconf.reports.records import Record

#: Said once when a report directory is claimed without fcntl (not POSIX).
NO_LOCK_NOTE = "no fcntl on this system: concurrent runs claiming one report directory are not serialised"
#: run.json facts a resumed run must share with the run it continues (else its verdicts could differ).
RESUME_FACTS = ("environment", "goldens", "golden_store", "backends", "policy", "suites", "cases_file", "args")
#: pytest arguments that name where the run goes or that it resumes: free to differ on a resume.
PLACE_OPTIONS = ("--mla-report-dir", "--mla-run-name")
RESUME_OPTION = "--mla-resume"


class RunDirectory:
    """One run's report directory, from its claim (run.json ``in_progress``) to its last write."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.journal: rundir.Journal | None = None

    def claim(self, document: Mapping[str, Any], *, kept: Sequence[Record] | None = None) -> str | None:
        """Own the directory before any test: run.json ``in_progress``, created exclusively.

        A directory is never silently reused: one whose run is still alive (same host, its pid
        running) is a usage error; one that holds a finished or dead run has that run moved to a
        fresh sibling name (``<dir>.previous-N``), so nothing is lost and the directory never shows
        an old run as this one.  ``kept``: a resumed run's earlier records, which stay (nothing is
        moved).  Returns the line that says what was moved, or None."""
        parent = safeio.safe_dir(self.path.parent)
        lock = None if fcntl is None else os.open(parent, os.O_RDONLY | os.O_DIRECTORY)
        try:
            if lock is not None:
                fcntl.flock(lock, fcntl.LOCK_EX)  # claims in one parent directory happen one at a time
            moved = self._move_earlier_run() if kept is None else None
            if lock is None:
                moved = f"{moved}; {NO_LOCK_NOTE}" if moved else NO_LOCK_NOTE
            safeio.safe_dir(self.path)
            text = json.dumps(document, indent=2, sort_keys=True, default=str) + "\n"
            if kept is None:
                safeio.create_exclusive(self.path / rundir.RUN_FILE, text)
                safeio.create_exclusive(self.path / rundir.RESULTS_FILE, "")
            else:
                rundir.write_results(self.path / rundir.RESULTS_FILE, kept)
                safeio.atomic_write(self.path / rundir.RUN_FILE, text)
            self.journal = rundir.Journal(self.path / rundir.RESULTS_FILE)
        except (OSError, safeio.ReportFileError) as exc:
            raise pytest.UsageError(f"report directory {self.path}: {exc}") from None
        finally:
            if lock is not None:
                os.close(lock)
        return moved

    def _move_earlier_run(self) -> str | None:
        directory = self.path
        if not directory.exists() or not any(directory.iterdir()):
            return None
        earlier = earlier_run(directory)
        if live(earlier):
            raise pytest.UsageError(
                f"{directory}: run {earlier.get('run_name')!r} (pid {earlier.get('pid')}) is still writing there; "
                "give this run another --mla-run-name or --mla-report-dir"
            )
        number = 1
        while (aside := directory.with_name(f"{directory.name}.previous-{number}")).exists():
            number += 1
        os.rename(directory, aside)
        status = earlier.get("status", "no status")
        return f"{directory} held an earlier run ({status}, started {earlier.get('started', '?')}): moved to {aside}"

    def append(self, record: Record) -> None:
        """Journal one record as its test ends (nothing before the claim: the run writes nowhere)."""
        if self.journal is not None:
            self.journal.append(record)

    def finish(self, ordered: Sequence[Record], run: Mapping[str, Any]) -> None:
        """The run's last writes: every record (sorted), run.json, the page."""
        from mlaconf.reports import html

        if self.journal is not None:
            self.journal.close()
            self.journal = None
        safeio.safe_dir(self.path)
        rundir.write_results(self.path / rundir.RESULTS_FILE, ordered)
        rundir.write_json(self.path / rundir.RUN_FILE, dict(run))
        html.write_report(self.path, list(ordered), dict(run))


def is_never_ran(record: Mapping[str, Any]) -> bool:
    """The record a selected test gets when the run ended before it ran (a stop, xdist out of restarts)."""
    return (record.get("failure") or {}).get("kind") == "not_run"


def live(run: Mapping[str, Any]) -> bool:
    """Whether the run that wrote this run.json is still running (same host, its pid alive)."""
    environment = run.get("environment")
    host = environment.get("host") if isinstance(environment, dict) else None
    return run.get("status") == "in_progress" and host == socket.gethostname() and process_alive(run.get("pid"))


def earlier_run(directory: Path) -> dict[str, Any]:
    """What run.json says of the run before this one; a file the readers refuse (an older schema, a
    damaged field) is still read for its liveness, so a live run is never moved aside."""
    try:
        return rundir.read_run(directory)
    except (records.RecordError, safeio.ReportFileError, ValueError):
        pass
    try:
        raw = safeio.loads(safeio.read_text(directory / rundir.RUN_FILE), str(directory / rundir.RUN_FILE))
    except (safeio.ReportFileError, ValueError, OSError):
        return {}
    return raw if isinstance(raw, dict) else {}


# ---- resuming an interrupted run ------------------------------------------------------------------


def goldens_facts() -> dict[str, Any]:
    """What decides the goldens besides the store and the cases: the generator and file format."""
    from mlaconf.golden.generate import GENERATOR_VERSION
    from mlaconf.golden.integrity import SCHEMA_VERSION

    return {"generator": GENERATOR_VERSION, "schema": SCHEMA_VERSION}


def comparable_args(args: Sequence[str]) -> list[str]:
    """pytest's arguments less where the run goes and whether it resumes (free to differ)."""
    out: list[str] = []
    skip = False
    for arg in args:
        if skip:
            skip = False
        elif arg == RESUME_OPTION or (arg.split("=", 1)[0] in PLACE_OPTIONS and "=" in arg):
            continue
        elif arg in PLACE_OPTIONS:
            skip = True
        else:
            out.append(arg)
    return out


def first_difference(before: Any, now: Any, where: str) -> str | None:
    """The first place two JSON values differ (``environment.packages.torch: '2.13.0' -> '2.14.0'``)."""
    if isinstance(before, dict) and isinstance(now, dict):
        for key in sorted(before.keys() | now.keys()):
            found = first_difference(before.get(key), now.get(key), f"{where}.{key}")
            if found:
                return found
        return None
    if before != now:
        return f"{where}: {json.dumps(before, default=str)[:80]} -> {json.dumps(now, default=str)[:80]}"
    return None


def resumable(
    directory: Path, document: Mapping[str, Any], *, skip: Sequence[str] = ()
) -> tuple[dict[str, Any], list[Record], str | None]:
    """The earlier run to continue, its records that stay (tests that ran), and a torn journal's note.

    Raises pytest.UsageError (one line) when there is nothing to resume (no run, a complete one, a
    live one) or when anything that decides the verdicts differs from this run (``document``):
    environment, goldens, store, backends, policy, suites, cases file or pytest arguments (less
    ``skip``)."""
    where = f"--mla-resume {directory}"
    try:
        earlier = rundir.read_run(directory, required=True)
        torn: list[str] = []
        kept = rundir.read_results(directory / rundir.RESULTS_FILE, torn=torn.append)
    except (ValueError, OSError) as exc:
        raise pytest.UsageError(f"{where}: cannot resume: {str(exc).splitlines()[0]}") from None
    status = earlier.get("status")
    if status == rundir.FINISHED:
        raise pytest.UsageError(f"{where}: the run is already complete; nothing to resume")
    if live(earlier):
        raise pytest.UsageError(f"{where}: run {earlier.get('run_name')!r} (pid {earlier.get('pid')}) is still running")
    for name in (fact for fact in RESUME_FACTS if fact not in skip):
        before, now = earlier.get(name), document.get(name)
        if name == "args":
            before, now = comparable_args(before or []), comparable_args(now or [])
        difference = first_difference(before, now, name)
        if difference:
            raise pytest.UsageError(
                f"{where}: cannot resume, this run differs from the one it would continue: {difference}"
            )
    ran = [r for r in kept if not is_never_ran(r)]
    return earlier, ran, torn[0] if torn else None


def recorded_tests(directory: Path) -> set[str]:
    """Node ids of the tests an interrupted run already recorded (resume deselects them): read on
    every process that collects, xdist workers included; a torn last line is silently left out."""
    path = directory / rundir.RESULTS_FILE
    try:
        return rundir.tests_recorded(rundir.read_results(path, torn=lambda line: None))
    except (ValueError, OSError):
        return set()  # the controller's claim refuses the resume, naming the file


def deselect_recorded(config: pytest.Config, items: list[pytest.Item], directory: Path) -> None:
    """``--mla-resume``: deselect every test the run being resumed already recorded."""
    done = recorded_tests(directory)
    drop = [item for item in items if item.nodeid in done]
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = [item for item in items if item.nodeid not in done]


def resumed_note(earlier: Mapping[str, Any], kept: int) -> list[dict[str, Any]]:
    """run.json ``resumed``: one entry per resume (when, and how many records the run kept)."""
    notes = earlier.get("resumed")
    return [*(notes if isinstance(notes, list) else []), {"at": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "kept": kept}]
