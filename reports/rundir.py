"""A run directory on disk: results.jsonl (the records, one per line) and run.json (the run's
status, counts and environment), written atomically and read back validated.

Apart from the schema (:mod:`mlaconf.reports.records`) because every report verb reads a run
directory but the run side writes it, and because "is this run complete?" (:class:`RunState`) is
a property of the directory, not of a record; docs/reports.md, "Run directories and their
status", says what each status means."""

from __future__ import annotations

import dataclasses
import json
import os
import sys
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mlaconf.reports import safeio
from mlaconf.reports.aggregate import verdict
from mlaconf.reports.records import (
    KNOWN_SCHEMAS,
    VERDICTS,
    Record,
    RecordError,
    ResultRecord,
    dumps,
    json_type_name,
    record_key,
    sort_records,
)

RESULTS_FILE = "results.jsonl"
RUN_FILE = "run.json"
HTML_FILE = "report.html"
#: Where run directories go when no report directory is named (relative to the working directory).
REPORTS_DIR = Path("reports") / "out"
#: Longest a record appended to the journal waits before it is synced to disk (seconds).
SYNC_S = 2.0


def write_results(path: Path, records: Iterable[Record]) -> None:
    """Write sorted records as JSON lines, atomically (:func:`safeio.atomic_write`)."""
    safeio.atomic_write(path, "".join(dumps(r) + "\n" for r in sort_records(records)))


def say_torn(line: str) -> None:
    """The default way a reader says it dropped a torn last line: one line on stderr."""
    print(line, file=sys.stderr)


def read_results(path: Path, *, torn: Callable[[str], None] = say_torn) -> list[Record]:
    """Read a results.jsonl (any known schema version, upgraded to the current one).  A malformed
    line (not JSON, too deep, a duplicate key, a field of the wrong type, an unknown schema
    version) or a record repeated on two lines raises ValueError naming the file and line.

    A last line without its newline that does not parse is the end of a journal cut off mid-write
    (a killed run): it is dropped and ``torn`` is told so, in one line naming the file and line."""
    records: list[Record] = []
    first_line: dict[tuple[str, str], int] = {}
    text = safeio.read_text(path)
    lines = text.splitlines()
    for lineno, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            value = safeio.loads(line, f"{path}:{lineno}")
        except safeio.ReportFileError:
            if lineno == len(lines) and not text.endswith("\n"):
                torn(f"{path}:{lineno}: dropped a torn last line ({len(line)} characters; the run was cut off)")
                break
            raise
        if not isinstance(value, dict):
            raise ValueError(f"{path}:{lineno}: a record must be a JSON object, got {json_type_name(value)}")
        try:
            record = ResultRecord.from_dict(value).to_dict()
        except RecordError as exc:
            raise ValueError(f"{path}:{lineno}: {exc}") from exc
        key = record_key(record)
        if key in first_line and not str(record.get("test", "")).endswith("@teardown"):
            raise ValueError(
                f"{path}:{lineno}: duplicate record of {key[0]} [{key[1]}] (first on line {first_line[key]})"
            )
        first_line.setdefault(key, lineno)
        records.append(record)
    return records


def journal_records(path: Path) -> tuple[list[Record], list[str]]:
    """Every record of an interrupted run's journal that reads, and one line per line that does not (a damaged
    or torn line is no record: its test runs again).  The file itself must be readable."""
    records: list[Record] = []
    notes: list[str] = []
    text = safeio.read_text(path)
    for lineno, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            value = safeio.loads(line, f"{path}:{lineno}")
            if not isinstance(value, dict):
                raise ValueError(f"{path}:{lineno}: a record must be a JSON object, got {json_type_name(value)}")
            records.append(ResultRecord.from_dict(value).to_dict())
        except (ValueError, RecordError) as exc:
            where = "" if str(exc).startswith(str(path)) else f"{path}:{lineno}: "
            notes.append(f"{where}{str(exc).splitlines()[0]}: not kept, its test runs again")
    return records, notes


