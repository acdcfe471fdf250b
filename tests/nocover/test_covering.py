"""The generated covering sections of smoke and standard (golden/coverage/covering.py), and the valid tuples counted
ahead (golden/coverage/valid_tuples.json), were made from today's inputs
(the digest each records: the hand-written part, the model, the generator's sources; running the generator again
takes minutes on the grown model: ``python -m mlaconf.golden.coverage.covering --check``), and they reach what they
promise: every valid pair and each kernel's tiling pairs, and standard every kernel-structure triple."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from mlaconf.golden.coverage import covering, valid_table
from mlaconf.golden.coverage.levels import KERNEL_PAIRS
from mlaconf.golden.specs.suites import suite_path

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("suite", sorted(covering.TARGETS))
def test_checked_in_covering_section_was_made_from_todays_inputs(suite: str) -> None:
    head, section = covering.split_suite(suite_path(suite).read_text(encoding="utf-8"))
    assert section.startswith(covering.MARKER)
    assert covering.recorded_digest(section) == covering.inputs_digest(head), (
        f"rewrite with python -m mlaconf.golden.coverage.covering {suite}"
    )


def test_the_valid_tuples_table_was_made_from_todays_sources() -> None:
    """golden/coverage/valid_tuples.json records the digest of the model and the search's sources it was made from
    (tests/cover/test_valid_table.py: its pairs are the search's; a stale or damaged table is not used)."""
    assert valid_table.recorded_sources() == valid_table.sources_digest(), (
        "rewrite with python -m mlaconf.golden.coverage.covering"
    )
    valid_table.shipped_sets.cache_clear()
    assert valid_table.shipped_sets(), "the table's checksum does not hold"


def test_a_changed_input_is_seen(tmp_path: Path) -> None:
    """Another hand-written part, or another model file, gives another digest; a section without one is stale."""
    head, section = covering.split_suite(suite_path("smoke").read_text(encoding="utf-8"))
    model = tmp_path / "factors.toml"
    model.write_bytes(covering.DEFAULT_PATH.read_bytes() + b"\n")
    today = covering.inputs_digest(head)
    assert covering.inputs_digest(head + "\n") != today and covering.inputs_digest(head, model) != today
    assert covering.recorded_digest(section.replace(covering.DIGEST_LINE, "# ")) is None


def test_smoke_is_pairwise_each_kernel_meets_every_tiling_pair_and_standard_holds_the_structure_triples() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "mlaconf", "coverage", "smoke", "standard", "--t", "3", "--json", "--show", "0"],
        capture_output=True, text=True, check=True, cwd=ROOT,
    )  # fmt: skip
    found = {entry["selection"]: {c["label"]: c for c in entry["coverage"]} for entry in json.loads(done.stdout)}
    for suite in ("smoke", "standard"):
        for label in ("2-way", KERNEL_PAIRS):
            assert found[suite][label]["percent"] == 100.0, (suite, label, found[suite][label]["uncovered"][:5])
    assert found["standard"]["3-way structure"]["uncovered_count"] == 0
