"""Helpers for tests that edit golden files on purpose."""

from __future__ import annotations

from pathlib import Path

from mlaconf.golden.store import seal


def reseal(path: Path) -> None:
    """Rewrite a file's integrity header in place, to reach the checks behind the header."""
    with open(path, "r+b") as fh:
        seal(fh)
