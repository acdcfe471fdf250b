"""docs/real-bugs.md: every reproduced upstream bug has its defect on the page and smoke cases that meet
its conditions; the one-row-tile defect is wrong exactly where the bug was (the kill itself, in every dtype
and mask, is read from smoke's power run in tests/nocover/test_power_smoke.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from mlaconf.golden.building.inputs import generate_inputs
from mlaconf.golden.specs.spec import CaseSpec
from mlaconf.golden.specs.spec_build import build_case
from mlaconf.golden.specs.suites import load_suites
from mlaconf.harness.defects import REAL_BUGS, SLICE_KEYS, TILE_ROWS, control_math, one_row_tile_p_reuse
from mlaconf.runner.execution import make_call

ROOT = Path(__file__).resolve().parents[2]


def test_every_reproduced_bug_is_on_the_page() -> None:
    page = (ROOT / "docs" / "real-bugs.md").read_text()
    for name in REAL_BUGS:
        assert f"`{name}`" in page, f"docs/real-bugs.md does not name the defect {name}"


def _one_row_tile(spec: CaseSpec) -> bool:
    """A batch whose last 128-row query tile has one row, and that row reads more than 256 keys."""
    pairs = zip(spec.q_seqlen, spec.kv_seqlen, strict=True)
    return any(q % TILE_ROWS == 1 and kv > SLICE_KEYS for q, kv in pairs)  # the last row reads all kv keys


@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
@pytest.mark.parametrize("mask", REAL_BUGS["one_row_tile_p_reuse"])
def test_smoke_meets_the_one_row_tile_conditions(dtype: str, mask: str) -> None:
    smoke = [s for s in load_suites(["smoke"]) if s.dtype == dtype and s.mask_name == mask]
    assert any(_one_row_tile(s) for s in smoke), f"no smoke case for {dtype} {mask} has a one-row last tile"


def _rows_differing(q_seqlen: list[int]) -> list[int]:
    spec = build_case(dict(dtype="fp16", mask_type="undefined", q_seqlen=q_seqlen, head_num=1, seed=1), source="t")
    inputs = generate_inputs(spec)
    wrong = one_row_tile_p_reuse().run(make_call(inputs, spec)).reshape(spec.total_q, -1)
    right = control_math().run(make_call(inputs, spec)).reshape(spec.total_q, -1)
    return torch.nonzero((wrong != right).any(dim=1)).flatten().tolist()


def test_the_defect_changes_only_the_one_row_tile() -> None:
    assert _rows_differing([257, 256]) == [256]  # batch 0's row 256: its 257th key slice reads P[0:1]
    assert _rows_differing([256, 129]) == []  # 129 rows read at most 129 keys
