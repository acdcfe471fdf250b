"""The run directory a pytest session owns: claimed before its first test, journaled as tests end,
written whole at the end with run.json's final status, or resumed.

Apart from :mod:`mlaconf.runner.recording` (which gathers the records and hands each to :class:`Run`)
because owning a directory is its own concern: never reuse one silently (an earlier run is moved aside,
a live one refused), keep every finished test's record on disk as it arrives
(:class:`mlaconf.reports.rundir.Journal`), say in run.json how the run ended, and continue an
interrupted run only where nothing that decides its verdicts has changed.  :class:`ReportState` is
the session's state both read.  docs/reports.md, "Stopping and resuming", says what each way of
stopping leaves behind."""

from __future__ import annotations

import json
import os
import socket
import time
import uuid
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

try:
    import fcntl
except ImportError:  # not POSIX: the plugin still loads; report-directory claims go unserialised
    fcntl = None  # type: ignore[assignment]

from mlaconf.facts.processes import process_alive
from mlaconf.reports import aggregate, env, records, rundir, safeio
from mlaconf.reports.records import Record

#: Said once when a report directory is claimed without fcntl (not POSIX).
NO_LOCK_NOTE = "no fcntl on this system: concurrent runs claiming one report directory are not serialised"
#: run.json facts a resumed run must share with the run it continues (else its verdicts could differ).
RESUME_FACTS = ("environment", "goldens", "golden_store", "backends", "policy", "suites", "cases_file", "args")
#: pytest arguments that name where the run goes or that it resumes: free to differ on a resume.
PLACE_OPTIONS = ("--mla-report-dir", "--mla-run-name")
RESUME_OPTION = "--mla-resume"


@dataclass
class ReportState:
    """Per-session state; on xdist workers only ``report_dir`` and ``save_outputs`` matter."""

    report_dir: Path
    run_name: str
    save_outputs: bool
    shard: tuple[int, int] | None
    started: float = field(default_factory=time.time)
    #: This run's identity in run.json: the diff refuses one run on both sides.
    run_id: str = field(default_factory=lambda: uuid.uuid4().hex)
    records: list[Record] = field(default_factory=list)
    run_info: dict[str, Any] = field(default_factory=dict)
    #: nodeid -> identity (from setup reports), and when the setup report arrived.
    identities: dict[str, dict[str, Any]] = field(default_factory=dict)
    setup_seen: dict[str, float] = field(default_factory=dict)
    #: Lines to print at the end of the run (unavailable explicit backends, empty selection ...).
    problems: list[str] = field(default_factory=list)
    #: MLA tests that ended with an outcome pytest counts (run.json ``counts.run``).
    ran: set[str] = field(default_factory=set)
    #: MLA tests selected (after deselection): nodeid -> identity (None: known by nodeid only, xdist).
    selected: dict[str, dict[str, Any] | None] = field(default_factory=dict)
    #: Whether this process claimed the report directory (wrote run.json ``in_progress``), or was
    #: refused it (another run owns it: this run then writes nothing there).
    claimed: bool = False
    refused: bool = False
    #: The status pytest exits with, once this session's run is ended (None before).
    exit_status: int | None = None
    #: Collection reports that failed (a test file that does not import, a suite that does not parse).
    collection_errors: int = 0
    #: ``--mla-resume``: this session continues the interrupted run in ``report_dir``; run.json's
    #: ``started`` and ``resumed`` (one entry per resume) once it has.
    resume: bool = False
    started_text: str | None = None
    resumed: list[dict[str, Any]] = field(default_factory=list)


STATE = pytest.StashKey[ReportState]()


def set_run_info(config: pytest.Config, key: str, value: Any) -> None:
    """Record run-level facts (``golden_store``, ``backends``, ``suites``, ``policy`` ...) in run.json.

    Call it on the controller (``pytest_configure``/``pytest_sessionstart`` or a session fixture
    under ``-n 0``); values set on xdist workers never reach run.json.  ``value`` must be
    JSON-serialisable (anything else is written with ``str``).
    """
    config.stash[STATE].run_info[key] = value


