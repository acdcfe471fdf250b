"""The MLA prefill operator's fixed dimensions, limits, enums and layout rules (docs/operator.md)."""

from __future__ import annotations

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
KV_LAYOUTS = ("padded", "packed")


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


def kv_layout_of(k_shape: Sequence[int], kv_seqlen: Sequence[int], kv_head_num: int) -> str | None:
    """Which kv layout a k tensor's shape denotes: ``packed``, ``padded`` or None (neither).

    Packed ``[sum(kvSeqLen), Hkv, 128]`` is tested first: a shape that also reads as padded
    ``[B, S, Hkv*128]`` then has Hkv = S = 1 and every kvSeqLen 1, where both readings agree.
    """
    shape = tuple(int(d) for d in k_shape)
    if len(shape) != 3:
        return None
    if shape == (sum(int(n) for n in kv_seqlen), kv_head_num, NOPE_DIM):
        return "packed"
    if shape[0] == len(kv_seqlen) and shape[2] == kv_head_num * NOPE_DIM:
        return "padded"
    return None


def padded_kv_misread(q_seqlen: Sequence[int], kv_seqlen: Sequence[int], capacity: int) -> bool:
    """Whether ATB's kernel reads a padded kv cache ``[B, S=capacity, Hkv*128]`` at the wrong rows.

    The kernel never looks at S: batch b starts at row ``b * max(kvSeqLen)`` when ``B * max(kvSeqLen)``
    equals k's first dim (here B, so only when max(kvSeqLen) is 1), else at ``sum(kvSeqLen[:b])``
    (mla_tiling_dependency.cpp GetKvFactor).  A batch is misread when it has query and key rows and its
    start differs from the padded ``b * S``: with max 1, any such batch after the first once S > 1;
    otherwise any such batch after one shorter than S (docs/operator.md §2, §7).
    """
    checked = [b for b, (q, kv) in enumerate(zip(q_seqlen, kv_seqlen, strict=True)) if q > 0 and kv > 0]
    if max(kv_seqlen, default=0) == 1:
        return capacity != 1 and any(b > 0 for b in checked)
    return any(min(kv_seqlen[:b], default=capacity) < capacity for b in checked)
