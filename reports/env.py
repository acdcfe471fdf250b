"""The run's environment for run.json: toolkit, library and device versions, host, git revision.

Everything here is best effort: a missing file, package or device is recorded as absent, never
raised, because a conformance run must not fail for want of provenance.
"""

from __future__ import annotations

import importlib
import importlib.util
import platform
import socket
import subprocess
from pathlib import Path
from typing import Any

from mlaconf.facts.versions import ascend_versions, package_version

PACKAGES = ("torch", "torch_npu", "numpy", "h5py", "ml_dtypes", "pytest", "pytest-xdist")


def package_versions() -> dict[str, str | None]:
    """Installed versions from package metadata (never imports the packages)."""
    return {name: package_version(name) for name in PACKAGES}


def devices() -> dict[str, Any]:
    """Accelerators visible to this process; torch_npu is imported only when it is installed."""
    out: dict[str, Any] = {}
    if importlib.util.find_spec("torch") is None:
        return out
    try:
        torch: Any = importlib.import_module("torch")
        if torch.cuda.is_available():
            count = torch.cuda.device_count()
            out["cuda"] = {"count": count, "names": [torch.cuda.get_device_name(i) for i in range(count)]}
    except Exception as exc:  # any failure of a driver stack is provenance, not an error
        out["cuda_error"] = repr(exc)
    if importlib.util.find_spec("torch_npu") is None:
        return out
    try:
        importlib.import_module("torch_npu")
        count = torch.npu.device_count()
        out["npu"] = {"count": count, "names": [torch.npu.get_device_name(i) for i in range(count)]}
    except Exception as exc:
        out["npu_error"] = repr(exc)
    return out


def git_revision(cwd: Path) -> dict[str, Any] | None:
    """HEAD and whether the tree is dirty; None outside git or without commits."""
    try:
        rev = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=cwd, capture_output=True, text=True, timeout=10, check=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=cwd,
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return {"revision": rev, "dirty": bool(dirty)}


def short_host() -> str:
    return socket.gethostname().split(".")[0] or "host"


def collect(repo: Path) -> dict[str, Any]:
    """The whole environment block of run.json."""
    return {
        "host": socket.gethostname(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "packages": package_versions(),
        "ascend": ascend_versions(),
        "devices": devices(),
        "git": git_revision(repo),
    }
