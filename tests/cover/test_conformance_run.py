"""run_case: numbers, interface contract (dtype, layout, untouched inputs), errors and deviations."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from golden.generate import build_golden
from golden.spec import build_case
from golden.types import GoldenCase
from harness.backend import BackendError, MlaPrefillCall
from harness.torch_backend import TorchSdpaBackend
from judge.deviations import load_deviations
from judge.policy import load_policies
from runner.conformance import run_case

POLICIES = load_policies()


@pytest.fixture(scope="module")
def golden() -> GoldenCase:
    return build_golden(build_case({"head_num": 2, "q_seqlen": [9, 4], "dtype": "bf16", "q_layout": "2d",
                                    "mask_type": 2}, source="test"))


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
        return out


def run(golden: GoldenCase, change: str, deviations: Path | None = None) -> tuple[str, str]:
    result = run_case(golden, Wrapped(change), policy_set=POLICIES, policy="default",
                      deviations=load_deviations(deviations))
    assert result.record.verdict == result.outcome and result.record.message == result.message
    return result.outcome, result.message


def test_correct_backend_passes(golden: GoldenCase) -> None:
    outcome, message = run(golden, "none")
    assert outcome == "passed", message


@pytest.mark.parametrize(("change", "fragment"), [
    ("float32", "attenOut dtype is float32, expected bf16"),
    ("3d_output", "attenOut shape is [13, 2, 128], expected [13, 256]"),
    ("scale_q_in_place", "modified its input q"),
])
def test_interface_contract_is_enforced(golden: GoldenCase, change: str, fragment: str) -> None:
    fresh = build_golden(golden.spec)  # the in-place defect corrupts the arrays it is given
    outcome, message = run(fresh, change)
    assert outcome == "failed" and fragment in message and fresh.spec.case_id in message


def test_backend_error_fails_unless_a_deviation_predicts_it(golden: GoldenCase, tmp_path: Path) -> None:
    outcome, message = run(golden, "raise")
    assert outcome == "failed" and "ERROR_INVALID_TENSOR_DIM (8) at setup" in message
    path = tmp_path / "deviations.toml"
    path.write_text('''[[deviation]]
id = "wrapped-rejects"
backend = "wrapped"
outcome = "error"
error_status = "ERROR_INVALID_TENSOR_DIM"
status = "confirmed"
reason = "test"
reference = "test"
[deviation.select]
mask = "mask_free"
''')
    outcome, message = run(golden, "raise", path)
    assert outcome == "xfailed" and "wrapped-rejects" in message
    outcome, message = run(golden, "none", path)
    assert outcome == "xpassed" and message.startswith("UNEXPECTED PASS")
