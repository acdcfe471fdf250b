"""Error contract: every case of ``cases/errors.toml`` must be rejected with its documented status
at its documented stage (docs/operator.md §1-3), by backends that declare an error contract.

Where ATB releases differ, a case's ``expect_by_release`` gives the rejection of the backend's
release (``BackendInfo.version``).  Known deviations (``judge/known_deviations.toml``) turn a
predicted misbehaviour into an xfail and a documented rejection despite a deviation into an
unexpected-pass warning; an entry that predicts exactly the expected rejection is no deviation here.
"""

from __future__ import annotations

import pytest

from mlaconf.golden.specs.spec import CaseSpec
from mlaconf.harness.backend import Backend
from mlaconf.judge.deviations import DeviationSet
from mlaconf.runner.applicability import not_applicable
from mlaconf.runner.ending import end
from mlaconf.runner.perturb import judge_error_case
from mlaconf.runner.recording import MlaReport

pytestmark = pytest.mark.error_contract


def test_error_contract(
    mla_error_case: CaseSpec, mla_backend: Backend, mla_deviation_set: DeviationSet, mla_report: MlaReport
) -> None:
    if not mla_backend.error_contract:
        not_applicable(
            f"backend {mla_backend.name} declares no error contract (error_contract = False); "
            "only backends promising ATB's status codes are checked"
        )
    verdict = judge_error_case(mla_error_case, mla_backend, mla_deviation_set)
    end(mla_report, verdict.ending(mla_backend.info().device))
