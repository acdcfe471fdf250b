"""How a test of the MLA suites ends: the suites' machinery says what happened, one place names it.

The machinery (:func:`mlaconf.runner.conformance.run_case`, the error contract's
:func:`mlaconf.runner.perturb.judge_error_case`, the property test, the metamorphic relations) never
writes a test's identity nor makes a record: it returns an :class:`Ending`, the outcome, the message
and the evidence.  :meth:`Ending.record` is the one place an ending becomes a
:class:`~mlaconf.reports.records.ResultRecord`, given the test's identity; in a test, :func:`end`
takes the running test's identity (:func:`mlaconf.runner.identity.identity`) and ends the test with
the record (``mla_report.conclude``: attached, then pytest's outcome).  Outside pytest (``mlaconf
repro``, ``mlaconf power``) the caller names the test with :func:`mlaconf.runner.identity.make_identity`.
A test that reached no verdict ends the same way (:func:`failure_ending`: pytest's outcome, a crash), and
a selected test that never ran gets :func:`never_ran_record` (the controller's and a lost Ray shard's):
``Ending.record`` makes every record (tests/cover/test_one_ending.py).

:func:`verdict_evidence` writes a numeric verdict's evidence, once for every suite that judges an
output against its golden, so the failure text and the record name the same worst element.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, Protocol

import numpy as np

from mlaconf.judge.verdict import Outcome, error_map
from mlaconf.reports.records import Failure, ResultRecord, make_record
from mlaconf.runner.identity import identity

#: What a record says of a test: a judged outcome, or pytest's when the test reached no verdict.
RecordOutcome = Outcome | Literal["skipped", "error"]

if TYPE_CHECKING:
    import pytest

    from mlaconf.golden.specs.types import GoldenCase
    from mlaconf.judge.causes import Cause
    from mlaconf.judge.metrics import Metrics
    from mlaconf.judge.policy import Policy, Verdict


@dataclass(frozen=True)
class Ending:
    """What happened in one test, before it is named: its outcome, its message (one paragraph: the
    record's and the start of pytest's failure text) and its evidence (record fields beside the
    identity, verdict and message: checks, metrics, error ..., and a property example's case; validated
    when the record is made)."""

    outcome: RecordOutcome
    message: str
    evidence: Mapping[str, Any] = field(default_factory=dict)
    #: Said after the message in pytest's failure text only (a property's case to paste into a suite).
    note: str = ""

    def record(self, ident: Mapping[str, Any]) -> ResultRecord:
        """The test's record: its identity (:func:`mlaconf.runner.identity.make_identity`) plus this ending.
        The one place a record is made: a verdict's, pytest's outcome's, a crash's, a never-ran test's."""
        return make_record(ident, verdict=self.outcome, message=self.message, **self.evidence)


def failure_ending(outcome: RecordOutcome, message: str, failure: Failure | None) -> Ending:
    """The ending of a test that reached no verdict: pytest's outcome, its message and how it failed."""
    return Ending(outcome, message, {"failure": failure})


def never_ran_record(ident: Mapping[str, Any], why: str) -> ResultRecord:
    """The record of a selected test that never ran (a stopped session, xdist out of workers, a lost
    Ray shard): an error in the report's counts, so the run cannot pass."""
    failure = Failure("not_run", "", f"never ran: {why}", "")
    return failure_ending("error", failure.text(), failure).record(ident)


def verdict_evidence(
    golden: GoldenCase,
    out: np.ndarray,
    judged: tuple[Metrics, Verdict],
    resolved: Policy,
    *,
    failed: bool,
    cause: Cause | None = None,
) -> dict[str, Any]:
    """The evidence of ``out`` judged under ``resolved``: every check, the worst slack, the metrics,
    the failing checks, the overrides that applied, the element the verdict names and, when the test
    fails, where the error sits (an error map: only failing records carry one, records stay small)
    and the likely ``cause`` a caller found; for a sampled golden, which rows were judged and why
    (``judged_rows``: how many of how many, and how many per reason)."""
    metrics, verdict = judged
    emap = None
    if failed:
        model = None
        if "model" in resolved.params:
            dtype = golden.spec.dtype
            model = (resolved.param("model", "false_alarm", dtype), resolved.param("model", "safety", dtype))
        emap = error_map(golden, out, verdict.worst_check(), model)
    sampled = {} if golden.sample is None else {"judged_rows": golden.sample.summary(golden.spec.total_q)}
    return sampled | {
        "checks": tuple(c.to_dict() for c in verdict.checks),
        "worst_slack": float(verdict.worst_slack),
        "metrics": metrics.to_dict(),
        "failing": tuple(c.text() for c in verdict.failing),
        "overrides": tuple(o.to_dict() for o in verdict.overrides),
        "worst_element": verdict.worst.to_dict() if verdict.worst is not None else None,
        "error_map": emap,
        "likely_cause": cause.to_dict() if cause else None,
    }


def side_failure(side: str, verdict: Verdict) -> dict[str, Any]:
    """A metamorphic side's conformance failure (a ``conformance_failures`` entry): which side, its
    worst slack and its verdict's summary."""
    return {"side": side, "worst_slack": float(verdict.worst_slack), "summary": verdict.summary()}


class RunningTest(Protocol):
    """What ending a test needs of the ``mla_report`` fixture (:class:`mlaconf.runner.recording.MlaReport`):
    the running test, and the way it concludes."""

    @property
    def node(self) -> pytest.Item: ...

    def conclude(
        self, record: ResultRecord, outcome: RecordOutcome, message: str, *, pending: bool = False
    ) -> None: ...


def named(report: RunningTest, ending: Ending) -> ResultRecord:
    """The running test's record of ``ending``: the test's identity added, the record made."""
    return ending.record(identity(report.node))


def end(report: RunningTest, ending: Ending, *, pending: bool = False) -> None:
    """End the running MLA test with ``ending``: its record attached (``pending``: kept only if the test
    ends failing, as hypothesis replays the shrunk example last), then pytest's outcome (an xfail, an
    unexpected-pass warning or a failure without a traceback; a pass returns)."""
    report.conclude(named(report, ending), ending.outcome, ending.message + ending.note, pending=pending)
