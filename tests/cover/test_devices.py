"""xdist device pinning: worker gwN uses device N mod K; -n auto starts one worker per device."""

from __future__ import annotations

import pytest

from mlaconf.harness.devices import auto_workers, worker_device_index, worker_index


@pytest.mark.parametrize(
    ("worker", "count", "device"),
    [("gw0", 4, 0), ("gw5", 4, 1), ("gw7", 8, 7), ("gw9", 3, 0), ("master", 2, 0), ("gw3", 0, 0)],
)
def test_worker_device_mapping(worker: str, count: int, device: int) -> None:
    assert worker_device_index(count, worker) == device


def test_worker_index_reads_xdist_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PYTEST_XDIST_WORKER", "gw12")
    assert worker_index() == 12
    monkeypatch.delenv("PYTEST_XDIST_WORKER")
    assert worker_index() == 0


def test_auto_workers_one_per_device_else_default() -> None:
    assert auto_workers(8) == 8
    assert auto_workers(0) is None