class Journal:
    """results.jsonl while its run is in progress: each record appended as one line as its test
    ends (one ``write``, so a killed process loses no line it finished), synced to disk at most
    :data:`SYNC_S` seconds later (a power cut loses at most that).  The run's end replaces the
    file with the sorted records (:func:`write_results`)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._fd: int | None = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_NOFOLLOW | os.O_CLOEXEC)
        self._lock = threading.Lock()
        self._synced = time.monotonic()
        self._timer: threading.Timer | None = None

    def append(self, record: Mapping[str, Any]) -> None:
        """Append one record; it reaches the disk within :data:`SYNC_S` seconds."""
        data = (dumps(record) + "\n").encode("utf-8")
        with self._lock:
            if self._fd is None:
                raise ValueError(f"{self.path}: the journal is closed")
            view = memoryview(data)
            while view:
                view = view[os.write(self._fd, view) :]
            if time.monotonic() - self._synced >= SYNC_S:
                self._sync_locked()
            elif self._timer is None:
                self._timer = threading.Timer(SYNC_S, self.sync)
                self._timer.daemon = True
                self._timer.start()

    def sync(self) -> None:
        """Flush what was appended to the disk."""
        with self._lock:
            self._sync_locked()

    def _sync_locked(self) -> None:
        self._timer = None
        if self._fd is not None:
            os.fsync(self._fd)
        self._synced = time.monotonic()

    def close(self) -> None:
        """Sync and close (the run's end, before results.jsonl is rewritten)."""
        with self._lock:
            timer, self._timer = self._timer, None
            if self._fd is not None:
                os.fsync(self._fd)
                os.close(self._fd)
                self._fd = None
        if timer is not None:
            timer.cancel()


def write_json(path: Path, value: Any) -> None:
    """Pretty JSON, atomically."""
    safeio.atomic_write(path, json.dumps(value, indent=2, sort_keys=True, default=str) + "\n")


# ---- run.json: the run's status and counts -------------------------------------------------------

#: ``run.json["status"]``: written ``in_progress`` before the first test, then one of the others.
RUN_STATUSES = (
    "in_progress",
    "complete",
    "interrupted",
    "crashed",
    "killed",
    "timed_out",
    "no_tests",
    "usage_error",
    "collection_error",
    "internal_error",
)
#: Statuses a report verb accepts without ``--allow-incomplete``.
FINISHED = "complete"


class IncompleteRun(ValueError):
    """A run directory that must not be diffed, merged or rendered as if it were complete."""


@dataclass(frozen=True)
class RunCounts:
    """How many tests the run selected (after -k/-m/--deselect), ran, and recorded (lines of
    results.jsonl, one per test outcome pytest counts, incl. tests that never ran)."""

    selected: int
    run: int
    recorded: int

    def __post_init__(self) -> None:
        for name in ("selected", "run", "recorded"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise RecordError(f"'counts.{name}': expected a count (an integer >= 0), got {value!r}")
        if self.run > self.selected:
            raise RecordError(f"'counts': {self.run} tests ran but only {self.selected} were selected")


@dataclass(frozen=True)
class RunState:
    """The part of run.json that says whether the run finished: ``status`` (:data:`RUN_STATUSES`)
    and ``counts``.  The run side writes ``RunState(...).to_dict()`` into run.json (before the
    first test with ``in_progress``, at the end with the final status); readers build it with
    :meth:`from_run` and ask :meth:`problem`."""

    status: str
    counts: RunCounts

    def __post_init__(self) -> None:
        if self.status not in RUN_STATUSES:
            raise RecordError(f"'status': {self.status!r} is not one of {', '.join(RUN_STATUSES)}")

    @classmethod
    def build(cls, status: str, *, selected: int, run: int, recorded: int) -> RunState:
        """Validated state for the writer (raises RecordError on a bad status or counts)."""
        return cls(status, RunCounts(selected, run, recorded))

    def to_dict(self) -> dict[str, Any]:
        """The run.json keys: ``{"status": ..., "counts": {"selected", "run", "recorded"}}``."""
        return {"status": self.status, "counts": dataclasses.asdict(self.counts)}

    @classmethod
    def from_run(cls, run: Mapping[str, Any]) -> RunState:
        """Read status and counts from a run.json; raises RecordError saying what is missing or wrong."""
        if "status" not in run:
            raise RecordError(
                "has no 'status' (written by an mlaconf from before run statuses, or not by a run at all)"
            )
        counts = run.get("counts")
        if not isinstance(counts, Mapping) or not all(k in counts for k in ("selected", "run", "recorded")):
            raise RecordError("'counts' must be an object with 'selected', 'run' and 'recorded'")
        status = run["status"]
        if not isinstance(status, str):
            raise RecordError(f"'status': expected a string, got {status!r}")
        return cls(status, RunCounts(counts["selected"], counts["run"], counts["recorded"]))

    def problem(self, records: int) -> str | None:
        """Why this run is not a complete one whose results.jsonl holds ``records`` records, or None."""
        c = self.counts
        if self.status == "in_progress":
            return f"is still in progress, or was killed (ran {c.run} of {c.selected} tests so far)"
        if self.status == "no_tests":
            return "selected no test (no_tests): it tested nothing"
        if self.status != FINISHED:
            return f"was {self.status} after {c.run} of {c.selected} selected tests"
        if c.recorded != records:
            return f"says {c.recorded} records but results.jsonl holds {records}"
        return None

    @property
    def short(self) -> int:
        """Selected tests that never ran (0 for a run that ran everything)."""
        return self.counts.selected - self.counts.run


#: run.json's top-level fields a reader relies on, and the JSON type each must have.
RUN_FIELD_TYPES: dict[str, type] = {
    "run_id": str,
    "run_name": str,
    "environment": dict,
    "problems": list,
    "backends": list,
    "policies": list,
    "devices_seen": list,
    "args": list,
    "shards": list,
    "verdicts": dict,
    "counts_by_suite": dict,
    "records": int,
}


def _check_run_fields(path: Path, value: Mapping[str, Any]) -> None:
    """Malformed, not incomplete: a field of the wrong type, problems that are not strings, or a
    status/counts that are present but wrong (no flag admits these)."""
    for name, kind in RUN_FIELD_TYPES.items():
        item = value.get(name)
        if item is not None and (not isinstance(item, kind) or isinstance(item, bool)):
            raise ValueError(f"{path}: {name!r}: expected {_json_kind(kind)}, got {json_type_name(item)}")
    if not all(isinstance(p, str) for p in value.get("problems") or []):
        raise ValueError(f"{path}: 'problems': expected an array of strings")
    if "status" in value:
        try:
            RunState.from_run(value)
        except RecordError as exc:
            raise ValueError(f"{path}: {exc}") from exc


def _json_kind(kind: type) -> str:
    return {str: "a string", dict: "an object", list: "an array", int: "an integer"}.get(kind, kind.__name__)


def read_run(directory: Path, *, required: bool = False) -> dict[str, Any]:
    """run.json of a report directory, validated as an object with a known schema version and
    fields of their types; {} when absent and not ``required``."""
    path = directory / RUN_FILE
    if not path.exists() and not path.is_symlink():
        if required:
            raise IncompleteRun(f"{path}: missing; is {directory} a run directory?")
        return {}
    value = safeio.loads(safeio.read_text(path), str(path))
    if not isinstance(value, dict):
        raise ValueError(
            f"{path}: run.json must be a JSON object, got {'null' if value is None else json_type_name(value)}"
        )
    version = value.get("schema_version")
    if version is not None and (
        not isinstance(version, int) or isinstance(version, bool) or version not in KNOWN_SCHEMAS
    ):
        raise ValueError(
            f"{path}: 'schema_version' {version!r} is not a known version ({', '.join(map(str, KNOWN_SCHEMAS))})"
        )
    _check_run_fields(path, value)
    return value


def run_state(directory: Path, run: Mapping[str, Any]) -> RunState:
    """The run's :class:`RunState`; an old or malformed run.json raises IncompleteRun naming it."""
    try:
        return RunState.from_run(run)
    except RecordError as exc:
        raise IncompleteRun(f"{directory / RUN_FILE}: {exc}") from exc


def check_complete(directory: Path, run: Mapping[str, Any], records: int) -> RunState:
    """The run's state, or IncompleteRun (one line naming run.json) for a run in progress,
    interrupted, crashed, old (no status) or inconsistent with its results.jsonl."""
    state = run_state(directory, run)
    problem = state.problem(records)
    if problem:
        raise IncompleteRun(f"{directory / RUN_FILE}: the run {problem}")
    return state


def load_run_dir(
    directory: Path, *, allow_incomplete: bool = False
) -> tuple[list[Record], dict[str, Any], RunState | None]:
    """A run directory's records, run.json and state.  Unless ``allow_incomplete``, a run that is
    not complete and consistent raises IncompleteRun; with it, the state is None when run.json
    cannot say (missing, old)."""
    records = read_results(directory / RESULTS_FILE)
    run = read_run(directory, required=not allow_incomplete)
    if problem := tally_problem(run, records):
        raise ValueError(f"{directory / RUN_FILE}: {problem}")
    if not allow_incomplete:
        missing = [name for name in ("schema_version", "run_id") if not run.get(name)]
        if missing:
            raise IncompleteRun(
                f"{directory / RUN_FILE}: has no {' or '.join(missing)} (written before runs had one, or not by "
                "a run): its identity cannot be checked; --allow-incomplete reads it anyway"
            )
        return records, run, check_complete(directory, run, len(records))
    try:
        return records, run, run_state(directory, run)
    except IncompleteRun:
        return records, run, None


def tally_problem(run: Mapping[str, Any], records: Sequence[Record]) -> str | None:
    """run.json's ``verdicts`` tally against its records, once the run has ended (a run in progress or killed
    tallied only what it had when it last wrote run.json); never admitted by ``--allow-incomplete``."""
    tally = run.get("verdicts")
    if not isinstance(tally, Mapping) or run.get("status") in (None, "in_progress"):
        return None
    counted = dict.fromkeys(VERDICTS, 0)
    for record in records:
        counted[verdict(record)] = counted.get(verdict(record), 0) + 1
    said = {k: tally.get(k, 0) for k in counted.keys() | tally.keys()}
    if said != {k: counted.get(k, 0) for k in said}:
        differing = ", ".join(
            f"{k} {said[k]} vs {counted.get(k, 0)}" for k in sorted(said) if said[k] != counted.get(k, 0)
        )
        return f"'verdicts' does not tally with results.jsonl ({differing})"
    return None


# ---- a run whose pytest died: ended by the survivor ----------------------------------------------


def tests_recorded(records: Iterable[Mapping[str, Any]]) -> set[str]:
    """The tests that ran and have a record (a test recorded as ``not_run`` has none that counts)."""
    return {
        str(r.get("test", "")).removesuffix("@teardown")
        for r in records
        if (r.get("failure") or {}).get("kind") != "not_run"
    }


def end_abandoned(directory: Path, pid: int, status: str, why: str) -> RunState | None:
    """End a run whose pytest (``pid``) died before it could: run.json gets ``status`` and counts from
    the journal (every test that ended before the death has its record), results.jsonl is rewritten
    whole (a torn last line dropped).  Nothing is touched, and None returned, unless run.json says
    ``in_progress`` and names ``pid`` (the run is this pytest's, and it never ended it)."""
    try:
        run = read_run(directory)
    except (ValueError, OSError):
        return None
    if run.get("status") != "in_progress" or run.get("pid") != pid:
        return None
    records = read_results(directory / RESULTS_FILE)
    ran = tests_recorded(records)
    selected = max(int((run.get("counts") or {}).get("selected") or 0), len(ran))
    state = RunState.build(status, selected=selected, run=len(ran), recorded=len(records))
    verdicts = dict.fromkeys(VERDICTS, 0)
    suites: dict[str, dict[str, int]] = {}
    for record in records:
        name = str(record.get("verdict"))
        name = name if name in VERDICTS else "error"
        verdicts[name] += 1
        suites.setdefault(str(record.get("suite", "?")), dict.fromkeys(VERDICTS, 0))[name] += 1
    problems = [*run.get("problems", []), why]
    run.update(
        state.to_dict(),
        records=len(records),
        verdicts=verdicts,
        counts_by_suite=suites,
        problems=problems,
        finished=time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    )
    write_results(directory / RESULTS_FILE, records)
    write_json(directory / RUN_FILE, run)
    return state
