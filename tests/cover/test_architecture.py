"""The rooms' import rules (docs/architecture.md), checked on the source, not on trust."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
OURS = {"facts", "golden", "harness", "native", "judge", "runner", "cases", "reports", "mlaconf"}

#: package -> our packages it must never import (at any depth, lazily or not).
FORBIDDEN = {
    "facts": OURS - {"facts"},
    "golden": {"harness", "reports", "judge", "runner", "cases", "mlaconf"},
    "harness": {"golden", "cases", "judge", "runner", "reports", "mlaconf"},
    "native": {"golden", "cases", "judge", "runner", "reports", "mlaconf"},
    "judge": {"harness", "runner", "cases", "reports", "mlaconf"},
    "reports": {"golden", "harness", "native", "judge", "runner", "cases", "mlaconf"},
}


def imported_packages(path: Path) -> set[str]:
    """Top-level names of every import in a module, including those inside functions."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module.split(".")[0])
    return names


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_package_imports_only_what_its_room_may(package: str) -> None:
    offences = [
        f"{path.relative_to(REPO)} imports {sorted(imported_packages(path) & FORBIDDEN[package])}"
        for path in sorted((REPO / package).rglob("*.py"))
        if imported_packages(path) & FORBIDDEN[package]
    ]
    assert not offences, f"{package} breaks its import rule: " + "; ".join(offences)


def test_cases_holds_suites_only() -> None:
    """cases/ is data and test modules: library code lives in the rooms named for its job."""
    modules = [p.name for p in (REPO / "cases").glob("*.py")]
    extra = [name for name in modules if name != "__init__.py" and not name.startswith("test_")]
    assert not extra, f"library modules in cases/: {extra}"
    assert sorted(p.stem for p in (REPO / "cases").glob("*.toml")), "no suite files shipped"


def test_the_rule_checker_sees_lazy_imports(tmp_path: Path) -> None:
    module = tmp_path / "m.py"
    module.write_text("def f():\n    from harness.registry import create\n    import golden.spec\n")
    assert imported_packages(module) == {"harness", "golden"}
