"""Result records on their way to the report: attached in tests, completed per test, gathered on
the controller.

Every test of the MLA suites (:func:`mlaconf.runner.identity.is_mla_test`) ends with exactly
one :class:`mlaconf.reports.records.ResultRecord`:

* the suites attach one through the ``mla_report`` fixture when they reach a verdict;
* :func:`complete_report` (the process that ran the test, worker or not) makes one from pytest's
  outcome when the test ended without one (a skip, an exception outside the verdict path, a
  timeout), and sets every record's verdict to pytest's outcome, so the report's counts are
  pytest's;
* the controller's :class:`RecordGatherer` makes one for a test whose xdist worker died under it
  (``worker 'gw0' crashed while running ...``), from the identity the worker sent with the test's
  setup report.

Records travel inside ``TestReport.user_properties`` (the one channel xdist already ships from
workers to the controller), so the controller alone gathers them, and hands each to the run
(:class:`mlaconf.runner.run_directory.Run`): it owns the report directory (claim, journal,
resume, run.json's status, the last writes).  Which tests are MLA tests is
:func:`mlaconf.runner.identity.is_mla_test`'s one rule.
"""

from __future__ import annotations

import dataclasses
import gc
import json
import os
import time
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from mlaconf.reports import records
from mlaconf.reports.records import PROPERTY_NAME, Failure, Record, RecordError, ResultRecord
from mlaconf.runner.applicability import declared_reason
from mlaconf.runner.ending import RecordOutcome, failure_ending, never_ran_record
from mlaconf.runner.failures import crash_failure, failure_of, short_text, worker_exit_status
from mlaconf.runner.identity import BACKEND_LABELS, identity, identity_from_nodeid, is_mla_test, is_mla_test_id
from mlaconf.runner.run_directory import ReportState, Run, is_never_ran

if TYPE_CHECKING:
    pass

#: Scalar record fields also attached as plain properties, so ``--junitxml`` shows them.
JUNIT_FIELDS = ("verdict", "worst_slack", "policy", "backend")
JUNIT_METRICS = ("max_rel_err", "rmse")
#: user_properties name of a test's identity, sent with its setup report (for crash records).
IDENTITY_NAME = "mla_identity"


#: A record a test wants attached only if it ends failing (property tests: the last failing
#: example, which hypothesis replays last, is the shrunk one).
PENDING = pytest.StashKey[ResultRecord]()
#: The record a test attached, kept as the object until its phase ends (then serialised once).
ATTACHED = pytest.StashKey[ResultRecord]()
#: Goldens this process's store rebuilt (damaged or stale) since the last test's record took them: case id -> why
#: (:class:`mlaconf.runner.run_store.RunStore`).
REBUILT = pytest.StashKey[dict[str, str]]()


def has_record(item: pytest.Item) -> bool:
    """Whether a test attached a record through ``mla_report`` (an MLA test or not)."""
    return ATTACHED in item.stash or PENDING in item.stash


def outcome_of_report(report: pytest.TestReport) -> RecordOutcome:
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
    rebuilt = item.config.stash.get(REBUILT, None)
    if rebuilt and report.when != "teardown":  # the goldens this test rebuilt: its record says so
        changes["golden_rebuilt"] = {**(record.golden_rebuilt or {}), **rebuilt}
        rebuilt.clear()
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
    outcome: RecordOutcome,
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
    return failure_ending(outcome, phase + message, failure).record(ident)


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

    def conclude(self, record: ResultRecord, outcome: RecordOutcome, message: str, *, pending: bool = False) -> None:
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


def end_workers(config: pytest.Config) -> None:
    """End the session's xdist workers at once (execnet's own ``Group.terminate``, with no grace before its
    kill).  After a stop a worker finishes the test it is running (``LeaveToTheController``) and xdist's
    teardown waits up to 10 s for it, while the controller records nothing after the stop: that wait only
    delayed the interrupted report (docs/reports.md, "Stopping and resuming", has the seconds)."""
    nodes = getattr(config.pluginmanager.getplugin("dsession"), "nodemanager", None)
    group = getattr(nodes, "group", None)
    if group is not None:
        group.terminate(timeout=0)


class RecordGatherer:
    """Controller-only hooks: gather every MLA test's record from pytest's reports (making one for a test
    whose worker crashed or that never ran) and hand each to the run, which owns the report directory
    (:class:`mlaconf.runner.run_directory.Run`); print the summary."""

    def __init__(self, config: pytest.Config, state: ReportState) -> None:
        self.config = config
        self.state = state
        self.run = Run(config, state)

    def pytest_collectreport(self, report: pytest.CollectReport) -> None:
        """Count failed collections (xdist forwards its workers'): the run ends ``collection_error``."""
        if report.failed:
            self.state.collection_errors += 1

    def pytest_collection_finish(self, session: pytest.Session) -> None:
        """Without xdist: the selected MLA tests, each with its identity (for a record if it never runs)."""
        self.state.selected.update({item.nodeid: identity(item) for item in session.items if is_mla_test(item)})
        self.run.claim_for_selection()

    @pytest.hookimpl(optionalhook=True)
    def pytest_xdist_node_collection_finished(self, node: Any, ids: list[str]) -> None:
        """Under xdist: the selected MLA tests, as every worker collected them (before any test runs)."""
        self.state.selected.update({nodeid: None for nodeid in ids if is_mla_test_id(nodeid, self.config.rootpath)})
        self.run.claim_for_selection()

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
            elapsed = None if seen is None else time.time() - seen
            status = worker_exit_status(getattr(report, "node", None))
            message, failure = crash_failure(report, elapsed, self._timeout(), self._timeout_method(), status)
            made = failure_ending("failed", message, failure).record(ident)
        elif ident is not None:  # an MLA test whose record got lost on the way: never silently
            failure = Failure("exception", "", short_text(str(report.longrepr or "")), "")
            made = failure_ending(outcome, failure.text(), failure if outcome in ("failed", "error") else None).record(
                ident
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
        self.run.journal(record)

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
            self.run.end(session, exitstatus, self.account_for_unrun)
        finally:
            self.state.exit_status = int(session.exitstatus)

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
            state.records.append(never_ran_record(ident, why).to_dict())
        state.problems.append(f"{len(unrun)} of {len(state.selected)} selected MLA tests never ran: {why}")
        return status

    def pytest_keyboard_interrupt(self, excinfo: pytest.ExceptionInfo[BaseException]) -> None:
        """A stopped run's xdist workers are ended now, before its report is written, not waited for; and the
        objects the session made so far are frozen out of the garbage collector: pytest's five full collections
        at its end (for unraisable exceptions) would walk everything torch's import made again (a second on 2
        cores), while the stopped run has only its report left to write."""
        if excinfo.errisinstance(KeyboardInterrupt):
            end_workers(self.config)
            gc.freeze()

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        from mlaconf.reports import summary

        if self.state.records:
            summary.write_terminal(terminalreporter, records.sort_records(self.state.records), self.state.report_dir)
        if self.state.problems:
            terminalreporter.section("MLA run cannot pass", red=True)
            for line in self.state.problems:
                terminalreporter.line(f"ERROR: {line}", red=True)
