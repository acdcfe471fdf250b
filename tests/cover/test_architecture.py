"""The rooms' import rules (docs/architecture.md), checked on the source, not on trust."""

from __future__ import annotations

import ast
import importlib
import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

import mlaconf
from tests.pytest_runs import run_pytest

REPO = Path(__file__).resolve().parents[2]
#: The one room list is mlaconf.ROOMS; what cannot be derived from it (pyproject, the folders) is tested below.
ROOMS = set(mlaconf.ROOMS)
#: The installed package's one top-level name; ``mlaconf.<room>`` is the folder ``<room>/``.
NAMESPACE = "mlaconf"
#: The console-script module itself (mlaconf/__init__.py), a room of its own for these rules.
CLI = "cli"
#: Public faces at the top of the namespace -> the room they stand for.
FACES = {"backend": "harness"}

#: room -> rooms it must never import (at any depth, lazily or not).
FORBIDDEN = {
    "facts": ROOMS - {"facts"} | {CLI},
    "golden": {"harness", "reports", "judge", "runner", "cases", CLI},
    "harness": {"golden", "cases", "judge", "runner", "reports", CLI},
    "native": {"golden", "cases", "judge", "runner", "reports", CLI},
    "judge": {"harness", "runner", "cases", "reports", CLI},
    "reports": {"golden", "harness", "native", "judge", "runner", "cases", CLI},
}


def imported_rooms(path: Path) -> set[str]:
    """The rooms of every import of ours in a module, including those inside functions; a bare
    room name (``import golden``) is reported as ``bare:golden``: it is not an installed name."""
    names: set[str] = set()
    modules: list[str] = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            modules += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            modules.append(node.module)
    for module in modules:
        parts = module.split(".")
        if parts[0] == NAMESPACE:
            room = parts[1] if len(parts) > 1 else ""
            names.add(room if room in ROOMS else FACES.get(room, CLI))
        elif parts[0] in ROOMS:
            names.add(f"bare:{parts[0]}")
    return names


@pytest.mark.parametrize("room", sorted(FORBIDDEN))
def test_room_imports_only_what_it_may(room: str) -> None:
    offences = [
        f"{path.relative_to(REPO)} imports {sorted(imported_rooms(path) & FORBIDDEN[room])}"
        for path in sorted((REPO / room).rglob("*.py"))
        if imported_rooms(path) & FORBIDDEN[room]
    ]
    assert not offences, f"{room} breaks its import rule: " + "; ".join(offences)


def test_every_import_uses_the_installed_name() -> None:
    """``import golden`` works only in this checkout; installed, there is only ``mlaconf.golden``."""
    sources = [p for p in REPO.rglob("*.py") if not {".git", "build", "mlaconf"} & set(p.relative_to(REPO).parts)]
    sources += list((REPO / NAMESPACE).glob("*.py"))
    offences = [
        f"{path.relative_to(REPO)}: {sorted(n for n in imported_rooms(path) if n.startswith('bare:'))}"
        for path in sorted(sources)
        if any(n.startswith("bare:") for n in imported_rooms(path))
    ]
    assert not offences, "imports by a bare room name: " + "; ".join(offences)


def test_the_namespace_maps_every_room() -> None:
    """Installed, each room is the subpackage mlaconf.<room> (package-dir); in the checkout, the same
    mapping is mlaconf/__init__.py's finder, and mypy's wrapper reads it from the same table."""
    import tomllib

    config = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]
    assert config["package-dir"] == {f"{NAMESPACE}.{room}": room for room in ROOMS}
    assert set(config["packages"]) == {NAMESPACE} | {f"{NAMESPACE}.{room}" for room in ROOMS}
    packages = {p.parent.name for p in REPO.glob("*/__init__.py")} - {NAMESPACE, "tests", "build"}
    assert packages == ROOMS, "every top-level package of the checkout is a room of mlaconf.ROOMS, and back"


def test_git_holds_no_symlink() -> None:
    """One path per file: a symlinked folder would give its files a second path (and pytest a second copy)."""
    staged = subprocess.run(["git", "ls-files", "-s"], cwd=REPO, capture_output=True, text=True, check=True)
    links = [line.split("\t")[1] for line in staged.stdout.splitlines() if line.startswith("120000")]
    assert not links, f"symlinks in the tree: {links}"


