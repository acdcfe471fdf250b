"""The shipped model's valid tuples counted ahead (golden/coverage/valid_tuples.json, golden/coverage/valid_table.py):
its answers are the search's, and a table that is stale, damaged or unreadable is not used (the search answers).
That the shipped table was made from today's sources, and equals a fresh one in full, is
tests/nocover/test_covering.py's."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from mlaconf.facts.factors import load_model
from mlaconf.golden.coverage import valid_table
from mlaconf.golden.coverage.levels import all_factor_sets, searched_bits

SHIPPED = valid_table.TABLE
MODEL = load_model().settled()


@pytest.fixture
def table(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A copy of the shipped table that :func:`valid_table.shipped_sets` reads instead (its cache cleared)."""
    copy = tmp_path / SHIPPED.name
    copy.write_bytes(SHIPPED.read_bytes())
    monkeypatch.setattr(valid_table, "TABLE", copy)
    valid_table.shipped_sets.cache_clear()
    yield copy
    valid_table.shipped_sets.cache_clear()


def test_the_shipped_table_answers_the_pairs_as_the_search_does() -> None:
    """Every 1- and 2-way set of the settled model (3,348 tuples): the table's bits are the search's."""
    valid_table.shipped_sets.cache_clear()
    assert valid_table.shipped_sets(), "the shipped table is stale or damaged: rewrite it (golden/coverage/covering.py)"
    for t in (1, 2):
        for names in all_factor_sets(MODEL, t):
            assert valid_table.valid_bits(names) == searched_bits(MODEL, names), names


def edit(path: Path, change: str) -> None:
    doc = json.loads(path.read_text())
    if change == "sources":
        doc["sources"] = "0" * 16
    elif change == "bits":  # one tuple of one pair flipped, the checksum left as it was
        name = "dtype,mask"
        doc["sets"][name] = format(int(doc["sets"][name], 16) ^ 1, "x")
    path.write_text(json.dumps(doc))


@pytest.mark.parametrize("change", ["sources", "bits"])
def test_a_stale_or_damaged_table_is_not_used(table: Path, change: str) -> None:
    assert valid_table.valid_bits(("dtype", "mask")) is not None
    edit(table, change)
    valid_table.shipped_sets.cache_clear()
    assert valid_table.shipped_sets() == {} and valid_table.valid_bits(("dtype", "mask")) is None


@pytest.mark.parametrize("text", ["", "{", "[]", '{"sets": {}}', "\x00\xff"])
def test_an_unreadable_table_is_not_used(table: Path, text: str) -> None:
    table.write_text(text, encoding="latin-1")
    assert valid_table.shipped_sets() == {}


def test_a_missing_table_is_not_used(table: Path) -> None:
    table.unlink()
    assert valid_table.shipped_sets() == {}
