"""Result records on their way to the report: attached in tests, completed per test, gathered on
the controller.

Every test of the MLA suites (an item that uses the ``mla_backend_name`` parameter) ends with exactly
one :class:`mlaconf.reports.records.ResultRecord`:

* the suites attach one through the ``mla_report`` fixture when they reach a verdict;
* :func:`complete_report` (the process that ran the test, worker or not) makes one from pytest's
  outcome when the test ended without one (a skip, an exception outside the verdict path, a
  timeout), and sets every record's verdict to pytest's outcome, so the report's counts are
  pytest's;
* the controller's :class:`Collector` makes one for a test whose xdist worker died under it
  (``worker 'gw0' crashed while running ...``), from the identity the worker sent with the test's
  setup report.

Records travel inside ``TestReport.user_properties`` (the one channel xdist already ships from
workers to the controller), so the controller alone gathers them: each is journaled into
``results.jsonl`` as its test ends, and at the end ``results.jsonl``, ``run.json`` and
``report.html`` are written whole and the summary printed.  The report directory itself (claim,
journal, resume) is :mod:`mlaconf.runner.run_directory`'s.
"""

from __future__ import annotations

import dataclasses
import importlib.resources
import json
import os
import time
import uuid
import warnings
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from mlaconf.reports import aggregate, env, records, rundir, safeio
from mlaconf.reports.records import PROPERTY_NAME, Failure, Record, RecordError, ResultRecord, make_record
from mlaconf.runner.applicability import declared_reason
from mlaconf.runner.failures import crash_record, failure_of, short_text
from mlaconf.runner.identity import BACKEND_LABELS, MLA_PARAMETER, identity, identity_from_nodeid
from mlaconf.runner.run_directory import RunDirectory, goldens_facts, is_never_ran, resumable, resumed_note

if TYPE_CHECKING:
    from mlaconf.judge.verdict import Outcome

#: Scalar record fields also attached as plain properties, so ``--junitxml`` shows them.
JUNIT_FIELDS = ("verdict", "worst_slack", "policy", "backend")
JUNIT_METRICS = ("max_rel_err", "rmse")
#: user_properties name of a test's identity, sent with its setup report (for crash records).
IDENTITY_NAME = "mla_identity"


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
#: A record a test wants attached only if it ends failing (property tests: the last failing
#: example, which hypothesis replays last, is the shrunk one).
PENDING = pytest.StashKey[ResultRecord]()
#: The record a test attached, kept as the object until its phase ends (then serialised once).
ATTACHED = pytest.StashKey[ResultRecord]()


def set_run_info(config: pytest.Config, key: str, value: Any) -> None:
    """Record run-level facts (``golden_store``, ``backends``, ``suites``, ``policy`` ...) in run.json.

    Call it on the controller (``pytest_configure``/``pytest_sessionstart`` or a session fixture
    under ``-n 0``); values set on xdist workers never reach run.json.  ``value`` must be
    JSON-serialisable (anything else is written with ``str``).
    """
    config.stash[STATE].run_info[key] = value


def is_mla_item(item: pytest.Item) -> bool:
    """A test of the MLA suites: one that runs on a selected backend (the plugin's ``mla_backend_name``
    parameter; never a generic fixture name a foreign project may also use)."""
    return MLA_PARAMETER in getattr(item, "fixturenames", ())


def has_record(item: pytest.Item) -> bool:
    """Whether a test attached a record through ``mla_report`` (an MLA test or not)."""
    return ATTACHED in item.stash or PENDING in item.stash


def is_mla_nodeid(nodeid: str, rootdir: Path) -> bool:
    """A test of the shipped MLA suites, known by its id only (the xdist controller collects nothing):
    a parametrized test in a file of the suites package, never a foreign module that shares a name."""
    suites = Path(str(importlib.resources.files("mlaconf.cases"))).resolve()
    return (rootdir / nodeid.partition("::")[0]).resolve().parent == suites and nodeid.endswith("]")


