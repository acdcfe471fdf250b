"""run_case: numbers, interface contract (dtype, layout, untouched inputs), errors and deviations."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from mlaconf.golden.building.generate import build_golden
from mlaconf.golden.specs.spec_build import build_case
from mlaconf.golden.specs.types import GoldenCase
from mlaconf.harness.backend import BackendError, MlaPrefillCall
from mlaconf.harness.torch_backend import TorchSdpaBackend
from mlaconf.judge.deviations import load_deviations
from mlaconf.judge.policy import Check, load_policies
from mlaconf.judge.verdict import MAP_ROWS, error_map
from mlaconf.runner.conformance import run_case
from mlaconf.runner.identity import conformance_identity

POLICIES = load_policies()


@pytest.fixture(scope="module")
def golden() -> GoldenCase:
    return build_golden(
        build_case(
            {"head_num": 2, "q_seqlen": [9, 4], "dtype": "bf16", "q_layout": "2d", "mask_type": 2}, source="test"
        )
    )


class Wrapped(TorchSdpaBackend):
    """torch-cpu with one change to what it hands back or touches."""

    def __init__(self, change: str) -> None:
        super().__init__("cpu")
        self.name, self.change = "wrapped", change

    def run(self, call: MlaPrefillCall) -> torch.Tensor:
        if self.change == "raise":
            raise BackendError("ERROR_INVALID_TENSOR_DIM", "setup", "rejected")
        if self.change == "scale_q_in_place":
            call.q.mul_(2)
        out = super().run(call)
        if self.change == "float32":
            return out.float()
        if self.change == "3d_output":
            return out.reshape(out.shape[0], -1, 128)
        if self.change == "corrupt_row_10_head_1":
            out = out.clone()
            out[10, 128:] += 1.0
        return out


def run_record(golden: GoldenCase, change: str, deviations: Path | None = None) -> dict[str, Any]:
    result = run_case(
        golden, Wrapped(change), policy_set=POLICIES, policy="default", deviations=load_deviations(deviations)
    )
    record = result.ending.record(conformance_identity(golden.spec, "wrapped", "default"))
    assert record.verdict == result.outcome and record.message == result.message
    return record.to_dict()


def run(golden: GoldenCase, change: str, deviations: Path | None = None) -> tuple[str, str]:
    record = run_record(golden, change, deviations)
    return record["verdict"], record["message"]


def test_a_failing_record_carries_its_error_map(golden: GoldenCase) -> None:
    assert run_record(golden, "none")["error_map"] is None  # passing records stay small
    record = run_record(golden, "corrupt_row_10_head_1")
    assert record["verdict"] == "failed"
    emap = record["error_map"]
    assert emap["row_stride"] == 1 and emap["q_seqlen"] == [9, 4] and emap["bound"] > 0
    values = np.array(emap["values"])
    assert values.shape == (13, 2) and values[10, 1] > 1  # only the corrupted (token, head) fails
    # in units of the deciding check: its worst cell is that check's slack, whichever rule it is
    deciding = max((c for c in record["checks"] if c["decisive"]), key=lambda c: c["slack"])
    assert emap["rule"] == f"{deciding['rule']}:{deciding['metric']}" == "model:max_err_over_bound"
    assert values[10, 1] == pytest.approx(record["worst_slack"], rel=2e-3)
    values[10, 1] = 0
    assert values.max() <= 1


def test_error_map_takes_the_deciding_checks_scale_not_the_evidence_rule(golden: GoldenCase) -> None:
    """The map of a case that fails the error model far beyond the atb evidence bound is painted by
    the model's slack: before, it was scaled by the non-deciding atb bound and read as a pass."""
    record = run_record(golden, "corrupt_row_10_head_1")
    atb = next(c for c in record["checks"] if c["rule"] == "atb")
    model = next(c for c in record["checks"] if c["rule"] == "model")
    assert not atb["decisive"] and model["decisive"] and model["slack"] > 1
    peak = max(v for row in record["error_map"]["values"] for v in row if v is not None)
    assert peak == pytest.approx(model["slack"], rel=2e-3) and peak != pytest.approx(atb["slack"], rel=2e-3)


def test_error_map_is_pooled_to_a_bounded_grid() -> None:
    big = build_golden(
        build_case({"head_num": 1, "q_seqlen": [300, 60], "dtype": "fp16", "mask_type": 2}, source="test")
    )
    out = big.out.astype(np.float16)
    out.reshape(360, -1)[299] = np.nan  # the last row of batch 1
    emap = error_map(big, out, None)
    assert emap["row_stride"] == 2 and len(emap["values"]) == 180 <= MAP_ROWS
    assert emap["values"][149] == [float("inf")]  # rows 298-299 hold the NaN
    assert max(v[0] for v in emap["values"] if v[0] != float("inf")) <= 1.0


def test_correct_backend_passes(golden: GoldenCase) -> None:
    outcome, message = run(golden, "none")
    assert outcome == "passed", message


