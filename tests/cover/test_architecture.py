"""The rooms' import rules (docs/architecture.md), checked on the source, not on trust."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
ROOMS = {"facts", "golden", "harness", "native", "judge", "runner", "cases", "reports"}
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
    """Each room is reachable as mlaconf.<room>: a symlink in the checkout, a package-dir entry installed."""
    import tomllib

    config = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]
    assert config["package-dir"] == {f"{NAMESPACE}.{room}": room for room in ROOMS}
    assert set(config["packages"]) == {NAMESPACE} | {f"{NAMESPACE}.{room}" for room in ROOMS}
    for room in ROOMS:
        link = REPO / NAMESPACE / room
        assert link.is_symlink() and link.resolve() == (REPO / room).resolve(), f"{link} must link to ../{room}"


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


def test_the_rule_checker_sees_lazy_and_bare_imports(tmp_path: Path) -> None:
    module = tmp_path / "m.py"
    module.write_text(
        "def f():\n    from mlaconf.harness.registry import create\n    import golden.spec\n    import mlaconf\n"
    )
    assert imported_rooms(module) == {"harness", "bare:golden", CLI}
