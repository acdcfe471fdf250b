"""The run's environment for run.json: toolkit, library and device versions, host, git revision,
and what a verdict's numbers depend on besides the code: the full build strings of torch and
torch_npu (``2.9.0+cu128``, which package metadata omits), the BLAS libraries loaded with their
vendor, version and thread counts (threadpoolctl), torch's own BLAS, threads and CPU capability,
and the CPU's instruction sets.  ``report diff`` lists every difference of this block first.

Everything here is best effort: a missing file, package or device is recorded as absent, never
raised, because a conformance run must not fail for want of provenance.  Thread counts and loaded
libraries are the controller process's (xdist workers start from the same environment).
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
import platform
import re
import socket
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from mlaconf.facts.versions import ascend_versions, package_version
from mlaconf.reports.html import flatten

PACKAGES = ("torch", "torch_npu", "numpy", "h5py", "ml_dtypes", "pytest", "pytest-xdist")
#: Packages whose ``version.py`` holds the build's full version string and build tags.
BUILD_FILES = ("torch", "torch_npu")
#: CPU feature flags (``/proc/cpuinfo``) that change which kernels a BLAS or torch picks.
ISA_FLAGS = frozenset(
    {"sse4_2", "avx", "avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl", "avx512_vnni", "avx512_bf16"}
    | {"avx512_fp16", "amx_tile", "amx_bf16", "amx_int8", "asimd", "asimdhp", "sve", "sve2", "bf16", "i8mm"}
)


def package_versions() -> dict[str, str | None]:
    """Installed versions from package metadata (never imports the packages)."""
    return {name: package_version(name) for name in PACKAGES}


def build_versions() -> dict[str, dict[str, Any]]:
    """Each of :data:`BUILD_FILES`' ``version.py`` constants (``__version__`` with its build tag,
    ``cuda``, ``git_version`` ...), read from the file: nothing is imported."""
    out: dict[str, dict[str, Any]] = {}
    for package in BUILD_FILES:
        try:
            spec = importlib.util.find_spec(package)
            locations = list(spec.submodule_search_locations or []) if spec else []
            if not locations:
                continue
            tree = ast.parse((Path(locations[0]) / "version.py").read_text(encoding="utf-8"))
        except (OSError, ImportError, ValueError, SyntaxError):
            continue
        constants: dict[str, Any] = {}
        for node in tree.body:
            target = node.targets[0] if isinstance(node, ast.Assign) and len(node.targets) == 1 else None
            target = node.target if isinstance(node, ast.AnnAssign) else target
            value = getattr(node, "value", None)
            plain = isinstance(value, ast.Constant) and (value.value is None or isinstance(value.value, str | int))
            if isinstance(target, ast.Name) and plain:
                constants[target.id.strip("_")] = value.value  # type: ignore[union-attr]
        out[package] = constants
    return out


def blas() -> list[dict[str, Any]]:
    """The BLAS and OpenMP libraries loaded in this process (threadpoolctl): vendor, version,
    threads, the kernel architecture OpenBLAS chose."""
    try:
        from threadpoolctl import threadpool_info

        info = threadpool_info()
    except Exception:  # a library that cannot be queried is absent provenance
        return []
    keys = ("user_api", "internal_api", "prefix", "version", "num_threads", "threading_layer", "architecture")
    return sorted(({k: lib.get(k) for k in keys if k in lib} for lib in info), key=lambda d: str(d.get("prefix")))


def torch_runtime() -> dict[str, Any]:
    """torch's threads, CPU capability and BLAS/LAPACK (its MKL is linked in, invisible to
    threadpoolctl); only when torch is already imported (:func:`devices` imports it)."""
    torch: Any = sys.modules.get("torch")
    if torch is None:
        return {}
    out: dict[str, Any] = {}
    try:
        out["num_threads"] = torch.get_num_threads()
        out["cpu_capability"] = torch.backends.cpu.get_cpu_capability()
        settings = torch.__config__.show()
        for key in ("BLAS_INFO", "LAPACK_INFO"):
            found = re.search(rf"{key}=([^,\s]+)", settings)
            out[key.lower()] = found.group(1) if found else None
    except Exception:  # any failure of a probe is absent provenance
        pass
    return out


def cpu() -> dict[str, Any]:
    """The CPU: architecture, model and the instruction sets of :data:`ISA_FLAGS` it has."""
    out: dict[str, Any] = {"machine": platform.machine()}
    try:
        text = Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace")
    except OSError:
        return out
    fields: dict[str, str] = {}
    for line in text.split("\n\n", 1)[0].splitlines():  # the first processor
        key, _, value = line.partition(":")
        fields.setdefault(key.strip(), value.strip())
    out["model"] = fields.get("model name") or fields.get("CPU part")
    flags = set((fields.get("flags") or fields.get("Features") or "").split())
    out["isa"] = sorted(flags & ISA_FLAGS)
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
    found = devices()  # imports torch where installed: torch_runtime reads it then
    return {
        "host": socket.gethostname(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "packages": package_versions(),
        "builds": build_versions(),
        "blas": blas(),
        "torch_runtime": torch_runtime(),
        "cpu": cpu(),
        "ascend": ascend_versions(),
        "devices": found,
        "git": git_revision(repo),
    }


#: Environment entries listed first when they differ (toolkit, libraries, BLAS, CPU); every other
#: difference of run.json's ``environment`` follows them.
ENV_KEYS = (
    "environment.ascend.cann_toolkit.version",
    "environment.ascend.atb.version",
    "environment.ascend.driver.version",
    "environment.builds.torch.version",
    "environment.builds.torch_npu.version",
    "environment.packages.torch",
    "environment.packages.torch_npu",
    "environment.packages.numpy",
    "environment.packages.ml_dtypes",
    "environment.packages.h5py",
    "environment.torch_runtime.blas_info",
    "environment.torch_runtime.num_threads",
    "environment.cpu.isa",
    "environment.host",
    "environment.git.revision",
)


def changes(base_run: Mapping[str, Any], cand_run: Mapping[str, Any]) -> list[tuple[str, str, str]]:
    """Every entry of the two runs' ``environment`` that differs, :data:`ENV_KEYS` first."""
    b = dict(flatten({"environment": base_run.get("environment") or {}}))
    c = dict(flatten({"environment": cand_run.get("environment") or {}}))
    keys = [k for k in ENV_KEYS if k in b or k in c] + sorted((b.keys() | c.keys()) - set(ENV_KEYS))
    return [(k, _shown(b.get(k)), _shown(c.get(k))) for k in keys if _shown(b.get(k)) != _shown(c.get(k))]


def _shown(value: str | None) -> str:
    """An entry as a diff line shows it: absent (a run recorded before the entry existed) and null (nothing
    there, e.g. no CUDA) are both "none", so neither reads as a change nor as a blank."""
    return value if value else "none"
