"""The generated covering sections of smoke and standard (golden/coverage/covering.py) are what the generator writes
today, and they reach what they promise: every valid pair, and standard every kernel-structure triple.
Slow (the generator runs for tens of seconds on 2 cores)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from mlaconf.golden.coverage import covering
from mlaconf.golden.specs.suites import suite_path

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("suite", sorted(covering.TARGETS))
def test_checked_in_covering_section_is_what_the_generator_writes(suite: str) -> None:
    _, section = covering.split_suite(suite_path(suite).read_text(encoding="utf-8"))
    assert section == covering.generated_section(suite), (
        f"rewrite with python -m mlaconf.golden.coverage.covering {suite}"
    )


def test_smoke_is_pairwise_and_standard_holds_the_structure_triples() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "mlaconf", "coverage", "smoke", "standard", "--t", "3", "--json", "--show", "0"],
        capture_output=True, text=True, check=True, cwd=ROOT,
    )  # fmt: skip
    found = {entry["selection"]: {c["label"]: c for c in entry["coverage"]} for entry in json.loads(done.stdout)}
    for suite in ("smoke", "standard"):
        assert found[suite]["2-way"]["percent"] == 100.0, found[suite]["2-way"]["uncovered"][:5]
    assert found["standard"]["3-way structure"]["uncovered_count"] == 0
