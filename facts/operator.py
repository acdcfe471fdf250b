"""The MLA prefill operator's fixed dimensions, limits, enums and layout rules (docs/operator.md)."""

from __future__ import annotations

import itertools
import math
import struct
from collections.abc import Sequence

#: Head dims are fixed by the operator: q/k "nope" part, rope part, value; scores use nope + rope.
NOPE_DIM = 128
ROPE_DIM = 64
V_DIM = 128
SCORE_DIM = NOPE_DIM + ROPE_DIM

#: qSeqLen / kvSeqLen hold at most this many batches; headNum lies in [1, MAX_HEADS].
MAX_BATCH = 8192
MAX_HEADS = 128
#: headNum, kvHeadNum and the sequence lengths travel as C int32.
INT32_MIN, INT32_MAX = -(2**31), 2**31 - 1
#: MASK_FREE's compressed causal mask is MASK_SIZE x MASK_SIZE.
MASK_SIZE = 512
#: The value above the diagonal of that mask (0 on and below): fp16 kernels add it, bf16 kernels
#: multiply it by -3e38 (docs/operator.md §4; ATB's RingMLA kernels read their triu mask the same way).
MASKED_VALUE = {"fp16": -10000.0, "bf16": 1.0}
#: What callers put above that diagonal (a case's ``mask_fill``): the documented values and the ones real callers
#: pass (sglang's fp16 mask from float32's min is -inf, vllm-ascend hands ring MLA triu(ones) in the query dtype).
#: The fp16 kernel adds the mask, the high-precision kernel multiplies it by -3e38 (facts/branches.toml
#: mask-free-additive, mask-free-multiplied): which fills mean "masked" depends on the kernel.
MASK_FILLS = {"neg10000": -10000.0, "neg_inf": -math.inf, "one": 1.0}
#: The documented fill per dtype (the names of :data:`MASKED_VALUE`'s values).
DOCUMENTED_FILL = {dtype: next(k for k, v in MASK_FILLS.items() if v == value) for dtype, value in MASKED_VALUE.items()}
#: The largest finite fp16 value: the fp16 kernel's raw Q.K store overflows beyond it.
FP16_MAX = 65504.0

DTYPES = ("fp16", "bf16")
#: Unit roundoff (half the spacing at 1.0) of each output dtype.
UNIT_ROUNDOFF = {"fp16": 2.0**-11, "bf16": 2.0**-8}
#: Unit roundoff of float32 (the kernels' accumulators and softmax) and of fp16 (fp16 scores).
U32 = 2.0**-24
U16 = UNIT_ROUNDOFF["fp16"]
MASK_NAMES = {0: "undefined", 1: "spec", 2: "mask_free", 3: "causal", 4: "swa_norm"}
MASK_CODES = {name: code for code, name in MASK_NAMES.items()}
CACHE_NAMES = {0: "kvcache", 1: "krope_ctkv", 2: "int8_nzcache", 3: "nzcache"}
CACHE_CODES = {name: code for code, name in CACHE_NAMES.items()}
#: maskType values whose semantics the goldens cover (4 needs a window the C interface cannot set).
SUPPORTED_MASKS = (0, 2, 3)
#: The only cacheMode prefill accepts.
KROPE_CTKV = 1
MASK_FREE = 2
CAUSAL = 3
Q_LAYOUTS = ("2d", "3d")
#: k's layouts (:func:`kv_layout_of`): padded ``[B, S, Hkv*128]``, packed ``[sum kv, Hkv, 128]`` and strided
#: ``[B * max kv, Hkv, 128]`` (the documented 3-D form with ragged lengths, batch b at row ``b * max kv``).
KV_LAYOUTS = ("padded", "packed", "strided")


def as_c_float(value: float) -> float:
    """The value a C ``float`` parameter holds: qkScale reaches the operator as fp32."""
    return float(struct.unpack("f", struct.pack("f", value))[0]) if math.isfinite(value) else value


#: 1/sqrt(192) as the operator receives it (fp32).
DEFAULT_QK_SCALE = as_c_float(1.0 / math.sqrt(SCORE_DIM))


def scores_in_fp16(dtype: str, mask_type: int) -> bool:
    """fp16 with maskType 0 or 2 stores the scores, and multiplies them by qkScale, in fp16; every
    other path keeps scores in fp32 (docs/operator.md, precision inside the kernels)."""
    return dtype == "fp16" and mask_type in (0, MASK_FREE)


def causal_offset(mask_type: int, q_len: int, kv_len: int) -> int | None:
    """Key j is allowed for query row i iff j <= i + offset; None means every key is allowed."""
    if mask_type == MASK_FREE:
        return 0
    if mask_type == CAUSAL:
        return kv_len - q_len
    return None


