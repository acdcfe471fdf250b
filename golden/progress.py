"""A dependency-free progress line on stderr: count/total, rate, ETA.

On a TTY one line is redrawn (at most every 0.2 s); in logs (CI, pytest capture) a full line is
printed per ~5 % of the work, and per item when there are at most 20, so logs stay short.
"""

from __future__ import annotations

import math
import sys
import time
from typing import TextIO


def _duration(seconds: float) -> str:
    if not math.isfinite(seconds):
        return "?"
    whole = round(seconds)
    hours, rest = divmod(whole, 3600)
    return f"{hours}:{rest // 60:02d}:{rest % 60:02d}" if hours else f"{rest // 60}:{rest % 60:02d}"


class Progress:
    """Call :meth:`advance` once per finished item and :meth:`close` at the end."""

    def __init__(self, total: int, label: str, stream: TextIO | None = None) -> None:
        self.total, self.label = total, label
        self.stream = stream if stream is not None else sys.stderr
        self.tty = self.stream.isatty()
        self.count = 0
        self.start = time.monotonic()
        self._last_draw = 0.0
        self._step = max(1, math.ceil(total / 20))

    def line(self, note: str = "") -> str:
        elapsed = time.monotonic() - self.start
        rate = self.count / elapsed if elapsed > 0 else 0.0
        eta = (self.total - self.count) / rate if rate > 0 else math.inf
        pct = 100.0 * self.count / self.total if self.total else 100.0
        text = (f"{self.label} {self.count}/{self.total} ({pct:.0f}%) {rate:.2f}/s "
                f"elapsed {_duration(elapsed)} ETA {_duration(eta)}")
        return f"{text} {note}".rstrip()

    def advance(self, note: str = "") -> None:
        self.count += 1
        now = time.monotonic()
        if self.tty:
            if now - self._last_draw >= 0.2 or self.count == self.total:
                self.stream.write("\r\033[K" + self.line(note))
                self.stream.flush()
                self._last_draw = now
        elif self.count % self._step == 0 or self.count == self.total:
            self.stream.write(self.line(note) + "\n")
            self.stream.flush()

    def close(self) -> None:
        if self.tty and self.count:
            self.stream.write("\n")
            self.stream.flush()
