"""Emulated same-dtype baseline: the reference computation rounded where ATB's kernels round.

Spec section 4 lists the precision path per dtype and mask: fp16 with maskType 0/2 stores scores
in fp16 and applies scale, mask and row max in fp16; bf16 (all masks) and fp16 CAUSAL keep scores
in fp32.  Both cast P to the input dtype before P.V, accumulate in fp32 and round the output.
Its error against the float64 golden is what a correct low-precision kernel may lose: the
denominator of the benchmark-relative tolerance rule.
"""

from __future__ import annotations

import numpy as np

from golden.inputs import FP16_MASK_VALUE, numpy_dtype
from golden.layout import out_shape
from golden.reference import DEFAULT_TILE, TileKernel, apply_causal, attention
from golden.spec import CaseSpec
from golden.types import OpInputs


def _to(values: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """Round float32 values through ``dtype`` and back to float32."""
    return values.astype(dtype).astype(np.float32)


def fp16_score_path(scale: float) -> TileKernel:
    """fp16 with maskType 0/2: scores, scale, mask and max in fp16; exp and sum in fp32."""
    half = np.dtype(np.float16)
    scale16 = np.float32(np.float16(scale))

    def kernel(q: np.ndarray, k: np.ndarray, v: np.ndarray, _: float, diag: tuple[int, int] | None) -> np.ndarray:
        scores = _to(q @ k.T, half)  # fp32 accumulation, stored as fp16
        scores = _to(scores * scale16, half)
        if diag is not None:  # the compressed mask is added in fp16 (0 / -10000)
            mask = np.zeros_like(scores)
            apply_causal(mask, diag, FP16_MASK_VALUE)
            scores = _to(scores + mask, half)
        scores -= scores.max(axis=1, keepdims=True)
        probs = np.exp(scores)
        denom = probs.sum(axis=1, keepdims=True, dtype=np.float32)
        return (_to(probs, half) @ v) / denom

    return kernel


def fp32_score_path(dtype: np.dtype) -> TileKernel:
    """bf16 (all masks) and fp16 CAUSAL: scores in fp32, P cast to the input dtype."""

    def kernel(q: np.ndarray, k: np.ndarray, v: np.ndarray, scale: float, diag: tuple[int, int] | None) -> np.ndarray:
        scores = (q @ k.T) * np.float32(scale)
        apply_causal(scores, diag, -np.inf)
        scores -= scores.max(axis=1, keepdims=True)
        probs = np.exp(scores)
        denom = probs.sum(axis=1, keepdims=True, dtype=np.float32)
        return (_to(probs, dtype) @ v) / denom

    return kernel


def baseline_kernel(spec: CaseSpec) -> TileKernel:
    """The precision path ATB takes for this case's dtype and mask (spec section 4)."""
    if spec.dtype == "fp16" and spec.mask_type in (0, 2):
        return fp16_score_path(spec.qk_scale)
    return fp32_score_path(numpy_dtype(spec.dtype))


def emulate_baseline(inputs: OpInputs, spec: CaseSpec, *, tile: int = DEFAULT_TILE, threads: int = 1) -> np.ndarray:
    """attenOut as a kernel with ATB's rounding points would produce it, in the case dtype."""
    out = attention(inputs, spec, baseline_kernel(spec), np.float32, tile=tile, threads=threads)
    return out.astype(numpy_dtype(spec.dtype)).reshape(out_shape(spec))
