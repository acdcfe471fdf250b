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


def test_no_eta_before_the_rate_stands_on_something(monkeypatch: pytest.MonkeyPatch) -> None:
    """The first seconds run a build's slowest stage: 1 % done after 1 s is no 100 s job, so no figure yet."""
    now = [0.0]
    monkeypatch.setattr(progress.time, "monotonic", lambda: now[0])
    bar = progress.Progress(1, "regen", io.StringIO(), work=100e9)
    now[0] = 1.0
    bar.in_flight = 1e9
    assert bar.line().endswith("ETA estimating")
    now[0] = 10.0
    bar.in_flight = 10e9
    assert bar.line().endswith("ETA 1:30")  # 10 % in 10 s: 90 s left


def test_regen_of_a_full_store_counts_only_work_to_do(tmp_path: pytest.TempPathFactory) -> None:
    """A store already holding every golden: one line says so, and no progress line counts work not done."""
    from mlaconf.golden.building import regen as rg
    from mlaconf.golden.building.generate import build_golden
    from mlaconf.golden.specs.spec_build import build_case
    from mlaconf.golden.store.directory import GoldenStore

    specs = [build_case({"q_seqlen": [n], "head_num": 1, "seed": n}, source="t") for n in (5, 7)]
    store = GoldenStore(tmp_path, builder=build_golden)  # type: ignore[arg-type]
    rg.regen(specs[:1], store, stream=io.StringIO())
    stream = io.StringIO()
    summary = rg.regen(specs, store, stream=stream)
    assert summary.count("generated") == 1 and summary.count("up-to-date") == 1
    lines = stream.getvalue().splitlines()
    assert (
        lines[0] == "regen: 1 of 2 goldens up to date; 1 to build (" + progress.flops_text(specs[1].useful_flops) + ")"
    )
    assert lines[-1].startswith("regen 1/1 (100% of ")
    full = io.StringIO()
    rg.regen(specs, store, stream=full)
    assert full.getvalue().splitlines() == ["regen: 2 of 2 goldens up to date; 0 to build (0 FLOP)"]
