"""judge.systematic: the temperature projection and the format signature, on correct and wrong outputs."""

from __future__ import annotations

import dataclasses
import math

import ml_dtypes
import numpy as np
import pytest

from mlaconf.facts.operator import UNIT_ROUNDOFF
from mlaconf.golden.building.generate import build_golden
from mlaconf.golden.building.reference import reference_attention
from mlaconf.golden.specs.layout import kv_views, offsets, out_shape, q_views, visible_keys
from mlaconf.golden.specs.spec import CaseSpec
from mlaconf.golden.specs.spec_build import build_case
from mlaconf.golden.specs.suites import load_suites
from mlaconf.golden.specs.types import GoldenCase
from mlaconf.judge import systematic
from mlaconf.judge.metrics import round_to_dtype
from mlaconf.judge.policy import load_policies
from mlaconf.judge.systematic import (
    BASELINE_NOISE,
    FORMAT_FLOOR,
    NEAR_TIE_ULPS,
    TEMPERATURE_FLOOR,
    critical_value,
    format_check,
    logit_spans,
    near_tie_rows,
    temperature_check,
    variant_spread,
)
from mlaconf.judge.verdict import judge_output

ALPHA = 0.5e-6  # each test's share of the default false-alarm rate


def _case(**fields: object) -> CaseSpec:
    base: dict[str, object] = dict(q_seqlen=[96, 64], head_num=4, kv_layout="packed", seed=11)
    return build_case({**base, **fields}, source="test_systematic")


BF16 = _case(dtype="bf16", mask_type=0)
FP16 = _case(dtype="fp16", mask_type=2)


@pytest.fixture(scope="module")
def bf16_golden() -> GoldenCase:
    return build_golden(BF16)


@pytest.fixture(scope="module")
def fp16_golden() -> GoldenCase:
    return build_golden(FP16)


def _at_temperature(golden: GoldenCase, factor: float) -> np.ndarray:
    """The correctly rounded output of the case with qkScale multiplied by ``factor``."""
    spec = dataclasses.replace(golden.spec, qk_scale=golden.spec.qk_scale * factor)
    out, _ = reference_attention(golden.inputs, spec)
    return round_to_dtype(out, golden.spec.dtype)


def test_critical_values_are_the_gaussian_tail_bound() -> None:
    x = critical_value(1e-6, 3)
    assert 3 * math.exp(-x * x / 2) == pytest.approx(1e-6, rel=1e-12)


def test_a_correct_output_shows_no_temperature_error(bf16_golden: GoldenCase) -> None:
    for out in (bf16_golden.baseline_out, round_to_dtype(bf16_golden.out, "bf16")):
        result = temperature_check(out, bf16_golden.out, bf16_golden.row_valid, bf16_golden.magnitudes, BF16, ALPHA)
        assert not result.significant and result.z < result.critical / 2, result.text
        assert abs(result.estimate) < 5 * result.standard_error + 1e-6


def test_a_wrong_temperature_is_estimated_and_significant(bf16_golden: GoldenCase) -> None:
    g = bf16_golden
    result = temperature_check(_at_temperature(g, 1 + 6e-3), g.out, g.row_valid, g.magnitudes, BF16, ALPHA)
    assert result.significant and result.z > 2 * result.critical, result.text
    assert result.estimate == pytest.approx(6e-3, rel=0.1) and result.standard_error < 2e-4
    smaller = temperature_check(_at_temperature(g, 1 - 6e-3), g.out, g.row_valid, g.magnitudes, BF16, ALPHA)
    assert smaller.significant and smaller.estimate == pytest.approx(-6e-3, rel=0.1)


