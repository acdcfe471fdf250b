"""Logical views of the operator's layouts: per-batch, per-head tensors without copies.

Padded kv means batch b's keys are ``k[b, :kvSeqLen[b]]`` (the documented contract); packed means
they start at row ``sum(kvSeqLen[:b])``, strided at row ``b * max(kvSeqLen)`` (:func:`kv_starts`).  q and
attenOut are always packed by qSeqLen.
"""

from __future__ import annotations

import functools

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


def kv_shape(spec: CaseSpec, head_dim: int = NOPE_DIM) -> tuple[int, int, int]:
    """The shape of k (``head_dim`` 128), kRope (64) or v (128) in the case's kv layout."""
    if spec.kv_layout == "padded":
        return (spec.batch, spec.padded_rows, spec.kv_head_num * head_dim)
    return (spec.kv_rows, spec.kv_head_num, head_dim)


def kv_starts(inputs: OpInputs, spec: CaseSpec) -> list[int]:
    """The row where each batch's keys start in k viewed as ``[rows, Hkv, D]``: the contract's reading of k's
    shape, the one fact every side uses (:func:`mlaconf.facts.operator.kv_row_starts`).  The shape is the
    array's own: a relation's side may keep a padded S its spec no longer implies (a query chunk)."""
    return list(_starts(tuple(inputs.k.shape), spec.kv_seqlen, spec.kv_head_num))


@functools.cache
def _starts(shape: tuple[int, ...], kv_seqlen: tuple[int, ...], kv_head_num: int) -> tuple[int, ...]:
    starts = operator.kv_row_starts(shape, kv_seqlen, kv_head_num)
    if starts is None:
        raise ValueError(f"k {list(shape)} is no kv layout for kv_seqlen {list(kv_seqlen)}, Hkv {kv_head_num}")
    return tuple(starts)


def kv_views(inputs: OpInputs, spec: CaseSpec, batch: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Batch ``batch``'s k, kRope and v as ``[kv_b, Hkv, D]`` (only its valid rows)."""
    length, hkv = spec.kv_seqlen[batch], spec.kv_head_num
    start = _starts(tuple(inputs.k.shape), spec.kv_seqlen, hkv)[batch]
    rows = slice(start, start + length)
    pairs = ((inputs.k, NOPE_DIM), (inputs.k_rope, ROPE_DIM), (inputs.v, V_DIM))
    k, kr, v = (x.reshape(-1, hkv, d)[rows] for x, d in pairs)
    return k, kr, v


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
