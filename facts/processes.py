"""Process facts every room leans on: the thread budget and the one thread pool that spends it, the thread
variables BLAS and OpenMP read, whether a pid lives, and a child that dies with its parent.

The budget (:func:`thread_share`) is the threads this process may run at once.  One pool per process
(:func:`shared_pool`, that many workers) runs both the golden reference's tiles and the chunk passes of the
judge and of the golden's statistics, under two rules: work mapped from inside a pool worker runs inline (a
worker waiting on the pool could wait forever once every worker did), and a pool worker runs torch (and the
MKL under its GEMMs, whose thread count is per thread) on one thread (:func:`pin_worker_threads`), so the
workers never multiply into more threads than the budget; the reference also pins BLAS process-wide while
its tiles run (``mlaconf.golden.building.reference.pinned_threads``).  A caller maps its own function with the map
:func:`map_for` hands it (the pool's ``Executor.map`` or the builtin ``map``): results come back in order,
so every fold adds the same numbers in the same order whatever the budget."""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

#: Read by BLAS (OpenBLAS, MKL, Accelerate), OpenMP and torch when they load: a process's thread share.
THREAD_ENV = (
    "OMP_NUM_THREADS",
    "OPENBLAS_NUM_THREADS",
    "MKL_NUM_THREADS",
    "VECLIB_MAXIMUM_THREADS",
    "NUMEXPR_NUM_THREADS",
)
PR_SET_PDEATHSIG = 1  # linux/prctl.h
#: Exit status of a command stopped by Ctrl-C or a stop signal (128 + SIGINT, as shells report it).
INTERRUPTED = 130


def usable_cpus() -> int:
    """The CPUs this process may run on (its affinity mask where the OS has one): the thread budget."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def thread_share() -> int:
    """The threads this process should run at once: OMP_NUM_THREADS when set (an xdist worker's or a
    regen job's share, see THREAD_ENV), else every usable CPU."""
    value = os.environ.get("OMP_NUM_THREADS", "")
    return max(int(value), 1) if value.strip().isdigit() else usable_cpus()


#: Work items a pool thread must have to be worth its hand-offs: a map of one or two items (most of the smoke
#: suite's chunk passes) runs inline; on the pool the smoke suite's judging overhead was 15 % larger.
MIN_ITEMS_PER_THREAD = 2

_pool: tuple[int, int, ThreadPoolExecutor] | None = None  # the process that made it, its workers, the pool
_pool_lock = threading.Lock()
_worker = threading.local()  # ``pool`` set in the pool's threads; ``torch_pinned`` once torch runs on one


def _start_worker() -> None:
    _worker.pool = True


def in_pool_worker() -> bool:
    """Whether the calling thread is one of the pool's workers."""
    return getattr(_worker, "pool", False)


def pin_worker_threads() -> None:
    """In a pool worker, torch's intra-op threads (OpenMP and MKL, both counted per calling thread) set to
    one, once torch is loaded: a worker's torch call never fans out past the budget, and a GEMM sums in the
    same order on every worker.  Work that runs torch calls it first (cheap: once per worker); a no-op in
    any other thread, so the caller's own torch threads stay as they are."""
    if in_pool_worker() and not getattr(_worker, "torch_pinned", False) and "torch" in sys.modules:
        sys.modules["torch"].set_num_threads(1)
        _worker.torch_pinned = True


def shared_pool() -> ThreadPoolExecutor | None:
    """The process's pool of :func:`thread_share` workers, or None where work must run inline: a budget
    of one thread, or a caller that is itself a pool worker.  A new share (another xdist worker count) or a
    forked child (the parent's threads did not come along) gets a new pool."""
    global _pool
    threads = thread_share()
    if threads <= 1 or in_pool_worker():
        return None
    with _pool_lock:
        if _pool is None or _pool[0] != os.getpid() or _pool[1] != threads:
            if _pool is not None and _pool[0] == os.getpid():
                _pool[2].shutdown(wait=False)
            _pool = (os.getpid(), threads, ThreadPoolExecutor(threads, "mlaconf-pool", initializer=_start_worker))
        return _pool[2]


def map_for(items: int) -> Callable[..., Iterator[Any]]:
    """The map to run ``items`` independent pieces of work with: the shared pool's ``Executor.map`` (results
    in order; an exception or a Ctrl-C cancels the items not yet started) when there are at least
    :data:`MIN_ITEMS_PER_THREAD` items per thread for two threads, else the builtin ``map`` (inline).

    The mapped function may run on another thread: numpy's error state (``np.errstate``) is per thread, so
    it sets its own.  The caller calls its own function through the standard map, so no room calls back
    into the room that owns the function."""
    pool = shared_pool() if items >= 2 * MIN_ITEMS_PER_THREAD else None  # a pool has at least two workers
    return map if pool is None else pool.map


def process_alive(pid: object) -> bool:
    """Whether a process of this host with that pid is running (another user's counts as running)."""
    if not isinstance(pid, int) or isinstance(pid, bool) or pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def kill_with_parent() -> bool:
    """Ask the kernel to SIGKILL this process when its parent dies (Linux); False where it cannot."""
    if not sys.platform.startswith("linux"):
        return False
    with contextlib.suppress(Exception):
        return bool(ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL) == 0)
    return False