def outcome_of_report(report: pytest.TestReport) -> str:
    """pytest's verdict for the phase, in the record vocabulary."""
    if hasattr(report, "wasxfail"):
        return "xfailed" if report.skipped else "xpassed"
    if report.when in ("setup", "teardown") and report.failed:
        return "error"
    return report.outcome


def agreed_verdict(attached: str, outcome: str) -> str:
    """pytest's outcome, except that a known deviation's unexpected pass stays ``xpassed`` (pytest
    counts it as passed and warns: both are passes)."""
    return "xpassed" if attached == "xpassed" and outcome == "passed" else outcome


def counts_for_pytest(report: pytest.TestReport) -> bool:
    """Whether pytest counts this report in its summary line (the call, a setup that did not
    pass, a teardown that failed, an xdist crash report)."""
    when = str(report.when)
    if when in ("call", "???"):  # "???": xdist's report of a test whose worker crashed
        return True
    if report.when == "setup":
        return not report.passed
    return report.when == "teardown" and report.failed


def complete_report(item: pytest.Item, call: pytest.CallInfo[None], report: pytest.TestReport) -> None:
    """Give a finished phase of an MLA test its record (run where the test ran, worker or not).

    The setup report carries the test's identity, so the controller can name a test whose worker
    dies later.  A report pytest counts gets exactly one record, with pytest's outcome as its
    verdict: the one the test attached (a failure outside the verdict path added when the test
    died after attaching it), a pending one (property tests), else one made from the outcome.
    """
    ident = identity(item)
    if report.when == "setup":
        report.user_properties.append((IDENTITY_NAME, json.dumps(ident, sort_keys=True, default=str)))
    if not counts_for_pytest(report):
        return
    outcome = outcome_of_report(report)
    # the record travels as one JSON property; a teardown error (counted besides the test's outcome)
    # gets a record of its own
    report.user_properties[:] = [p for p in report.user_properties if p[0] != PROPERTY_NAME]
    excinfo = call.excinfo
    pending = item.stash.get(PENDING, None)
    attached = item.stash.get(ATTACHED, None) if report.when != "teardown" else None
    if pending is not None and outcome in ("failed", "error"):  # the failing example beats passes so far
        record = pending
    elif attached is not None:
        record = attached
    else:
        record = _from_outcome(ident, outcome, report, item, excinfo)
    changes: dict[str, Any] = {}
    if outcome == "skipped" and (reason := declared_reason(excinfo)):
        changes["not_applicable"] = reason  # the backend's own declaration rules the test out
    if record.verdict != agreed_verdict(record.verdict, outcome):
        changes["verdict"] = outcome
        if outcome in ("failed", "error") and record.failure is None and excinfo is not None:
            failure = failure_of(item, excinfo)
            changes["failure"] = failure
            changes["message"] = f"{record.message} | then {failure.text()}" if record.message else failure.text()
    if changes:
        record = dataclasses.replace(record, **changes)
    entry = (PROPERTY_NAME, json.dumps(record.to_dict(), sort_keys=True, default=str))
    report.user_properties.append(entry)
    if report.when != "teardown":  # the item's own list is what --junitxml reads, at teardown
        item.user_properties[:] = [p for p in item.user_properties if p[0] != PROPERTY_NAME] + [entry]


def _from_outcome(
    ident: Mapping[str, Any],
    outcome: str,
    report: pytest.TestReport,
    item: pytest.Item,
    excinfo: pytest.ExceptionInfo[BaseException] | None,
) -> ResultRecord:
    failure: Failure | None = None
    if outcome == "skipped" and isinstance(report.longrepr, tuple):
        message = str(report.longrepr[2]).removeprefix("Skipped: ")
    elif hasattr(report, "wasxfail"):
        message = str(report.wasxfail)
    elif excinfo is not None and outcome in ("failed", "error"):
        failure = failure_of(item, excinfo)
        message = failure.text()
    else:
        message = ""
    phase = "" if report.when == "call" else f"{report.when}: "
    if report.when == "teardown":
        ident = dict(ident, test=f"{ident['test']}@teardown")
    return make_record(ident, verdict=outcome, message=phase + message, failure=failure)


