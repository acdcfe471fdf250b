"""``mlaconf ascend``: the one command to run on an Ascend box (``native/run_on_ascend.sh`` calls it).

Build the extension (and check ``atb_abi.h`` against the installed headers), probe the chip, the
ATB/CANN releases and the driver, regenerate the smoke and metamorphic goldens, run them on every available NPU
backend and on torch-cpu over the same goldens, diff ATB against each of the others, and pack the
run directories, the probe and the environment into one archive to send back.  Every step's
command and output go to ``<out>/logs/``; ``--dry-run`` prints the plan and runs only the probe.
The probe is the gate: with no NPU backend available the command stops there, says why per
backend, and still packs what it found.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from mlaconf.facts.versions import RELEASE_UNKNOWN, ascend_versions, package_version
from mlaconf.harness.registry import NPU_BACKENDS, BackendSelectionError, create
from mlaconf.tools.facts_report import write_facts_report

#: The reference every NPU backend is also compared with, on the same goldens.
CPU_REFERENCE = "torch-cpu"
#: What the device runs: smoke's conformance (and its error contract) and the metamorphic relations
#: (determinism, batch order, padding contents: what a tolerance cannot see on a real kernel).
SUITES = ("smoke", "metamorphic")
#: Exit status when nothing could run: a build prerequisite is missing, or no NPU backend is available.
STOPPED_AT_PROBE = 3
#: What the build (``pip install -e . --no-build-isolation``) imports from the venv itself, by module name
#: and the pip requirement that provides it (pyproject.toml [build-system] requires).
BUILD_REQUIREMENTS = {"setuptools": "setuptools>=64", "pybind11": "pybind11>=2.12"}
#: Environment variables worth sending back (paths and settings, never credentials).
ENV_PREFIXES = ("ASCEND_", "ATB_", "MLA_", "NPU_", "HCCL_", "CANN_")
ENV_NAMES = ("LD_LIBRARY_PATH", "PATH", "PYTHONPATH", "CXX", "OMP_NUM_THREADS")
#: The source checkout this module sits in (None when installed as a package).
SOURCE_ROOT = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Step:
    """One command of the plan: what it is for and the argv it runs."""

    name: str
    argv: list[str]
    #: Whether a non-zero exit makes the whole command fail (cross-backend diffs only inform).
    gates: bool = True


@dataclass
class ProbeResult:
    """What the probe found, per NPU backend, and the box's versions."""

    backends: dict[str, dict[str, Any]] = field(default_factory=dict)
    installation: dict[str, Any] = field(default_factory=dict)

    @property
    def available(self) -> list[str]:
        return [name for name, found in self.backends.items() if found["available"]]


def probe(names: Sequence[str] = NPU_BACKENDS) -> ProbeResult:
    """Availability (with the reason), device and versions of each NPU backend; never raises."""
    result = ProbeResult(installation=_installation())
    for name in names:
        try:
            backend = create(name)
            availability = backend.available()
            info = backend.info()
        except BackendSelectionError as exc:
            result.backends[name] = {"available": False, "reason": str(exc)}
            continue
        result.backends[name] = {
            "available": bool(availability),
            "reason": availability.reason,
            "device": info.device,
            "version": info.version,
            "versions": info.versions,
        }
    return result


def _installation() -> dict[str, Any]:
    found = ascend_versions()
    return {
        "cann_toolkit": (found["cann_toolkit"] or {}).get("version"),
        "atb": (found["atb"] or {}).get("version"),
        "driver": (found["driver"] or {}).get("version"),
        "files": {part: (entry or {}).get("file") for part, entry in found.items()},
        "torch": package_version("torch"),
        "torch_npu": package_version("torch-npu") or package_version("torch_npu"),
        "npu_smi": _npu_smi(),
    }


