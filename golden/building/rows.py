"""A sampled golden's arrays: the float64 reference, its magnitudes and the emulated baseline of chosen rows.

A case with ``rows`` set (golden/specs/sample.py) is built for its sampled token rows only, every head of
each, so its cost grows with rows sampled times the keys each sees, not with q times kv.

The reference and its magnitudes come from row-independent kernels (``row_scores``, ``softmax_tile`` with
per-row key counts, ``weighted_rows`` in golden/building/src/tile_kernel.cpp): every element is one sum in
one fixed order over the row's own keys, so a row's bits do not depend on which other rows are built with
it: the rows of a sample equal the same rows of a golden of every row (:func:`sampled_reference`
with every valid row), bit for bit.  BLAS, which the full tile path uses, picks its summation by the
matrix shapes, so a row's last bits there depend on its tile.  The magnitudes are the float64 sums
themselves (as on the golden device, golden/building/magnitudes.py's ``torch_tile``), rounded up to
their stored types.  The baseline emulates ATB's precision path on each run of consecutive sampled
rows with the full path's tile kernels (an emulation, not a reference: its bits may differ from a full
build's)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass

import ml_dtypes
import numpy as np

from mlaconf.facts.operator import SCORE_DIM, V_DIM, scores_in_fp16
from mlaconf.facts.processes import map_for, pin_worker_threads
from mlaconf.golden.building import progress
from mlaconf.golden.building.baseline import baseline_kernel, flush_fp16_subnormals
from mlaconf.golden.building.inputs import numpy_dtype
from mlaconf.golden.building.magnitudes import (
    round_up_bf16,
    round_up_float32,
    scale_derivative,
    score_rss,
    subnormal_weight,
)
from mlaconf.golden.building.reference import (
    ROUNDED_UP_FLOOR,
    effective_scale,
    pinned_threads,
    tile_flops,
    tile_kernel,
)
from mlaconf.golden.specs.layout import causal_offset, offsets, out_shape, visible_keys
from mlaconf.golden.specs.spec import CaseSpec
from mlaconf.golden.specs.types import ELEMENT_MAGNITUDES, ROW_MAGNITUDES, element_magnitudes

#: The kernels take rows in blocks of ROW_BLOCK, scores in blocks of KEYS keys and weighted columns in vectors of
#: COLUMNS (callers pad).
ROW_BLOCK, KEYS, COLUMNS = 4, 16, 8
#: Sampled rows per kernel call: bounds the per-call buffers (rows x keys float64, a few of them).
ROW_CHUNK = 64
#: What computed a sampled golden's reference and magnitudes (its provenance).
SAMPLED_REFERENCE = "float64 row kernels (fixed summation order per row) in mlaconf.golden.building._tile_kernel"


def _padded(count: int, multiple: int) -> int:
    return -(-count // multiple) * multiple


@dataclass(frozen=True)
class KeyOperands:
    """One (batch, kv head)'s keys and values as the row kernels read them, padded with zero keys to a
    multiple of KEYS, and the running maxima along the keys a row's prefix of keys reads."""

    kp: np.ndarray  # [keys / KEYS, 192, KEYS] float64: K in panels of KEYS keys (row_scores' operand)
    v: np.ndarray  # [keys, 128]
    v_abs: np.ndarray  # [keys, 128]
    v_sq: np.ndarray  # [keys, 128]
    ones: np.ndarray  # [keys, COLUMNS]: weighted_rows of it is a row sum in the kernels' order
    abs_peak: np.ndarray  # [kv_len, 128] float64: max_{j' <= j} |V_j'c|
    key_peak: np.ndarray  # [kv_len] float64: max_{j' <= j} ||k_j'||

    @classmethod
    def of(cls, k: np.ndarray, v: np.ndarray) -> KeyOperands:
        """From one kv head's keys ``k`` [kv_len, 192] and values ``v`` [kv_len, 128] (any float dtype)."""
        keys = _padded(k.shape[0], KEYS)
        kp = np.zeros((keys // KEYS, KEYS, SCORE_DIM))
        kp.reshape(keys, SCORE_DIM)[: k.shape[0]] = k
        kp = np.ascontiguousarray(kp.transpose(0, 2, 1))
        vv = np.zeros((keys, V_DIM))
        vv[: v.shape[0]] = v
        k64 = np.asarray(k, dtype=np.float64)
        return cls(
            kp,
            vv,
            np.abs(vv),
            vv * vv,
            np.ones((keys, COLUMNS)),
            np.maximum.accumulate(np.abs(vv[: v.shape[0]]), axis=0),
            np.maximum.accumulate(np.linalg.norm(k64, axis=1)),
        )


def weighted(w: np.ndarray, m: np.ndarray) -> np.ndarray:
    """``w @ m[:w.shape[1]]``, each element summed over j in ascending order (the row kernel)."""
    out = np.empty((w.shape[0], m.shape[1]))
    tile_kernel().weighted_rows(w, m, out)
    return out


def row_block(
    qs: np.ndarray, counts: np.ndarray, ops: KeyOperands, score_terms: bool, subnormal_terms: bool
) -> dict[str, np.ndarray]:
    """The golden ``out`` and every magnitude, float64, of rows whose scaled queries are ``qs`` [R, 192]
    (R a multiple of ROW_BLOCK) and which see keys ``[0, counts[r])``: each row's values from its own
    query and keys alone."""
    rows = qs.shape[0]
    cols = _padded(int(counts.max()), KEYS)
    p = np.empty((rows, cols))
    tile_kernel().row_scores(qs, ops.kp, p)
    stats, ps, ps_sums = np.empty((4, rows)), np.empty((rows, cols)), np.empty((2, rows))
    raw = np.empty((rows, cols)) if score_terms else None
    tile_kernel().softmax_tile(p, stats, None, None, None, ROUNDED_UP_FLOOR, raw, ps, ps_sums, counts)
    denom = stats[2][:, None]
    keys = counts[:, None]
    golden = weighted(p, ops.v) / denom
    last = counts - 1
    out = {
        "out": golden,
        "pv_abs": weighted(p, ops.v_abs) / denom,
        "pv_rss": np.sqrt(weighted(p * p, ops.v_sq)) / denom,
        "pv_scale": scale_derivative(
            weighted(ps, ops.v), ps_sums[0][:, None], ps_sums[1][:, None], golden, ops.abs_peak[last], keys
        ),
        "p_rss": np.sqrt(stats[3]) / stats[2],
        "score_absmax": np.maximum(np.abs(stats[0]), np.abs(stats[1])),
        "score_dot": np.linalg.norm(qs, axis=1) * ops.key_peak[last],
    }
    if subnormal_terms:  # fp16: keys whose P may be flushed to zero, and the renormalisation they cause
        sub = p * subnormal_weight(p)
        dropped = weighted(sub, ops.ones)[:, :1]
        out["pv_sub"] = (weighted(sub, ops.v_abs) + dropped * np.abs(golden)) / (denom - dropped)
    if score_terms:
        assert raw is not None
        weight = (p / denom) * (2.0 * np.abs(raw) + np.abs(raw - stats[0][:, None]))
        w2 = weight * weight
        out["pvs_rss"] = score_rss(
            golden, weighted(w2, ops.v_sq), weighted(w2, ops.v), weighted(w2, ops.ones)[:, :1], keys=keys
        )
    return out


def _batch_rows(spec: CaseSpec, rows: np.ndarray) -> Iterator[tuple[int, np.ndarray, np.ndarray]]:
    """Per batch with sampled rows: the batch, the rows' positions in the sample and their rows in the batch."""
    starts = offsets(spec.q_seqlen)
    for b in range(spec.batch):
        if spec.q_seqlen[b] == 0 or spec.kv_seqlen[b] == 0:
            continue
        first, last = np.searchsorted(rows, [starts[b], starts[b + 1]])
        if last > first:
            yield b, np.arange(first, last), rows[first:last] - starts[b]


#: Batch ``b``'s keys of kv head ``h``: k and kRope side by side ``[kv_b, 192]`` and v ``[kv_b, 128]`` (any float
#: dtype): drawn per head by golden/building/blocks.py, so no whole kv tensor is ever held.
Keys = Callable[[int, int], tuple[np.ndarray, np.ndarray]]


def sampled_reference(
    queries: tuple[np.ndarray, np.ndarray], keys: Keys, spec: CaseSpec, rows: np.ndarray, *, threads: int = 1
) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """The float64 golden of token rows ``rows`` (sorted, valid) in attenOut's layout with one row per sampled
    row, and the magnitudes of ``spec`` for them (element ones bf16, row ones float32 ``[n, H]``).  ``queries``:
    q ``[n, H, 128]`` and qRope ``[n, H, 64]`` of those rows, in their order; ``keys``: each (batch, kv head)'s."""
    n, h, g = rows.size, spec.head_num, spec.head_num // spec.kv_head_num
    golden = np.zeros((n, h, V_DIM))
    stored = {name: np.zeros((n, h, V_DIM), dtype=ml_dtypes.bfloat16) for name in element_magnitudes(spec)}
    stored.update({name: np.zeros((n, h), dtype=np.float32) for name in ROW_MAGNITUDES})
    qn, qr = queries
    counts = visible_keys(spec)[rows]
    scale = effective_scale(spec)
    score_terms, subnormal_terms = scores_in_fp16(spec.dtype, spec.mask_type), spec.dtype == "fp16"
    tasks = [(b, where, kv_head) for b, where, _ in _batch_rows(spec, rows) for kv_head in range(spec.kv_head_num)]

    def task(item: tuple[int, np.ndarray, int]) -> None:
        pin_worker_threads()
        b, where, kv_head = item
        ops = KeyOperands.of(*keys(b, kv_head))
        for head in range(kv_head * g, (kv_head + 1) * g):
            for start in range(0, where.size, ROW_CHUNK):
                at = where[start : start + ROW_CHUNK]
                size = at.size
                padded = _padded(size, ROW_BLOCK)
                qs = np.zeros((padded, SCORE_DIM))
                qs[:size] = np.concatenate([qn[at, head], qr[at, head]], axis=1)
                qs *= scale  # exact: dtype values times the fp32 scale (as the tile path scales its queries)
                chunk_counts = np.ones(padded, dtype=np.int64)  # the padding rows see one key
                chunk_counts[:size] = counts[at]
                values = row_block(qs, chunk_counts, ops, score_terms, subnormal_terms)
                golden[at, head] = values["out"][:size]
                for name, target in stored.items():
                    rounded = round_up_bf16 if name in ELEMENT_MAGNITUDES else round_up_float32
                    target[at, head] = rounded(values[name][:size])
                progress.add_work(
                    2 * (SCORE_DIM + V_DIM) * int(chunk_counts[:size].sum())
                )  # golden/building/cost.py sampled_flops' share

    mapping = map_for(len(tasks)) if threads > 1 else map
    with pinned_threads():  # torch imported here, BLAS and torch on one thread per worker (reference.py)
        list(mapping(task, tasks))
    shape = (n, *out_shape(spec)[1:])
    return golden.reshape(shape), {
        name: a.reshape(shape) if name in ELEMENT_MAGNITUDES else a for name, a in stored.items()
    }


def _runs(positions: np.ndarray) -> Iterator[tuple[int, int]]:
    """``[i0, i1)`` of each run of consecutive values in sorted ``positions``."""
    breaks = np.flatnonzero(np.diff(positions) != 1) + 1
    for run in np.split(positions, breaks):
        yield int(run[0]), int(run[-1]) + 1


def sampled_baseline(
    queries: tuple[np.ndarray, np.ndarray], keys: Keys, spec: CaseSpec, rows: np.ndarray, *, threads: int = 1
) -> np.ndarray:
    """attenOut's sampled rows as a kernel with ATB's rounding points computes them, in the case dtype: the
    full path's tile kernel (golden/building/baseline.py) on each run of consecutive sampled rows (``queries``
    and ``keys`` as :func:`sampled_reference` takes them)."""
    kernel = baseline_kernel(spec)
    scale = effective_scale(spec)
    out = np.zeros((rows.size, spec.head_num, V_DIM), dtype=np.float32)
    qn, qr = queries
    group = spec.head_num // spec.kv_head_num
    tasks = [
        (b, where, local, kv_head) for b, where, local in _batch_rows(spec, rows) for kv_head in range(spec.kv_head_num)
    ]

    def task(item: tuple[int, np.ndarray, np.ndarray, int]) -> None:
        pin_worker_threads()
        b, where, local, kv_head = item
        kv_len, offset = spec.kv_seqlen[b], causal_offset(spec, b)
        k_both, v_head = keys(b, kv_head)
        k = np.asfortranarray(k_both, dtype=np.float32)
        v = np.ascontiguousarray(v_head, dtype=np.float32)
        for head in range(kv_head * group, (kv_head + 1) * group):
            for i0, i1 in _runs(local):
                at = where[np.searchsorted(local, i0) : np.searchsorted(local, i1)]  # consecutive: one run
                q = np.concatenate([qn[at, head], qr[at, head]], axis=1)
                k_end = kv_len if offset is None else max(0, min(kv_len, i1 + offset))
                diag = None if offset is None else (i0, offset)
                out[at, head] = kernel(q.astype(np.float32), k[:k_end], v[:k_end], scale, diag)
                progress.add_work(tile_flops(i1 - i0, k_end, diag))

    mapping = map_for(len(tasks)) if threads > 1 else map
    with pinned_threads():  # torch imported here, BLAS and torch on one thread per worker (reference.py)
        list(mapping(task, tasks))
    rounded = out.astype(numpy_dtype(spec.dtype))
    if spec.dtype == "fp16":
        flush_fp16_subnormals(rounded)
    return rounded.reshape(rows.size, *out_shape(spec)[1:])
