"""How slow this machine is now, for the few assertions that a thing happens promptly (a stopped run
exits within seconds, not after its remaining work): such a limit is written for a quiet 2-core machine
and scaled by :func:`slowness`, measured when the assertion is made, so a loaded machine never fails it.
Limits that only guard a hang need no scaling: they are generous (:data:`HANG_S`)."""

from __future__ import annotations

import statistics
import time

#: A child process's limit that only guards a hang: nothing the tests start takes this long when it works,
#: even on a loaded 2-core machine.
HANG_S = 3600
#: Seconds :func:`_work` takes on a quiet 2-core machine (one core free for it).
QUIET_WORK_S = 0.08


def _work() -> float:
    start = time.perf_counter()
    sum(i * i for i in range(1_000_000))
    return time.perf_counter() - start


def slowness() -> float:
    """How many times slower than on a quiet machine a fixed piece of CPU work runs now (at least 1)."""
    return max(1.0, statistics.median(_work() for _ in range(5)) / QUIET_WORK_S)


def within(seconds: float) -> float:
    """``seconds`` on a quiet machine, as long as the same work takes here now."""
    return seconds * slowness()
