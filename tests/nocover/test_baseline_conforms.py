"""The emulated ATB-precision baseline passes the default policy on every shipped small case.

If it did not, the policy (or an input distribution) would be stricter than ATB's own rounding
path and would fail a correct kernel: the suites' "never fail a correct implementation" promise.
The goldens are the session's shared ones (the baseline is part of the stored golden), so smoke's are the
files every other smoke run of the session reads, not computed again here.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from mlaconf.golden.building.generate import build_golden
from mlaconf.golden.building.stats import ErrorStats
from mlaconf.golden.specs.spec import CaseSpec
from mlaconf.golden.specs.suites import load_suites
from mlaconf.golden.store.directory import GoldenStore
from mlaconf.judge.policy import load_policies
from mlaconf.judge.verdict import verdict_context
from tests.goldens import baseline_metrics

CASES = [c for c in load_suites(["smoke", "edge"])]


@pytest.mark.parametrize("spec", CASES, ids=[c.case_id for c in CASES])
def test_emulated_baseline_meets_the_default_policy(spec: CaseSpec, shared_golden: Path) -> None:
    golden = GoldenStore(str(shared_golden), builder=build_golden).ensure(spec)
    baseline = ErrorStats.from_dict(golden.baseline_stats)
    metrics = baseline_metrics(golden)
    policy = load_policies().resolve("default", "emulated-baseline", spec.dtype, spec.mask_name, spec.case_id)
    verdict = policy.evaluate(metrics, baseline, verdict_context(golden, golden.baseline_out, policy))
    assert verdict.passed, f"{spec.case_id}: ATB's own precision path fails: {verdict.summary()}"
    assert verdict.worst_slack < 0.95, f"{spec.case_id}: less than 5% headroom: {verdict.summary()}"
