"""The shipped model's valid tuples, counted ahead: which level tuples of each factor set some valid case can hold.

Counting them is a search (``levels.Validity``): about 10 s of CPU for the 1-, 2- and 3-way sets of the settled
model, paid by every process that reports coverage (``mlaconf list``, ``mlaconf coverage``, the covering
generator's targets).  ``valid_tuples.json`` beside this module holds the answer for every factor set those
reports ask about, one bit per level tuple (the levels' product in model order), made by that same search.  It is
used only for the shipped model, settled, while the files it was made from are today's (:func:`sources_digest`)
and its own checksum holds; otherwise, or for a set it lacks, the search runs, so a stale or damaged table costs
time and never changes an answer.  ``python -m mlaconf.golden.coverage.covering`` rewrites it with the suites'
generated sections, ``--check-inputs`` says when it is stale (tests/nocover/test_covering.py).  A leaf: reads
files, imports nothing of the rooms but the model's path."""

from __future__ import annotations

import hashlib
import json
from functools import cache
from importlib.util import find_spec
from pathlib import Path
from typing import Any

from mlaconf.facts.factors import DEFAULT_PATH

TABLE = Path(__file__).with_name("valid_tuples.json")
#: The modules whose text decides which tuples are valid, beside the model file: the level rules and the search,
#: the model's reading, the operator's limits.
SOURCES = ("mlaconf.facts.factors", "mlaconf.facts.operator", "mlaconf.golden.coverage.levels")


def sources_digest(model_path: Path = DEFAULT_PATH) -> str:
    """sha256 (16 hex digits) of the model file and :data:`SOURCES`."""
    digest = hashlib.sha256(model_path.read_bytes())
    for name in SOURCES:
        spec = find_spec(name)
        assert spec is not None and spec.origin is not None, name
        digest.update(Path(spec.origin).read_bytes())
    return digest.hexdigest()[:16]


def _checksum(sets: dict[str, str]) -> str:
    return hashlib.sha256(json.dumps(sets, sort_keys=True).encode("ascii")).hexdigest()


def table_text(sets: dict[str, str], model_path: Path = DEFAULT_PATH) -> str:
    """The file's text for ``sets`` (factor names joined by commas -> the hex bit set of its valid tuples)."""
    doc = {"sources": sources_digest(model_path), "checksum": _checksum(sets), "sets": sets}
    return json.dumps(doc, indent=0, sort_keys=True) + "\n"


def _document(path: Path) -> dict[str, Any] | None:
    """The table file as JSON, None when it cannot be read as an object."""
    try:
        doc = json.loads(path.read_text(encoding="ascii"))
    except (OSError, ValueError):
        return None
    return doc if isinstance(doc, dict) else None


def recorded_sources(path: Path = TABLE) -> str | None:
    """The sources digest the table records (None: no readable table)."""
    found = (_document(path) or {}).get("sources")
    return found if isinstance(found, str) else None


@cache
def shipped_sets() -> dict[str, str]:
    """The table's sets while it is current and whole; empty otherwise (every set is then searched)."""
    doc = _document(TABLE) or {}
    sets = doc.get("sets")
    if not isinstance(sets, dict) or doc.get("sources") != sources_digest() or doc.get("checksum") != _checksum(sets):
        return {}
    return sets


def valid_bits(names: tuple[str, ...]) -> int | None:
    """The shipped bit set of one factor set's valid tuples (bit i: the i-th tuple of the levels' product), or
    None when the table does not answer."""
    bits = shipped_sets().get(",".join(names))
    return int(bits, 16) if isinstance(bits, str) else None
