"""How ``pytest -n auto`` spreads the framework's own tests over its workers: slowest first, and a module
whose tests share a module-scoped fixture on one worker.

xdist's default (``load``) hands tests out in collection order, one by one, round robin. Our slowest tests
(whole-suite child runs, minutes each) sit at the end of that order, in ``tests/nocover``: one worker ran
the last of them alone while the other stood idle, and a module's tests split over both workers either
made their module fixture twice or left one worker waiting on the other's lock. Here the measured slowest
modules start first, so the light tests fill the other worker's time, and a module with a module-scoped
fixture is one unit of work. What a test checks is unchanged; only where and when it runs.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from xdist.remote import Producer
from xdist.scheduler import LoadScopeScheduling

#: The modules measured slowest in worker-seconds (a quiet 2-core ``pytest -n auto``, docs/benchmarks.md
#: "The framework's own runs"), slowest first. A stale entry costs wall time, never a result.
SLOWEST_FIRST = (
    "tests/nocover/test_power_smoke.py",
    "tests/nocover/test_defects.py",
    "tests/nocover/test_run_lifecycle.py",
    "tests/nocover/test_docs_commands.py",
    "tests/nocover/test_ray_cluster.py",
    "tests/nocover/test_ascend_rehearsal.py",
    "tests/nocover/test_store_faults.py",
    "tests/nocover/test_guest.py",
    "tests/nocover/test_smoke_reports.py",
    "tests/nocover/test_golden_agreement.py",
    "tests/nocover/test_every_outcome.py",
    "tests/cover/test_front_door.py",
    "tests/nocover/test_store_concurrency.py",
    "tests/nocover/test_baseline_conforms.py",
    "tests/nocover/test_msprobe_dumps.py",
    "tests/cover/test_registry.py",
    "tests/cover/test_coverage.py",
    "tests/nocover/test_power_branches.py",
)
#: A module-scoped fixture, as our test modules write one.
MODULE_FIXTURE = re.compile(r"@pytest\.fixture\(scope=\"module\"")


def slowest_first(items: list[pytest.Item]) -> None:
    """Reorder ``items`` in place: the :data:`SLOWEST_FIRST` modules in that order, then the rest as
    collected (a stable sort: a module's own order is kept)."""
    rank = {module: i for i, module in enumerate(SLOWEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.nodeid.split("::", 1)[0], len(rank)))


class SharedSetupScheduling(LoadScopeScheduling):
    """xdist's ``load`` distribution in collection order, test by test, except that a module of ``tests/``
    defining a module-scoped fixture goes to one worker whole."""

    def __init__(self, config: pytest.Config, log: Producer | None = None) -> None:
        super().__init__(config, log)
        config.option.loadscopereorder = False  # the collection order is the slowest-first order
        self._root = Path(config.rootpath)
        self._whole: dict[str, bool] = {}

    def _split_scope(self, nodeid: str) -> str:
        module = nodeid.split("::", 1)[0]
        if module not in self._whole:
            path = self._root / module
            self._whole[module] = (
                module.startswith("tests/") and path.is_file() and bool(MODULE_FIXTURE.search(path.read_text()))
            )
        return module if self._whole[module] else nodeid
