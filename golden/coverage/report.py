"""What ``mlaconf coverage`` says of a selection of cases: how much of the factor model (facts/factors.toml) they
cover, per strength t, the tuples of levels no case covers, the pending levels and the branch backlog, in words
or as JSON.

The verb itself (its command line and the ``--backend`` filter, which needs the known deviations) is
:mod:`mlaconf.tools.coverage_report`'s; the suites and the model load when it runs."""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from mlaconf.golden.coverage.levels import Coverage
    from mlaconf.golden.specs.spec import CaseSpec


def selections(args: argparse.Namespace) -> list[tuple[str, list[CaseSpec]]]:
    """The suites (``all``: every value suite) and ``--cases`` files ``mlaconf coverage`` names, by name."""
    from mlaconf.golden.specs.suites import load_suite, load_suites, suites_in_all

    names = list(args.suites) or ([] if args.cases else ["smoke"])
    expanded: list[str] = []
    for name in names:
        expanded += suites_in_all() if name == "all" else [name]
    chosen = [(name, load_suites([name])) for name in dict.fromkeys(expanded)]
    return chosen + [(str(path), load_suite(path)) for path in args.cases]


def pending_held(cases: Sequence[CaseSpec]) -> list[tuple[str, str, int]]:
    """Each pending level of the model (not yet targeted by the covering sets) and how many cases hold it."""
    from mlaconf.facts.factors import load_model
    from mlaconf.golden.coverage.levels import case_levels

    valid = [case_levels(spec) for spec in cases if spec.expect_error is None]
    return [(f, lv, sum(lv in levels[f] for levels in valid)) for f, lv in load_model().pending]


def backlog_lines(show: int) -> list[str]:
    """The branch inventory's backlog: how many of ATB's branches (facts/branches.toml) no level takes yet."""
    from mlaconf.facts.branches import load_inventory

    inventory = load_inventory()
    missing = inventory.missing
    lines = [
        f"ATB's MLA prefill at {inventory.commit[:9]}: {len(inventory.branches)} branches (facts/branches.toml), "
        f"{len(missing)} with no factor level yet"
    ]
    listed = missing if show == 0 else missing[:show]
    lines += [f"  {branch.id}: {branch.note}" for branch in listed]
    if len(listed) < len(missing):
        lines.append(f"  ... and {len(missing) - len(listed)} more (--show 0 lists all)")
    return lines


def _jsonable(result: Coverage, show: int) -> dict[str, Any]:
    from mlaconf.golden.coverage.levels import describe

    listed = result.uncovered if show == 0 else result.uncovered[:show]
    return {
        "label": result.label,
        "valid": result.total,
        "covered": result.total - len(result.uncovered),
        "percent": round(result.percent, 2),
        "uncovered_count": len(result.uncovered),
        "uncovered": [{"levels": dict(items), "text": describe(items)} for items in listed],
    }


def summary(results: Sequence[Coverage]) -> str:
    """``1-way 100.0 %, 2-way 100.0 %, 3-way 61.9 %, 3-way structure 76.1 %``."""
    return ", ".join(f"{r.label} {r.percent:.1f} %" for r in results)


def selection_document(name: str, cases: Sequence[CaseSpec], found: Sequence[Coverage], show: int) -> dict[str, Any]:
    """One selection's coverage as ``mlaconf coverage --json`` writes it."""
    return {
        "selection": name,
        "cases": len(cases),
        "coverage": [_jsonable(r, show) for r in found],
        "pending": [{"factor": f, "level": lv, "cases": n} for f, lv, n in pending_held(cases)],
    }


def selection_lines(name: str, cases: Sequence[CaseSpec], found: Sequence[Coverage], show: int) -> list[str]:
    """One selection's coverage in words: the percentages, the first ``show`` uncovered tuples (0: all), the
    pending levels with the cases holding each."""
    from mlaconf.golden.coverage.levels import describe

    lines = [f"{name}: {len(cases)} cases; {summary(found)}"]
    for result in found:
        covered = result.total - len(result.uncovered)
        lines.append(f"  {result.label}: {result.percent:.1f} % ({covered} of {result.total} valid tuples)")
        listed = result.uncovered if show == 0 else result.uncovered[:show]
        lines += [f"    {describe(items)}" for items in listed]
        if len(listed) < len(result.uncovered):
            lines.append(f"    ... and {len(result.uncovered) - len(listed)} more (--show 0 lists all)")
    held = ", ".join(f"{f} {lv} ({n})" for f, lv, n in pending_held(cases))
    if held:
        lines.append(f"  pending levels, not in the percentages (cases holding each): {held}")
    return lines


def suite_coverage_lines(suites: Sequence[str]) -> list[str]:
    """One line per named suite for ``mlaconf list``: its 1/2/3-way coverage."""
    from mlaconf.golden.coverage.levels import coverage
    from mlaconf.golden.specs.suites import load_suites, suites_in_all

    names: list[str] = []
    for name in suites:
        names += suites_in_all() if name == "all" else [name]
    return [f"coverage {name}: {summary(coverage(load_suites([name])))}" for name in dict.fromkeys(names)]
