"""Smoke's power, measured once: ``mlaconf power --suite smoke`` (every catalogued defect of
``harness/defects.py`` and every zoo member of ``harness/zoo.py`` over smoke's conformance cases, in
process, judged by the code the pytest suite uses) plus the defects' own bug-free path (``control_math``)
over the same cases.  Every proof about what smoke kills and what it lets pass reads that one run:

- every defect is killed, and clearly: its largest failing slack at least :data:`NEAR_MISS`;
- every reproduced upstream bug (``REAL_BUGS``, docs/real-bugs.md) is killed at :data:`NEAR_MISS` or more
  in both dtypes and every mask its conditions reach;
- ``control_math`` and every zoo member (correct kernels on other rounding paths) fail no case;
- docs/conformance.md's defect and zoo tables are the measured ones: the same defects and members, the
  same kills and case counts, the same deciding checks, slacks within :data:`SLACK_RTOL` (a BLAS may round a
  sum differently).

The run (about 4 minutes quiet on 2 cores at ``-j 2``, goldens from the session's shared store) is made by
the first test of the session that asks for it and kept under the session's shared folder, behind a file
lock, so under xdist the other worker reads it instead of measuring again.  What only a pytest run shows
(the clean backend on seeds 2-5, defects through JUnit and records, the kills only metamorphic relations
make, the error suite) is tests/nocover/test_defects.py.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from filelock import FileLock

import mlaconf
from mlaconf.golden.specs.suites import load_suites
from mlaconf.harness.defects import CATALOGUE, REAL_BUGS, control_math
from tests.sessions import session_root

DOC = Path(__file__).resolve().parents[2] / "docs" / "conformance.md"
BEGIN, END = "<!-- power-tables: begin -->", "<!-- power-tables: end -->"
#: Relative difference allowed between a documented slack and the measured one.
SLACK_RTOL = 0.05
#: A defect must fail some case clearly: its largest failing slack at least this (a defect caught only near
#: slack 1 is a near miss: add a case that exposes it).
NEAR_MISS = 2.0
#: The dtypes every reproduced upstream bug must be killed in.
DTYPES = ("fp16", "bf16")


def _measure(out: Path, golden: Path) -> None:
    """``mlaconf power --suite smoke -j 2`` into ``out``, then control_math over the same cases into
    ``out/control.json``; ``out/status`` (the command's exit status) is written last."""
    from mlaconf.judge.deviations import load_deviations
    from mlaconf.judge.policy import load_policies
    from mlaconf.tools import power

    status = mlaconf.main(["power", "--suite", "smoke", "-j", "2", "--out", str(out), "--golden-dir", str(golden)])
    cases = [c for c in load_suites(["smoke"]) if c.expect_error is None]
    control = power.Subject("control_math", "zoo", "the defects' own fp32 path without a bug", control_math)
    run = power.PowerRun("suite smoke", cases, {control.name: power.SubjectResult(control)})
    power.PowerRunner(
        run, golden_dir=str(golden), policy_set=load_policies(), deviations=load_deviations(), jobs=2, progress=False
    ).execute()
    (out / "control.json").write_text(json.dumps(power.report(run, {}), default=str))
    (out / "status").write_text(str(status))


@pytest.fixture(scope="module")
def power_run(tmp_path_factory: pytest.TempPathFactory, shared_golden: Path) -> Iterator[Path]:
    """The folder of the session's one power run of smoke (made here if no process made it yet)."""
    out = session_root(tmp_path_factory) / "power-smoke"
    with FileLock(f"{out}.lock"):
        if not (out / "status").exists():
            out.mkdir(exist_ok=True)
            _measure(out, shared_golden)
    yield out


def _slack(value: Any) -> float:
    return math.inf if value == "inf" else float(value if value is not None else 0.0)


@pytest.fixture(scope="module")
def report(power_run: Path) -> dict[str, Any]:
    result: dict[str, Any] = json.loads((power_run / "power.json").read_text())
    result["status"] = int((power_run / "status").read_text())
    return result


def test_the_command_ends_complete_with_no_survivor_and_no_false_alarm(report: dict[str, Any]) -> None:
    assert report["complete"] and report["error"] is None, report["summary"]
    assert report["status"] == 0 and not report["survivors"], report["summary"]


def test_every_defect_is_killed_clearly(report: dict[str, Any]) -> None:
    rows = {row["name"]: row for row in report["defects"]}
    assert sorted(rows) == sorted(CATALOGUE)
    not_killed = [name for name, row in rows.items() if not row["killed"]]
    assert not not_killed, f"defects smoke does not catch: {not_killed}\n{report['summary']}"
    near = {
        name: row["largest_failing_slack"]
        for name, row in rows.items()
        if _slack(row["largest_failing_slack"]) < NEAR_MISS
    }
    assert not near, f"defects smoke fails only near their bound (largest failing slack < {NEAR_MISS}): {near}"


def test_each_real_bug_is_killed_clearly_in_every_dtype_and_mask_it_reaches(report: dict[str, Any]) -> None:
    """docs/real-bugs.md: smoke kills each reproduced upstream bug at slack >= NEAR_MISS in both dtypes and
    every mask its conditions reach (its largest failing slack over the cases of that dtype and mask)."""
    by_case = {spec.case_id: (spec.dtype, spec.mask_name) for spec in load_suites(["smoke"])}
    rows = {row["name"]: row for row in report["defects"]}
    short = []
    for name, masks in REAL_BUGS.items():
        largest: dict[tuple[str, str], float] = {}
        for verdict in rows[name]["failed"]:
            key = by_case[verdict["case"]]
            largest[key] = max(largest.get(key, 0.0), _slack(verdict["slack"]))
        short += [
            f"{name}: {dtype} {mask} largest failing slack {largest.get((dtype, mask), 0.0):.3g}"
            for dtype in DTYPES
            for mask in masks
            if largest.get((dtype, mask), 0.0) < NEAR_MISS
        ]
    assert REAL_BUGS and not short, "\n".join(short)


def test_the_defects_own_path_without_a_bug_passes_every_case(power_run: Path) -> None:
    control = json.loads((power_run / "control.json").read_text())
    (row,) = control["zoo"]
    assert control["complete"] and row["cases"] == len(control["cases"]) > 0, control["summary"]
    assert not row["false_alarms"], control["summary"]


def test_no_zoo_member_fails_a_case(report: dict[str, Any]) -> None:
    alarms = {row["name"]: row["false_alarms"] for row in report["zoo"] if row["false_alarms"]}
    assert report["zoo"] and not alarms, alarms


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


def test_the_documented_power_tables_are_the_measured_ones(power_run: Path) -> None:
    measured, doc = rows((power_run / "power.md").read_text()), documented()
    assert sorted(measured) == sorted(doc), "docs/conformance.md's power tables list other defects or members"
    for name, cells in measured.items():
        differing = [(d, m) for d, m in zip(doc[name], cells, strict=True) if not same_cell(d, m)]
        assert not differing, f"{name}: documented vs measured {differing}"