def _npu_smi() -> str | None:
    """``npu-smi info`` (chip, firmware and driver as the box reports them), when installed."""
    binary = shutil.which("npu-smi")
    if binary is None:
        return None
    try:
        done = subprocess.run([binary, "info"], capture_output=True, text=True, timeout=60, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"npu-smi info failed: {exc}"
    return done.stdout + done.stderr


def build_steps(root: Path | None = SOURCE_ROOT) -> list[Step]:
    """Build the extension in a source checkout, then check atb_abi.h against the installed headers."""
    steps: list[Step] = []
    if root is not None and (root / "setup.py").is_file():
        steps.append(
            Step(
                "build", [sys.executable, "-m", "pip", "install", "-e", str(root), "--no-deps", "--no-build-isolation"]
            )
        )
        atb_home, ascend_home = os.environ.get("ATB_HOME_PATH"), os.environ.get("ASCEND_HOME_PATH")
        if atb_home and ascend_home:
            steps.append(
                Step(
                    "check-headers",
                    [
                        "bash",
                        str(root / "native" / "check_headers.sh"),
                        f"{atb_home}/include",
                        f"{ascend_home}/include",
                        f"{ascend_home}/include/aclnn",
                    ],
                )
            )
    return steps


def missing_build_requirements(root: Path | None = SOURCE_ROOT) -> list[str]:
    """The build requirements a source build needs but the venv lacks (no build isolation fetches them)."""
    if root is None or not (root / "setup.py").is_file():
        return []
    import importlib.util

    return [req for module, req in BUILD_REQUIREMENTS.items() if importlib.util.find_spec(module) is None]


def run_steps(
    available: Sequence[str], out: Path, golden_dir: Path, jobs: str, root: Path | None = SOURCE_ROOT
) -> list[Step]:
    """The harness's own NPU tests (with ATB, in a checkout), regenerate the goldens, run smoke and the
    metamorphic relations on each available NPU backend and torch-cpu, diff ATB (else the first NPU backend)
    against the others."""
    mlaconf = [sys.executable, "-m", "mlaconf"]
    steps = []
    if "atb" in available and root is not None and (root / "tests").is_dir():
        tests = [sys.executable, "-m", "pytest", "-m", "npu", "-q", "-p", "no:cacheprovider", str(root / "tests")]
        steps.append(Step("npu-tests", tests))
    steps.append(Step("regen", [*mlaconf, "regen", *SUITES, "--out", str(golden_dir)]))
    backends = [*available, CPU_REFERENCE]
    for name in backends:
        steps.append(
            Step(
                f"smoke-{name}",
                [
                    *mlaconf,
                    "run",
                    *(arg for suite in SUITES for arg in ("--suite", suite)),
                    "--backend",
                    name,
                    "--golden-dir",
                    str(golden_dir),
                    "--report-dir",
                    str(out / "runs" / name),
                    "-n",
                    jobs,
                ],
            )
        )
    base = "atb" if "atb" in available else backends[0]
    for other in backends:
        if other != base:
            steps.append(
                Step(
                    f"diff-{base}-vs-{other}",
                    [
                        *mlaconf,
                        "report",
                        "diff",
                        str(out / "runs" / base),
                        str(out / "runs" / other),
                        "--out",
                        str(out / "diffs" / f"{base}-vs-{other}"),
                        "--base-backend",
                        base,
                        "--cand-backend",
                        other,
                        "--allow-missing",
                        "--skips-expected",  # routes without an error contract skip it; the page counts them
                    ],
                    gates=False,
                )
            )
    return steps


def _environment() -> dict[str, Any]:
    names = sorted(n for n in os.environ if n.startswith(ENV_PREFIXES) or n in ENV_NAMES)
    packages = sorted(f"{d.metadata['Name']}=={d.version}" for d in _distributions())
    return {
        "python": sys.version,
        "platform": platform.platform(),
        "machine": platform.machine(),
        "hostname": platform.node(),
        "environ": {n: os.environ[n] for n in names},
        "packages": packages,
        "argv": sys.argv,
        "time_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }


def _distributions() -> list[Any]:
    import importlib.metadata

    return [d for d in importlib.metadata.distributions() if d.metadata["Name"]]


def _write_json(path: Path, data: Any) -> None:
    """Atomically, never through a symlink: a temp file beside it, then rename over it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.is_symlink():
        raise OSError(f"{path} is a symlink: refusing to write through it")
    with tempfile.NamedTemporaryFile("w", dir=path.parent, prefix=f".{path.name}.", delete=False) as handle:
        json.dump(data, handle, indent=2, sort_keys=True, default=str)
        temp = Path(handle.name)
    os.replace(temp, path)


def pack(out: Path, leave_out: Sequence[str] = ("golden",)) -> Path:
    """``<out>.tar.gz`` holding everything under ``out`` but ``leave_out`` (the goldens: large, and
    rebuilt from the case specs by ``mlaconf regen``); links are stored as links, never followed."""
    archive = out.with_name(out.name + ".tar.gz")
    if archive.is_symlink():
        raise OSError(f"{archive} is a symlink: refusing to write through it")
    skipped = {f"{out.name}/{name}" for name in leave_out}

    def keep(member: tarfile.TarInfo) -> tarfile.TarInfo | None:
        return None if member.name in skipped else member

    with tempfile.NamedTemporaryFile(dir=archive.parent, prefix=f".{archive.name}.", delete=False) as handle:
        temp = Path(handle.name)
    try:
        with tarfile.open(temp, "w:gz") as tar:
            tar.add(out, arcname=out.name, filter=keep)
        temp.chmod(0o644)
        os.replace(temp, archive)
    finally:
        temp.unlink(missing_ok=True)
    return archive


def _execute(step: Step, logs: Path) -> int:
    """Run one step, its output both on the terminal and in ``logs/<name>.log``."""
    log = logs / f"{step.name}.log"
    print(f"== {step.name}: {' '.join(step.argv)}", flush=True)
    with log.open("w", encoding="utf-8") as handle:
        handle.write("+ " + " ".join(step.argv) + "\n")
        handle.flush()
        child = subprocess.Popen(step.argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        assert child.stdout is not None
        for line in child.stdout:
            sys.stdout.write(line)
            handle.write(line)
        return child.wait()


def ascend(args: argparse.Namespace) -> int:
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    logs = out / "logs"
    logs.mkdir(exist_ok=True)
    golden_dir = Path(args.golden_dir).resolve() if args.golden_dir else out / "golden"
    summary: dict[str, Any] = {"dry_run": args.dry_run, "steps": []}
    _write_json(out / "environment.json", _environment())
    status = 0
    missing = [] if args.no_build or args.dry_run else missing_build_requirements()
    if missing:
        wanted = " ".join(repr(req) for req in missing)
        print(f"== stopped before the build: install {wanted} first ({sys.executable} -m pip install {wanted})")
        summary["missing_build_requirements"] = missing
        status = STOPPED_AT_PROBE
    for step in [] if args.no_build or status else build_steps():
        if args.dry_run:
            print(f"== {step.name} (dry run, not run): {' '.join(step.argv)}")
            continue
        code = _execute(step, logs)
        summary["steps"].append({**asdict(step), "exit": code})
        if code != 0:
            print(f"== stopped: {step.name} exited {code} (log: {logs / f'{step.name}.log'})")
            status = code
            break
    found: ProbeResult | None = None
    if status == 0:
        print("== probe: chip, releases and driver; which NPU backends can run")
        found = probe()
        _write_json(out / "probe.json", asdict(found))
        for name, entry in found.backends.items():
            state = f"available on {entry.get('device')}" if entry["available"] else f"unavailable: {entry['reason']}"
            print(f"   {name}: {state}")
        versions = {k: v for k, v in found.installation.items() if k in ("cann_toolkit", "atb", "driver")}
        print(f"   installed: {versions}")
        if "atb" in found.available and not found.backends["atb"].get("version"):
            print(f"   {RELEASE_UNKNOWN}")
        if not found.available:
            print("== stops at the probe: no NPU backend can run here (reasons above); nothing to regenerate or run")
            status = STOPPED_AT_PROBE
    if status == 0 and found is not None:
        for step in run_steps(found.available, out, golden_dir, args.jobs):
            if args.dry_run:
                print(f"== {step.name} (dry run, not run): {' '.join(step.argv)}")
                continue
            code = _execute(step, logs)
            summary["steps"].append({**asdict(step), "exit": code})
            if code != 0 and step.gates:
                status = status or code
    summary["status"] = status
    _write_json(out / "summary.json", summary)
    if not args.dry_run:
        print(f"== facts report (every unconfirmed fact, what the device did): {write_facts_report(out)}")
    archive = pack(out)
    print(f"== archive to send back: {archive}")
    return status
