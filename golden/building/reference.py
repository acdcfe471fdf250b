"""The float64 MLA prefill reference (docs/operator.md §4), computed blockwise.

For each batch, kv head and query head, query rows are processed in tiles: one GEMM against the
keys the tile may see (keys beyond the last allowed one are never touched, so causal masks halve
the work), an exact mask on the diagonal part, a max-subtracted softmax in float64, and one GEMM
with V.  Memory is inputs + output + O(tile x S) per worker, never O(S^2) per head.

Throughput is bounded by float64 GEMM.  On the CPU (:func:`fused_tile`) the two GEMMs run in
BLAS (torch's, which is faster than numpy's at the tiles' shapes) and everything between them runs
in one compiled pass per row while the row is in cache (``mlaconf.golden.building._tile_kernel``: mask, row
max, exp, sum); :func:`float64_tile` is the same mathematics in plain numpy, kept as the formula the
fused kernel is checked against (tests) and for other kernels' tiles.  ``threads`` workers take tiles
from a bounded queue while BLAS is pinned to one thread each (threadpoolctl, when installed):
tiles, not heads, are the unit so a single-head case also uses every worker, and the numpy exp
that BLAS threads cannot parallelise runs on all cores.  Results do not depend on ``threads``.

``device="cuda"`` runs the same tiling in torch float64 on a GPU (see :func:`torch_attention`).
"""

from __future__ import annotations

import contextlib
import functools
import os
import re
import threading
from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import Future, wait
from dataclasses import dataclass
from typing import Any

import numpy as np

from mlaconf.facts.operator import SCORE_DIM, V_DIM
from mlaconf.facts.processes import pin_worker_threads, shared_pool
from mlaconf.golden.building import progress
from mlaconf.golden.specs.layout import causal_offset, kv_views, offsets, out_shape, q_views, row_valid
from mlaconf.golden.specs.spec import CaseSpec
from mlaconf.golden.specs.types import OpInputs

try:  # optional: without it BLAS keeps its own thread count (may oversubscribe with threads > 1)
    from threadpoolctl import threadpool_limits
except ImportError:  # pragma: no cover - exercised only where threadpoolctl is absent
    threadpool_limits = None

#: Query rows per tile; tuned with ``mlaconf bench`` (docs/benchmarks.md).
DEFAULT_TILE = 256
#: Query rows per tile of the fused CPU kernel (its GEMMs run closer to BLAS's peak on taller tiles).
FUSED_TILE = 512
#: Floor of the rounded-up float32 P and P^2 (the magnitudes' GEMM operands; see mlaconf.golden.building.magnitudes).
ROUNDED_UP_FLOOR = 2.0**-126
#: GPU tiles are larger: a tile of scores is tile x S x 8 bytes of device memory.
DEFAULT_GPU_TILE = 2048
#: Environment variable ``build_golden`` reads to pick the reference's device ("cpu" or "cuda").
DEVICE_ENV = "MLA_GOLDEN_DEVICE"


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
    vt: np.ndarray  # [128, kv_len], V transposed, C-contiguous: the operand of value_gemm


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
            # Fortran order: the tiles' ``q @ k[:k_end].T`` is then a plain (NN) GEMM, ~5-9 % faster
            k = np.asfortranarray(np.concatenate([kn[:, g], kr[:, g]], axis=1), dtype=compute_dtype)
            v = np.ascontiguousarray(vv[:, g], dtype=compute_dtype)
            vt = np.ascontiguousarray(v.T)
            for h in range(g * group, (g + 1) * group):
                q = np.concatenate([qn[rows, h], qr[rows, h]], axis=1).astype(compute_dtype)
                yield HeadTask(b, h, int(starts[b]), q_len, causal_offset(spec, b), q, k, v, vt)


