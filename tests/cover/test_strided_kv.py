"""The kv addressing is one fact (facts/operator.py kv_row_starts, ATB's GetKvFactor rule for the 3-D forms)
and the documented 3-D form with ragged lengths, ``[B * max kv, Hkv, 128]`` (kv_layout ``strided``), runs end
to end: spec, inputs, golden, torch-cpu, the contract model, the factor levels and a planted defect that
reads it at packed offsets; so does a packed k with spare rows (``kv_capacity``)."""

from __future__ import annotations

import re
from typing import Any

import numpy as np
import pytest
import torch

from mlaconf.facts.operator import atb_kv_starts, kv_layout_of, kv_row_starts, padded_kv_misread
from mlaconf.golden.building.generate import build_golden
from mlaconf.golden.building.inputs import generate_inputs
from mlaconf.golden.coverage.levels import case_levels
from mlaconf.golden.specs.layout import kv_shape, kv_views
from mlaconf.golden.specs.spec import SpecError
from mlaconf.golden.specs.spec_build import build_case
from mlaconf.golden.specs.suites import load_suites
from mlaconf.harness import defects
from mlaconf.harness.backend import BackendError, MlaPrefillCall
from mlaconf.harness.contract import validate
from mlaconf.harness.torch_backend import TorchSdpaBackend
from mlaconf.judge.policy import load_policies
from mlaconf.judge.verdict import judge_output
from mlaconf.runner.execution import execute, make_call
from mlaconf.tools import power

POLICIES = load_policies()


def spec(**fields: Any) -> Any:
    return build_case({"q_seqlen": [4, 8], "head_num": 1, "kv_layout": "strided", **fields}, source="test")


@pytest.mark.parametrize(
    ("shape", "kv", "layout", "starts", "kernel"),
    [
        ((2, 8, 128), (8, 5), "padded", [0, 8], [0, 8]),  # every batch before the last full: read right
        ((2, 8, 128), (5, 8), "padded", [0, 8], [0, 5]),  # a shorter batch first: ATB misreads the second
        ((2, 10, 128), (8, 8), "padded", [0, 10], [0, 8]),  # S > max kv
        ((16, 1, 128), (4, 8), "strided", [0, 8], [0, 8]),  # the 3-D form with ragged lengths
        ((12, 1, 128), (4, 8), "packed", [0, 4], [0, 4]),
        ((13, 1, 128), (4, 8), "packed", [0, 4], [0, 4]),  # spare rows after the last batch
        ((11, 1, 128), (4, 8), None, None, None),  # too short for the rows it would read
        ((2, 4, 128), (4, 8), None, None, None),  # S below max kv
    ],
)
def test_kv_rows_by_layout_and_atbs_rule(
    shape: tuple[int, ...], kv: tuple[int, ...], layout: Any, starts: Any, kernel: Any
) -> None:
    assert kv_layout_of(shape, kv, 1) == layout
    assert kv_row_starts(shape, kv, 1) == starts
    if kernel is not None:
        assert atb_kv_starts(kv, shape[0]) == kernel
    if layout == "padded":
        assert padded_kv_misread((1, 1), kv, shape[1]) == (starts != kernel)


def _call(k_rows: int, mask_type: int = 0) -> MlaPrefillCall:
    """The issue's call: B = 2, kv = [4, 8], one head, k ``[k_rows, 1, 128]``."""
    gen = torch.Generator().manual_seed(3)
    lengths = torch.tensor([4, 8], dtype=torch.int32)

    def rand(*shape: int) -> torch.Tensor:
        return torch.rand(*shape, generator=gen).half()

    return MlaPrefillCall(
        rand(12, 1, 128), rand(12, 1, 64), rand(k_rows, 1, 128), rand(k_rows, 1, 64), rand(k_rows, 1, 128),
        lengths, lengths.clone(), None, 1, 0.07, 1, mask_type, 1,
    )  # fmt: skip


def _attention(call: MlaPrefillCall, q_rows: slice, kv_rows: slice) -> torch.Tensor:
    q = torch.cat([call.q[q_rows], call.q_rope[q_rows]], -1)[:, 0].float()
    k = torch.cat([call.k[kv_rows], call.k_rope[kv_rows]], -1)[:, 0].float()
    return torch.softmax(q @ k.T * call.qk_scale, -1) @ call.v[kv_rows, 0].float()


def test_the_documented_3d_ragged_call_runs_on_torch_cpu_at_stride_max_kv() -> None:
    """B = 2, kv = [4, 8], k [16, 1, 128], maskType 0 passes the contract, and torch-cpu reads batch 1 at
    row 8 (before: kv_layout_of gave None and torch-cpu raised "shape '[4, 1, 128]' is invalid")."""
    call = _call(16)
    validate(call)
    out = TorchSdpaBackend("cpu").run(call).float()[:, 0]
    assert torch.allclose(out[:4], _attention(call, slice(0, 4), slice(0, 4)), atol=2e-3)
    assert torch.allclose(out[4:], _attention(call, slice(4, 12), slice(8, 16)), atol=2e-3)
    assert not torch.allclose(out[4:], _attention(call, slice(4, 12), slice(4, 12)), atol=2e-3)


