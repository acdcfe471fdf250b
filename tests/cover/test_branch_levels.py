"""The levels read from ATB's branches (facts/factors.toml): each classified by its rule, settled (the shipped covering
sets target them), drawn as its level promises (NaN padding, shifted logits, raw products past fp16), held by the
branches suite, and given the outcome on ATB the suite file states."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from mlaconf.facts.factors import load_model
from mlaconf.facts.operator import FP16_MAX
from mlaconf.golden.building.inputs import generate_inputs
from mlaconf.golden.coverage.levels import batch_rows, case_levels, cheapest_lengths
from mlaconf.golden.specs.layout import causal_offset, kv_starts, kv_views, q_views
from mlaconf.golden.specs.spec import CaseSpec
from mlaconf.golden.specs.spec_build import build_case
from mlaconf.golden.specs.suites import load_suites
from mlaconf.judge.deviations import has_prefix_not_mod128, load_deviations

MODEL = load_model()
BRANCHES = load_suites(["branches"])


def case(**fields: Any) -> CaseSpec:
    return build_case({"head_num": 2, "q_seqlen": [16], "seed": 2, **fields}, source="test")


def test_per_batch_levels_of_stacks_and_tiles() -> None:
    spec = case(mask_type="causal", kv_layout="padded", q_seqlen=[256, 5, 385, 100], kv_seqlen=[768, 5, 385, 612])
    rows = [(r["q_len"], r["kv_len"]) for r in batch_rows(spec)]
    assert rows[0][0] >= {"mod128_0"} and not rows[0][0] & {"single_tile", "mod16_tail", "mod128_1_long"}
    assert rows[0][1] >= {"stack256", "several_blocks"} and "stack_over256" not in rows[0][1]
    assert rows[1][0] >= {"single_tile", "lt16"} and rows[1][1] >= {"single_block", "stack_tail_short"}
    assert rows[2][0] >= {"mod128_1_long", "mod16_tail"} and rows[2][1] >= {"stack_over256", "several_blocks"}
    assert rows[3][0] >= {"single_tile", "mod16_tail"} and rows[3][1] == {"not_mult16", "several_blocks"}


@pytest.mark.parametrize(
    ("fields", "factor", "levels"),
    [
        ({"q_seqlen": [0, 4, 3]}, "batch", {"many", "empty_row", "empty_first"}),
        ({"q_seqlen": [4, 3, 0]}, "batch", {"many", "empty_row", "empty_last"}),
        ({"q_seqlen": [4, 0, 3]}, "batch", {"many", "empty_row"}),
        ({"head_num": 1}, "heads", {"one"}),
        ({"head_num": 7}, "heads", {"few"}),
        ({"head_num": 64}, "heads", {"tp"}),
        ({"head_num": 128}, "heads", {"all"}),
        ({"q_seqlen": [9, 30, 0, 30]}, "batch_order", {"shorter_first"}),
        ({"q_seqlen": [30, 9, 30]}, "batch_order", {"shorter_first", "longer_first"}),
        ({"q_seqlen": [30, 30]}, "batch_order", set()),
        ({"head_num": 2, "q_seqlen": [129, 100]}, "tasks", {"few"}),  # 2 x 3 tiles
        ({"head_num": 16, "q_seqlen": [129, 1]}, "tasks", {"rounds"}),  # 16 x 3
        ({"head_num": 8, "q_seqlen": [129, 1]}, "tasks", set()),  # 24: one round on 24 cores, two on 20
        ({"qk_scale": 1.0}, "qk_scale", {"one"}),
        ({}, "qk_scale", {"default"}),
        ({"qk_scale": 0.125}, "qk_scale", {"fp16_exact"}),
        ({"qk_scale": 1e-4}, "qk_scale", {"tiny"}),
        ({"qk_scale": 0.1}, "qk_scale", set()),  # fp16-inexact, neither default nor tiny
        ({}, "logits", {"centred"}),
        ({"structure": {"logit_shift": -20.0}}, "logits", {"negative"}),
        ({"structure": {"logit_shift": 20.0}, "dtype": "bf16"}, "logits", set()),  # bf16's exp reaches 87
        ({"structure": {"logit_shift": 110.0}, "dtype": "bf16"}, "logits", {"positive"}),
        ({"structure": {"logit_shift": -20.0}, "distribution": "large_logits"}, "logits", set()),  # too wide
        ({}, "mask_fill", {"none"}),
        ({"mask_type": "mask_free"}, "mask_fill", {"neg10000"}),
        ({"mask_type": "mask_free", "dtype": "bf16"}, "mask_fill", {"one"}),
        ({"mask_type": "mask_free", "mask_fill": "neg_inf"}, "mask_fill", {"neg_inf"}),
        ({}, "padding", {"none"}),
        ({"q_seqlen": [4, 8], "kv_layout": "strided"}, "padding", {"garbage"}),
        ({"kv_capacity": 20, "padding": "nan"}, "padding", {"nan"}),
        ({"distribution": "large_raw_scores", "qk_scale": 1e-4}, "inputs", {"raw_overflow"}),
        ({"distribution": "large_raw_scores", "qk_scale": 5e-4}, "inputs", set()),
    ],
)
def test_case_levels_of_the_grown_factors(fields: dict[str, Any], factor: str, levels: set[str]) -> None:
    assert case_levels(case(**fields))[factor] == levels


#: The levels read from ATB's branches beside the factors that came with them (heads, batch_order, tasks, qk_scale,
#: logits, mask_fill, padding).
GROWN_FACTORS = ("heads", "batch_order", "tasks", "qk_scale", "logits", "mask_fill", "padding")
GROWN_LEVELS = {
    "kv_layout": ("strided", "padded_full", "padded_short_before_last", "padded_over_capacity", "packed_spare"),
    "batch": ("empty_first", "empty_last"),
    "q_len": ("single_tile", "mod16_tail", "mod128_1_long"),
    "kv_len": ("single_block", "several_blocks", "stack256", "stack_over256", "stack_tail_short"),
    "inputs": ("raw_overflow",),
}


def test_the_grown_levels_are_settled_and_targeted() -> None:
    """No level waits: the settled model is the model, and the lengths the covering generator picks from hold the
    grown per-batch levels."""
    assert MODEL.pending == () and MODEL.settled() == MODEL
    atoms = cheapest_lengths()
    for factor, index in (("q_len", 0), ("kv_len", 1)):
        assert set(GROWN_LEVELS[factor]) <= {atom[index] for atom in atoms}


def test_the_branches_suite_holds_every_grown_level() -> None:
    held = [case_levels(spec) for spec in BRANCHES if spec.expect_error is None]
    wanted = [(f, lv) for f in GROWN_FACTORS for lv in MODEL.factor(f).level_names]
    wanted += [(f, lv) for f, levels in GROWN_LEVELS.items() for lv in levels]
    assert [(f, lv) for f, lv in wanted if not any(lv in levels[f] for levels in held)] == []


def test_nan_padding_fills_only_the_rows_no_batch_reads() -> None:
    for fields in (
        {"q_seqlen": [3, 8, 2], "kv_layout": "padded"},
        {"q_seqlen": [3, 8, 2], "kv_layout": "strided"},
        {"q_seqlen": [3, 8], "kv_capacity": 20},
    ):
        spec = case(padding="nan", **fields)
        inputs = generate_inputs(spec)
        for tensor in (inputs.k, inputs.k_rope, inputs.v):
            rows = tensor.reshape(spec.kv_rows, -1).astype(np.float64)
            read = np.zeros(spec.kv_rows, dtype=bool)
            for start, length in zip(kv_starts(inputs, spec), spec.kv_seqlen, strict=True):
                read[start : start + length] = True
            assert np.isfinite(rows[read]).all() and np.isnan(rows[~read]).all() and (~read).any()


def _logits(spec: CaseSpec, batch: int = 0) -> np.ndarray:
    """The batch's scaled logits ``[H, q, kv]`` in float64 from the drawn inputs, masked keys -inf."""
    inputs = generate_inputs(spec)
    qn, qr = (x.astype(np.float64) for x in q_views(inputs, spec))
    start = sum(spec.q_seqlen[:batch])
    q = np.concatenate([qn, qr], axis=2)[start : start + spec.q_seqlen[batch]]
    kn, kr, _ = (x.astype(np.float64) for x in kv_views(inputs, spec, batch))
    raw = np.einsum("ihd,jhd->hij", q, np.concatenate([kn, kr], axis=2))
    offset = causal_offset(spec, batch)
    if offset is not None:
        rows, cols = np.arange(raw.shape[1])[:, None], np.arange(raw.shape[2])[None, :]
        raw = np.where(cols <= rows + offset, raw, -np.inf)
    logits: np.ndarray = raw * spec.qk_scale
    return logits