class MlaReport:
    """What the ``mla_report`` fixture gives a test: ``record(...)``, ``attach(record)``,
    ``pending(record)`` and ``outputs_dir``."""

    def __init__(self, node: pytest.Item, state: ReportState) -> None:
        self._node = node
        self._state = state

    @property
    def node(self) -> pytest.Item:
        """The running test."""
        return self._node

    @property
    def outputs_dir(self) -> Path | None:
        """Directory for saved outputs with ``--mla-save-outputs`` (created on first use), else None."""
        if not self._state.save_outputs:
            return None
        path = self._state.report_dir / "outputs"
        path.mkdir(parents=True, exist_ok=True)
        return path

    def attach(self, record: ResultRecord | Mapping[str, Any]) -> None:
        """Attach the running test's record (one per test; a later one replaces an earlier one).

        A mapping is validated into a record here; the record stays an object until the test's phase
        ends, when :func:`complete_report` gives it pytest's outcome and serialises it once."""
        if isinstance(record, Mapping):
            data = dict(record)
            data.setdefault("verdict", "error")  # until the test ends: then pytest's outcome
            for name in ("case_id", "backend"):
                if not data.get(name) and not (name == "case_id" and data.get("relation")):
                    raise ValueError(f"mla_report.attach: record lacks {name!r}")
            try:
                record = ResultRecord.from_dict(data)
            except RecordError as exc:
                raise ValueError(f"mla_report.attach: {exc}") from exc
        elif not isinstance(record, ResultRecord):
            raise TypeError(f"mla_report.attach expects a ResultRecord or a dict, got {type(record).__name__}")
        if not record.test:
            record = dataclasses.replace(record, test=self._node.nodeid)
        self._node.stash[ATTACHED] = record
        props = self._node.user_properties
        props[:] = [p for p in props if p[0] not in (*JUNIT_FIELDS, *JUNIT_METRICS)]  # a replaced record's go
        props.extend((name, getattr(record, name)) for name in JUNIT_FIELDS if getattr(record, name) is not None)
        props.extend((name, record.metrics[name]) for name in JUNIT_METRICS if name in (record.metrics or {}))

    def pending(self, record: ResultRecord) -> None:
        """Keep ``record`` for the test, to be used only if the test ends failing."""
        self._node.stash[PENDING] = record

    def conclude(self, record: ResultRecord, outcome: Outcome, message: str, *, pending: bool = False) -> None:
        """The one way an MLA test ends: its record attached (``pending``: kept for the test only if it
        ends failing), then pytest's outcome from it: an xfail, a loud warning for an unexpected pass
        (a known deviation that did not reproduce), or a failure without a traceback."""
        (self.pending if pending else self.attach)(record)
        if outcome == "xfailed":
            pytest.xfail(message)
        if outcome == "xpassed":
            warnings.warn(UnexpectedPassWarning(message), stacklevel=2)
        if outcome == "failed":
            pytest.fail(message, pytrace=False)


class UnexpectedPassWarning(UserWarning):
    """A known deviation did not reproduce: confirm it and update judge/known_deviations.toml."""


