"""The branches suite's power, measured once: ``mlaconf power --suite branches`` with every defect of
``harness/branch_defects.py`` (in the catalogue: smoke holds their levels too), ``padding_nan_unsafe``
(killed there without its NaN probe) and every zoo member of ``harness/zoo.py``, in process, goldens from the
session's shared store (about 30 s on 2 cores at ``-j 2``):

- every defect is killed on at least two cases, and clearly (largest failing slack at least 2);
- no zoo member fails a case; the members on ATB's fp16 score path meet only the two cases the known deviation
  ``zoo-fp16-score-path-raw-overflow`` names, as it predicts, and stay below slack 1 on the rest.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

import mlaconf
from mlaconf.harness.branch_defects import BRANCH_ENTRIES
from mlaconf.harness.defects import CATALOGUE

DEFECTS = [entry.name for entry in BRANCH_ENTRIES] + ["padding_nan_unsafe"]


@pytest.fixture(scope="module")
def report(tmp_path_factory: pytest.TempPathFactory, shared_golden: Path) -> dict[str, Any]:
    out = tmp_path_factory.mktemp("power-branches")
    argv = ["power", "--suite", "branches", "--defects", *DEFECTS, "--zoo", "--no-suggest", "-j", "2"]
    status = mlaconf.main([*argv, "--out", str(out), "--golden-dir", str(shared_golden)])
    document: dict[str, Any] = json.loads((out / "power.json").read_text())
    assert status == 0, document["summary"]
    return document


def test_every_branch_defect_is_catalogued_and_killed_on_two_cases_or_more(report: dict[str, Any]) -> None:
    assert {entry.name for entry in BRANCH_ENTRIES} <= set(CATALOGUE)
    rows = {row["name"]: row for row in report["defects"]}
    assert set(rows) == set(DEFECTS) and report["complete"]
    for name, row in rows.items():
        largest = row["largest_failing_slack"]  # power.json writes an infinite slack as "inf"
        assert row["failed_cases"] >= 2 and (largest == "inf" or largest >= 2.0), (name, row["failed_cases"])


def test_no_zoo_member_fails_a_branches_case(report: dict[str, Any]) -> None:
    for row in report["zoo"]:
        assert row["false_alarms"] == [], row["name"]
        on_fp16_path = row["name"] in ("atb_fp16", "atb_fp16_512", "ftz_fp16")
        assert len(row["known_deviations"]) == (2 if on_fp16_path else 0), row["name"]
        assert all("large_raw_scores" in case for case in row["known_deviations"])
        assert row["largest_slack"] < 1.0
