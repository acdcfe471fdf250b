"""The run's environment for run.json: toolkit, library and device versions, host, git revision.

Everything here is best effort: a missing file, package or device is recorded as absent, never
raised, because a conformance run must not fail for want of provenance.
"""

from __future__ import annotations

import glob
import importlib
import importlib.metadata
import importlib.util
import os
import platform
import re
import socket
import subprocess
from pathlib import Path
from typing import Any

ASCEND_ROOT = Path("/usr/local/Ascend")
PACKAGES = ("torch", "torch_npu", "numpy", "h5py", "ml_dtypes", "pytest", "pytest-xdist")
_LINE = re.compile(r"^\s*([^=:]+?)\s*[=:]\s*(.*?)\s*$")


def parse_info(text: str) -> dict[str, str]:
    """Parse Ascend ``*.info``/``version.cfg`` files: ``key=value`` or ``key : value`` lines."""
    out: dict[str, str] = {}
    for line in text.splitlines():
        match = _LINE.match(line)
        if match and match.group(1) and not line.lstrip().startswith("#"):
            out.setdefault(match.group(1), match.group(2))
    return out


def _version_of(info: dict[str, str]) -> str | None:
    """The entry that names the version ('version', 'Version', 'Ascend-cann-atb Version', ...)."""
    for key in sorted(info, key=len):
        if key.lower().endswith("version"):
            return info[key]
    return None


def _read_first(candidates: list[str]) -> dict[str, Any] | None:
    for pattern in candidates:
        for name in sorted(glob.glob(pattern)):
            try:
                info = parse_info(Path(name).read_text(encoding="utf-8", errors="replace"))
            except OSError:
                continue
            if info:
                return {"file": name, "version": _version_of(info), "info": info}
    return None


def ascend_versions(root: Path = ASCEND_ROOT, environ: dict[str, str] | None = None) -> dict[str, Any]:
    """CANN toolkit, ATB (NNAL) and driver versions from their install files, when present."""
    env = dict(os.environ) if environ is None else environ
    toolkit_homes = [env.get("ASCEND_TOOLKIT_HOME", ""), f"{root}/ascend-toolkit/latest", f"{root}/cann*"]
    toolkit = [f"{h}/*/ascend_toolkit_install.info" for h in toolkit_homes if h]
    toolkit += [f"{h}/ascend_toolkit_install.info" for h in toolkit_homes if h]
    toolkit += [f"{h}/version.cfg" for h in toolkit_homes if h]
    atb: list[str] = []
    if env.get("ATB_HOME_PATH"):
        # ATB_HOME_PATH is .../nnal/atb/<ver>/atb/cxx_abi_N; version.info sits two levels up.
        home = Path(env["ATB_HOME_PATH"])
        atb += [
            str(home / "version.info"),
            str(home.parent / "version.info"),
            str(home.parent.parent / "version.info"),
        ]
    atb.append(f"{root}/nnal/atb/latest/version.info")
    driver = [f"{root}/driver/version.info"]
    return {
        "cann_toolkit": _read_first(toolkit),
        "atb": _read_first(atb),
        "driver": _read_first(driver),
    }


def package_versions() -> dict[str, str | None]:
    """Installed versions from package metadata (never imports the packages)."""
    out: dict[str, str | None] = {}
    for name in PACKAGES:
        try:
            out[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            out[name] = None
    return out


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
