"""What the processes of one test session share: a folder every xdist worker of the session sees."""

from __future__ import annotations

import os
from pathlib import Path

import pytest


def session_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The folder every process of this test session shares: under xdist the parent of the worker's own
    base temp (``pytest-N``, which holds every ``popen-gwK``), else the base temp itself."""
    base = tmp_path_factory.getbasetemp()
    return base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base
