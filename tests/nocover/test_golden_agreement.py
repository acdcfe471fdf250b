"""On every shipped case the fused golden agrees with the unfused
float64 formula to 1e-12 relative (tests/agreement.py defines the scale).  smoke, edge and standard
run with the slow tests (about a minute on 2 cores); deepseek (19 TFLOP, twice) is a soak test:
``pytest -m soak tests/nocover/test_golden_agreement.py``."""

from __future__ import annotations

import pytest

from mlaconf.golden.specs.spec import CaseSpec
from mlaconf.golden.specs.suites import load_suites
from tests.agreement import AGREEMENT, worst_disagreement


@pytest.mark.parametrize("spec", load_suites(["smoke", "edge", "standard"]), ids=lambda s: s.case_id)
def test_fused_golden_agrees_on_shipped_case(spec: CaseSpec) -> None:
    assert worst_disagreement(spec) <= AGREEMENT


@pytest.mark.soak
@pytest.mark.parametrize("spec", load_suites(["deepseek"]), ids=lambda s: s.case_id)
def test_fused_golden_agrees_on_deepseek_case(spec: CaseSpec) -> None:
    assert worst_disagreement(spec) <= AGREEMENT
