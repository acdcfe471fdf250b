"""The verdict walk (tests/verdict_walk.py): judging one verdict never calls up the house, and its path
does not grow."""

from __future__ import annotations

import pytest

from mlaconf.golden.building.generate import build_golden
from tests import verdict_walk

#: Files judge_resolved's verdict walks through (docs/architecture.md, "The verdict walk"): its stops are not
#: held (a function per named step is what a reader wants; 35 stops were once bought by folding functions
#: into closures), the files a reader opens and the climbs are.
MAX_FILES = 13


@pytest.fixture(scope="module")
def walk() -> verdict_walk.Walk:
    golden = build_golden(verdict_walk.smoke_case())
    return verdict_walk.measure(golden, "torch-cpu", "judge_resolved")


def test_judging_never_calls_up_the_house(walk: verdict_walk.Walk) -> None:
    """A lower room calling a higher room's function (golden/chunks calling back into the judge) is a climb."""
    assert not walk.climbs, sorted(walk.climbs)
    assert {
        "judge/metrics.py",
        "judge/error_model.py",
        "golden/building/chunks.py",
    } <= walk.files  # it walked the judge


def test_the_walk_does_not_spread(walk: verdict_walk.Walk) -> None:
    """The verdict stays in as many files as it has: the judge's own, the golden's chunks and statistics, the
    spec's and the process's pool (a new file on the path is a new room a reader must open)."""
    assert walk.stops and len(walk.files) <= MAX_FILES, sorted(walk.files)


def test_a_callback_into_a_higher_room_is_a_climb() -> None:
    """The measure itself: the rooms' order is read from their imports."""
    assert verdict_walk.is_climb("golden", "judge") and verdict_walk.is_climb("facts", "judge")
    assert not verdict_walk.is_climb("judge", "golden") and not verdict_walk.is_climb("golden", "harness")
    assert not verdict_walk.is_climb("judge", "judge")