def test_a_certain_but_immaterial_bias_does_not_decide(bf16_golden: GoldenCase) -> None:
    """A noiseless bias along T is certain on any case; below the floor it is a rounding path, not a defect."""
    g = bf16_golden
    t = g.magnitudes["pv_scale"].astype(np.float64)
    rows = g.row_valid.astype(bool)
    ratio = math.sqrt(
        np.square(g.out.reshape(rows.size, -1)[rows]).mean() / np.square(t.reshape(rows.size, -1)[rows]).mean()
    )
    for effect, decides in ((0.5 * TEMPERATURE_FLOOR, False), (2 * TEMPERATURE_FLOOR, True)):
        eps = effect * UNIT_ROUNDOFF["bf16"] * ratio
        result = temperature_check(g.out + eps * t, g.out, g.row_valid, g.magnitudes, BF16, ALPHA)
        assert result.z > result.critical and result.effect == pytest.approx(effect, rel=0.05), result.text
        assert result.significant == decides, result.text


def test_the_documented_paths_own_projection_is_legitimate(bf16_golden: GoldenCase) -> None:
    """Where the emulated baseline itself projects on T, a kernel on its path may too (near-tie scores)."""
    g = bf16_golden
    wrong = _at_temperature(g, 1 + 2e-3)
    alike = temperature_check(wrong, g.out, g.row_valid, g.magnitudes, BF16, ALPHA, baseline=wrong)
    assert not alike.significant and alike.z == 0.0, alike.text
    beyond = temperature_check(_at_temperature(g, 1 + 1.2e-2), g.out, g.row_valid, g.magnitudes, BF16, ALPHA, wrong)
    assert beyond.significant and beyond.estimate == pytest.approx(1.2e-2, rel=0.1), beyond.text


def test_another_emulation_of_the_documented_path_may_land_beyond_its_draw(bf16_golden: GoldenCase) -> None:
    """The baseline's estimate is one draw of one emulation: the interval reaches as far again beyond it
    (plus its noise), and no further."""
    g = bf16_golden
    baseline = _at_temperature(g, 1 + 2e-3)
    for factor, decides in ((1 + 3.5e-3, False), (1 + 1.2e-2, True)):
        result = temperature_check(_at_temperature(g, factor), g.out, g.row_valid, g.magnitudes, BF16, ALPHA, baseline)
        assert result.significant == decides, result.text
    residuals = np.array([[1.0, -1.0], [2.0, 0.0]])
    assert variant_spread(-2e-3, residuals, 100.0) == pytest.approx(2e-3 + BASELINE_NOISE * math.sqrt(6.0) / 100.0)


def test_the_fp16_score_path_may_cast_the_scale(fp16_golden: GoldenCase) -> None:
    """qkScale cast to fp16 is ATB's own path there: inside the legitimate interval, no alarm."""
    g = fp16_golden
    scale = float(np.float32(FP16.qk_scale))
    cast = float(np.float16(scale)) / scale
    legit = temperature_check(_at_temperature(g, cast), g.out, g.row_valid, g.magnitudes, FP16, ALPHA)
    assert not legit.significant and legit.z < legit.critical / 2, legit.text
    assert legit.estimate == pytest.approx(cast - 1, rel=0.05)
    beyond = temperature_check(_at_temperature(g, 1 + 3 * (1 - cast)), g.out, g.row_valid, g.magnitudes, FP16, ALPHA)
    assert beyond.significant, beyond.text


