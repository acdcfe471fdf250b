"""A golden store this user cannot write, partly filled: one line naming the store and what it lacks,
instead of a failing test with a traceback per missing golden."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from mlaconf.runner import front_door


@pytest.fixture
def read_only(monkeypatch: pytest.MonkeyPatch) -> None:
    """This user may write nothing (root may write everywhere, so the test says it for the kernel)."""
    real = os.access
    monkeypatch.setattr(os, "access", lambda path, mode, **kw: False if mode & os.W_OK else real(path, mode, **kw))


def test_a_partly_filled_store_that_cannot_be_written_is_one_line(tmp_path: Path, read_only: None) -> None:
    (tmp_path / "a.h5").write_bytes(b"")
    gap = front_door.unwritable_store_gap(tmp_path, ["a", "b", "c"])
    assert gap is not None and "\n" not in gap
    assert str(tmp_path) in gap and "lacks 2 of the 3" in gap and "first: b" in gap


def test_a_complete_read_only_store_serves(tmp_path: Path, read_only: None) -> None:
    (tmp_path / "a.h5").write_bytes(b"")
    assert front_door.unwritable_store_gap(tmp_path, ["a"]) is None


def test_a_writable_store_makes_what_it_lacks(tmp_path: Path) -> None:
    assert front_door.unwritable_store_gap(tmp_path, ["a", "b"]) is None
