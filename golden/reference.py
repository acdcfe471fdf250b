"""The float64 MLA prefill reference (spec section 4), computed blockwise.

For each batch, kv head and query head, query rows are processed in tiles: one GEMM against the
keys the tile may see (keys beyond the last allowed one are never touched, so causal masks halve
the work), an exact mask on the diagonal part, a max-subtracted softmax in float64, and one GEMM
with V.  Memory is inputs + output + O(tile x S) per worker, never O(S^2) per head.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np

from golden.layout import causal_offset, kv_views, offsets, out_shape, q_views, row_valid
from golden.spec import V_DIM, CaseSpec
from golden.types import OpInputs

DEFAULT_TILE = 256


@dataclass(frozen=True)
class HeadTask:
    """One (batch, query head) of work: its query rows and its kv head's keys and values."""

    batch: int
    head: int
    q_start: int
    q_len: int
    offset: int | None  # causal offset, None = bidirectional
    q: np.ndarray  # [q_len, 192]
    k: np.ndarray  # [kv_len, 192]
    v: np.ndarray  # [kv_len, 128]


#: A tile kernel computes attention rows for queries ``q`` against keys ``k[:k_end]``.
#: ``diag`` is the query row index (within the batch) of the tile's first row and the causal
#: offset, or None for bidirectional tiles.
TileKernel = Callable[[np.ndarray, np.ndarray, np.ndarray, float, "tuple[int, int] | None"], np.ndarray]


def effective_scale(spec: CaseSpec) -> float:
    """qkScale as the operator receives it: a C ``float``."""
    return float(np.float32(spec.qk_scale))


def iter_head_tasks(inputs: OpInputs, spec: CaseSpec, compute_dtype: type[np.floating]) -> Iterator[HeadTask]:
    """Yield per-(batch, head) work with k/v converted once per (batch, kv head)."""
    qn, qr = q_views(inputs, spec)
    starts = offsets(spec.q_seqlen)
    group = spec.head_num // spec.kv_head_num
    for b in range(spec.batch):
        q_len, kv_len = spec.q_seqlen[b], spec.kv_seqlen[b]
        if q_len == 0 or kv_len == 0:
            continue
        kn, kr, vv = kv_views(inputs, spec, b)
        rows = slice(int(starts[b]), int(starts[b]) + q_len)
        for g in range(spec.kv_head_num):
            k = np.concatenate([kn[:, g], kr[:, g]], axis=1).astype(compute_dtype)
            v = np.ascontiguousarray(vv[:, g], dtype=compute_dtype)
            for h in range(g * group, (g + 1) * group):
                q = np.concatenate([qn[rows, h], qr[rows, h]], axis=1).astype(compute_dtype)
                yield HeadTask(b, h, int(starts[b]), q_len, causal_offset(spec, b), q, k, v)


def run_tiles(task: HeadTask, kernel: TileKernel, scale: float, tile: int) -> np.ndarray:
    """Apply ``kernel`` tile by tile over one head's query rows; returns ``[q_len, 128]``."""
    out = np.empty((task.q_len, V_DIM), dtype=task.q.dtype)
    kv_len = task.k.shape[0]
    for i0 in range(0, task.q_len, tile):
        i1 = min(i0 + tile, task.q_len)
        if task.offset is None:
            k_end, diag = kv_len, None
        else:
            k_end, diag = min(kv_len, i1 + task.offset), (i0, task.offset)
        out[i0:i1] = kernel(task.q[i0:i1], task.k[:k_end], task.v[:k_end], scale, diag)
    return out


def apply_causal(scores: np.ndarray, diag: tuple[int, int] | None, fill: float) -> None:
    """Set disallowed keys (j > i + offset) of a tile to ``fill``, in place."""
    if diag is None:
        return
    row0, offset = diag
    rows, cols = scores.shape
    first_masked = row0 + offset + 1  # first disallowed key of the tile's first row
    if first_masked >= cols:
        return
    i = np.arange(rows)[:, None] + row0
    j = np.arange(first_masked, cols)[None, :]
    block = scores[:, first_masked:]
    block[j > i + offset] = fill


def float64_tile(q: np.ndarray, k: np.ndarray, v: np.ndarray, scale: float, diag: tuple[int, int] | None) -> np.ndarray:
    """Exact-as-float64-allows attention for one tile."""
    scores = q @ k.T
    scores *= scale
    apply_causal(scores, diag, -np.inf)
    scores -= scores.max(axis=1, keepdims=True)
    np.exp(scores, out=scores)
    denom = scores.sum(axis=1, keepdims=True)
    out = scores @ v
    out /= denom
    return out


def attention(
    inputs: OpInputs,
    spec: CaseSpec,
    kernel: TileKernel,
    compute_dtype: type[np.floating],
    *,
    tile: int = DEFAULT_TILE,
    threads: int = 1,
) -> np.ndarray:
    """Run ``kernel`` over every (batch, head); returns ``[T, H, 128]`` in ``compute_dtype``."""
    out = np.zeros((spec.total_q, spec.head_num, V_DIM), dtype=compute_dtype)
    scale = effective_scale(spec)

    def work(task: HeadTask) -> None:
        out[task.q_start : task.q_start + task.q_len, task.head] = run_tiles(task, kernel, scale, tile)

    tasks = iter_head_tasks(inputs, spec, compute_dtype)
    if threads <= 1:
        for task in tasks:
            work(task)
    else:
        with ThreadPoolExecutor(max_workers=threads) as pool:
            pending: deque[Future[None]] = deque()
            for task in tasks:  # a bounded window keeps memory at O(threads) tasks
                pending.append(pool.submit(work, task))
                if len(pending) >= 2 * threads:
                    pending.popleft().result()
            for future in pending:
                future.result()
    return out


def default_threads() -> int:
    return max(1, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1)


def reference_attention(
    inputs: OpInputs, spec: CaseSpec, *, tile: int = DEFAULT_TILE, threads: int = 1
) -> tuple[np.ndarray, np.ndarray]:
    """The float64 golden in attenOut's layout, and the per-row validity mask."""
    out = attention(inputs, spec, float64_tile, np.float64, tile=tile, threads=threads)
    return out.reshape(out_shape(spec)), row_valid(spec)
