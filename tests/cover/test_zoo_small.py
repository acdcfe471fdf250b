"""A small matrix: correct paths on short sequences pass the default policy.

fp16/bf16 x maskType 0/2 x q_seqlen 1, 2, 3, 5, 8 x seeds 1-5, one head: under the former default
(atb + benchmark deciding on any sample) a correct path with P rounded to the input dtype failed 6 of
these 100 cases on the benchmark ratios.  Every zoo member must pass them all, and a planted error
of a few rounding steps in one element must still fail (the rule keeps its power on short rows).
"""

from __future__ import annotations

import numpy as np
import pytest

from mlaconf.golden.building.generate import build_golden
from mlaconf.golden.specs.spec import CaseSpec
from mlaconf.golden.specs.spec_build import build_case
from mlaconf.harness import zoo
from mlaconf.judge.policy import load_policies
from mlaconf.judge.systematic import TEMPERATURE_FLOOR
from mlaconf.judge.verdict import judge_output
from mlaconf.runner.execution import execute, make_call

POLICIES = load_policies()
SPECS = [
    build_case(dict(dtype=dtype, mask_type=mask, q_seqlen=[n], head_num=1, seed=seed), source="test_zoo_small")
    for dtype in ("fp16", "bf16")
    for mask in ("undefined", "mask_free")
    for n in (1, 2, 3, 5, 8)
    for seed in range(1, 6)
]
MEMBERS = [getattr(zoo, name)() for name in zoo.ZOO]


@pytest.mark.parametrize("spec", SPECS, ids=[f"{s.case_id}-seed{s.seed}" for s in SPECS])
def test_every_zoo_member_passes_short_rows(spec: CaseSpec) -> None:
    golden = build_golden(spec)
    for member in MEMBERS:
        out = execute(member, make_call(golden.inputs, spec), spec).out
        _, verdict = judge_output(golden, out, POLICIES, "default", member.name)
        assert verdict.passed, f"{spec.case_id} seed {spec.seed} [{member.name}]: {verdict.summary()}"
        assert verdict.worst_slack < 0.8, f"{spec.case_id} seed {spec.seed} [{member.name}]: {verdict.summary()}"
        assert all(not c.decisive for c in verdict.checks if c.rule == "benchmark")  # <= 1024 elements


@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
def test_a_few_rounding_steps_in_one_element_still_fail(dtype: str) -> None:
    spec = build_case(dict(dtype=dtype, mask_type="mask_free", q_seqlen=[8], head_num=1), source="test_zoo_small")
    golden = build_golden(spec)
    out = execute(MEMBERS[0], make_call(golden.inputs, spec), spec).out
    bad = out.copy().reshape(-1)
    flat = bad.astype(np.float64)
    index = int(np.argmax(np.abs(golden.out.reshape(-1))))  # the largest |g|: the loosest element
    step = 2.0**-10 if dtype == "fp16" else 2.0**-7  # one ulp at |g| in [1, 2)
    bad[index] = flat[index] + 6 * step * max(1.0, abs(flat[index]))
    _, verdict = judge_output(golden, bad.reshape(out.shape), POLICIES, "default", "planted")
    assert not verdict.passed, verdict.summary()
    assert [c.rule for c in verdict.failing] == ["model"]


def test_split_kv_partials_snapped_to_one_key_are_not_a_temperature_error() -> None:
    """Four or five keys per split part with logits within +-7 and raw scores past fp16's range: each part's
    softmax is dominated by one key, so ``split_rounded``'s fp16 partials snap to that key's V, a sharper softmax
    on every row (z far over its critical value).  Its effect along T stays under the materiality floor, while
    that bias is above the former floor 0.05 (a false alarm on a correct split-KV path)."""
    spec = build_case(
        dict(dtype="fp16", mask_type="causal", q_layout="3d", kv_layout="padded", head_num=128, kv_head_num=1, seed=1,
             q_seqlen=[1, 17], kv_seqlen=[16, 17], kv_capacity=33, distribution="large_raw_scores", qk_scale=1e-4),
        source="test_zoo_small",
    )  # fmt: skip
    golden = build_golden(spec)
    out = execute(zoo.split_rounded(), make_call(golden.inputs, spec), spec).out
    _, verdict = judge_output(golden, out, POLICIES, "default", "split_rounded")
    assert verdict.passed, verdict.summary()
    found = {c.metric: c for c in verdict.checks if c.rule == "systematic"}
    effect, z = found["temperature_effect"], found["temperature_z"]
    assert z.value > z.bound and 0.05 < effect.value < TEMPERATURE_FLOOR / 2, verdict.summary()