def test_the_contract_takes_every_kv_layout_that_covers_its_rows_and_refuses_a_short_one() -> None:
    validate(_call(13))  # packed with a spare row
    with pytest.raises(BackendError, match=re.escape("kv_dims: k (11, 1, 128)")) as raised:
        validate(_call(11))
    assert (raised.value.status_name, raised.value.stage) == ("ERROR_INVALID_TENSOR_DIM", "setup")
    with pytest.raises(BackendError, match="no kv layout"):
        TorchSdpaBackend("cpu").run(_call(11))  # a backend refuses it in one line, not with a reshape error
    with pytest.raises(BackendError, match=r"ERROR_INVALID_TENSOR_DIM.*kv_dims"):
        validate(_call(16, mask_type=3))  # CAUSAL takes the padded form only


def test_a_strided_spec_puts_batch_b_at_b_times_max_kv_with_garbage_between() -> None:
    case = spec(q_seqlen=[3, 0, 7], dtype="bf16")
    assert "-strided-" in case.case_id and kv_shape(case) == (21, 1, 128) and case.kv_rows == 21
    inputs = generate_inputs(case)
    assert inputs.k.shape == (21, 1, 128) and inputs.v.shape == (21, 1, 128) and inputs.k_rope.shape == (21, 1, 64)
    k = inputs.k.astype(np.float64)
    assert np.array_equal(kv_views(inputs, case, 2)[0], inputs.k[14:21]) and kv_views(inputs, case, 0)[0].shape[0] == 3
    gap = k[3:14]  # batch 0's unused rows and the empty batch: garbage the kernel must not read (|x| in [2, 4))
    assert np.all((np.abs(gap) >= 2) & np.isfinite(gap)) and np.all(np.abs(k[:3]) <= 1)


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"q_seqlen": [8, 8]}, "needs ragged kv_seqlen"),
        ({"q_seqlen": [5]}, "needs ragged kv_seqlen"),
        ({"kv_capacity": 9}, "the strided layout has no capacity"),
        ({"kv_layout": "packed", "kv_capacity": 11}, "the sum of kv_seqlen .12."),
        ({"kv_layout": "packed", "kv_capacity": 16}, "is read as the strided layout"),
        ({"mask_type": "causal"}, "accepts only the padded kv layout"),
    ],
)
def test_a_strided_spec_the_operator_cannot_mean_is_one_clear_error(fields: dict[str, Any], message: str) -> None:
    with pytest.raises(SpecError, match=f"case .*: field '(kv_layout|kv_capacity)': .*{message}"):
        spec(**fields)


def test_kv_layout_levels_name_how_atb_addresses_a_case() -> None:
    def padded(**fields: Any) -> frozenset[str]:
        return case_levels(spec(kv_layout="padded", **fields))["kv_layout"]

    assert case_levels(spec())["kv_layout"] == {"strided"}
    assert case_levels(spec(kv_layout="packed"))["kv_layout"] == {"packed"}
    assert case_levels(spec(kv_layout="packed", kv_capacity=14))["kv_layout"] == {"packed", "packed_spare"}
    assert padded(q_seqlen=[8, 4]) == {"padded", "padded_full"}
    assert padded() == {"padded", "padded_short_before_last"}
    assert padded(q_seqlen=[8, 8], kv_capacity=9) == {"padded", "padded_short_before_last", "padded_over_capacity"}
    assert padded(q_seqlen=[8], kv_capacity=9) == {"padded", "padded_full", "padded_over_capacity"}


def test_a_packed_spec_with_spare_rows_leaves_garbage_after_the_last_batch() -> None:
    case = spec(kv_layout="packed", kv_capacity=14, dtype="bf16")
    assert kv_shape(case) == (14, 1, 128) and "-packed-cap14-" in case.case_id
    k = generate_inputs(case).k.astype(np.float64)
    assert k.shape == (14, 1, 128) and np.all(np.abs(k[12:]) >= 2) and np.all(np.abs(k[:12]) <= 1)


STRIDED = [spec(), spec(q_seqlen=[129, 0, 40], mask_type="mask_free", dtype="bf16", head_num=2)]
SPARE = spec(kv_layout="packed", kv_capacity=20, q_seqlen=[9, 3])


@pytest.mark.parametrize("case", STRIDED, ids=[c.case_id for c in STRIDED])
def test_torch_cpu_passes_a_strided_golden_and_the_packed_misread_fails_it(case: Any) -> None:
    golden = build_golden(case)
    verdicts = {}
    for name in ("torch-cpu", "strided_as_packed", "padded_as_packed"):
        backend = TorchSdpaBackend("cpu") if name == "torch-cpu" else defects.ENTRIES[name].make()
        out = execute(backend, make_call(golden.inputs, case), case).out
        verdicts[name] = judge_output(golden, out, POLICIES, "default", name)[1].passed
    assert verdicts == {"torch-cpu": True, "strided_as_packed": False, "padded_as_packed": True}


def test_torch_cpu_passes_a_packed_golden_with_spare_rows() -> None:
    golden = build_golden(SPARE)
    assert golden.inputs.k.shape == (20, 1, 128)
    out = execute(TorchSdpaBackend("cpu"), make_call(golden.inputs, SPARE), SPARE).out
    assert judge_output(golden, out, POLICIES, "default", "torch-cpu")[1].passed


def test_smoke_power_judges_the_strided_misread_now_its_level_is_settled() -> None:
    """Its trigger (kv_layout strided) is a settled level that smoke's covering set holds, so the defect is in the
    catalogue smoke's power is judged on (docs/conformance.md's power table), no longer run by name only."""
    entry = defects.ENTRIES["strided_as_packed"]
    assert not entry.pending and "strided_as_packed" in defects.CATALOGUE and not defects.PENDING
    assert "strided_as_packed" in [s.name for s in power.subjects(None, with_zoo=False)]
    assert any(spec.kv_layout == "strided" for spec in load_suites(["smoke"]))
