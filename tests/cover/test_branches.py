"""The branch inventory of ATB's MLA prefill (facts/branches.toml) and the factor model (facts/factors.toml) hold
each other: every branch names levels the model has (or says it has none yet) and sites with lines, every level
is named by a branch or cites a contract line a user can open, and ``mlaconf coverage`` shows the backlog."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from mlaconf.facts.branches import BranchInventoryError, load_inventory, parse_inventory, problems
from mlaconf.facts.factors import Level, load_model, parse_model
from mlaconf.golden.specs.suites import load_suite, suite_path

ROOT = Path(__file__).resolve().parents[2]
INVENTORY = load_inventory()
MODEL = load_model()
ERROR_CASES = frozenset(spec.name for spec in load_suite(suite_path("errors")))


def inventory(**branch: Any) -> dict[str, Any]:
    """A one-branch inventory file's data, the branch's fields overridden."""
    fields = {"id": "b", "on": "what", "at": ["dep:478-484"], "levels": ["kv_layout.packed"], **branch}
    return {
        "repository": "r",
        "commit": "c",
        "files": {"dep": "src/dep.cpp"},
        "branch": [{k: v for k, v in fields.items() if v is not None}],
    }


def test_the_shipped_inventory_and_model_hold_each_other() -> None:
    assert problems(INVENTORY, MODEL, ERROR_CASES, ROOT) == []
    assert INVENTORY.commit.startswith("ddcc8b622")
    assert len(INVENTORY.branches) >= 60 and INVENTORY.missing, "the backlog is part of the inventory"


def test_a_branch_naming_a_level_or_error_case_the_model_lacks_is_a_problem() -> None:
    wrong = parse_inventory(inventory(levels=["kv_layout.sideways"], errors=["no-such-case"]), "t.toml")
    found = problems(wrong, MODEL, ERROR_CASES, ROOT)
    assert "branch b: no level kv_layout.sideways in the model" in found
    assert "branch b: no error case 'no-such-case'" in found


@pytest.mark.parametrize(
    ("at", "message"),
    [
        (None, "'at' must list one or more sites"),
        (["dep"], "is not FILE:LINE"),
        (["dep:0"], "is not FILE:LINE"),
        (["tiling:12"], "is not FILE:LINE"),
        (["dep:9-3"], "ends before it starts"),
    ],
)
def test_a_branch_without_file_and_line_is_refused(at: list[str] | None, message: str) -> None:
    with pytest.raises(BranchInventoryError, match=message):
        parse_inventory(inventory(at=at), "t.toml")


def test_a_missing_branch_needs_a_note() -> None:
    with pytest.raises(BranchInventoryError, match="needs a note"):
        parse_inventory(inventory(levels="missing"), "t.toml")
    with pytest.raises(BranchInventoryError, match="'levels' must be"):
        parse_inventory(inventory(levels=["packed"]), "t.toml")
    parsed = parse_inventory(inventory(levels="missing", note="no level yet"), "t.toml")
    assert [b.id for b in parsed.missing] == ["b"] and str(parsed.branches[0].at[0]) == "src/dep.cpp:478-484"


def _with_level(source: str) -> Any:
    """The shipped model with one more q_layout level, citing ``source``."""
    q_layout = MODEL.factor("q_layout")
    grown = dataclasses.replace(q_layout, levels=(*q_layout.levels, Level("4d", "w", source)))
    return dataclasses.replace(MODEL, factors=tuple(grown if f is q_layout else f for f in MODEL.factors))


def test_a_level_citing_neither_a_branch_nor_a_contract_line_is_a_problem() -> None:
    assert problems(INVENTORY, _with_level("docs/operator.md §2"), ERROR_CASES, ROOT) == []
    for source, why in (
        ("", "no branch names it and it cites no contract line"),
        ("/work/shared/spec/mla_prefill.md: 128-row query tiles", "is no file of the repository"),
        ("docs/nowhere.md §1", "is no file of the repository"),
    ):
        assert [p for p in problems(INVENTORY, _with_level(source), ERROR_CASES, ROOT) if "4d" in p] == [
            f"level q_layout.4d: {f'source {source!r} ' if source else ''}{why}"
        ]


def test_pending_levels_stay_out_of_the_settled_model() -> None:
    """A pending level is in the model (branches may name it) but not in what coverage and the covering sets
    target; a constraint keeps only its settled levels.  The shipped model has none left."""
    assert MODEL.pending == () and MODEL.settled() == MODEL
    raw = {
        "factor": [
            {
                "name": "a",
                "scope": "case",
                "why": "w",
                "levels": [{"name": "x", "why": "w"}, {"name": "y", "why": "w"}],
            },
            {"name": "b", "scope": "case", "why": "w", "levels": [{"name": "p", "why": "w", "pending": True}]},
        ]
    }
    constraint = {"when": {"a": ["x"]}, "then": {"b": ["p", "q"]}, "why": "w"}
    with pytest.raises(ValueError, match="at least two levels"):
        parse_model(raw, "m.toml")  # a factor needs two levels, pending or not
    raw["factor"][1]["levels"].append({"name": "q", "why": "w", "pending": "yes"})
    with pytest.raises(ValueError, match="pending must be true or false"):
        parse_model(raw, "m.toml")
    raw["factor"][1]["levels"][1]["pending"] = True
    assert [f.name for f in parse_model(raw, "m.toml").settled().factors] == ["a"]
    raw["factor"][1]["levels"][1]["pending"] = False
    raw["constraint"] = [constraint]
    settled = parse_model(raw, "m.toml").settled()
    assert settled.pending == () and [dict(c.then)["b"] for c in settled.constraints] == [frozenset({"q"})]


def test_coverage_shows_the_backlog_and_the_pending_levels() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "mlaconf", "coverage", "edge", "--t", "1", "--show", "0"],
        capture_output=True, text=True, check=True, cwd=ROOT,
    )  # fmt: skip
    head = (
        f"{len(INVENTORY.branches)} branches (facts/branches.toml), {len(INVENTORY.missing)} with no factor level yet"
    )
    assert head in done.stdout
    assert all(f"  {b.id}: {b.note}" in done.stdout for b in INVENTORY.missing)
    assert "pending levels" not in done.stdout  # every level is settled: all counted in the percentages
