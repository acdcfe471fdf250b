"""Dependency-free progress on stderr, by work (useful FLOPs) rather than by count.

:class:`Progress` draws count/total, the work done and its rate, and an ETA from the work left
(``useful FLOPs`` of the cases not yet done, less what the running cases have already done). On a
TTY one line is redrawn (at most every 0.2 s); in logs (CI, pytest capture) a full line is printed
per ~5 % of the items (per item when there are at most 20), and while a long case runs at most one
line every :data:`LOG_INTERVAL` seconds, so logs stay short but never go silent for minutes.

Progress *within* a case comes from :func:`case_work`: the golden builder declares the case and
its stages, the reference and baseline report every finished tile (:func:`add_work`), and whoever
listens (``regen``'s progress line, a worker process's queue, the pytest plugin's terminal line)
gets a :class:`CaseWork` snapshot at most every :data:`NOTIFY_INTERVAL` seconds.
"""

from __future__ import annotations

import contextlib
import math
import os
import shutil
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import TextIO

#: Seconds between two in-case notifications to listeners.
NOTIFY_INTERVAL = 0.5
#: Seconds between two progress lines in a log (non-TTY) while a case runs.
LOG_INTERVAL = 30.0


def _duration(seconds: float) -> str:
    if not math.isfinite(seconds):
        return "?"
    whole = round(seconds)
    hours, rest = divmod(whole, 3600)
    return f"{hours}:{rest // 60:02d}:{rest % 60:02d}" if hours else f"{rest // 60}:{rest % 60:02d}"


def flops_text(flops: float) -> str:
    """FLOPs with a unit: 85.9 GFLOP, 19.07 TFLOP."""
    for unit, scale in (("PFLOP", 1e15), ("TFLOP", 1e12), ("GFLOP", 1e9), ("MFLOP", 1e6)):
        if flops >= scale:
            return f"{flops / scale:.{2 if scale >= 1e12 else 1}f} {unit}"
    return f"{flops:.0f} FLOP"


#: An ETA is shown once the rate stands on something: this many seconds in, and this share of the work done
#: (the first seconds of a build run its slowest stage first: a first ETA of hours for a job of a minute).
ETA_AFTER_S = 5.0
ETA_AFTER_SHARE = 0.02


class Progress:
    """Call :meth:`advance` once per finished item and :meth:`close` at the end.

    ``work`` (the useful FLOPs of all items) switches the percentage, rate and ETA from items to
    work; then :meth:`advance` takes each item's work and :meth:`partial` the work the running
    items have done so far.  Thread-safe.
    """

    def __init__(self, total: int, label: str, stream: TextIO | None = None, *, work: float | None = None) -> None:
        self.total, self.label = total, label
        self.stream = stream if stream is not None else sys.stderr
        self.tty = self.stream.isatty()
        self.count = 0
        self.work, self.work_done, self.in_flight = work, 0.0, 0.0
        self.start = time.monotonic()
        self._last_draw = self._last_log = self.start
        self._step = max(1, math.ceil(total / 20))
        self._lock = threading.Lock()
        self._drawn = False  # a TTY line is on screen without its newline yet

    def line(self, note: str = "") -> str:
        elapsed = time.monotonic() - self.start
        if self.work is not None:
            done = self.work_done + self.in_flight
            rate = done / elapsed if elapsed > 0 else 0.0
            left = self.work - done
            eta = 0.0 if left <= 0 else left / rate if rate > 0 else math.inf
            settled = elapsed >= ETA_AFTER_S and done >= ETA_AFTER_SHARE * self.work
            pct = 100.0 * done / self.work if self.work else 100.0
            text = (
                f"{self.label} {self.count}/{self.total} ({pct:.0f}% of "
                f"{flops_text(self.work)}) {rate / 1e9:.1f} GF/s "
                f"elapsed {_duration(elapsed)} ETA {_duration(eta) if settled or left <= 0 else 'estimating'}"
            )
        else:
            rate = self.count / elapsed if elapsed > 0 else 0.0
            eta = (self.total - self.count) / rate if rate > 0 else math.inf
            settled = elapsed >= ETA_AFTER_S and self.count > 0
            pct = 100.0 * self.count / self.total if self.total else 100.0
            text = (
                f"{self.label} {self.count}/{self.total} ({pct:.0f}%) {rate:.2f}/s "
                f"elapsed {_duration(elapsed)} ETA {_duration(eta) if settled else 'estimating'}"
            )
        return f"{text} {note}".rstrip()

    def expect(self, work: float = 0.0) -> None:
        """One more item than counted at the start (a golden thought up to date that had to be built)."""
        with self._lock:
            self.total += 1
            if self.work is not None:
                self.work += work

    def _write(self, note: str, *, final: bool) -> None:
        now = time.monotonic()
        if self.tty:
            if now - self._last_draw >= 0.2 or final:
                # one screen row: a longer line wraps, and "\r" then redraws only its last row
                width = shutil.get_terminal_size().columns - 1
                self.stream.write("\r\033[K" + self.line(note)[: max(width, 20)])
                self.stream.flush()
                self._last_draw, self._drawn = now, True
        elif final or now - self._last_log >= LOG_INTERVAL:
            self.stream.write(self.line(note) + "\n")
            self.stream.flush()
            self._last_log = now

    def advance(self, note: str = "", work: float = 0.0, *, skipped: bool = False) -> None:
        """One item finished; ``skipped`` (nothing computed, e.g. up to date) drops its ``work`` from
        the total instead of counting it as done, so the rate and ETA reflect computed work only."""
        with self._lock:
            self.count += 1
            if skipped and self.work is not None:
                self.work = max(self.work - work, 0.0)
            else:
                self.work_done += work
            self.in_flight = max(0.0, self.in_flight - work)
            log_line = self.count % self._step == 0 or self.count == self.total
            self._write(note, final=self.count == self.total or (not self.tty and log_line))

    def partial(self, in_flight: float, note: str = "") -> None:
        """Work done so far by the items still running (replaces the previous figure)."""
        with self._lock:
            self.in_flight = in_flight
            self._write(note, final=False)

    def close(self) -> None:
        """End the redrawn line, so what follows (a summary, an interrupt's) starts on its own."""
        with self._lock:
            if self._drawn:
                self.stream.write("\n")
                self.stream.flush()
                self._drawn = False


