"""Row chunks of ``[T, ...]`` arrays, mapped on a thread pool: the judge's passes and the golden's statistics.

A chunk holds about :data:`CHUNK_ELEMENTS` elements, so that one pass's float64 temporaries (about
ten of them) stay in a core's share of the cache: on the 2-core reference machine the judge of a
deepseek-sized case takes half the time it took with 1 Mi-element chunks (docs/benchmarks.md,
"Judging overhead: chunks and reused memory").  Chunks run on the process's thread share
(:func:`mlaconf.facts.processes.thread_share`; numpy releases the GIL in its loops) and their
results come back in chunk order, so every fold adds the same numbers in the same order whatever the
thread count: a verdict never depends on the machine's core count."""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import TypeVar

import numpy as np

from mlaconf.facts.processes import thread_share

#: Elements per chunk (1 MiB of float64).
CHUNK_ELEMENTS = 128 * 1024
#: At most this many judge threads, whatever the core count (the passes are memory-bound beyond it).
MAX_THREADS = 8
#: A thread is only worth its hand-offs with at least this many chunks to do: a case of one or two
#: chunks (most of the smoke suite) runs inline; on the pool the smoke suite's overhead was 15 % larger.
MIN_CHUNKS_PER_THREAD = 2

R = TypeVar("R")


@dataclass(frozen=True)
class RowChunk:
    """Consecutive valid rows: ``tokens`` their indices, ``start`` the first one's position among the
    valid rows, ``pick`` what indexes them in a ``[T, ...]`` array (a slice when every row is valid,
    so that no chunk is a gathered copy)."""

    start: int
    tokens: np.ndarray
    pick: slice | np.ndarray


def row_chunks(row_valid: np.ndarray, per_row: int) -> list[RowChunk]:
    """The valid rows of ``row_valid`` (bool ``[T]``) in chunks of about CHUNK_ELEMENTS elements of
    ``per_row`` each."""
    valid = np.asarray(row_valid, dtype=bool)
    rows = np.flatnonzero(valid)
    step = max(CHUNK_ELEMENTS // max(per_row, 1), 1)
    contiguous = rows.size == valid.size
    chunks = []
    for start in range(0, rows.size, step):
        tokens = rows[start : start + step]
        chunks.append(RowChunk(start, tokens, slice(start, start + tokens.size) if contiguous else tokens))
    return chunks


_pool: tuple[int, int, ThreadPoolExecutor] | None = None  # the process that made it, its threads, the pool
_pool_lock = threading.Lock()
_in_worker = threading.local()


def _mark_worker() -> None:
    _in_worker.active = True


def _executor(threads: int) -> ThreadPoolExecutor:
    """The process's pool (a forked child makes its own: the parent's threads did not come along)."""
    global _pool
    with _pool_lock:
        if _pool is None or _pool[0] != os.getpid() or _pool[1] != threads:  # never more than the share
            if _pool is not None and _pool[0] == os.getpid():
                _pool[2].shutdown(wait=False)
            _pool = (os.getpid(), threads, ThreadPoolExecutor(threads, "mlaconf-chunks", initializer=_mark_worker))
        return _pool[2]


def map_chunks(fn: Callable[[RowChunk], R], chunks: Sequence[RowChunk]) -> list[R]:
    """``fn`` of every chunk, in chunk order; on the pool when there are several chunks and threads.

    ``fn`` runs in another thread: numpy's error state (``np.errstate``) is per thread, so ``fn`` sets
    its own.  A call from inside a pool thread runs inline (no pool thread waits on the pool); an
    exception or a Ctrl-C cancels the chunks not yet started."""
    threads = min(thread_share(), MAX_THREADS)
    if min(threads, len(chunks) // MIN_CHUNKS_PER_THREAD) <= 1 or getattr(_in_worker, "active", False):
        return [fn(chunk) for chunk in chunks]
    pool = _executor(threads)
    futures: list[Future[R]] = [pool.submit(fn, chunk) for chunk in chunks]
    try:
        return [future.result() for future in futures]
    finally:
        for future in futures:
            future.cancel()