def tile_rows(q_len: int, kv_len: int, offset: int | None, tile: int) -> Iterator[tuple[int, int, int]]:
    """``(i0, i1, k_end)`` per query tile of one (batch, head): rows i0..i1 see at most keys ``[0, k_end)``.

    A causal tile computes its whole ``rows x k_end`` block, the masked corner above the diagonal included:
    cutting the diagonal tile into 256-row blocks computed 5.6 % fewer pairs on a causal 4096 head but
    built only about 3 % faster (quiet A/B), too little to change every causal golden's last bits for."""
    for i0 in range(0, q_len, tile):
        i1 = min(i0 + tile, q_len)
        yield i0, i1, kv_len if offset is None else max(0, min(kv_len, i1 + offset))


def tile_bounds(task: HeadTask, tile: int) -> Iterator[tuple[int, int, int, tuple[int, int] | None]]:
    """``(i0, i1, k_end, diag)`` per query tile (:func:`tile_rows`): rows i0..i1 see at most keys ``[0, k_end)``."""
    for i0, i1, k_end in tile_rows(task.q_len, task.k.shape[0], task.offset, tile):
        yield i0, i1, k_end, None if task.offset is None else (i0, task.offset)


def tile_flops(q_len: int, k_end: int, diag: tuple[int, int] | None) -> int:
    """Useful FLOPs of a tile of ``q_len`` rows (summed over every tile: the case's useful FLOPs)."""
    if diag is None:
        pairs = q_len * k_end
    else:  # row row0 + r sees min(k_end, first + r) keys, first = row0 + offset + 1 (closed form)
        row0, offset = diag
        first = row0 + offset + 1
        growing = max(0, min(q_len, k_end - first))  # rows still below k_end
        pairs = growing * first + growing * (growing - 1) // 2 + (q_len - growing) * k_end
    return 2 * (SCORE_DIM + V_DIM) * pairs


def causal_block(diag: tuple[int, int] | None, shape: tuple[int, ...]) -> tuple[int, np.ndarray] | None:
    """The tile's masked part: first masked key column and a boolean mask of the columns after it.

    Only columns past the first row's last allowed key can be masked, so kernels touch that
    (at most tile-wide) block instead of the whole tile.  None when nothing is masked.
    """
    if diag is None:
        return None
    row0, offset = diag
    rows, cols = shape
    first_masked = row0 + offset + 1  # first disallowed key of the tile's first row
    if first_masked >= cols:
        return None
    i = np.arange(rows)[:, None] + row0
    j = np.arange(first_masked, cols)[None, :]
    return first_masked, j > i + offset


def apply_causal(scores: np.ndarray, diag: tuple[int, int] | None, fill: float) -> None:
    """Set disallowed keys (j > i + offset) of a tile to ``fill``, in place."""
    block = causal_block(diag, scores.shape)
    if block is not None:
        first_masked, masked = block
        scores[:, first_masked:][masked] = fill


def float64_tile(q: np.ndarray, k: np.ndarray, v: np.ndarray, scale: float, diag: tuple[int, int] | None) -> np.ndarray:
    """Exact-as-float64-allows attention for one tile, with every elementwise pass in place.

    The scale is folded into q (a tile x 192 pass instead of a tile x S one); for dtype-valued
    inputs ``q * float32(scale)`` is exact in float64, so only GEMM rounding differs.
    """
    scores = (q * scale) @ k.T
    apply_causal(scores, diag, -np.inf)
    np.subtract(scores, scores.max(axis=1, keepdims=True), out=scores)
    exp_inplace(scores)
    denom = scores.sum(axis=1, keepdims=True)
    out: np.ndarray = scores @ v
    out /= denom
    return out


class Workspace(threading.local):
    """Per-thread scratch buffers of one build, reused from tile to tile (fresh pages cost page faults)."""

    def __init__(self) -> None:
        self._buffers: dict[str, np.ndarray] = {}

    def take(self, name: str, shape: tuple[int, int], dtype: type[np.floating]) -> np.ndarray:
        """A C-contiguous ``shape`` view of the thread's buffer ``name`` (contents undefined)."""
        size = shape[0] * shape[1]
        buffer = self._buffers.get(name)
        if buffer is None or buffer.size < size or buffer.dtype != dtype:
            buffer = self._buffers[name] = np.empty(size, dtype=dtype)
        return buffer[:size].reshape(shape)


