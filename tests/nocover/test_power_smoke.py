"""docs/conformance.md's defect and zoo tables are what ``mlaconf power --suite smoke`` measures now.

Runs the command (every catalogued defect and zoo member over smoke's 108 cases: an hour on a loaded
2-core machine, about 4 minutes on a quiet one at -j 2; goldens from ``$MLA_GOLDEN_DIR`` when set) and compares its
power.md with the tables between the ``power-tables`` markers of the doc: the same defects and members,
the same kills and case counts, the same deciding checks, slacks within :data:`SLACK_RTOL` (a BLAS
may round a sum differently).
"""

from __future__ import annotations

import math
import os
import re
from pathlib import Path

import mlaconf

DOC = Path(__file__).resolve().parents[2] / "docs" / "conformance.md"
BEGIN, END = "<!-- power-tables: begin -->", "<!-- power-tables: end -->"
#: Relative difference allowed between a documented slack and the measured one.
SLACK_RTOL = 0.05


def rows(markdown: str) -> dict[str, list[str]]:
    """Table rows by their first cell (a defect or member name), cells stripped; headers dropped."""
    found = {}
    for line in markdown.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if line.startswith("| `") and len(cells) > 2:
            found[cells[0]] = cells
    return found


def documented() -> dict[str, list[str]]:
    text = DOC.read_text()
    assert BEGIN in text and END in text, f"{DOC} lacks the {BEGIN} ... {END} block"
    return rows(text[text.index(BEGIN) : text.index(END)])


def same_cell(doc: str, now: str) -> bool:
    numbers = [re.fullmatch(r"-?[0-9.e+-]+|inf", value) for value in (doc, now)]
    if all(numbers) and doc != now:
        a, b = float(doc), float(now)
        return math.isclose(a, b, rel_tol=SLACK_RTOL) or (math.isinf(a) and math.isinf(b))
    return doc == now


def test_smoke_power_is_the_documented_one(tmp_path: Path) -> None:
    golden = os.environ.get("MLA_GOLDEN_DIR") or str(tmp_path / "golden")
    status = mlaconf.main(["power", "--suite", "smoke", "--out", str(tmp_path), "--golden-dir", golden])
    assert status == 0, (tmp_path / "power.md").read_text()
    measured, doc = rows((tmp_path / "power.md").read_text()), documented()
    assert sorted(measured) == sorted(doc), "docs/conformance.md's power tables list other defects or members"
    for name, cells in measured.items():
        differing = [(d, m) for d, m in zip(doc[name], cells, strict=True) if not same_cell(d, m)]
        assert not differing, f"{name}: documented vs measured {differing}"
