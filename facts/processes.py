"""Process facts every room leans on: the thread variables BLAS and OpenMP read, whether a pid lives,
and a child that dies with its parent."""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import sys

#: Read by BLAS (OpenBLAS, MKL, Accelerate), OpenMP and torch when they load: a process's thread share.
THREAD_ENV = (
    "OMP_NUM_THREADS",
    "OPENBLAS_NUM_THREADS",
    "MKL_NUM_THREADS",
    "VECLIB_MAXIMUM_THREADS",
    "NUMEXPR_NUM_THREADS",
)
PR_SET_PDEATHSIG = 1  # linux/prctl.h


def usable_cpus() -> int:
    """The CPUs this process may run on (its affinity mask where the OS has one): the thread budget."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def thread_share() -> int:
    """The threads this process should run at once: OMP_NUM_THREADS when set (an xdist worker's or a
    regen job's share, see THREAD_ENV), else every usable CPU."""
    value = os.environ.get("OMP_NUM_THREADS", "")
    return max(int(value), 1) if value.strip().isdigit() else usable_cpus()


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