@functools.cache
def tile_kernel() -> Any:
    """The compiled fused softmax kernel (built with the package, like the ATB harness)."""
    try:
        from mlaconf.golden.building import _tile_kernel
    except ImportError as exc:
        raise ImportError(
            "mlaconf.golden.building._tile_kernel is not built: "
            "pip install -e . (or python setup.py build_ext --inplace)"
        ) from exc
    return _tile_kernel


def gemm(a: np.ndarray, b: np.ndarray, out: np.ndarray) -> np.ndarray:
    """``out = a @ b`` through torch's BLAS (faster than numpy's at the tiles' shapes); numpy views in and out."""
    torch = _torch()
    if torch is None:  # pragma: no cover - torch is a dependency
        return np.matmul(a, b, out=out)
    torch.matmul(torch.from_numpy(a), torch.from_numpy(b), out=torch.from_numpy(out))
    return out


def gemm_library() -> str:
    """What :func:`gemm` runs in, for a golden's provenance: torch's BLAS (MKL in the x86 wheels; not
    numpy's OpenBLAS) with the CPU code path it picks, which decides the summation order; MKL_CBWR,
    when set, fixes that path."""
    torch = _torch()
    if torch is None:  # pragma: no cover - torch is a dependency
        return f"numpy {np.__version__} matmul (numpy's BLAS)"
    config = torch.__config__.show()
    blas = re.search(r"BLAS_INFO=([^,\s]+)", config)
    mkl = re.search(r"Math Kernel Library Version ([0-9.]+)", config)
    name = f"MKL {mkl[1]}" if mkl and blas and blas[1] == "mkl" else (blas[1] if blas else "unknown BLAS")
    capability = torch.backends.cpu.get_cpu_capability()
    cbwr = os.environ.get("MKL_CBWR", "unset")
    return f"{name} via torch {torch.__version__} (CPU capability {capability}, MKL_CBWR {cbwr})"


def value_gemm(p: np.ndarray, vt: np.ndarray) -> np.ndarray:
    """``p @ v`` for ``vt = v.T`` (C-contiguous rows, any row stride), as the transposed product ``vt @ p.T``
    into a fresh array: MKL's float64 GEMM runs ~1.4x faster with the tile's rows as N than with V's 128
    columns (docs/benchmarks.md).  Returns the ``[rows, 128]`` (Fortran-ordered) view."""
    out = np.empty((vt.shape[0], p.shape[0]), dtype=p.dtype)
    gemm(vt, p.T, out)
    result: np.ndarray = out.T
    return result


def fused_scores(
    q: np.ndarray,
    k: np.ndarray,
    diag: tuple[int, int] | None,
    work: Workspace,
    *,
    rounded_up: bool = False,
    raw: np.ndarray | None = None,
    products: tuple[np.ndarray, np.ndarray] | None = None,
) -> tuple[np.ndarray, np.ndarray, tuple[np.ndarray, np.ndarray] | None]:
    """``P = e^(q k^T - row max)`` (0 on masked keys) in a workspace tile, and its row statistics
    ``[4, rows]`` (max and min of the allowed scores, sum of P, sum of P^2); with ``rounded_up``
    also P and P^2 as float32 rounded up (floored at float32's smallest normal:
    :mod:`mlaconf.golden.building.magnitudes`).
    ``raw`` receives the scores before the softmax with masked keys 0, copied in the kernel's pass (a copy
    costs far less than a second GEMM); ``products`` = ``(ps, ps_sums)`` receives the magnitudes' ``(P / sum P) s``
    and its row sums of ``|.|`` and of it, made in the same pass while each row is in cache."""
    rows, cols = q.shape[0], k.shape[0]
    scores = gemm(q, k.T, work.take("scores", (rows, cols), np.float64))
    stats = np.empty((4, rows))
    p32 = (
        (work.take("p32", (rows, cols), np.float32), work.take("p2_32", (rows, cols), np.float32))
        if rounded_up
        else None
    )
    first = None if diag is None else diag[0] + diag[1]
    tile_kernel().softmax_tile(
        scores, stats, first, *(p32 or (None, None)), ROUNDED_UP_FLOOR, raw, *(products or (None, None))
    )
    return scores, stats, p32


