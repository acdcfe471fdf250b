"""The environment a verdict depends on is recorded (full build strings, BLAS and threads, CPU
ISA), every change of it is the diff's first news, and report.html names the backend's versions
in its banner."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from mlaconf.reports import diff, diff_render, env, html
from tests.runs import record, write_run_dir


def test_build_versions_keep_the_build_tag(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Package metadata says ``2.9.0``; the build says ``2.9.0+cu128`` (read from version.py, no import)."""
    package = tmp_path / "fake_torch_build"
    package.mkdir()
    (package / "__init__.py").write_text("raise ImportError('never imported')\n")
    (package / "version.py").write_text(
        "from typing import Optional\n__version__ = '2.9.0+cu128'\ncuda: Optional[str] = '12.8'\ndebug = False\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(env, "BUILD_FILES", ("fake_torch_build", "not_installed_here"))
    assert env.build_versions() == {"fake_torch_build": {"version": "2.9.0+cu128", "cuda": "12.8", "debug": False}}


def test_the_run_records_blas_threads_and_the_cpu() -> None:
    assert np.ones(2) @ np.ones(2) == 2.0  # numpy (and its BLAS) loaded
    block = env.collect(Path(__file__).parent)
    assert {"builds", "blas", "torch_runtime", "cpu"} <= block.keys()
    assert all(isinstance(lib.get("num_threads"), int) for lib in block["blas"]), block["blas"]
    assert block["cpu"]["machine"] and isinstance(block["cpu"].get("isa", []), list)
    if "torch" in sys.modules:  # the backends import it; its BLAS is linked in, invisible to threadpoolctl
        assert isinstance(block["torch_runtime"]["num_threads"], int)


def environment(torch: str, ml_dtypes: str, threads: int) -> dict[str, Any]:
    return {
        "host": "h",
        "packages": {"torch": torch.split("+")[0], "numpy": "2.4.6", "ml_dtypes": ml_dtypes, "h5py": "3.16.0"},
        "builds": {"torch": {"version": torch}},
        "blas": [{"user_api": "blas", "internal_api": "openblas", "version": "0.3.31", "num_threads": threads}],
        "torch_runtime": {"blas_info": "mkl", "num_threads": threads, "cpu_capability": "AVX512"},
        "cpu": {"machine": "x86_64", "isa": ["avx2", "avx512f"]},
    }


def test_the_diff_lists_every_environment_change_first(tmp_path: Path) -> None:
    a = write_run_dir(tmp_path / "a", [record("x")], run_id="a", environment=environment("2.9.0+cu128", "0.5.4", 2))
    b = write_run_dir(tmp_path / "b", [record("x")], run_id="b", environment=environment("2.13.0+cpu", "0.7.0", 16))
    result = diff.diff_dirs(a, b)
    changes = {k: (old, new) for k, old, new in result.env_changes}
    assert changes == {
        "environment.builds.torch.version": ("2.9.0+cu128", "2.13.0+cpu"),
        "environment.packages.torch": ("2.9.0", "2.13.0"),
        "environment.packages.ml_dtypes": ("0.5.4", "0.7.0"),
        "environment.torch_runtime.num_threads": ("2", "16"),
        "environment.blas[0].num_threads": ("2", "16"),
    }
    assert result.env_changes[0][0] == "environment.builds.torch.version"
    lines = diff_render.terminal(result).splitlines()
    assert (
        lines[2].startswith("  GATE PASSES")
        and lines[3] == "  env environment.builds.torch.version: 2.9.0+cu128 -> 2.13.0+cpu"
    )
    page = diff_render.render_html(result)
    assert '<h2 id="environment">Environment changes (5)</h2>' in page


def test_the_report_banner_names_the_backend_and_its_versions() -> None:
    records = [record("x", backend="torch-cpu", backend_versions={"torch": "2.13.0+cpu"})]
    run = {"status": "complete", "environment": environment("2.13.0+cpu", "0.7.0", 2)}
    page = html.render(records, run)
    banner = page[page.index('id="verdict"') : page.index('class="counts"')]
    assert 'id="backend"' in banner, banner
    for part in ("backend torch-cpu (torch 2.13.0+cpu)", "ml_dtypes 0.7.0", "torch BLAS mkl, 2 threads, AVX512"):
        assert part in banner, banner
    assert "openblas 0.3.31 (2 threads)" in banner and "CPU x86_64 avx2 avx512f" in banner


def test_absent_and_null_entries_are_no_change_and_none_is_said(tmp_path: Path) -> None:
    """One run lacks the rocm and xpu keys, the other records them as null: no line; CUDA present on one side
    and null on the other reads "12.8 -> none", never a blank."""
    base_env = environment("2.9.0+cu128", "0.5.4", 2) | {"builds": {"torch": {"version": "2.9.0", "cuda": "12.8"}}}
    cand_env = environment("2.9.0+cu128", "0.5.4", 2) | {
        "builds": {"torch": {"version": "2.9.0", "cuda": None, "rocm": None, "xpu": None}}
    }
    a = write_run_dir(tmp_path / "a", [record("x")], run_id="a", environment=base_env)
    b = write_run_dir(tmp_path / "b", [record("x")], run_id="b", environment=cand_env)
    assert diff.diff_dirs(a, b).env_changes == [("environment.builds.torch.cuda", "12.8", "none")]
