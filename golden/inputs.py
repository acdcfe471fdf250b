"""Deterministic operator inputs from (spec, seed), rounded to the case dtype.

Values are drawn in float64 with numpy's Generator and rounded once to fp16 or bf16 (ml_dtypes,
round-to-nearest-even), so every backend and the reference see exactly the same numbers.  The
padded kv layout fills rows beyond each kvSeqLen with large finite garbage: an implementation that
reads them gets visibly wrong answers instead of accidentally right ones (zeros would hide it).
"""

from __future__ import annotations

import math
from typing import Any

import ml_dtypes
import numpy as np

from facts.operator import NOPE_DIM, ROPE_DIM, SCORE_DIM, V_DIM
from golden.spec import CaseSpec
from golden.types import OpInputs

MASK_SIZE = 512
FP16_MASK_VALUE = -10000.0  # fp16 kernels add the mask
BF16_MASK_VALUE = 1.0  # bf16 kernels multiply the mask by -3e38

#: Target standard deviation of the scaled logits for the ``large_logits`` distribution, per dtype.
#: fp16 kernels store raw scores in fp16, so the spread is chosen where a kernel with ATB's
#: precision still meets ATB's own rule while exp() without max subtraction overflows fp16
#: (logits above ~11); bf16 keeps scores in fp32 and is pushed harder.
LARGE_LOGIT_STD = {"fp16": 2.5, "bf16": 8.0}
V_OUTLIER_FRACTION = 0.002
V_OUTLIER_MAGNITUDE = 64.0
NEAR_TIE_NOISE = 0.01


def numpy_dtype(dtype: str) -> np.dtype[Any]:
    """The numpy dtype holding a case dtype's values exactly."""
    if dtype == "fp16":
        return np.dtype(np.float16)
    if dtype == "bf16":
        bf16: np.dtype[Any] = np.dtype(ml_dtypes.bfloat16)
        return bf16
    raise ValueError(f"unknown dtype {dtype!r}")


def round_to(values: np.ndarray, dtype: str) -> np.ndarray:
    """Round float64 values to the case dtype (round-to-nearest-even)."""
    rounded: np.ndarray = np.ascontiguousarray(values).astype(numpy_dtype(dtype))
    return rounded


def case_rng(spec: CaseSpec) -> np.random.Generator:
    """A generator seeded by the spec's seed and content, so equal specs give equal data."""
    return np.random.default_rng(np.random.SeedSequence([spec.seed, int(spec.content_hash[:16], 16)]))


def build_mask(dtype: str) -> np.ndarray:
    """The 512x512 MASK_FREE mask encoded for the dtype's kernels (spec section 4)."""
    upper = np.triu(np.ones((MASK_SIZE, MASK_SIZE), dtype=bool), k=1)
    value = FP16_MASK_VALUE if dtype == "fp16" else BF16_MASK_VALUE
    return round_to(np.where(upper, value, 0.0), dtype)


def _uniform_amplitude_for_logit_std(target_std: float, qk_scale: float) -> float:
    """Amplitude a of U(-a, a) for q and k such that scaled logits have ``target_std``."""
    # var(q*k) = a^4 / 9 per term, SCORE_DIM terms, then scaled by qk_scale.
    return math.sqrt(target_std * 3.0 / (qk_scale * math.sqrt(SCORE_DIM)))


def _draw(rng: np.random.Generator, spec: CaseSpec, shape: tuple[int, ...], role: str) -> np.ndarray:
    """Draw one logical tensor (role: 'q', 'k' or 'v') from the case's distribution."""
    dist = spec.distribution
    if dist == "normal":
        return rng.standard_normal(shape)
    if dist == "large_logits" and role in ("q", "k"):
        amp = _uniform_amplitude_for_logit_std(LARGE_LOGIT_STD[spec.dtype], spec.qk_scale)
        return rng.uniform(-amp, amp, shape)
    values = rng.uniform(-1.0, 1.0, shape)
    if dist == "v_outliers" and role == "v":
        hits = rng.random(shape) < V_OUTLIER_FRACTION
        values[hits] = rng.choice([-1.0, 1.0], size=int(hits.sum())) * V_OUTLIER_MAGNITUDE
    return values


def _near_tie_keys(rng: np.random.Generator, spec: CaseSpec, shape: tuple[int, ...]) -> np.ndarray:
    """Keys that are tiny perturbations of one row per kv head: all logits of a row nearly tie."""
    base = rng.uniform(-1.0, 1.0, (1, *shape[1:]))
    return base + NEAR_TIE_NOISE * rng.uniform(-1.0, 1.0, shape)


def _padded(packed: np.ndarray, spec: CaseSpec, rng: np.random.Generator) -> np.ndarray:
    """Scatter packed rows ``[sum(kv), N, D]`` into ``[B, S, N*D]`` with garbage in the padding."""
    n, d = packed.shape[1], packed.shape[2]
    s = spec.padded_rows
    shape = (spec.batch, s, n * d)
    garbage: np.ndarray = rng.uniform(2.0, 4.0, shape) * rng.choice([-1.0, 1.0], shape)
    offset = 0
    for b, length in enumerate(spec.kv_seqlen):
        garbage[b, :length] = packed[offset : offset + length].reshape(length, n * d)
        offset += length
    return garbage


def generate_inputs(spec: CaseSpec) -> OpInputs:
    """All operator inputs of a case, in its layouts and dtype (see :class:`OpInputs`)."""
    rng = case_rng(spec)
    t, tk, h, hkv = spec.total_q, spec.total_kv, spec.head_num, max(spec.kv_head_num, 1)
    q_nope = _draw(rng, spec, (t, h, NOPE_DIM), "q")
    q_rope = _draw(rng, spec, (t, h, ROPE_DIM), "q")
    if spec.distribution == "near_tie":
        k_full = _near_tie_keys(rng, spec, (tk, hkv, SCORE_DIM))
        k_nope, k_rope = k_full[..., :NOPE_DIM], k_full[..., NOPE_DIM:]
    else:
        k_nope = _draw(rng, spec, (tk, hkv, NOPE_DIM), "k")
        k_rope = _draw(rng, spec, (tk, hkv, ROPE_DIM), "k")
    v = _draw(rng, spec, (tk, hkv, V_DIM), "v")

    if spec.q_layout == "2d":
        q_nope, q_rope = q_nope.reshape(t, h * NOPE_DIM), q_rope.reshape(t, h * ROPE_DIM)
    if spec.kv_layout == "padded":
        k_nope, k_rope, v = (_padded(x, spec, rng) for x in (k_nope, k_rope, v))
    return OpInputs(
        q=round_to(q_nope, spec.dtype),
        q_rope=round_to(q_rope, spec.dtype),
        k=round_to(k_nope, spec.dtype),
        k_rope=round_to(k_rope, spec.dtype),
        v=round_to(v, spec.dtype),
        q_seqlen=np.asarray(spec.q_seqlen, dtype=np.int32),
        kv_seqlen=np.asarray(spec.kv_seqlen, dtype=np.int32),
        mask=build_mask(spec.dtype) if spec.mask_type == 2 else None,
    )