def fused_tile(
    q: np.ndarray, k: np.ndarray, vt: np.ndarray, scale: float, diag: tuple[int, int] | None, work: Workspace
) -> np.ndarray:
    """:func:`float64_tile` with the elementwise steps fused in the compiled kernel (same scaled q,
    same row max; the sums, exp and ``P V`` (:func:`value_gemm`) round differently, within ~1e-15 of
    the result); ``vt`` is V transposed."""
    p, stats, _ = fused_scores(q * scale, k, diag, work)
    out = value_gemm(p, vt)
    out /= stats[2][:, None]
    return out


@functools.cache
def _torch() -> Any:
    """The torch module when installed (for its vectorised exp), else None."""
    try:
        import torch
    except ImportError:  # pragma: no cover - torch is a dependency; the fallback is tested directly
        return None
    return torch


def exp_inplace(values: np.ndarray) -> None:
    """``values = e^values`` for a C-contiguous float64 array.

    numpy's float64 exp is scalar libm on AVX2 machines (~5 ns per element, a fifth of a tile's
    time); torch's is vectorised (~2 ns).  Both are within 1 ulp, so the choice moves results by
    rounding only.  Call it inside :func:`pinned_threads`, or torch forks its own threads.
    """
    torch = _torch()
    if torch is None:
        np.exp(values, out=values)
    else:
        torch.from_numpy(values).exp_()


@contextlib.contextmanager
def blas_threads(count: int) -> Iterator[None]:
    """Pin BLAS to ``count`` threads inside the block (process-wide; a no-op without threadpoolctl)."""
    if threadpool_limits is None:
        yield
        return
    with threadpool_limits(limits=count, user_api="blas"):
        yield


@contextlib.contextmanager
def pinned_threads() -> Iterator[None]:
    """One BLAS thread and one torch (OpenMP) thread per calling thread inside the block.

    Process-wide settings, restored on exit: our workers are the parallelism, and a BLAS or torch
    call that forked its own threads would oversubscribe the cores ``threads`` promised to use.
    Pool workers also pin torch themselves (:func:`mlaconf.facts.processes.pin_worker_threads`).
    """
    torch = _torch()
    previous = torch.get_num_threads() if torch is not None else 0
    if torch is not None:
        torch.set_num_threads(1)
    try:
        with blas_threads(1):
            yield
    finally:
        if torch is not None:
            torch.set_num_threads(previous)


#: What :func:`for_each_tile` calls per tile: ``(task, i0, i1, k_end, diag)``.
TileVisitor = Callable[[HeadTask, int, int, int, "tuple[int, int] | None"], None]


def for_each_tile(
    inputs: OpInputs,
    spec: CaseSpec,
    visit: TileVisitor,
    compute_dtype: type[np.floating],
    *,
    tile: int = DEFAULT_TILE,
    threads: int = 1,
) -> None:
    """Call ``visit`` on every query tile of every (batch, head), then report the tile's useful FLOPs.

    With ``threads > 1`` up to ``threads`` tiles at once run on the process's pool (at most its thread
    budget: :func:`mlaconf.facts.processes.shared_pool`; inline inside a pool worker) through a bounded
    window (memory stays O(threads) tasks) while BLAS and torch run one thread each; visitors write
    disjoint rows, so their results are bit-for-bit independent of ``threads``.
    """
    running = threading.BoundedSemaphore(max(threads, 1))

    def one_tile(task: HeadTask, i0: int, i1: int, k_end: int, diag: tuple[int, int] | None) -> None:
        pin_worker_threads()
        with running:
            visit(task, i0, i1, k_end, diag)
        progress.add_work(tile_flops(i1 - i0, k_end, diag))

    tasks = iter_head_tasks(inputs, spec, compute_dtype)
    with pinned_threads():
        pool = shared_pool() if threads > 1 else None
        if pool is None:
            for task in tasks:
                for bounds in tile_bounds(task, tile):
                    one_tile(task, *bounds)
            return
        pending: deque[Future[None]] = deque()
        try:
            for task in tasks:
                for bounds in tile_bounds(task, tile):
                    pending.append(pool.submit(one_tile, task, *bounds))
                    if len(pending) >= 4 * threads:
                        pending.popleft().result()
            for future in pending:
                future.result()
        finally:  # a failed tile: the others not started are dropped, the running ones finish under the pins
            for future in pending:
                future.cancel()
            wait(pending)


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

    def visit(task: HeadTask, i0: int, i1: int, k_end: int, diag: tuple[int, int] | None) -> None:
        rows = slice(task.q_start + i0, task.q_start + i1)
        out[rows, task.head] = kernel(task.q[i0:i1], task.k[:k_end], task.v[:k_end], scale, diag)

    for_each_tile(inputs, spec, visit, compute_dtype, tile=tile, threads=threads)
    return out


