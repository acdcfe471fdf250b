"""Accelerators under xdist: worker gwN is pinned to device N mod K; ``-n auto`` = one per device."""

from __future__ import annotations

import os


def worker_index(worker_id: str | None = None) -> int:
    """The xdist worker number (gw3 -> 3); 0 outside xdist."""
    worker_id = worker_id if worker_id is not None else os.environ.get("PYTEST_XDIST_WORKER", "")
    digits = worker_id[2:] if worker_id.startswith("gw") else ""
    return int(digits) if digits.isdigit() else 0


def worker_device_index(device_count: int, worker_id: str | None = None) -> int:
    """The device this worker uses: worker number modulo the device count (0 with no devices)."""
    return worker_index(worker_id) % device_count if device_count > 0 else 0


def npu_count() -> int:
    """Visible Ascend NPUs; 0 when torch_npu is absent or fails to import (it raises without CANN)."""
    try:
        import torch
        import torch_npu  # noqa: F401

        return int(torch.npu.device_count())  # type: ignore[attr-defined]
    except Exception:  # torch_npu raises RuntimeError and more on machines without CANN
        return 0


def cuda_count() -> int:
    try:
        import torch

        return int(torch.cuda.device_count()) if torch.cuda.is_available() else 0
    except Exception:
        return 0


def accelerator_count() -> int:
    """Devices that ``-n auto`` should start one worker for; 0 means keep xdist's CPU default."""
    return npu_count() or cuda_count()


def auto_workers(device_count: int) -> int | None:
    """What xdist's auto-worker hook returns: one worker per device, or None for its default."""
    return device_count if device_count > 0 else None
