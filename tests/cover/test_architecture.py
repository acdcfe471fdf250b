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
from tests.machine import HANG_S
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
    "golden": {"harness", "reports", "judge", "runner", "tools", "cases", CLI},
    "harness": {"golden", "cases", "judge", "runner", "tools", "reports", CLI},
    "native": {"golden", "cases", "judge", "runner", "tools", "reports", CLI},
    "judge": {"harness", "runner", "tools", "cases", "reports", CLI},
    "runner": {"tools", "cases"},
    "tools": {"cases"},
    "reports": {"golden", "harness", "native", "judge", "runner", "tools", "cases", CLI},
}


def imported_modules(path: Path) -> list[str]:
    """Every absolute import in a module, inside functions too; ``from a import b`` gives ``a.b`` and ``a``."""
    modules: list[str] = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            modules += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            modules += [node.module, *(f"{node.module}.{alias.name}" for alias in node.names)]
    return modules


def installed_modules() -> dict[str, Path]:
    """Installed module name -> the file git knows, for every module of the package."""
    found = {}
    for path in [*(p for room in ROOMS for p in (REPO / room).rglob("*.py")), *(REPO / NAMESPACE).glob("*.py")]:
        parts = path.relative_to(REPO).with_suffix("").parts
        parts = parts if parts[0] == NAMESPACE else (NAMESPACE, *parts)
        found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def import_graph() -> dict[str, set[str]]:
    """Module -> the modules of ours it imports (lazily or not): the installed layout's import graph."""
    modules = installed_modules()
    return {name: set(imported_modules(path)) & set(modules) - {name} for name, path in modules.items()}


def imported_rooms(path: Path) -> set[str]:
    """The rooms of every import of ours in a module, including those inside functions; a bare
    room name (``import golden``) is reported as ``bare:golden``: it is not an installed name."""
    names: set[str] = set()
    for module in imported_modules(path):
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


def test_golden_sub_rooms_import_only_downward() -> None:
    """A golden sub-room imports only from itself and the sub-rooms before it (golden.SUB_ROOMS), never the
    room's own verb modules above them."""
    from mlaconf.golden import SUB_ROOMS

    assert {p.name for p in (REPO / "golden").iterdir() if (p / "__init__.py").is_file()} == set(SUB_ROOMS)
    offences = []
    for floor, sub_room in enumerate(SUB_ROOMS):
        allowed = {f"{NAMESPACE}.golden.{below}" for below in SUB_ROOMS[: floor + 1]}
        for path in sorted((REPO / "golden" / sub_room).rglob("*.py")):
            for module in imported_modules(path):
                parts = module.split(".")
                if parts[:2] == [NAMESPACE, "golden"] and len(parts) > 2 and ".".join(parts[:3]) not in allowed:
                    offences.append(f"{path.relative_to(REPO)} imports {module}")
    assert not offences, "golden sub-rooms importing upward: " + "; ".join(offences)


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for child in sorted(graph[node]):
            if child not in index:
                visit(child)
                low[node] = min(low[node], low[child])
            elif child in stack:
                low[node] = min(low[node], index[child])
        if low[node] == index[node]:
            component = []
            while True:
                top = stack.pop()
                component.append(top)
                if top == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_the_import_graph_has_no_circle() -> None:
    """No module reaches itself through imports of ours, lazy and type-only ones included: within a room
    as between rooms, every arrow points down."""
    assert not circles(import_graph())


def test_the_circle_finder_sees_a_circle() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert circles(graph) == [["a", "b", "c"]] and not circles({"a": {"b"}, "b": set()})


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
    sub_packages = {
        f"{NAMESPACE}.{'.'.join(p.parent.relative_to(REPO).parts)}"
        for room in ROOMS
        for p in (REPO / room).glob("*/__init__.py")
    }
    assert set(config["packages"]) == {NAMESPACE} | {f"{NAMESPACE}.{room}" for room in ROOMS} | sub_packages
    packages = {p.parent.name for p in REPO.glob("*/__init__.py")} - {NAMESPACE, "tests", "build"}
    assert packages == ROOMS, "every top-level package of the checkout is a room of mlaconf.ROOMS, and back"


def test_git_ignores_no_module_of_a_room() -> None:
    """Every module of the rooms is one git tracks: an ignore rule (``build/`` once matched a sub-room named
    build) would leave a package's __init__.py out of every clone and CI run."""
    modules = [
        str(p.relative_to(REPO)) for room in ROOMS for p in (REPO / room).rglob("*.py*") if p.suffix in {".py", ".pyi"}
    ]
    ignored = subprocess.run(
        ["git", "check-ignore", "--no-index", "--stdin"],
        cwd=REPO,
        input="\n".join(modules),
        capture_output=True,
        text=True,
    )
    assert not ignored.stdout.split(), f"modules git ignores: {ignored.stdout.split()}"


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
    assert (
        sources["golden/specs/spec.py"] == "mlaconf.golden.specs.spec"
        and sources["runner/__init__.py"] == "mlaconf.runner"
    )
    assert sources["mlaconf/backend.py"] == "mlaconf.backend"


def test_a_checkout_without_symlinks_imports_from_its_own_tree(tmp_path: Path) -> None:
    """``git -c core.symlinks=false clone`` works, and PYTHONPATH=<that clone> wins over any installed copy."""
    clone = tmp_path / "clone"
    subprocess.run(
        ["git", "-c", "core.symlinks=false", "clone", "-q", "--no-hardlinks", str(REPO), str(clone)], check=True
    )
    probe = "import mlaconf.runner.plugin as p, mlaconf.golden.specs.spec as s; print(p.__file__); print(s.__file__)"
    env = {**os.environ, "PYTHONPATH": str(clone)}
    ran = subprocess.run([sys.executable, "-c", probe], cwd=tmp_path, env=env, capture_output=True, text=True)
    assert ran.returncode == 0, ran.stderr
    assert ran.stdout.split() == [str(clone / "runner" / "plugin.py"), str(clone / "golden" / "specs" / "spec.py")]


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


#: Most lines one module of the rooms may hold (files past ~700 lines were split where a
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
    listed = run_pytest("--fixtures", "-q", str(REPO / "cases"), cwd=tmp_path, inherit=True, timeout=HANG_S)
    assert listed.returncode == 0, listed.output
    assert "runner/suites_plugin.py:" in listed.stdout and "mlaconf/runner" not in listed.stdout