def _iso(timestamp: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S%z", time.localtime(timestamp))


class Collector:
    """Controller-only hooks: gather records from reports, write files, print the summary."""

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
        earlier, kept, torn = resumable(state.report_dir, self.run_document(None, "in_progress"), skip=unnamed)
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
        return f"{said}; {torn}" if torn else said

    def pytest_collectreport(self, report: pytest.CollectReport) -> None:
        """Count failed collections (xdist forwards its workers'): the run ends ``collection_error``."""
        if report.failed:
            self.state.collection_errors += 1

    def pytest_collection_finish(self, session: pytest.Session) -> None:
        """Without xdist: the selected MLA tests, each with its identity (for a record if it never runs)."""
        self.state.selected.update({item.nodeid: identity(item) for item in session.items if is_mla_item(item)})
        self._claim_for_selection()

    @pytest.hookimpl(optionalhook=True)
    def pytest_xdist_node_collection_finished(self, node: Any, ids: list[str]) -> None:
        """Under xdist: the selected MLA tests, as every worker collected them (before any test runs)."""
        self.state.selected.update({nodeid: None for nodeid in ids if is_mla_nodeid(nodeid, self.config.rootpath)})
        self._claim_for_selection()

    def _claim_for_selection(self) -> None:
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

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        """Take the record of every report pytest counts; make one for a crashed worker's test."""
        state = self.state
        for name, value in report.user_properties:
            if name == IDENTITY_NAME:
                state.identities[report.nodeid] = json.loads(str(value))
                state.setup_seen[report.nodeid] = time.time()
        if not counts_for_pytest(report):
            return
        found = False
        outcome = outcome_of_report(report)
        for name, value in report.user_properties:
            if name == PROPERTY_NAME:
                record: Record = json.loads(str(value))
                record["verdict"] = agreed_verdict(str(record.get("verdict")), outcome)  # pytest's counts
                self._keep(record)
                found = True
        if found or report.nodeid in state.selected or report.nodeid in state.identities:
            state.ran.add(report.nodeid)  # an MLA test, or any test that attached a record
        if found or report.when == "teardown":
            return
        ident = state.identities.get(report.nodeid)
        if str(report.when) == "???":  # xdist: the worker died while running this test
            ident = ident or identity_from_nodeid(report.nodeid, self._backend_labels())
            seen = state.setup_seen.get(report.nodeid)
            made = crash_record(
                ident, report, None if seen is None else time.time() - seen, self._timeout(), self._timeout_method()
            )
        elif ident is not None:  # an MLA test whose record got lost on the way: never silently
            failure = Failure("exception", "", short_text(str(report.longrepr or "")), "")
            made = make_record(
                ident,
                verdict=outcome,
                message=failure.text(),
                failure=failure if outcome in ("failed", "error") else None,
            )
        else:
            return
        self._keep(made.to_dict())

    def _keep(self, record: Record) -> None:
        """A test's record: gathered for the end, and journaled now (a hard end keeps it).  It replaces a
        'never ran' record its test got when a stop's accounting came before its report."""
        test = record.get("test")
        self.state.records[:] = [r for r in self.state.records if not (r.get("test") == test and is_never_ran(r))]
        self.state.records.append(record)
        try:
            self.directory.append(record)
        except OSError as exc:  # a full disk: the end's write says it again, and fails the run
            self.state.problems.append(f"the journal {self.directory.path / rundir.RESULTS_FILE}: {exc}")

    def _backend_labels(self) -> dict[str, str]:
        """Selection name -> record label of the run's backends (as far as the controller knows)."""
        labels = {name: label for name, label in BACKEND_LABELS.items()}
        for entry in self.state.run_info.get("backends") or []:
            if isinstance(entry, Mapping) and entry.get("name"):
                labels.setdefault(str(entry["name"]), str(entry.get("label") or entry["name"]))
                if entry.get("resolved"):
                    labels.setdefault(str(entry["resolved"]), str(entry["resolved"]))
        for ident in self.state.identities.values():  # names seen in other tests' ids
            test = str(ident.get("test", ""))
            for name in list(labels):
                if test.endswith(f"-{name}]"):
                    labels[name] = str(ident.get("backend") or labels[name])
        return labels

    def _timeout_method(self) -> str:
        """pytest-timeout's method of this run ('' without the plugin)."""
        if not self.config.pluginmanager.hasplugin("timeout"):
            return ""
        method = self.config.getoption("timeout_method", None) or self._ini("timeout_method")
        return str(method or os.environ.get("PYTEST_TIMEOUT_METHOD") or "signal")

    def _timeout(self) -> float | None:
        """The run's per-test timeout: --timeout or the ini value if given, else --mla-timeout."""
        for value in (
            self.config.getoption("timeout", None),
            self._ini("timeout"),
            self.config.getoption("mla_timeout", None),
        ):
            try:
                if value:
                    return float(value)
            except (TypeError, ValueError):
                continue
        return None

    def _ini(self, name: str) -> Any:
        try:
            return self.config.getini(name)
        except ValueError:  # pytest-timeout not installed
            return None

    def pytest_sessionfinish(self, session: pytest.Session, exitstatus: int) -> None:
        """Account for every selected test, then complete run.json; fail a run that cannot pass.  The
        status pytest will exit with is kept for the run's last line (pytest hands the terminal summary
        the status from before this hook)."""
        try:
            self.finish_run(session, exitstatus)
        finally:
            self.state.exit_status = int(session.exitstatus)

    def finish_run(self, session: pytest.Session, exitstatus: int) -> None:
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
        status = "complete" if config.option.collectonly else self.final_status(exitstatus)
        if empty:
            status = "no_tests"
        failing = state.resume and any(aggregate.verdict(r) in ("failed", "error") for r in state.records)
        if (state.problems or failing) and session.exitstatus == pytest.ExitCode.OK:
            session.exitstatus = pytest.ExitCode.TESTS_FAILED  # a resumed run's earlier failures count
        if not state.claimed and not state.records:
            return
        ordered = records.sort_records(state.records)
        try:
            self.directory.finish(ordered, self.run_document(time.time(), status))
        except (OSError, safeio.ReportFileError) as exc:  # a planted link, a full disk: say so, fail the run
            state.problems.append(f"the report could not be written: {exc}")
            session.exitstatus = pytest.ExitCode.TESTS_FAILED

    def final_status(self, exitstatus: int) -> str:
        """run.json's last status: what stopped the run when something did (docs/reports.md, statuses)."""
        state = self.state
        status = self.account_for_unrun(exitstatus)
        if exitstatus == pytest.ExitCode.INTERNAL_ERROR:
            state.problems.append("pytest stopped with an internal error (its INTERNALERROR lines say where)")
            return "internal_error"
        if state.collection_errors:
            state.problems.append(f"{state.collection_errors} error(s) during collection: the selection is not whole")
            return "collection_error"
        timed_out = any((record.get("failure") or {}).get("kind") == "timeout" for record in state.records)
        return "timed_out" if status in ("crashed", "interrupted") and timed_out else status

    def account_for_unrun(self, exitstatus: int) -> str:
        """A record for every selected test that never ran, and the run's final status."""
        state = self.state
        recorded = {record.get("test") for record in state.records}  # a record that came without its count
        unrun = [nodeid for nodeid in state.selected if nodeid not in state.ran and nodeid not in recorded]
        interrupted = exitstatus == pytest.ExitCode.INTERRUPTED
        if not unrun:
            return "interrupted" if interrupted else "complete"
        crashed = any((record.get("failure") or {}).get("kind") == "crash" for record in state.records)
        status = "crashed" if crashed and not interrupted else "interrupted"
        why = {
            "interrupted": "the session was interrupted or stopped before it ran",
            "crashed": "xdist stopped restarting crashed workers before it ran",
        }[status]
        labels = self._backend_labels()
        for nodeid in unrun:
            ident = state.selected[nodeid] or state.identities.get(nodeid) or identity_from_nodeid(nodeid, labels)
            failure = Failure("not_run", "", f"never ran: {why}", "")
            state.records.append(make_record(ident, verdict="error", message=failure.text(), failure=failure).to_dict())
        state.problems.append(f"{len(unrun)} of {len(state.selected)} selected MLA tests never ran: {why}")
        return status

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        from mlaconf.reports import summary

        if self.state.records:
            summary.write_terminal(terminalreporter, records.sort_records(self.state.records), self.state.report_dir)
        if self.state.problems:
            terminalreporter.section("MLA run cannot pass", red=True)
            for line in self.state.problems:
                terminalreporter.line(f"ERROR: {line}", red=True)

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
                "started": state.started_text or _iso(state.started),
                "finished": None if finished is None else _iso(finished),
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
                "invocation_dir": str(config.invocation_params.dir),
            }
            | run_state.to_dict()
        )
        if state.resumed:
            doc["resumed"] = state.resumed
        return doc