def allowed_pairs(mask_type: int, q_seqlen: Sequence[int], kv_seqlen: Sequence[int]) -> int:
    """(query, key) pairs the mask allows, summed over the batch (per head)."""
    pairs = 0
    for q_len, kv_len in zip(q_seqlen, kv_seqlen, strict=True):
        if q_len <= 0 or kv_len <= 0:
            continue
        offset = causal_offset(mask_type, q_len, kv_len)
        if offset is None:
            pairs += q_len * kv_len
        else:  # row i sees i + offset + 1 keys (kv >= q wherever a mask applies)
            pairs += q_len * (q_len + 1) // 2 + q_len * offset
    return pairs


def useful_flops(mask_type: int, q_seqlen: Sequence[int], kv_seqlen: Sequence[int], head_num: int) -> int:
    """FLOPs of the attention itself: 2*(192+128) per allowed (query, key) pair per head.

    Masked pairs, the softmax and work a tiling wastes on diagonal blocks are not counted, so
    FLOPs / seconds is an effective rate comparable across implementations and with a GEMM's.
    """
    return 2 * (SCORE_DIM + V_DIM) * allowed_pairs(mask_type, q_seqlen, kv_seqlen) * head_num


def atb_kv_starts(kv_seqlen: Sequence[int], first_dim: int) -> list[int]:
    """The key row at which ATB's kernels start each batch, in k viewed as ``[rows, Hkv*128]``.

    The tiling (mla_tiling_dependency.cpp GetKvFactor, PrefillTilingParam) advances by ``max(kvSeqLen)``
    per batch when ``B * max(kvSeqLen)`` equals k's first dim, else by each ``kvSeqLen[b]``; it never reads
    any other dim of k (facts/branches.toml ``kv-factor-*``)."""
    lengths = [int(n) for n in kv_seqlen]
    longest = max(lengths, default=0)
    step = [longest] * len(lengths) if len(lengths) * longest == first_dim else lengths
    return [0, *itertools.accumulate(step)][: len(lengths)]


def kv_layout_of(k_shape: Sequence[int], kv_seqlen: Sequence[int], kv_head_num: int) -> str | None:
    """Which kv layout a k tensor's shape denotes (:data:`KV_LAYOUTS`), or None when it is none of them or
    too short for the rows its layout reads.

    A 3-D ``[N, Hkv, 128]`` k is read by ATB's rule (:func:`atb_kv_starts`): ``strided`` when
    ``N = B * max(kvSeqLen)`` differs from ``sum(kvSeqLen)`` (the documented ``[batch*seq, Hkv, 128]`` with
    ragged lengths: batch b at row ``b * max``), else ``packed`` when ``N >= sum(kvSeqLen)`` (spare rows
    after the last batch are never read).  ``padded`` is ``[B, S, Hkv*128]`` with ``S >= max(kvSeqLen)``.
    The 3-D reading is tested first: a shape that also reads as padded has Hkv = S = 1, where both readings
    address the same rows."""
    shape = tuple(int(d) for d in k_shape)
    if len(shape) != 3:
        return None
    lengths = [int(n) for n in kv_seqlen]
    total, longest = sum(lengths), max(lengths, default=0)
    if shape[1:] == (kv_head_num, NOPE_DIM):
        if shape[0] == total:
            return "packed"
        if shape[0] == len(lengths) * longest:
            return "strided"
        if shape[0] > total:
            return "packed"
    if shape[0] == len(lengths) and shape[2] == kv_head_num * NOPE_DIM and shape[1] >= longest:
        return "padded"
    return None


def kv_row_starts(k_shape: Sequence[int], kv_seqlen: Sequence[int], kv_head_num: int) -> list[int] | None:
    """Where the contract reads batch b's keys: the row of its first key in k viewed as ``[rows, Hkv, 128]``.

    Padded ``[B, S, Hkv*128]``: ``b * S`` (the documented layout; ATB's kernel reads it otherwise,
    :func:`padded_kv_misread`).  The 3-D forms: ATB's own rule (:func:`atb_kv_starts`), which is what the
    documented ``[batch*seq, Hkv, 128]`` means.  None when the shape is no kv layout (:func:`kv_layout_of`)."""
    layout = kv_layout_of(k_shape, kv_seqlen, kv_head_num)
    if layout is None:
        return None
    if layout == "padded":
        return [b * int(k_shape[1]) for b in range(len(kv_seqlen))]
    return atb_kv_starts(kv_seqlen, int(k_shape[0]))


def padded_kv_misread(q_seqlen: Sequence[int], kv_seqlen: Sequence[int], capacity: int) -> bool:
    """Whether ATB's kernel reads a padded kv cache ``[B, S=capacity, Hkv*128]`` at the wrong rows.

    The kernel never looks at S (:func:`atb_kv_starts` with k's first dim B): a batch with query and key rows
    is misread when that start differs from the padded ``b * S``: with max(kvSeqLen) 1, any such batch after
    the first once S > 1; otherwise any such batch after one shorter than S (docs/operator.md §2, §7)."""
    starts = atb_kv_starts(kv_seqlen, len(kv_seqlen))
    checked = [b for b, (q, kv) in enumerate(zip(q_seqlen, kv_seqlen, strict=True)) if q > 0 and kv > 0]
    return any(starts[b] != b * capacity for b in checked)
