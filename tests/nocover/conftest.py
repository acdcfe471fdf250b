"""Every test in this folder is slow (minutes: real goldens, child runs, whole suites): marked ``slow`` here,
by folder, so ``-m "not slow"`` leaves the folder out whatever a file declares."""

from __future__ import annotations

from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent


@pytest.hookimpl(tryfirst=True)  # before ``-m`` deselects by marker
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if HERE in Path(item.path).resolve().parents:
            item.add_marker(pytest.mark.slow)