@pytest.mark.parametrize(
    ("change", "fragment"),
    [
        ("float32", "attenOut dtype is float32, expected bf16"),
        ("3d_output", "attenOut shape is [13, 2, 128], expected [13, 256]"),
        ("scale_q_in_place", "modified its input q"),
    ],
)
def test_interface_contract_is_enforced(golden: GoldenCase, change: str, fragment: str) -> None:
    fresh = build_golden(golden.spec)  # the in-place defect corrupts the arrays it is given
    outcome, message = run(fresh, change)
    assert outcome == "failed" and fragment in message and fresh.spec.case_id in message


def test_backend_error_fails_unless_a_deviation_predicts_it(golden: GoldenCase, tmp_path: Path) -> None:
    outcome, message = run(golden, "raise")
    assert outcome == "failed" and "ERROR_INVALID_TENSOR_DIM (8) at setup" in message
    path = tmp_path / "deviations.toml"
    path.write_text("""[[deviation]]
id = "wrapped-rejects"
backend = "wrapped"
outcome = "error"
error_status = "ERROR_INVALID_TENSOR_DIM"
status = "confirmed"
reason = "test"
reference = "test"
[deviation.select]
mask = "mask_free"
""")
    outcome, message = run(golden, "raise", path)
    assert outcome == "xfailed" and "wrapped-rejects" in message
    outcome, message = run(golden, "none", path)
    assert outcome == "xpassed" and message.startswith("UNEXPECTED PASS")


def test_overhead_tool_times_every_stage_of_run_case(tmp_path: Path) -> None:
    """``python -m mlaconf.tools.overhead``: per-stage times of the framework around backend.run."""
    from mlaconf.golden.store.directory import GoldenStore
    from mlaconf.tools.overhead import STAGES, format_rows, measure

    specs = [build_case({"head_num": 2, "q_seqlen": [n], "dtype": "fp16"}, source="test") for n in (5, 33)]
    rows = measure(specs, "torch-cpu", 2, GoldenStore(tmp_path, builder=build_golden))
    assert [row["case"] for row in rows] == [s.case_id for s in specs]
    for row in rows:
        assert all(row[f"wall:{stage}"] >= 0.0 for stage in STAGES)
        assert row["wall:load"] > 0.0 and row["wall:metrics+verdict"] > 0.0 and row["wall:backend"] > 0.0
        assert 0.0 < row["wall:overhead"] < row["wall:total"]
    table = format_rows(rows)
    assert table.startswith("2 cases;") and "overhead" in table and "backend" in table


@pytest.mark.parametrize(
    ("check", "scaled"),
    [
        (Check("atb", "atb_max_scaled_err", 0.02, 0.004, False), False),
        (Check("benchmark", "mare_ratio", 30.0, 10.0, False), True),
    ],
)
def test_error_map_of_other_deciding_rules(golden: GoldenCase, check: Check, scaled: bool) -> None:
    """atb: the scaled error over e; a rule without a per-element bound: scaled to its slack."""
    out = golden.out.astype(np.float32)
    out.reshape(golden.spec.total_q, -1)[10, 200] += 0.5  # token 10, head 1
    out = out.astype(golden.out.dtype)
    emap = error_map(golden, out, check)
    assert emap["rule"] == f"{check.rule}:{check.metric}" and emap["scaled"] is scaled
    peak = max(v for row in emap["values"] for v in row if v is not None)
    assert emap["values"][10][1] == peak
    if scaled:
        assert peak == pytest.approx(check.slack, rel=2e-3)
    else:
        worst = float(np.max(np.abs(out.astype(np.float64) - golden.out) / np.maximum(np.abs(golden.out), 1.0)))
        assert peak == pytest.approx(worst / check.bound, rel=2e-3)


def test_a_framework_failure_names_the_function_it_came_from() -> None:
    """A failure's ``where``: the innermost function of ours on the stack, by its installed name."""
    from mlaconf.golden.specs.spec import SpecError
    from mlaconf.golden.specs.spec_build import build_case
    from mlaconf.runner.failures import _where

    with pytest.raises(SpecError) as excinfo:
        build_case({"q_seqlen": [4], "head_num": 0}, source="test")
    assert _where(excinfo).startswith("mlaconf.golden.specs.spec_build."), _where(excinfo)


@pytest.mark.parametrize(("backend", "disagreeing"), [("torch-cpu", 0), ("nondeterministic", 3)])
def test_mla_repeat_compares_every_rerun_bitwise(golden: GoldenCase, backend: str, disagreeing: int) -> None:
    """``--mla-repeat 4``: three reruns after the first call; a backend whose output moves by one ulp per
    call fails however small the change, and the record counts the disagreeing runs."""
    from mlaconf.harness.defects import nondeterministic

    chosen = TorchSdpaBackend("cpu") if backend == "torch-cpu" else nondeterministic()
    result = run_case(golden, chosen, policy_set=POLICIES, policy="default", deviations=load_deviations(None), reruns=4)
    record = result.ending.record(conformance_identity(golden.spec, chosen.name, "default")).to_dict()
    assert record["timing"]["reruns"] == 3 and record["timing"]["disagreeing_runs"] == disagreeing
    assert result.outcome == ("failed" if disagreeing else "passed"), result.message
    if disagreeing:
        assert "3 of 3 reruns differ bitwise" in result.message
