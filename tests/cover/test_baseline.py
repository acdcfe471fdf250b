"""The emulated same-dtype baseline rounds where docs/operator.md §4 says ATB's kernels round."""

from __future__ import annotations

import numpy as np
import pytest

from mlaconf.golden.building.baseline import baseline_kernel, emulate_baseline, fp16_score_path, fp32_score_path
from mlaconf.golden.building.inputs import generate_inputs, numpy_dtype
from mlaconf.golden.building.reference import reference_attention
from mlaconf.golden.specs.spec import CaseSpec
from mlaconf.golden.specs.spec_build import build_case
from mlaconf.golden.specs.types import OpInputs


def case(**fields: object) -> CaseSpec:
    return build_case(dict(fields), source="test_baseline")


def crafted_scores() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """One query, two keys whose scores are 1000 and 1000.25: fp16 storage (ulp 0.5) ties them."""
    q = np.zeros((1, 192), dtype=np.float32)
    q[0, :2] = 1.0
    k = np.zeros((2, 192), dtype=np.float32)
    k[0, :2] = 500.0
    k[1, :2] = (500.0, 500.25)
    v = np.zeros((2, 128), dtype=np.float32)
    v[0], v[1] = 1.0, -1.0
    return q, k, v


def test_fp16_score_storage_changes_the_result_where_it_should() -> None:
    q, k, v = crafted_scores()
    fp16_path = fp16_score_path(1.0)(q, k, v, 1.0, None)
    fp32_path = fp32_score_path(np.dtype(np.float16))(q, k, v, 1.0, None)
    assert np.all(fp16_path == 0.0)  # 1000.25 rounds (ties to even) to 1000 in fp16: equal weights
    e = np.exp(np.float32(0.25))
    np.testing.assert_allclose(fp32_path, (1 - e) / (1 + e), rtol=1e-3)


def test_fp16_path_matches_a_scalar_emulation_of_spec_section_4() -> None:
    """Integer q, k make every fp32 dot product exact, so each rounding point shows alone."""
    rng = np.random.default_rng(1)
    q = rng.integers(-2, 3, (1, 192)).astype(np.float32)
    k = rng.integers(-2, 3, (8, 192)).astype(np.float32)
    v = rng.uniform(-1, 1, (8, 128)).astype(np.float16).astype(np.float32)
    half, f32 = np.float16, np.float32
    scores = [half(f32(half(f32(q[0] @ k[j]))) * f32(half(0.1))) for j in range(8)]  # fp16 x fp16(scale)
    top = max(scores)
    e = [np.exp(f32(s) - f32(top), dtype=f32) for s in scores]
    total = f32(0)
    for x in e:
        total = f32(total + x)
    expected = sum(f32(half(x)) * v[j] for j, x in enumerate(e)) / total
    got = fp16_score_path(0.1)(q, k, v, 0.1, None)
    np.testing.assert_allclose(got[0], expected, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize(
    ("dtype", "mask_type", "fp16_scores"),
    [
        ("fp16", 0, True),
        ("fp16", 2, True),
        ("fp16", 3, False),
        ("bf16", 0, False),
        ("bf16", 2, False),
        ("bf16", 3, False),
    ],
)
def test_kernel_choice_follows_dtype_and_mask(dtype: str, mask_type: int, fp16_scores: bool) -> None:
    fields: dict[str, object] = {"q_seqlen": [1], "head_num": 1, "dtype": dtype, "mask_type": mask_type}
    if mask_type == 3:
        fields["kv_layout"] = "padded"
    q, k, v = crafted_scores()
    out = baseline_kernel(case(**fields))(q, k, v, 1.0, None)
    assert bool(np.all(out == 0.0)) == fp16_scores


@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
@pytest.mark.parametrize("mask_type", [0, 2, 3])
def test_a_row_that_sees_one_key_returns_that_value_exactly(dtype: str, mask_type: int) -> None:
    """P = 1 exactly, so the output is v itself: no rounding may creep in anywhere."""
    fields: dict[str, object] = {"q_seqlen": [1, 6], "head_num": 2, "dtype": dtype, "mask_type": mask_type}
    if mask_type == 3:
        fields.update(kv_layout="padded", q_seqlen=[1, 6], kv_seqlen=[1, 6])
    spec = case(**fields)
    inputs = generate_inputs(spec)
    out = emulate_baseline(inputs, spec)
    assert out.dtype == numpy_dtype(dtype)
    assert out[0].tobytes() == first_value(inputs, spec, 0).tobytes()
    if mask_type in (2, 3):  # batch 1's first row is causal: it too sees only its first key
        assert out[1].tobytes() == first_value(inputs, spec, 1).tobytes()


def first_value(inputs: OpInputs, spec: CaseSpec, b: int) -> np.ndarray:
    """v of batch b's first key, ``[Hkv, 128]`` (docs/operator.md §2 layouts)."""
    if spec.kv_layout == "padded":
        return np.ascontiguousarray(inputs.v[b, 0].reshape(spec.kv_head_num, 128))
    return np.ascontiguousarray(inputs.v[sum(spec.kv_seqlen[:b])])


@pytest.mark.parametrize(
    ("dtype", "mask_type", "bound"), [("fp16", 0, 2e-3), ("fp16", 2, 2e-3), ("fp16", 3, 2e-3), ("bf16", 2, 1.6e-2)]
)
def test_baseline_error_against_golden_is_small_but_not_zero(dtype: str, mask_type: int, bound: float) -> None:
    fields: dict[str, object] = {"q_seqlen": [40, 90], "head_num": 2, "dtype": dtype, "mask_type": mask_type}
    if mask_type == 3:
        fields.update(kv_layout="padded", kv_seqlen=[40, 218])
    spec = case(**fields)
    inputs = generate_inputs(spec)
    golden, valid = reference_attention(inputs, spec)
    baseline = emulate_baseline(inputs, spec).astype(np.float64)
    err = np.abs(baseline - golden)[valid]
    assert 0 < err.max() <= bound * np.abs(golden).max()


def test_threads_do_not_change_the_baseline() -> None:
    spec = case(q_seqlen=[50, 0, 77], head_num=3, mask_type=2, dtype="fp16")
    inputs = generate_inputs(spec)
    one = emulate_baseline(inputs, spec, tile=16, threads=1)
    two = emulate_baseline(inputs, spec, tile=16, threads=2)
    assert one.tobytes() == two.tobytes()