def iso_time(timestamp: float) -> str:
    """A time as run.json writes it (local, with its UTC offset)."""
    return time.strftime("%Y-%m-%dT%H:%M:%S%z", time.localtime(timestamp))


class Run:
    """The controller's side of a run directory: claimed once MLA tests are selected (or the interrupted run
    there continued), each record journaled as the gatherer hands it over, run.json's final status and
    every record written at the end.  The gatherer (:class:`mlaconf.runner.recording.RecordGatherer`) gathers the
    records; what the directory holds is decided here."""

    def __init__(self, config: pytest.Config, state: ReportState) -> None:
        self.config = config
        self.state = state
        self.directory = RunDirectory(state.report_dir)

    def claim(self) -> str | None:
        """Own the report directory before any test (:meth:`RunDirectory.claim`); with
        ``--mla-resume``, continue the run there instead: its records stay, its tests are not rerun.
        Returns a line to say (an earlier run moved aside, a torn journal), or None."""
        state = self.state
        if not state.resume:
            moved = self.directory.claim(self.run_document(None, "in_progress"))
            state.claimed = True
            return moved
        unnamed = () if "backends" in state.run_info else ("backends",)  # then read off the records
        earlier, kept, notes = resumable(state.report_dir, self.run_document(None, "in_progress"), skip=unnamed)
        state.run_id = str(earlier.get("run_id") or state.run_id)
        state.run_name = str(earlier.get("run_name") or state.run_name)
        state.started_text = str(earlier.get("started") or "") or None
        state.resumed = resumed_note(earlier, len(kept))
        state.records[:0] = kept
        for record in kept:
            nodeid = str(record.get("test", "")).removesuffix("@teardown")
            state.ran.add(nodeid)
            state.selected.setdefault(nodeid, None)
        self.directory.claim(self.run_document(None, "in_progress"), kept=kept)
        state.claimed = True
        said = f"resuming the run in {state.report_dir}: {len(kept)} tests recorded earlier are not rerun"
        return "; ".join([said, *notes])

    def claim_for_selection(self) -> None:
        """Claim the report directory once MLA tests are selected to run (not for --collect-only)."""
        state = self.state
        if state.claimed or not (state.selected or state.resume) or self.config.option.collectonly:
            return
        try:
            moved = self.claim()
        except pytest.UsageError as exc:
            self.state.refused = True
            pytest.exit(f"ERROR: {exc}", returncode=pytest.ExitCode.USAGE_ERROR)
        reporter = self.config.pluginmanager.get_plugin("terminalreporter")
        if moved and reporter is not None:
            reporter.write_line(f"mla: {moved}", yellow=True)

    def stamped(self, record: Record) -> Record:
        """The record as the run directory holds it: with the id of the run that wrote it."""
        return {**record, "run_id": self.state.run_id}

    def journal(self, record: Record) -> None:
        """Keep a record on disk as its test ends (a hard stop keeps it); nothing before the claim."""
        try:
            self.directory.append(self.stamped(record))
        except OSError as exc:  # a full disk: the end's write says it again, and fails the run
            self.state.problems.append(f"the journal {self.directory.path / rundir.RESULTS_FILE}: {exc}")

    def end_with_usage_error(self, message: str) -> Path | None:
        """A named report directory ends ``usage_error`` (an earlier run there is moved aside): it never
        shows a previous run as this one.  A default (timestamped) directory is left unmade, and a run
        being resumed as it was.  Returns the directory written, for the usage error to say."""
        named = self.config.getoption("mla_report_dir") or self.config.getoption("mla_run_name")
        if not named or self.config.getoption("mla_resume"):
            return None
        self.state.problems.append(f"usage error: {message.splitlines()[0]}")
        try:
            self.claim()
            rundir.write_json(self.state.report_dir / rundir.RUN_FILE, self.run_document(time.time(), "usage_error"))
        except (pytest.UsageError, OSError, safeio.ReportFileError):  # another run owns it, or it cannot be written
            return None
        return self.state.report_dir

    def end(self, session: pytest.Session, exitstatus: int, account_for_unrun: Callable[[int], str]) -> None:
        """Complete run.json with the run's final status and write every record and the page; fail a run
        that cannot pass.  ``account_for_unrun`` (the gatherer's) gives every selected test that never ran
        its record and says whether the run completed, was interrupted or crashed."""
        state, config = self.state, self.config
        empty = exitstatus == pytest.ExitCode.NO_TESTS_COLLECTED and any(
            config.getoption(name, None) for name in ("mla_cases", "mla_suite", "mla_backend")
        )
        if empty and state.resume and state.claimed:  # everything had run: the resumed run ends now
            empty = False
            session.exitstatus = pytest.ExitCode.OK
        if empty:  # pytest exits 5 'no tests ran': say why that is no pass
            state.problems.append("empty selection: no MLA test was selected (a -k or -m that matches nothing?)")
        if state.refused:
            return
        ended_early = state.collection_errors or exitstatus == pytest.ExitCode.INTERNAL_ERROR
        if (empty or ended_early) and not state.claimed and not config.option.collectonly:
            try:  # the directory must not go on showing the previous run as this one
                self.claim()
            except pytest.UsageError as exc:
                state.problems.append(str(exc))
                return
        status = "complete" if config.option.collectonly else self.final_status(exitstatus, account_for_unrun)
        if empty:
            status = "no_tests"
        failing = state.resume and any(aggregate.verdict(r) in ("failed", "error") for r in state.records)
        if (state.problems or failing) and session.exitstatus == pytest.ExitCode.OK:
            session.exitstatus = pytest.ExitCode.TESTS_FAILED  # a resumed run's earlier failures count
        if not state.claimed and not state.records:
            return
        ordered = records.sort_records([self.stamped(r) for r in state.records])
        try:
            self.directory.finish(ordered, self.run_document(time.time(), status))
        except (OSError, safeio.ReportFileError) as exc:  # a planted link, a full disk: say so, fail the run
            state.problems.append(f"the report could not be written: {exc}")
            session.exitstatus = pytest.ExitCode.TESTS_FAILED

    def final_status(self, exitstatus: int, account_for_unrun: Callable[[int], str]) -> str:
        """run.json's last status: what stopped the run when something did (docs/reports.md, statuses)."""
        state = self.state
        status = account_for_unrun(exitstatus)
        if exitstatus == pytest.ExitCode.INTERNAL_ERROR:
            state.problems.append("pytest stopped with an internal error (its INTERNALERROR lines say where)")
            return "internal_error"
        if state.collection_errors:
            state.problems.append(f"{state.collection_errors} error(s) during collection: the selection is not whole")
            return "collection_error"
        # a run stopped short without a crashed worker (status interrupted) whose tests timed out; a crashed
        # worker (status crashed) stays a crash whatever other tests did
        timed_out = any((record.get("failure") or {}).get("kind") == "timeout" for record in state.records)
        return "timed_out" if status == "interrupted" and timed_out else status

    def run_document(self, finished: float | None, status: str) -> dict[str, Any]:
        """run.json: the lead's run info, then run facts, status and the environment (these win);
        ``finished`` is None while the run is in progress."""
        state, config = self.state, self.config
        run_state = rundir.RunState.build(
            status, selected=len(state.selected.keys() | state.ran), run=len(state.ran), recorded=len(state.records)
        )
        counts = dict.fromkeys(records.VERDICTS, 0)
        suites: dict[str, dict[str, int]] = {}
        for record in state.records:
            counts[aggregate.verdict(record)] += 1
            per_suite = suites.setdefault(str(record.get("suite", "?")), dict.fromkeys(records.VERDICTS, 0))
            per_suite[aggregate.verdict(record)] += 1
        doc: dict[str, Any] = dict(state.run_info)
        if "backends" not in doc:  # none named (auto): what ran, and whether anything could run on it
            seen: dict[str, bool] = {}
            for record in state.records:
                label = str(record.get("backend"))
                seen[label] = seen.get(label, False) or aggregate.verdict(record) != "skipped"
            doc["backends"] = [
                {"name": label, "label": label, "explicit": False, "ran": ran} for label, ran in sorted(seen.items())
            ]
        doc.update(
            {
                "schema_version": records.SCHEMA_VERSION,
                "run_name": state.run_name,
                "run_id": state.run_id,
                "pid": os.getpid(),
                "started": state.started_text or iso_time(state.started),
                "finished": None if finished is None else iso_time(finished),
                "shard": f"{state.shard[0]}/{state.shard[1]}" if state.shard else None,
                "workers": getattr(config.option, "numprocesses", None) or 0,
                "args": list(config.invocation_params.args),
                "records": len(state.records),
                "verdicts": counts,
                "counts_by_suite": suites,
                "problems": list(state.problems),
                "policies": sorted({str(r["policy"]) for r in state.records if r.get("policy")}),
                "devices_seen": sorted(
                    {f"{r.get('backend')}:{r.get('device')}" for r in state.records if r.get("device")}
                ),
                "environment": env.collect(Path(__file__).resolve().parent.parent),
                "goldens": goldens_facts(),
                "goldens_rebuilt": records.goldens_rebuilt(state.records),
                "invocation_dir": str(config.invocation_params.dir),
            }
            | run_state.to_dict()
        )
        if state.resumed:
            doc["resumed"] = state.resumed
        return doc


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
        aside = safeio.move_aside(directory)
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
    from mlaconf.golden.store.integrity import GENERATOR_VERSION, SCHEMA_VERSION

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
) -> tuple[dict[str, Any], list[Record], list[str]]:
    """The earlier run to continue, its records that stay (tests that ran), and a line per kind of record left out.

    Raises pytest.UsageError (one line) when there is nothing to resume (no run, a complete one, a
    live one) or when anything that decides the verdicts differs from this run (``document``):
    environment, goldens, store, backends, policy, suites, cases file or pytest arguments (less
    ``skip``)."""
    where = f"--mla-resume {directory}"
    try:
        earlier = rundir.read_run(directory, required=True)
        kept, notes = own_records(directory, earlier)
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
    return earlier, ran, notes


