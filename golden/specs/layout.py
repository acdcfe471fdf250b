"""Logical views of the operator's layouts: per-batch, per-head tensors without copies.

Padded kv means batch b's keys are ``k[b, :kvSeqLen[b]]`` (the documented contract); packed means
they start at row ``sum(kvSeqLen[:b])``.  q and attenOut are always packed by qSeqLen.
"""

from __future__ import annotations

import numpy as np

from mlaconf.facts import operator
from mlaconf.facts.operator import NOPE_DIM, ROPE_DIM, V_DIM
from mlaconf.golden.specs.spec import CaseSpec
from mlaconf.golden.specs.types import OpInputs


def offsets(lengths: tuple[int, ...] | np.ndarray) -> np.ndarray:
    """Start row of every batch in a packed tensor (length B + 1, last entry the total)."""
    return np.concatenate([[0], np.cumsum(np.asarray(lengths, dtype=np.int64))])


def q_views(inputs: OpInputs, spec: CaseSpec) -> tuple[np.ndarray, np.ndarray]:
    """q and qRope as ``[T, H, D]`` whatever the q layout."""
    t, h = spec.total_q, spec.head_num
    return inputs.q.reshape(t, h, NOPE_DIM), inputs.q_rope.reshape(t, h, ROPE_DIM)


def kv_views(inputs: OpInputs, spec: CaseSpec, batch: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Batch ``batch``'s k, kRope and v as ``[kv_b, Hkv, D]`` (only its valid rows)."""
    length, hkv = spec.kv_seqlen[batch], spec.kv_head_num
    if spec.kv_layout == "padded":
        rows = slice(None, length)
        k, kr, v = inputs.k[batch, rows], inputs.k_rope[batch, rows], inputs.v[batch, rows]
    else:
        start = int(offsets(spec.kv_seqlen)[batch])
        rows = slice(start, start + length)
        k, kr, v = inputs.k[rows], inputs.k_rope[rows], inputs.v[rows]
    return k.reshape(length, hkv, NOPE_DIM), kr.reshape(length, hkv, ROPE_DIM), v.reshape(length, hkv, V_DIM)


def causal_offset(spec: CaseSpec, batch: int) -> int | None:
    """Key j is allowed for query row i iff j <= i + offset; None means every key is allowed."""
    return operator.causal_offset(spec.mask_type, spec.q_seqlen[batch], spec.kv_seqlen[batch])


def row_valid(spec: CaseSpec) -> np.ndarray:
    """Per output token row: True where the operator promises a value."""
    valid = np.zeros(spec.total_q, dtype=bool)
    starts = offsets(spec.q_seqlen)
    for b, (qn, kn) in enumerate(zip(spec.q_seqlen, spec.kv_seqlen, strict=True)):
        if qn > 0 and kn > 0:
            valid[starts[b] : starts[b] + qn] = True
    return valid


def visible_keys(spec: CaseSpec) -> np.ndarray:
    """int64 ``[T]``: how many keys each output token row attends to, always a prefix of its batch's keys
    (0 for zero-length batches)."""
    counts = np.zeros(spec.total_q, dtype=np.int64)
    start = 0
    for b, (q_len, kv_len) in enumerate(zip(spec.q_seqlen, spec.kv_seqlen, strict=True)):
        if q_len and kv_len:
            offset = causal_offset(spec, b)
            rows = np.arange(q_len, dtype=np.int64)
            counts[start : start + q_len] = kv_len if offset is None else np.clip(rows + offset + 1, 0, kv_len)
        start += q_len
    return counts


def out_shape(spec: CaseSpec) -> tuple[int, ...]:
    """attenOut's shape: q's layout with the value head dim."""
    if spec.q_layout == "2d":
        return (spec.total_q, spec.head_num * V_DIM)
    return (spec.total_q, spec.head_num, V_DIM)