# -- work inside one case --------------------------------------------------------------------------


@dataclass
class CaseWork:
    """The case this process is building: its stages' progress as a fraction of its tile work."""

    case_id: str
    total: float  # tile work of the whole build (reference + baseline: 2 x useful FLOPs)
    done: float = 0.0
    stage: str = "inputs"
    started: float = field(default_factory=time.monotonic)
    finished: bool = False

    @property
    def fraction(self) -> float:
        return min(1.0, self.done / self.total) if self.total > 0 else (1.0 if self.finished else 0.0)

    @property
    def elapsed(self) -> float:
        return time.monotonic() - self.started

    def text(self) -> str:
        return f"[{self.case_id}: {self.stage} {100.0 * self.fraction:.0f}%, {_duration(self.elapsed)}]"


Listener = Callable[[CaseWork], None]
_listeners: list[Listener] = []
_current: CaseWork | None = None
_lock = threading.Lock()
_last_notify = 0.0


def add_listener(listener: Listener) -> Callable[[], None]:
    """Call ``listener`` with in-case progress; returns a function that removes it."""
    _listeners.append(listener)
    return lambda: _listeners.remove(listener) if listener in _listeners else None


def _notify(work: CaseWork) -> None:
    global _last_notify
    _last_notify = time.monotonic()
    for listener in list(_listeners):
        listener(work)


@contextlib.contextmanager
def case_work(case_id: str, total: float) -> Iterator[CaseWork]:
    """Declare the case this process builds (nested calls: the outer one counts)."""
    global _current
    if _current is not None or not _listeners:
        yield _current or CaseWork(case_id, total)
        return
    work = _current = CaseWork(case_id, total)
    try:
        _notify(work)
        yield work
    finally:
        work.finished, _current = True, None
        _notify(work)


def set_stage(name: str) -> None:
    """The running case moved on to stage ``name`` (reference + magnitudes, baseline, statistics)."""
    work = _current
    if work is not None:
        work.stage = name
        _notify(work)


def add_work(amount: float) -> None:
    """A tile of ``amount`` useful FLOPs finished (called from worker threads)."""
    work = _current
    if work is None:
        return
    with _lock:
        work.done += amount
        due = time.monotonic() - _last_notify >= NOTIFY_INTERVAL
    if due:
        _notify(work)


class Announcer:
    """A listener that prints a line for every case build running longer than ``after`` seconds.

    Then one line at most every ``every`` seconds (stage, percent, elapsed, ETA) and one when the
    case is done: pytest runs that generate goldens on demand show why they are slow.
    """

    def __init__(
        self, write: Callable[[str], None], *, after: float = 3.0, every: float = 10.0, label: str = "golden"
    ) -> None:
        self.write, self.after, self.every, self.label = write, after, every, label
        self._last: dict[str, float] = {}

    def __call__(self, work: CaseWork) -> None:
        if work.finished:
            if self._last.pop(work.case_id, None) is not None:
                self.write(f"{self.label}: generated {work.case_id} in {_duration(work.elapsed)}")
            return
        now = time.monotonic()
        if work.elapsed < self.after or now - self._last.get(work.case_id, -math.inf) < self.every:
            return
        first = work.case_id not in self._last
        self._last[work.case_id] = now
        fraction = work.fraction
        eta = work.elapsed * (1.0 - fraction) / fraction if fraction >= 0.02 else math.inf
        size = f" ({flops_text(work.total / 2)} useful)" if first else ""
        self.write(
            f"{self.label}: generating {work.case_id}{size}: {work.stage} {100 * fraction:.0f}%, "
            f"elapsed {_duration(work.elapsed)}, ETA {_duration(eta)}"
        )


def fd_writer(fd: int) -> Callable[[str], None]:
    """Write whole lines to a file descriptor (one ``write`` each, so concurrent writers don't mix)."""

    def write(line: str) -> None:
        with contextlib.suppress(OSError):
            os.write(fd, ("\n" + line + "\n").encode())

    return write