@pytest.mark.parametrize(("dtype", "shift"), [("fp16", -20.0), ("fp16", 20.0), ("bf16", -110.0), ("bf16", 110.0)])
def test_a_logit_shift_moves_every_visible_logit_past_its_level(dtype: str, shift: float) -> None:
    spec = case(dtype=dtype, mask_type="mask_free", q_seqlen=[40], structure={"logit_shift": shift})
    logits = _logits(spec)
    visible = logits[np.isfinite(logits)]
    level = {"fp16": 14.0, "bf16": 87.0}[dtype]
    assert (visible < -level).all() if shift < 0 else (visible > level).all()
    assert np.abs(visible - shift).max() < 4.0  # the random part rides on the shift


def test_large_raw_scores_overflow_fp16_where_the_logits_stay_moderate() -> None:
    """With qkScale 1e-4 the first key's raw product passes 65504 for every query row (so an fp16 score store
    overflows on every row), while the scaled logits stay within +-7.5 and spread."""
    spec = case(distribution="large_raw_scores", qk_scale=1e-4, q_seqlen=[50, 20], mask_type="causal",
                kv_layout="padded", kv_seqlen=[90, 20])  # fmt: skip
    for batch in range(2):
        logits = _logits(spec, batch)
        raw = logits / spec.qk_scale
        assert (raw[:, :, 0] > FP16_MAX).all()
        visible = logits[np.isfinite(logits)]
        assert np.abs(visible).max() < 7.5 and visible.std() > 2.0
    calm = _logits(case(distribution="large_raw_scores", qk_scale=5e-4, q_seqlen=[50]))
    assert np.abs(calm / 5e-4).max() < FP16_MAX / 4


