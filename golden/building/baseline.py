"""Emulated same-dtype baseline: the reference computation rounded where ATB's kernels round.

Spec section 4 lists the precision path per dtype and mask: fp16 with maskType 0/2 stores scores
in fp16 and applies scale, mask and row max in fp16; bf16 (all masks) and fp16 CAUSAL keep scores
in fp32.  Both cast P to the input dtype before P.V, accumulate in fp32 and round the output.
Its error against the float64 golden is what a correct low-precision kernel may lose: the
denominator of the benchmark-relative tolerance rule.

fp16 subnormals are flushed to zero (P and the output): of the two legitimate underflow behaviours
(docs/conformance.md "Flush-to-zero") the one with the larger error, so the benchmark ratios of a
device that flushes and of one with gradual underflow are both measured against it.

The kernels work in place on one float32 score tile and mask only the diagonal block; on the fp32
score path the steps between the GEMMs run in the compiled tile kernel, rounding P to bf16 or fp16
with integer arithmetic (exact round-to-nearest-even).
"""

from __future__ import annotations

import numpy as np

from mlaconf.facts.operator import MASKED_VALUE
from mlaconf.golden.building.inputs import numpy_dtype
from mlaconf.golden.building.reference import (
    DEFAULT_TILE,
    TileKernel,
    Workspace,
    _torch,
    attention,
    causal_block,
    gemm,
    tile_kernel,
)
from mlaconf.golden.specs.layout import out_shape
from mlaconf.golden.specs.spec import CaseSpec
from mlaconf.golden.specs.types import OpInputs

_HALF = np.dtype(np.float16)
Diag = tuple[int, int] | None
#: fp16's smallest normal value; a flush-to-zero device stores 0 below it.
FP16_MIN_NORMAL = np.float32(2.0**-14)


def flush_fp16_subnormals(values: np.ndarray) -> np.ndarray:
    """Zero the fp16-subnormal values of an array already rounded to fp16 (in place; returns it)."""
    values[np.abs(values) < FP16_MIN_NORMAL] = 0.0
    return values


def _to(values: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """Round float32 values through ``dtype`` and back to float32; may reuse ``values``' memory.

    fp16 goes through torch when installed: the same IEEE round-to-nearest-even, but vectorised
    (F16C) and in place, ~6x faster than numpy's float32 -> float16 -> float32 round trip.
    """
    torch = _torch()
    if dtype == _HALF and torch is not None and values.dtype == np.float32 and values.flags.c_contiguous:
        tensor = torch.from_numpy(values)
        tensor.copy_(tensor.half())
        return values
    return values.astype(dtype).astype(np.float32)


def _gemm32(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """An fp32-accumulating GEMM (torch's BLAS, like the reference's) into a fresh float32 array."""
    return gemm(a, b, np.empty((a.shape[0], b.shape[1]), dtype=np.float32))


def fp16_score_path(scale: float) -> TileKernel:
    """fp16 with maskType 0/2: scores, scale, mask and max in fp16; exp and sum in fp32."""
    scale16 = np.float32(np.float16(scale))
    mask_value = np.float32(MASKED_VALUE["fp16"])

    def kernel(q: np.ndarray, k: np.ndarray, v: np.ndarray, _: float, diag: Diag) -> np.ndarray:
        scores = _to(_gemm32(q, k.T), _HALF)  # fp32 accumulation, stored as fp16
        scores *= scale16  # exact in fp32 (11-bit x 11-bit), so one rounding to fp16 below
        scores = _to(scores, _HALF)
        block = causal_block(diag, scores.shape)
        if block is not None:  # the compressed mask is added in fp16: -10000 where masked, 0 elsewhere
            first_masked, masked = block
            part = scores[:, first_masked:]
            part[masked] = _to(part[masked] + mask_value, _HALF)
        scores -= scores.max(axis=1, keepdims=True)
        np.exp(scores, out=scores)
        denom = scores.sum(axis=1, keepdims=True, dtype=np.float32)
        out = _gemm32(flush_fp16_subnormals(_to(scores, _HALF)), v)
        out /= denom
        return out

    return kernel


def fp32_score_path(dtype: np.dtype) -> TileKernel:
    """bf16 (all masks) and fp16 CAUSAL: scores in fp32, P cast to the input dtype.

    Between the two GEMMs one compiled pass per row (``baseline_softmax_tile``: scale, mask, row max,
    exp, the fp32 row sum, P rounded in place) replaces numpy's six passes over the tile."""
    rounding = "fp16" if dtype == _HALF else "bf16"
    work = Workspace()  # the tile's scores reuse one buffer per thread (fresh pages cost page faults)

    def kernel(q: np.ndarray, k: np.ndarray, v: np.ndarray, scale: float, diag: Diag) -> np.ndarray:
        scores = gemm(q, k.T, work.take("scores32", (q.shape[0], k.shape[0]), np.float32))
        denom = np.empty(q.shape[0], dtype=np.float32)
        first = None if diag is None else diag[0] + diag[1]
        tile_kernel().baseline_softmax_tile(scores, denom, float(np.float32(scale)), first, rounding)
        out = _gemm32(scores, v)
        out /= denom[:, None]
        return out

    return kernel


def baseline_kernel(spec: CaseSpec) -> TileKernel:
    """The precision path ATB takes for this case's dtype and mask (docs/operator.md §4); on raw products past
    fp16's range, where ATB's fp16 score store overflows (a known deviation, not a precision a correct kernel
    may lose), the fp32 score path."""
    if spec.dtype == "fp16" and spec.mask_type in (0, 2) and not spec.raw_scores_past_fp16:
        return fp16_score_path(spec.qk_scale)
    return fp32_score_path(numpy_dtype(spec.dtype))


def emulate_baseline(inputs: OpInputs, spec: CaseSpec, *, tile: int = DEFAULT_TILE, threads: int = 1) -> np.ndarray:
    """attenOut as a kernel with ATB's rounding points would produce it, in the case dtype."""
    out = attention(inputs, spec, baseline_kernel(spec), np.float32, tile=tile, threads=threads)
    rounded = out.astype(numpy_dtype(spec.dtype))
    if spec.dtype == "fp16":
        flush_fp16_subnormals(rounded)
    return rounded.reshape(out_shape(spec))