@pytest.mark.parametrize("room", sorted(ROOMS))
def test_a_room_module_names_the_path_git_knows(room: str) -> None:
    """``__file__``, tracebacks and coverage name <room>/..., never mlaconf/<room>/..."""
    module = importlib.import_module(f"{NAMESPACE}.{room}")
    assert module.__file__ is not None and Path(module.__file__) == REPO / room / "__init__.py"
    assert list(module.__path__) == [str(REPO / room)]


def test_mypy_sees_every_module_under_its_installed_name() -> None:
    spec = importlib.util.spec_from_file_location("mypy_rooms", REPO / ".ci" / "mypy_rooms.py")
    assert spec is not None and spec.loader is not None
    mypy_rooms = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mypy_rooms)
    sources = {source.path: source.module for source in mypy_rooms.module_sources(REPO)}
    files = {str(p.relative_to(REPO)) for room in ROOMS for p in (REPO / room).rglob("*.py")}
    files |= {str(p.relative_to(REPO)) for p in (REPO / NAMESPACE).glob("*.py")}
    assert files <= set(sources), f"modules mypy would skip: {sorted(files - set(sources))}"
    assert sources["golden/spec.py"] == "mlaconf.golden.spec" and sources["runner/__init__.py"] == "mlaconf.runner"
    assert sources["mlaconf/backend.py"] == "mlaconf.backend"


def test_a_checkout_without_symlinks_imports_from_its_own_tree(tmp_path: Path) -> None:
    """``git -c core.symlinks=false clone`` works, and PYTHONPATH=<that clone> wins over any installed copy."""
    clone = tmp_path / "clone"
    subprocess.run(
        ["git", "-c", "core.symlinks=false", "clone", "-q", "--no-hardlinks", str(REPO), str(clone)], check=True
    )
    probe = "import mlaconf.runner.plugin as p, mlaconf.golden.spec as s; print(p.__file__); print(s.__file__)"
    env = {**os.environ, "PYTHONPATH": str(clone)}
    ran = subprocess.run([sys.executable, "-c", probe], cwd=tmp_path, env=env, capture_output=True, text=True)
    assert ran.returncode == 0, ran.stderr
    assert ran.stdout.split() == [str(clone / "runner" / "plugin.py"), str(clone / "golden" / "spec.py")]


def test_the_backend_module_is_the_public_face_of_the_protocol() -> None:
    import mlaconf.backend
    import mlaconf.harness.backend as home

    assert mlaconf.backend.__all__ and all(
        getattr(mlaconf.backend, n) is getattr(home, n) for n in mlaconf.backend.__all__
    )
    assert imported_rooms(REPO / NAMESPACE / "backend.py") == {"harness"}


def test_cases_holds_suites_only() -> None:
    """cases/ is data and test modules: library code lives in the rooms named for its job."""
    modules = [p.name for p in (REPO / "cases").glob("*.py")]
    extra = [name for name in modules if name != "__init__.py" and not name.startswith("test_")]
    assert not extra, f"library modules in cases/: {extra}"
    assert sorted(p.stem for p in (REPO / "cases").glob("*.toml")), "no suite files shipped"


#: Most lines one module of the rooms may hold (issue 30: files past ~700 lines were split where a
#: concept ends); a module that outgrows it is split the same way, not exempted.
MAX_MODULE_LINES = 700


def test_no_module_outgrows_the_split_limit() -> None:
    sizes = {
        str(p.relative_to(REPO)): len(p.read_text().splitlines())
        for room in sorted(ROOMS | {NAMESPACE})
        for p in (REPO / room).rglob("*.py")
    }
    large = {path: lines for path, lines in sorted(sizes.items()) if lines > MAX_MODULE_LINES}
    assert not large, f"modules over {MAX_MODULE_LINES} lines (split where a concept ends): {large}"


def test_the_rule_checker_sees_lazy_and_bare_imports(tmp_path: Path) -> None:
    module = tmp_path / "m.py"
    module.write_text(
        "def f():\n    from mlaconf.harness.registry import create\n    import golden.spec\n    import mlaconf\n"
    )
    assert imported_rooms(module) == {"harness", "bare:golden", CLI}


def test_pytest_fixtures_names_the_path_git_knows(tmp_path: Path) -> None:
    listed = run_pytest("--fixtures", "-q", str(REPO / "cases"), cwd=tmp_path, inherit=True, timeout=300)
    assert listed.returncode == 0, listed.output
    assert "runner/session.py:" in listed.stdout and "mlaconf/runner" not in listed.stdout
