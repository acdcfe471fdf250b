"""The regen progress line on a terminal: one screen row, and ended before any summary follows."""

from __future__ import annotations

import io
import os

import pytest

from mlaconf.golden.building import progress


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.mark.parametrize("columns", [40, 80, 200])
def test_the_redrawn_line_fits_the_terminal(monkeypatch: pytest.MonkeyPatch, columns: int) -> None:
    monkeypatch.setattr(progress.shutil, "get_terminal_size", lambda *a, **k: os.terminal_size((columns, 24)))
    screen = Terminal()
    bar = progress.Progress(3, "regen", screen, work=3e9)
    for _ in range(3):
        bar.advance("bf16-causal-krope_ctkv-b4-s1024-h16-q3d-padded-3fa2c1d0 generated", work=1e9)
    drawn = [row.removeprefix("\033[K") for row in screen.getvalue().split("\r") if row]
    assert drawn and all(len(row) < columns for row in drawn), [len(row) for row in drawn]


def test_an_interrupt_summary_starts_on_its_own_line(monkeypatch: pytest.MonkeyPatch) -> None:
    """Ctrl-C before the first case finished: the partial line was drawn, close() must still end it."""
    clock = iter(range(1000))
    monkeypatch.setattr(progress.time, "monotonic", lambda: float(next(clock)))  # a second between calls
    screen = Terminal()
    bar = progress.Progress(5, "regen", screen, work=5e9)
    bar.partial(1e8)
    assert screen.getvalue().startswith("\r\033[Kregen 0/5")
    bar.close()
    screen.write("regen: interrupted: 0 generated")
    assert screen.getvalue().endswith("\nregen: interrupted: 0 generated")
    bar.close()  # a second close draws nothing more
    assert screen.getvalue().count("\n") == 1