def own_records(directory: Path, earlier: Mapping[str, Any]) -> tuple[list[Record], list[str]]:
    """The records of the interrupted run's journal that are its own and whole, and a line for each kind left
    out: a damaged or torn line, a record another run wrote (another run id, or none), a test recorded twice.
    Whatever is left out is no evidence of this run: its test runs again."""
    run_id = earlier.get("run_id")
    readable, notes = rundir.journal_records(directory / rundir.RESULTS_FILE)
    own = [r for r in readable if run_id and r.get("run_id") == run_id]
    if len(own) < len(readable):
        notes.append(
            f"{len(readable) - len(own)} records not written by run {run_id} (another run's, or from before records "
            "carried their run) are not kept: their tests run again"
        )
    times = Counter(str(r.get("test")) for r in own)
    twice = sorted(test for test, n in times.items() if n > 1)
    if twice:
        notes.append(f"{len(twice)} tests recorded more than once (first {twice[0]}) are not kept: they run again")
    return [r for r in own if times[str(r.get("test"))] == 1], notes


def recorded_tests(directory: Path) -> set[str]:
    """Node ids of the tests an interrupted run already recorded (resume deselects them): the records
    :func:`own_records` keeps, read on every process that collects, xdist workers included."""
    try:
        return rundir.tests_recorded(own_records(directory, rundir.read_run(directory, required=True))[0])
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
    return [*(notes if isinstance(notes, list) else []), {"at": iso_time(time.time()), "kept": kept}]