def _every_p_alike(golden: GoldenCase) -> np.ndarray:
    """The output of a kernel whose rounded P is one value across each row: the mean of the visible V
    (rows that see every key of their batch), rounded to the dtype."""
    spec = golden.spec
    out = np.zeros(out_shape(spec)).reshape(spec.total_q, spec.head_num, -1)
    starts, group = offsets(spec.q_seqlen), spec.head_num // spec.kv_head_num
    for b in range(spec.batch):
        v = kv_views(golden.inputs, spec, b)[2].astype(np.float64)
        for head in range(spec.head_num):
            out[starts[b] : starts[b + 1], head] = v[:, head // group].mean(axis=0)
    return round_to_dtype(out.reshape(out_shape(spec)), spec.dtype)


def test_near_tie_rows_are_set_aside_by_the_temperature_test(monkeypatch: pytest.MonkeyPatch) -> None:
    """A tiny qkScale over uniform inputs makes every row a near tie: P rounded to bf16 is one value per
    row, which reads as the whole temperature lost (eps -1) though the kernel is correct; set aside, such
    rows carry no evidence, while an ordinary case sets none aside and still finds a wrong temperature.  (Its
    effect, 0.05, is under the materiality floor: a floor of 0.04 shows the set-aside deciding alone.)"""
    monkeypatch.setattr(systematic, "TEMPERATURE_FLOOR", 0.04)
    g = build_golden(_case(dtype="bf16", mask_type=0, qk_scale=1e-4, head_num=2))
    collapsed = _every_p_alike(g)
    blind = temperature_check(collapsed, g.out, g.row_valid, g.magnitudes, g.spec, ALPHA, g.baseline_out)
    assert blind.significant and blind.estimate == pytest.approx(-1.0, abs=0.15), blind.text
    ties = near_tie_rows(g.inputs, g.spec, g.row_valid, g.token_rows)
    assert ties.all()
    guarded = temperature_check(
        collapsed, g.out, g.row_valid, g.magnitudes, g.spec, ALPHA, g.baseline_out, near_ties=lambda: ties
    )
    assert not guarded.significant and "near tie" in guarded.text, guarded.text
    monkeypatch.undo()
    ordinary = build_golden(BF16)
    none = near_tie_rows(ordinary.inputs, BF16, ordinary.row_valid, None)
    assert none.shape == (int(ordinary.row_valid.sum()), BF16.head_num) and not none.any()
    wrong = _at_temperature(ordinary, 1 + 6e-3)
    found = temperature_check(
        wrong, ordinary.out, ordinary.row_valid, ordinary.magnitudes, BF16, ALPHA, near_ties=lambda: none
    )
    assert found.significant, found.text


def test_logit_spans_follow_each_rows_visible_keys() -> None:
    """The spans equal float64 max - min of qkScale q.k over the keys a (causal, padded, GQA) row sees, for
    every row or a sample of token rows, and the near-tie threshold is NEAR_TIE_ULPS steps of the dtype."""
    spec = _case(
        dtype="fp16", mask_type=3, kv_layout="padded", q_seqlen=[5, 40], kv_seqlen=[37, 40], head_num=4, kv_head_num=2
    )
    g = build_golden(spec)
    q_nope, q_rope = q_views(g.inputs, spec)
    keys, starts = visible_keys(spec), offsets(spec.q_seqlen)
    expected = np.zeros((spec.total_q, spec.head_num))
    for b in range(spec.batch):
        k, k_rope, _ = kv_views(g.inputs, spec, b)
        for row in range(starts[b], starts[b + 1]):
            for head in range(spec.head_num):
                q = np.concatenate([q_nope[row, head], q_rope[row, head]]).astype(np.float64)
                kv = np.concatenate([k[:, head // 2], k_rope[:, head // 2]], axis=1).astype(np.float64)
                s = spec.qk_scale * (kv[: keys[row]] @ q)
                expected[row, head] = s.max() - s.min()
    every = logit_spans(g.inputs, spec, g.row_valid, None)
    assert np.allclose(every, expected, rtol=1e-5, atol=1e-6)
    picked = np.array([44, 0, 7, 3])
    assert np.allclose(logit_spans(g.inputs, spec, np.ones(4, bool), picked), expected[picked], rtol=1e-5, atol=1e-6)
    step = NEAR_TIE_ULPS * 2 * UNIT_ROUNDOFF["fp16"]
    assert (near_tie_rows(g.inputs, spec, g.row_valid, None) == (every < step)).all()
    assert (every[starts[1]] == 0).all() == (keys[starts[1]] == 1)


def test_temperature_needs_a_finite_output_and_t(bf16_golden: GoldenCase) -> None:
    g = bf16_golden
    bad = g.baseline_out.copy()
    bad.reshape(-1)[5] = np.nan
    assert math.isnan(temperature_check(bad, g.out, g.row_valid, g.magnitudes, BF16, ALPHA).z)
    missing = {k: v for k, v in g.magnitudes.items() if k != "pv_scale"}
    assert "no stored T" in temperature_check(g.baseline_out, g.out, g.row_valid, missing, BF16, ALPHA).text


def test_the_format_signature_finds_bf16_rounding_on_one_head(fp16_golden: GoldenCase) -> None:
    g = fp16_golden
    clean = round_to_dtype(g.out, "fp16")
    for out in (clean, g.baseline_out):
        result = format_check(out, g.out, g.row_valid, FP16, ALPHA)
        assert not result.significant and result.z < result.critical / 2, result.text
    coarse = clean.reshape(FP16.total_q, FP16.head_num, 128).copy()
    coarse[:, 2] = coarse[:, 2].astype(ml_dtypes.bfloat16).astype(np.float16)
    result = format_check(coarse, g.out, g.row_valid, FP16, ALPHA)
    assert result.significant and result.z > 2 * result.critical and "head 2" in result.text, result.text
    wide = format_check(coarse.astype(np.float32), g.out, g.row_valid, FP16, ALPHA)  # judged as rounded
    assert (wide.z, wide.estimate) == (result.z, result.estimate)


def test_a_coarse_golden_raises_the_chance() -> None:
    """Outputs that copy coarse input values (a golden of small integers) are no evidence of a format."""
    spec = _case(dtype="fp16", mask_type=0, q_seqlen=[64], head_num=2)
    rng = np.random.default_rng(1)
    golden = rng.integers(1, 9, size=(64, 2 * 128)).astype(np.float64)
    result = format_check(golden.astype(np.float16), golden, np.ones(64, bool), spec, ALPHA)
    assert result.estimate == 1.0 and not result.significant, result.text


def test_the_default_verdict_carries_both_tests(bf16_golden: GoldenCase, fp16_golden: GoldenCase) -> None:
    policies = load_policies()
    _, ok = judge_output(bf16_golden, bf16_golden.baseline_out, policies, "default", "b")
    found = {c.metric: c for c in ok.checks if c.rule == "systematic"}
    assert set(found) == {"temperature_z", "temperature_effect", "format_z", "format_effect"} and ok.passed
    assert all(not c.decisive for c in found.values()) and found["temperature_z"].passed  # evidence until significant
    assert found["temperature_effect"].bound == TEMPERATURE_FLOOR and found["format_effect"].bound == FORMAT_FLOOR
    _, wrong = judge_output(bf16_golden, _at_temperature(bf16_golden, 1 + 6e-3), policies, "default", "b")
    failing = [c.metric for c in wrong.failing]
    assert not wrong.passed and failing == ["temperature_z", "temperature_effect"], wrong.summary()
    _, atb_only = judge_output(bf16_golden, _at_temperature(bf16_golden, 1 + 2e-3), policies, "atb", "b")
    assert atb_only.passed and any(c.metric == "temperature_z" for c in atb_only.evidence_over)


def test_the_suites_expose_the_rounding_paths_on_long_rows() -> None:
    """Near-tie rows of 4096 keys and more (both dtypes, bidirectional and CAUSAL) and large-logit
    rows long enough to split, where the legitimate paths' roundings are least symmetric."""
    cases = load_suites(["standard", "edge"])
    ties = {(c.dtype, c.mask_type == 3) for c in cases if c.distribution == "near_tie" and c.max_kv >= 2048}
    assert ties == {(d, causal) for d in ("fp16", "bf16") for causal in (False, True)}
    assert max(c.max_kv for c in cases if c.distribution == "near_tie") >= 4096
    assert {c.dtype for c in cases if c.distribution == "large_logits" and c.max_kv >= 1024} == {"fp16", "bf16"}
