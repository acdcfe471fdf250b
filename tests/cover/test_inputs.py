"""Inputs: deterministic, exactly in the case dtype, documented layouts, garbage padding, masks."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from mlaconf.golden.building.inputs import LARGE_LOGIT_STD, V_OUTLIER_MAGNITUDE, build_mask, generate_inputs
from mlaconf.golden.specs.layout import kv_views, q_views
from mlaconf.golden.specs.spec import CaseSpec
from mlaconf.golden.specs.spec_build import build_case


def spec_of(**fields: object) -> CaseSpec:
    base: dict[str, object] = {"head_num": 2, "q_seqlen": [5, 9], "seed": 3}
    base.update(fields)
    return build_case(base, source="test")


def test_deterministic_in_spec_and_seed() -> None:
    a, b = generate_inputs(spec_of()), generate_inputs(spec_of())
    for name, array in a.arrays().items():
        assert np.array_equal(array.view(np.uint8), b.arrays()[name].view(np.uint8)), name
    c = generate_inputs(spec_of(seed=4))
    assert not np.array_equal(a.q, c.q)


@pytest.mark.parametrize(("dtype", "np_dtype"), [("fp16", np.float16), ("bf16", ml_dtypes.bfloat16)])
def test_values_are_in_the_case_dtype(dtype: str, np_dtype: type) -> None:
    inputs = generate_inputs(spec_of(dtype=dtype, mask_type=2))
    for name in ("q", "q_rope", "k", "k_rope", "v", "mask"):
        assert getattr(inputs, name).dtype == np.dtype(np_dtype), name
    assert inputs.q_seqlen.dtype == np.int32 and inputs.kv_seqlen.dtype == np.int32


def test_layout_shapes() -> None:
    packed = generate_inputs(spec_of(q_layout="3d", kv_layout="packed"))
    assert packed.q.shape == (14, 2, 128) and packed.q_rope.shape == (14, 2, 64)
    assert packed.k.shape == (14, 2, 128) and packed.k_rope.shape == (14, 2, 64) and packed.v.shape == (14, 2, 128)
    padded = generate_inputs(spec_of(q_layout="2d", kv_layout="padded"))
    assert padded.q.shape == (14, 256) and padded.q_rope.shape == (14, 128)
    assert padded.k.shape == (2, 9, 256) and padded.k_rope.shape == (2, 9, 128) and padded.v.shape == (2, 9, 256)
    assert padded.mask is None


def test_kv_capacity_sets_padded_rows() -> None:
    spec = spec_of(kv_layout="padded", kv_capacity=12)
    inputs = generate_inputs(spec)
    assert inputs.k.shape == (2, 12, 256) and inputs.v.shape == (2, 12, 256) and "cap12" in spec.case_id
    assert (np.abs(inputs.k[1, 9:].astype(np.float64)) >= 2.0).all()


def test_padding_holds_large_finite_garbage() -> None:
    spec = spec_of(kv_layout="padded", mask_type=3, q_seqlen=[2, 9], kv_seqlen=[3, 9])
    inputs = generate_inputs(spec)
    for tensor in (inputs.k, inputs.k_rope, inputs.v):
        pad = tensor[0, 3:].astype(np.float64)
        assert pad.size and np.isfinite(pad).all() and (np.abs(pad) >= 2.0).all()
    k, _, v = kv_views(inputs, spec, 0)
    assert k.shape == (3, 2, 128) and np.abs(k.astype(np.float64)).max() <= 1.0
    assert np.abs(v.astype(np.float64)).max() <= 1.0


@pytest.mark.parametrize(
    ("dtype", "fill", "masked_value"),
    [
        ("fp16", None, -10000.0),
        ("bf16", None, 1.0),
        ("fp16", "neg_inf", -np.inf),
        ("fp16", "one", 1.0),
        ("bf16", "neg10000", -9984.0),  # -10000 rounded to bf16
        ("bf16", "neg_inf", -np.inf),
    ],
)
def test_mask_free_mask_encoding(dtype: str, fill: str | None, masked_value: float) -> None:
    """The mask holds the dtype's documented fill above its diagonal unless the case names another, 0 elsewhere."""
    spec = spec_of(dtype=dtype, mask_type=2, mask_fill=fill)
    mask = build_mask(spec).astype(np.float64)
    assert mask.shape == (512, 512)
    upper = np.triu(np.ones((512, 512), dtype=bool), k=1)
    assert (mask[upper] == masked_value).all() and (mask[~upper] == 0.0).all()
    assert (generate_inputs(spec).mask.astype(np.float64) == mask).all()


def test_large_logits_reach_their_target_spread() -> None:
    spec = spec_of(distribution="large_logits", q_seqlen=[256], dtype="bf16")
    inputs = generate_inputs(spec)
    qn, qr = q_views(inputs, spec)
    kn, kr, _ = kv_views(inputs, spec, 0)
    q = np.concatenate([qn[:, 0], qr[:, 0]], axis=1).astype(np.float64)
    k = np.concatenate([kn[:, 0], kr[:, 0]], axis=1).astype(np.float64)
    std = float((q @ k.T * spec.qk_scale).std())
    assert 0.8 * LARGE_LOGIT_STD["bf16"] < std < 1.2 * LARGE_LOGIT_STD["bf16"]


def test_near_ties_and_outliers() -> None:
    spec = spec_of(distribution="near_tie", q_seqlen=[128])
    inputs = generate_inputs(spec)
    kn, _, _ = kv_views(inputs, spec, 0)
    assert float(np.ptp(kn.astype(np.float64)[:, 0, 0])) < 0.05  # every key is one row plus noise
    outliers = generate_inputs(spec_of(distribution="v_outliers", q_seqlen=[512]))
    assert np.abs(outliers.v.astype(np.float64)).max() == V_OUTLIER_MAGNITUDE


@pytest.mark.parametrize("distribution", ["uniform", "normal", "near_tie", "v_outliers", "large_logits"])
@pytest.mark.parametrize("kv_layout", ["padded", "packed"])
def test_values_do_not_depend_on_the_chunk_size_or_the_threads(
    monkeypatch: pytest.MonkeyPatch, distribution: str, kv_layout: str
) -> None:
    """Inputs are drawn and rounded in chunks (bounded memory); every stream is consumed in row order, and
    each tensor has its own streams, so tensors filled side by side on threads get the same values."""
    import mlaconf.golden.building.inputs as inputs_module

    fields: dict[str, object] = {"q_seqlen": [37, 64], "kv_seqlen": [40, 70], "mask_type": 3, "kv_capacity": 80}
    if kv_layout == "packed":
        fields = {"q_seqlen": [37, 64], "mask_type": 0}
    spec = spec_of(distribution=distribution, kv_layout=kv_layout, **fields)
    whole = generate_inputs(spec)
    monkeypatch.setattr(inputs_module, "CHUNK_ELEMENTS", 1000)  # a few rows per chunk
    chunked = generate_inputs(spec)
    threaded = generate_inputs(spec, threads=3)  # small chunks: the threads' draws interleave
    for name, array in whole.arrays().items():
        assert np.array_equal(array.view(np.uint8), chunked.arrays()[name].view(np.uint8)), name
        assert np.array_equal(array.view(np.uint8), threaded.arrays()[name].view(np.uint8)), name