def torch_attention(
    inputs: OpInputs, spec: CaseSpec, *, device: str = "cuda", tile: int = DEFAULT_GPU_TILE
) -> np.ndarray:
    """The same tiled float64 computation in torch on ``device``; returns ``[T, H, 128]`` float64.

    Off by default: GPUs make float64 goldens for production shapes cheap.  It shares the task and
    tile decomposition with the numpy path and is tested against it on CPU (``device="cpu"``).
    """
    import torch  # deferred: the numpy path must not pay for importing torch

    if device.startswith("cuda") and not torch.cuda.is_available():
        raise RuntimeError(f"{DEVICE_ENV}={device!r} but torch sees no CUDA device")
    dev = torch.device(device)
    out = torch.zeros((spec.total_q, spec.head_num, V_DIM), dtype=torch.float64, device=dev)
    scale = effective_scale(spec)
    kv_cache: tuple[Any, Any, Any] | None = None  # the current kv head's k, v on the device
    for task in iter_head_tasks(inputs, spec, np.float64):
        if kv_cache is None or kv_cache[0] is not task.k:
            kv_cache = (task.k, torch.from_numpy(task.k).to(dev), torch.from_numpy(task.v).to(dev))
        _, k, v = kv_cache
        q = torch.from_numpy(task.q).to(dev) * scale
        for i0, i1, k_end, diag in tile_bounds(task, tile):
            scores = q[i0:i1] @ k[:k_end].T
            if diag is not None:
                i = torch.arange(i0, i1, device=dev)[:, None]
                j = torch.arange(k_end, device=dev)[None, :]
                scores.masked_fill_(j > i + diag[1], float("-inf"))
            scores -= scores.amax(dim=1, keepdim=True)
            scores.exp_()
            rows = slice(task.q_start + i0, task.q_start + i1)
            out[rows, task.head] = (scores @ v[:k_end]) / scores.sum(dim=1, keepdim=True)
            progress.add_work(tile_flops(i1 - i0, k_end, diag))
    result: np.ndarray = out.cpu().numpy()
    return result


def reference_attention(
    inputs: OpInputs,
    spec: CaseSpec,
    *,
    tile: int | None = None,
    threads: int = 1,
    device: str = "cpu",
) -> tuple[np.ndarray, np.ndarray]:
    """The float64 golden in attenOut's layout, and the per-row validity mask.

    ``device="cpu"`` is the fused CPU path (:func:`fused_tile`); anything else (``"cuda"``, ``"cuda:1"``) runs
    :func:`torch_attention` there.  ``tile`` defaults per path.
    """
    if device == "cpu":
        work = Workspace()
        out = np.zeros((spec.total_q, spec.head_num, V_DIM))
        scale = effective_scale(spec)

        def visit(task: HeadTask, i0: int, i1: int, k_end: int, diag: tuple[int, int] | None) -> None:
            tile_out = fused_tile(task.q[i0:i1], task.k[:k_end], task.vt[:, :k_end], scale, diag, work)
            out[task.q_start + i0 : task.q_start + i1, task.head] = tile_out

        for_each_tile(inputs, spec, visit, np.float64, tile=tile or FUSED_TILE, threads=threads)
    else:
        out = torch_attention(inputs, spec, device=device, tile=tile or DEFAULT_GPU_TILE)
    return out.reshape(out_shape(spec)), row_valid(spec)
