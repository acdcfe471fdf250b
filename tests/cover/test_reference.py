"""The blocked float64 reference against independent implementations written from docs/operator.md.

``simple_attention`` below re-derives layouts from its §2 and the mathematics from its §4 with a
per-row loop; it shares no code with ``mlaconf.golden.building.reference`` or ``mlaconf.golden.specs.layout``.
"""

from __future__ import annotations

import mpmath
import numpy as np
import pytest

from mlaconf.golden.building import reference
from mlaconf.golden.building.inputs import generate_inputs
from mlaconf.golden.building.reference import (
    DEFAULT_TILE,
    attention,
    float64_tile,
    reference_attention,
    torch_attention,
)
from mlaconf.golden.specs.spec import CaseSpec
from mlaconf.golden.specs.spec_build import build_case
from mlaconf.golden.specs.types import OpInputs

NOPE, ROPE, VD = 128, 64, 128


def allowed_keys(mask_type: int, i: int, q_len: int, kv_len: int) -> int:
    """Number of keys row i may see (docs/operator.md §4: keys 0..n-1)."""
    if mask_type == 2:
        return i + 1
    if mask_type == 3:
        return i + 1 + (kv_len - q_len)
    return kv_len


def head_rows(inputs: OpInputs, spec: CaseSpec, b: int, h: int) -> tuple[np.ndarray, ...]:
    """Batch b's q (query head h) and k, v (its kv head) as float64, read per docs/operator.md §2."""
    q_start = sum(spec.q_seqlen[:b])
    q_len, kv_len = spec.q_seqlen[b], spec.kv_seqlen[b]
    g = h // (spec.head_num // spec.kv_head_num)
    qn = inputs.q.astype(np.float64)
    qr = inputs.q_rope.astype(np.float64)
    if qn.ndim == 2:  # [T, H*128]: head h is columns h*128 .. h*128+127
        q = np.hstack([qn[:, h * NOPE : (h + 1) * NOPE], qr[:, h * ROPE : (h + 1) * ROPE]])
    else:
        q = np.hstack([qn[:, h], qr[:, h]])
    q = q[q_start : q_start + q_len]
    k, kr, v = (x.astype(np.float64) for x in (inputs.k, inputs.k_rope, inputs.v))
    if spec.kv_layout == "padded":  # [B, S, Hkv*D]: batch b's keys are k[b, :kv_len]
        k = np.hstack([k[b, :kv_len, g * NOPE : (g + 1) * NOPE], kr[b, :kv_len, g * ROPE : (g + 1) * ROPE]])
        v = v[b, :kv_len, g * VD : (g + 1) * VD]
    else:  # [Tk, Hkv, D]: batch b starts at row sum(kvSeqLen[:b])
        start = sum(spec.kv_seqlen[:b])
        k = np.hstack([k[start : start + kv_len, g], kr[start : start + kv_len, g]])
        v = v[start : start + kv_len, g]
    return q, k, v


def simple_attention(inputs: OpInputs, spec: CaseSpec) -> np.ndarray:
    """Per-row float64 attention, ``[T, H, 128]``; rows of zero-length batches stay 0."""
    scale = float(np.float32(spec.qk_scale))  # qkScale crosses the C interface as a float
    out = np.zeros((spec.total_q, spec.head_num, VD))
    for b in range(spec.batch):
        q_start, q_len, kv_len = sum(spec.q_seqlen[:b]), spec.q_seqlen[b], spec.kv_seqlen[b]
        if q_len == 0 or kv_len == 0:
            continue
        for h in range(spec.head_num):
            q, k, v = head_rows(inputs, spec, b, h)
            for i in range(q_len):
                n = allowed_keys(spec.mask_type, i, q_len, kv_len)
                s = np.array([scale * np.dot(q[i], k[j]) for j in range(n)])
                p = np.exp(s - s.max())
                out[q_start + i, h] = (p / p.sum()) @ v[:n]
    return out


def case(**fields: object) -> CaseSpec:
    return build_case(dict(fields), source="test_reference")


LAYOUT_CASES = (
    [
        case(q_seqlen=[5, 0, 33, 1], head_num=2, mask_type=m, dtype=d, q_layout=ql, kv_layout=kl)
        for m in (0, 2)
        for d, ql, kl in (
            ("fp16", "2d", "padded"),
            ("bf16", "3d", "packed"),
            ("fp16", "3d", "packed"),
            ("bf16", "2d", "padded"),
        )
    ]
    + [
        case(
            q_seqlen=[7, 0, 20],
            kv_seqlen=[135, 4, 20],
            head_num=4,
            kv_head_num=2,
            mask_type=3,
            dtype="bf16",
            q_layout=ql,
            kv_layout="padded",
        )
        for ql in ("2d", "3d")
    ]
    + [
        case(
            q_seqlen=[9],
            kv_seqlen=[21],
            head_num=3,
            kv_head_num=1,
            mask_type=3,
            dtype="fp16",
            kv_layout="padded",
            distribution="large_logits",
        ),
    ]
)


