"""The likely-cause catalogue names the planted mistake, and nothing for a correct or uncatalogued one."""

from __future__ import annotations

import functools

import pytest

from mlaconf.golden.building.generate import build_golden
from mlaconf.golden.specs.spec_build import build_case
from mlaconf.golden.specs.types import GoldenCase
from mlaconf.harness import defects
from mlaconf.judge.causes import likely_cause
from mlaconf.runner.execution import execute, make_call

#: defect -> the catalogue entry that must explain it (None: a correct path or a mistake outside the catalogue)
EXPECTED = {
    "control_math": None,
    "causal_top_left": "causal_top_left",
    "scale_ignored": "scale_ignored",
    "scale_twice": "scale_twice",
    "rope_dropped": "rope_dropped",
    "gqa_modulo": "gqa_modulo",
    "one_key_short": "last_key_dropped",
    "padded_as_packed": "padded_as_packed",
    "prefix_tail_dropped": "prefix_rounded_to_tile",
    "p_fp8": None,
    "batch_swap": None,
}


@functools.cache
def golden() -> GoldenCase:
    """Two CAUSAL batches with prefixes (one not a multiple of 128), GQA, padded kv with spare capacity."""
    raw = {
        "q_seqlen": [24, 9],
        "kv_seqlen": [160, 40],
        "head_num": 4,
        "kv_head_num": 2,
        "mask_type": "CAUSAL",
        "kv_layout": "padded",
        "kv_capacity": 192,
    }
    return build_golden(build_case(raw, source="test_causes"))


@pytest.mark.parametrize("defect", sorted(EXPECTED))
def test_likely_cause_names_the_planted_mistake(defect: str) -> None:
    case = golden()
    out = execute(getattr(defects, defect)(), make_call(case.inputs, case.spec), case.spec).out
    cause = likely_cause(case, out)
    assert (cause.name if cause else None) == EXPECTED[defect]
    if cause is not None:
        assert cause.sentence().startswith("output matches the golden with ")
        assert cause.error * 30 <= cause.true_error
