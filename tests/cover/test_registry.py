"""Backend selection: built-ins, auto, environment, and external backends by import path."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest

from mlaconf.harness import registry
from mlaconf.harness.backend import Backend
from tests.machine import HANG_S
from tests.pytest_runs import PytestRun, run_pytest

#: The README's ten-line external backend; ``my_lib.mla_prefill`` stands in as torch-cpu.
MY_LIB = textwrap.dedent("""
    from mlaconf.harness.backend import MlaPrefillCall
    from mlaconf.harness.torch_backend import torch_cpu

    _kernel = torch_cpu()

    def mla_prefill(**arguments):
        return _kernel.run(MlaPrefillCall(**arguments))
""")
EXTERNAL = textwrap.dedent("""
    from mlaconf.harness.backend import Availability, BackendInfo
    from my_lib import mla_prefill

    class MyKernel:
        name, error_contract, deterministic = "my-kernel", False, True
        def available(self): return Availability(True)
        def info(self): return BackendInfo(self.name, "cpu", {"my_lib": "1.0"}, version="1.0")
        def synchronize(self): pass
        def run(self, call): return mla_prefill(**vars(call))

    def factory():
        return MyKernel()
""")


def test_builtin_and_auto() -> None:
    backend = registry.create("torch-cpu")
    assert isinstance(backend, Backend) and backend.name == "torch-cpu" and backend.available()
    assert registry.resolve_auto() in registry.AUTO_ORDER


def test_selection_from_option_and_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(registry.ENV_VAR, "torch-cpu, pkg.mod:make")
    assert registry.selected_names(None) == ["torch-cpu", "pkg.mod:make"]
    assert registry.selected_names(["torch-cuda,torch-cpu", "torch-cpu"]) == ["torch-cuda", "torch-cpu"]


@pytest.mark.parametrize(
    ("name", "fragment"),
    [
        ("nonsense", "built-in name or 'pkg.module:factory'"),
        ("no_such_module_xyz:f", "cannot import"),
        ("mlaconf.harness.registry:missing", "has no 'missing'"),
        ("mlaconf.harness.registry:resolve_auto", "lacks the Backend protocol"),
    ],
)
def test_bad_selection_is_explained(name: str, fragment: str) -> None:
    with pytest.raises(registry.BackendSelectionError, match=fragment):
        registry.create(name)


def run_suite(tmp_path: Path, *args: str) -> PytestRun:
    return run_pytest(
        "cases/test_conformance.py",
        "-q",
        "-rs",
        *args,
        golden=tmp_path / "golden",
        report=tmp_path / "report",
        paths=[tmp_path],
        timeout=HANG_S,
    )


def test_external_backend_runs_the_suite(tmp_path: Path) -> None:
    (tmp_path / "my_kernels.py").write_text(EXTERNAL)
    (tmp_path / "my_lib.py").write_text(MY_LIB)
    result = run_suite(tmp_path, "--mla-backend", "my_kernels:factory", "-k", "fp16-undefined and b3 and q2d")
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-2000:]
    assert "2 passed" in result.stdout and "my-kernel" in (tmp_path / "report" / "results.jsonl").read_text()


def test_named_unavailable_backend_fails_the_run_with_its_reason(tmp_path: Path) -> None:
    """Named explicitly, an unavailable backend is no green run of skips: exit 1 with the probe's
    reason, and it is in run.json and the tables next to the backend that ran."""
    result = run_suite(
        tmp_path, "--mla-backend", "atb", "--mla-backend", "torch-cpu", "-k", "fp16-undefined and b3-s160 and q2d"
    )
    assert result.returncode == 1, result.stdout[-3000:]
    assert "2 skipped" in result.stdout and "2 passed" in result.stdout
    assert "backend atb unavailable: torch_npu" in result.stdout
    assert "ERROR: backend atb was named explicitly but is unavailable here: torch_npu" in result.stdout
    run = json.loads((tmp_path / "report" / "run.json").read_text())
    atb = next(b for b in run["backends"] if b["name"] == "atb")
    assert atb["available"] is False and "torch_npu" in atb["reason"]
    assert run["verdicts"]["skipped"] == 2 and run["verdicts"]["passed"] == 2
    assert any(line.startswith("atb ") for line in result.stdout.splitlines())  # a row of the group table


@pytest.mark.parametrize(
    ("value", "fragment"),
    [
        ("torch-cpuu", "unknown backend 'torch-cpuu'"),
        ("raising_module:factory", "cannot import 'raising_module': boom on import"),
        ("mlaconf.harness.registry:resolve_auto", "lacks the Backend protocol"),
        ("raising_factory:factory", "the factory raised RuntimeError: no device"),
    ],
)
def test_bad_backend_is_one_usage_error(tmp_path: Path, value: str, fragment: str) -> None:
    (tmp_path / "raising_module.py").write_text("raise ImportError('boom on import')\n")
    (tmp_path / "raising_factory.py").write_text("def factory():\n    raise RuntimeError('no device')\n")
    result = run_suite(tmp_path, "--mla-backend", value)
    assert result.returncode == 4, result.stdout[-2000:] + result.stderr[-2000:]
    assert fragment in result.stderr and "valid backends: auto, atb, torch-cuda, torch-cpu" in result.stderr
    assert "Traceback" not in result.stderr + result.stdout and len(result.stderr.splitlines()) <= 4
