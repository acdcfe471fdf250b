"""Numerical conformance: every selected case on every selected backend, judged against its golden.

Run with ``--mla-suite``, ``--mla-backend``, ``--mla-policy``; one test per case x backend.
"""

from __future__ import annotations

import pytest

from mlaconf.golden.specs.spec import CaseSpec
from mlaconf.golden.store.directory import GoldenStore
from mlaconf.harness.backend import Backend
from mlaconf.judge.deviations import DeviationSet
from mlaconf.judge.policy import PolicySet
from mlaconf.runner.conformance import run_case, save_output
from mlaconf.runner.ending import end
from mlaconf.runner.identity import policy_name
from mlaconf.runner.recording import MlaReport

pytestmark = pytest.mark.conformance


def test_conformance(
    mla_conformance_case: CaseSpec,
    mla_backend: Backend,
    mla_golden_store: GoldenStore,
    mla_policy_set: PolicySet,
    mla_deviation_set: DeviationSet,
    mla_report: MlaReport,
    pytestconfig: pytest.Config,
) -> None:
    golden = mla_golden_store.ensure(mla_conformance_case)
    result = run_case(
        golden,
        mla_backend,
        policy_set=mla_policy_set,
        policy=policy_name(pytestconfig),
        deviations=mla_deviation_set,
        repeats=pytestconfig.getoption("mla_timing_repeats"),
        warmup=pytestconfig.getoption("mla_warmup"),
        reruns=pytestconfig.getoption("mla_repeat"),
        causes_for="all" if pytestconfig.getoption("mla_likely_cause") else "small",
    )
    if mla_report.outputs_dir is not None and result.output is not None:
        save_output(mla_report.outputs_dir, mla_conformance_case, mla_backend.name, result.output)
    end(mla_report, result.ending)