def test_the_branches_suite_states_each_case_s_outcome_on_atb() -> None:
    """The deviations a run on ATB meets in the branches suite are the ones its comments name, no more: raw scores
    past fp16 on the fp16 kernel, a 0/1 fill added, a negative fill multiplied, padded kv S > max kv, and CAUSAL
    through the C interface, padded kv read at the kv lengths' offsets."""
    deviations = load_deviations()
    found: dict[str, set[str]] = {}
    for spec in BRANCHES:
        for entry in deviations.candidates("atb", "8.3.RC1", spec):
            found.setdefault(entry.id, set()).add(spec.case_id)
    expected = {
        "atb-fp16-raw-scores-overflow": lambda s: (
            s.dtype == "fp16" and s.mask_type != 3 and s.distribution == "large_raw_scores" and s.qk_scale < 2e-4
        ),
        "atb-mask-free-fill-one-added": lambda s: s.dtype == "fp16" and s.mask_fill == "one",
        "atb-mask-free-fill-negative-multiplied": lambda s: s.dtype == "bf16" and (s.mask_fill or "").startswith("neg"),
        "atb-padded-kv-capacity": lambda s: s.kv_layout == "padded" and s.padded_rows > s.max_kv,
        "atb-padded-kv-ragged": lambda s: s.kv_layout == "padded" and s.mask_type != 3 and s.q_seqlen == (90, 20, 150),
        "atb-c-causal-in-tensor-num": lambda s: s.mask_type == 3,
        "atb-causal-prefix-not-128": lambda s: s.mask_type == 3 and has_prefix_not_mod128(s),
    }
    assert set(found) == set(expected)
    for name, rule in expected.items():
        assert found[name] == {s.case_id for s in BRANCHES if rule(s)}, name
    assert len(found["atb-fp16-raw-scores-overflow"]) == 2 and len(found["atb-mask-free-fill-one-added"]) == 1
