"""Installed beside an unrelated project, the plugin is a guest: that project's pytest runs the same.

A fresh venv (no system site-packages) gets pytest, pytest-xdist and hypothesis; a foreign project with
its own ``runner/`` and ``reports/`` packages, a conftest adding ``--backend`` and a hypothesis test runs
under ``pytest``, ``pytest -p no:xdist``, ``pytest -n 2`` and ``pytest -n auto``.  Then this package is
installed into the venv from a wheel (non-editable, with its dependencies, torch included) and the same
four runs must give the same exit codes, the same test outcomes and the same facts: hypothesis profile
and example count, thread variables, whether torch was imported (controller and workers), the worker count.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import venv
import zipfile
from pathlib import Path

from tests.machine import HANG_S

REPO = Path(__file__).resolve().parents[2]
RUNS = {"plain": [], "no-xdist": ["-p", "no:xdist"], "n2": ["-n", "2"], "nauto": ["-n", "auto"]}

CONFTEST = """
import json, os, sys
from pathlib import Path

import pytest


def pytest_addoption(parser):
    parser.addoption("--backend", default="theirs", help="the project's own option")
    parser.addoption("--suite", default="mine", help="the project's own option, named like mlaconf run's")


@pytest.fixture
def backend_name(request):  # named like the plugin's parameter once was: the plugin must leave it alone
    return "theirs-" + request.config.getoption("suite")


def pytest_unconfigure(config):
    where = os.environ.get("PYTEST_XDIST_WORKER", "controller")
    facts = {"torch": "torch" in sys.modules, "omp": os.environ.get("OMP_NUM_THREADS"),
             "workers": getattr(config.option, "numprocesses", None)}
    Path(os.environ["FACTS_DIR"], where + ".json").write_text(json.dumps(facts))
"""

TEST_APP = """
import json, os, sys
from pathlib import Path

from hypothesis import given, settings, strategies as st

import cases
import golden
import judge
import pytest
import reports
import runner.plugin


def test_own_packages_and_option(request):
    assert runner.plugin.NAME == "theirs" and reports.env == "theirs"
    assert (judge.env, golden.env, cases.env) == ("theirs", "theirs", "theirs")
    assert request.config.getoption("backend") == "theirs" and request.config.getoption("suite") == "mine"


def test_own_backend_fixture(backend_name):
    assert backend_name == "theirs-mine"


@pytest.mark.parametrize("backend_name", ["a", "b"])
def test_own_backend_parameter(backend_name):
    assert backend_name in {"a", "b"}


@given(st.integers())
def test_hypothesis_defaults(value):
    facts = {"profile": settings.get_current_profile_name(), "examples": settings.default.max_examples,
             "deadline": str(settings.default.deadline), "omp": os.environ.get("OMP_NUM_THREADS"),
             "torch": "torch" in sys.modules}
    where = os.environ.get("PYTEST_XDIST_WORKER", "controller")
    Path(os.environ["FACTS_DIR"], "test-" + where + ".json").write_text(json.dumps(facts))
"""


#: A module named like a shipped suite's, parametrized: under xdist it is still not an MLA test.
TEST_CONFORMANCE = """
import pytest


@pytest.mark.parametrize("case", ["x", "y"])
def test_conformance(case, backend_name):
    assert backend_name == "theirs-mine"
"""
#: The foreign project's tests: 5 in test_app (3 of them on its backend_name, 1 + 2), 2 in its test_conformance.
FOREIGN_TESTS = 7


def make_project(root: Path) -> Path:
    project = root / "foreign"
    for package in ("runner", "reports", "judge", "golden", "cases"):
        (project / package).mkdir(parents=True)
        (project / package / "__init__.py").write_text("" if package == "runner" else 'env = "theirs"\n')
    (project / "runner" / "plugin.py").write_text('NAME = "theirs"\n')
    (project / "conftest.py").write_text(CONFTEST)
    (project / "test_app.py").write_text(TEST_APP)
    (project / "test_conformance.py").write_text(TEST_CONFORMANCE)
    (project / "pytest.ini").write_text("[pytest]\n")
    return project


def project_files(project: Path) -> list[Path]:
    """What a run may not add to: the project's files, less caches its own tools write."""
    caches = {"__pycache__", ".hypothesis"}
    return sorted(p.relative_to(project) for p in project.rglob("*") if not caches & set(p.parts))


def wheel_names(wheel: Path) -> set[str]:
    with zipfile.ZipFile(wheel) as archive:
        return set(archive.namelist())


def pin_to_this_environment(path: Path) -> Path:
    """Constraints for the venv: the versions installed here (torch stays the CPU wheel at hand)."""
    frozen = subprocess.run([sys.executable, "-m", "pip", "freeze"], capture_output=True, text=True, check=True)
    pins = [line for line in frozen.stdout.splitlines() if "==" in line and not line.startswith(("-e", "mla-"))]
    path.write_text("\n".join(pins) + "\n")
    return path


