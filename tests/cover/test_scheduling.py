"""How ``pytest -n auto`` spreads our own tests (tests/scheduling.py): the measured slowest modules first,
a module with a module-scoped fixture as one unit of work, everything else test by test."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

from tests.scheduling import SLOWEST_FIRST, SharedSetupScheduling, slowest_first

ROOT = Path(__file__).resolve().parents[2]


def test_every_listed_slow_module_exists_once() -> None:
    assert len(set(SLOWEST_FIRST)) == len(SLOWEST_FIRST)
    missing = [module for module in SLOWEST_FIRST if not (ROOT / module).is_file()]
    assert not missing, f"tests/scheduling.py lists modules that are gone: {missing}"


def test_the_slowest_modules_come_first_and_the_rest_keep_their_order() -> None:
    nodeids = [
        "tests/cover/test_docs.py::test_a",
        f"{SLOWEST_FIRST[1]}::test_b",
        "cases/test_conformance.py::test_conformance[x]",
        f"{SLOWEST_FIRST[0]}::test_c",
        f"{SLOWEST_FIRST[1]}::test_a",
        "tests/cover/test_docs.py::test_b",
    ]
    items: list[Any] = [SimpleNamespace(nodeid=n) for n in nodeids]
    slowest_first(items)
    assert [item.nodeid for item in items] == [
        f"{SLOWEST_FIRST[0]}::test_c",
        f"{SLOWEST_FIRST[1]}::test_b",
        f"{SLOWEST_FIRST[1]}::test_a",
        "tests/cover/test_docs.py::test_a",
        "cases/test_conformance.py::test_conformance[x]",
        "tests/cover/test_docs.py::test_b",
    ]


def test_a_module_with_a_module_fixture_is_one_unit_and_any_other_test_its_own() -> None:
    scheduler = SharedSetupScheduling.__new__(SharedSetupScheduling)  # _split_scope needs no xdist nodes
    scheduler._root, scheduler._whole = ROOT, {}
    shared = "tests/nocover/test_power_smoke.py"  # its power_run fixture is module-scoped
    assert scheduler._split_scope(f"{shared}::test_a") == scheduler._split_scope(f"{shared}::test_b") == shared
    for nodeid in ("tests/cover/test_docs.py::test_a", "cases/test_conformance.py::test_conformance[x]"):
        assert scheduler._split_scope(nodeid) == nodeid