@pytest.mark.parametrize("spec", LAYOUT_CASES, ids=lambda s: s.readable_id)
def test_blocked_matches_independent_per_row_implementation(spec: CaseSpec) -> None:
    inputs = generate_inputs(spec)
    expected = simple_attention(inputs, spec).reshape(-1, spec.head_num, VD)
    out, valid = reference_attention(inputs, spec, tile=8)
    np.testing.assert_allclose(out.reshape(expected.shape)[valid], expected[valid], rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize("tile", [1, 3, 7, 32, DEFAULT_TILE, 10_000])
def test_tile_size_does_not_change_results(tile: int) -> None:
    spec = case(q_seqlen=[40, 0, 23], kv_seqlen=[45, 3, 30], head_num=2, mask_type=3, kv_layout="padded")
    inputs = generate_inputs(spec)
    expected = simple_attention(inputs, spec)
    out = attention(inputs, spec, float64_tile, np.float64, tile=tile)
    assert np.abs(out - expected).max() <= 1e-13 * np.abs(expected).max()


def test_tiles_only_read_keys_they_may_see() -> None:
    spec = case(q_seqlen=[10], kv_seqlen=[13], head_num=1, mask_type=3, kv_layout="padded")
    seen: list[tuple[int, int]] = []

    def recording(q: np.ndarray, k: np.ndarray, v: np.ndarray, scale: float, diag: object) -> np.ndarray:
        seen.append((q.shape[0], k.shape[0]))
        return float64_tile(q, k, v, scale, diag)  # type: ignore[arg-type]

    attention(generate_inputs(spec), spec, recording, np.float64, tile=4)
    assert seen == [(4, 7), (4, 11), (2, 13)]  # rows 0-3 see keys < 3+3+1, ...


def test_numpy_exp_fallback_gives_the_same_reference(monkeypatch: pytest.MonkeyPatch) -> None:
    """Where torch is absent the softmax uses numpy's exp; both must give the golden."""
    spec = case(q_seqlen=[30, 11], head_num=2, mask_type=2, dtype="bf16")
    inputs = generate_inputs(spec)
    expected = simple_attention(inputs, spec)
    monkeypatch.setattr(reference, "_torch", lambda: None)
    out = attention(inputs, spec, float64_tile, np.float64, tile=8)
    assert np.abs(out - expected).max() <= 1e-13 * np.abs(expected).max()


def test_against_mpmath_at_40_digits() -> None:
    spec = case(
        q_seqlen=[3, 5],
        kv_seqlen=[4, 5],
        head_num=2,
        mask_type=3,
        kv_layout="padded",
        distribution="normal",
        qk_scale=0.3,
    )
    inputs = generate_inputs(spec)
    out, _ = reference_attention(inputs, spec, tile=2)
    out = out.reshape(-1, 2, VD)
    mpmath.mp.dps = 40
    scale = mpmath.mpf(float(np.float32(0.3)))
    for b in range(spec.batch):
        q_start = sum(spec.q_seqlen[:b])
        for h in range(spec.head_num):
            q, k, v = head_rows(inputs, spec, b, h)
            for i in range(spec.q_seqlen[b]):
                n = allowed_keys(3, i, spec.q_seqlen[b], spec.kv_seqlen[b])
                dots = [
                    mpmath.fsum(mpmath.mpf(a) * mpmath.mpf(c) for a, c in zip(q[i], k[j], strict=True))
                    for j in range(n)
                ]
                s = [scale * dot for dot in dots]
                top = max(s)
                p = [mpmath.exp(x - top) for x in s]
                total = mpmath.fsum(p)
                exact = [mpmath.fsum(p[j] * mpmath.mpf(v[j, d]) for j in range(n)) / total for d in range(VD)]
                got = out[q_start + i, h]
                err = max(abs(mpmath.mpf(g) - e) for g, e in zip(got, exact, strict=True))
                assert err <= 1e-12 * max(abs(e) for e in exact)


def test_row_valid_is_false_exactly_on_zero_length_batches() -> None:
    spec = build_case(
        {"q_seqlen": [2, 3, 0, 1, 2], "kv_seqlen": [2, 0, 4, 1, 5], "head_num": 1}, source="test", validate=False
    )
    out, valid = reference_attention(generate_inputs(spec), spec)
    assert valid.tolist() == [True, True, False, False, False, True, True, True]
    assert np.isfinite(out[valid]).all()


def test_threads_do_not_change_a_single_bit() -> None:
    spec = case(q_seqlen=[70, 0, 31], head_num=3, mask_type=2, dtype="bf16")
    inputs = generate_inputs(spec)
    one, _ = reference_attention(inputs, spec, tile=16, threads=1)
    two, _ = reference_attention(inputs, spec, tile=16, threads=2)
    assert one.tobytes() == two.tobytes()


def test_torch_path_matches_numpy_path_on_cpu() -> None:
    pytest.importorskip("torch")
    spec = case(
        q_seqlen=[37, 0, 20],
        kv_seqlen=[60, 3, 20],
        head_num=4,
        kv_head_num=2,
        mask_type=3,
        kv_layout="padded",
        dtype="fp16",
    )
    inputs = generate_inputs(spec)
    expected, valid = reference_attention(inputs, spec)
    got = torch_attention(inputs, spec, device="cpu", tile=16).reshape(expected.shape)
    np.testing.assert_allclose(got[valid], expected[valid], rtol=1e-12, atol=1e-14)


def test_cuda_path_matches_numpy_path() -> None:
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device: the GPU float64 path is checked where one exists")
    spec = case(q_seqlen=[300, 129], head_num=4, mask_type=2, dtype="bf16")
    inputs = generate_inputs(spec)
    expected, valid = reference_attention(inputs, spec)
    got, _ = reference_attention(inputs, spec, device="cuda")
    np.testing.assert_allclose(got[valid], expected[valid], rtol=1e-12, atol=1e-14)