def pip(env_dir: Path, *args: str) -> None:
    constraints = pin_to_this_environment(env_dir.parent / "constraints.txt")
    # without PYTHONPATH: a checkout on it (with the egg-info a wheel build leaves) reads as installed to pip
    clean = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    result = subprocess.run(
        [str(env_dir / "bin" / "python"), "-m", "pip", "install", "-q", "-c", str(constraints), *args],
        capture_output=True,
        text=True,
        env=clean,
    )
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]


def run_all(env_dir: Path, project: Path, facts_root: Path) -> dict[str, dict[str, object]]:
    """Every run's exit code, outcome lines and recorded facts."""
    seen: dict[str, dict[str, object]] = {}
    for name, extra in RUNS.items():
        facts_dir = facts_root / name
        facts_dir.mkdir(parents=True)
        result = subprocess.run(
            [str(env_dir / "bin" / "python"), "-m", "pytest", "-rA", "-q", "-p", "no:cacheprovider", *extra],
            cwd=project,
            capture_output=True,
            text=True,
            timeout=HANG_S,
            env={"PATH": "/usr/bin:/bin", "FACTS_DIR": str(facts_dir), "HOME": str(facts_root)},
        )
        outcomes = sorted(line for line in result.stdout.splitlines() if line.startswith(("PASSED", "FAILED", "ERROR")))
        facts = {p.stem.replace("gw1", "gw0"): json.loads(p.read_text()) for p in sorted(facts_dir.glob("*.json"))}
        seen[name] = {"rc": result.returncode, "outcomes": outcomes, "facts": facts, "log": result.stdout[-3000:]}
    return seen


def test_a_foreign_project_runs_the_same_with_the_package_installed(tmp_path: Path, shared_golden: Path) -> None:
    wheels = tmp_path / "wheels"
    built = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(wheels), str(REPO)],
        capture_output=True,
        text=True,
    )
    assert built.returncode == 0, built.stderr[-3000:]
    names = wheel_names(next(wheels.glob("*.whl")))
    tops = {name.split("/", 1)[0] for name in names if not name.split("/", 1)[0].endswith(".dist-info")}
    assert tops == {"mlaconf"}, f"the wheel installs more than one name: {sorted(tops)}"
    assert {"mlaconf/golden/specs/spec.py", "mlaconf/runner/plugin.py", "mlaconf/cases/smoke.toml"} <= names
    env_dir = tmp_path / "venv"
    venv.EnvBuilder(with_pip=True).create(env_dir)
    pip(env_dir, "pytest", "pytest-xdist", "hypothesis")
    project = make_project(tmp_path)
    without = run_all(env_dir, project, tmp_path / "without")
    for name, run in without.items():
        assert run["rc"] == 0 and len(run["outcomes"]) == FOREIGN_TESTS, (name, run["log"])
    files_before = project_files(project)

    pip(env_dir, str(next(wheels.glob("*.whl"))))
    with_package = run_all(env_dir, project, tmp_path / "with")
    for name in RUNS:
        before, after = without[name], with_package[name]
        for key in ("rc", "outcomes", "facts"):
            assert before[key] == after[key], (
                f"pytest {name}: {key} changed\n{before[key]}\n{after[key]}\n{after['log']}"
            )
    files_after = project_files(project)
    assert files_after == files_before, "the plugin wrote into a foreign project"
    # the installed plugin did load (it is a guest, not absent)
    listed = subprocess.run(
        [str(env_dir / "bin" / "python"), "-m", "pytest", "--help"], cwd=project, capture_output=True, text=True
    )
    assert "--mla-backend" in listed.stdout and "--backend" in listed.stdout

    # and the main job runs from the installed package alone, in an empty directory (its goldens: smoke's, from
    # the session's shared store, named as a user names a store built ahead)
    empty = tmp_path / "empty"
    empty.mkdir()
    job = subprocess.run(
        [
            str(env_dir / "bin" / "mlaconf"),
            "run",
            "--backend",
            "torch-cpu",
            "--run-name",
            "r",
            "-n",
            "2",
            "--",
            "-k",
            "b1-",
        ],
        cwd=empty,
        capture_output=True,
        text=True,
        timeout=HANG_S,
        env={"PATH": f"{env_dir / 'bin'}:/usr/bin:/bin", "HOME": str(tmp_path), "MLA_GOLDEN_DIR": str(shared_golden)},
    )
    assert job.returncode == 0, job.stdout[-3000:] + job.stderr[-2000:]
    run_json = json.loads((empty / "reports" / "out" / "r" / "run.json").read_text())
    assert run_json["status"] == "complete" and run_json["counts"]["run"] > 0
    assert str(env_dir) in run_json["args"][0] or "site-packages" in " ".join(run_json["args"])
