"""mlaconf.harness.contract and runner.perturb: the contract model, the error suite and how it is judged."""

from __future__ import annotations

import dataclasses
import functools
import math

import pytest
import torch

from mlaconf.facts.status import STATUS_CODES
from mlaconf.golden.building.inputs import generate_inputs
from mlaconf.golden.specs.spec import CaseSpec, SpecError
from mlaconf.golden.specs.spec_build import build_case, spec_from_json
from mlaconf.golden.specs.suites import load_suites
from mlaconf.harness.backend import Availability, BackendError, BackendInfo, MlaPrefillCall
from mlaconf.harness.contract import (
    CHECK_NAMES,
    DOCUMENTED,
    ContractBackend,
    Installation,
    strict_torch_cpu,
    validate,
)
from mlaconf.judge.deviations import Deviation, DeviationSet, load_deviations
from mlaconf.runner.execution import make_call
from mlaconf.runner.perturb import PERTURBATIONS, error_call, judge_error_case, nearest_valid


@functools.cache
def error_cases() -> tuple[CaseSpec, ...]:
    return tuple(load_suites(["errors"]))


@functools.cache
def valid_cases() -> tuple[CaseSpec, ...]:
    return tuple(load_suites(["smoke", "edge"]))


class Zeros:
    """A backend stand-in that accepts anything: the contract model alone decides."""

    name = "zeros"
    error_contract = False
    deterministic = True

    def available(self) -> Availability:
        return Availability(True)

    def info(self) -> BackendInfo:
        return BackendInfo(self.name, "cpu")

    def synchronize(self) -> None:
        pass

    def run(self, call: MlaPrefillCall) -> torch.Tensor:
        return torch.zeros(call.q.shape, dtype=call.q_rope.dtype)


class CausalSlots(Zeros):
    """ATB through its C interface as its source reads: CAUSAL fails Setup's slot count."""

    def run(self, call: MlaPrefillCall) -> torch.Tensor:
        if call.mask_type == 3:
            raise BackendError("ERROR_INVALID_IN_TENSOR_NUM", "setup", "8 slots where CAUSAL prefill has 7")
        return super().run(call)


def model(
    name: str = "model", skip: frozenset[str] = frozenset(), installation: Installation = DOCUMENTED
) -> ContractBackend:
    return ContractBackend(Zeros(), name, skip, installation)


def no_deviations() -> DeviationSet:
    return DeviationSet("<none>", [])


def deviation(**fields: object) -> DeviationSet:
    base: dict[str, object] = dict(
        id="d",
        backend="model",
        versions="",
        outcome="fail",
        error_status=None,
        stage=None,
        status="unconfirmed",
        reason="r",
        reference="ref",
        select={"case": "*-err-nan_qk_scale-*"},
    )
    base.update(fields)
    return DeviationSet("<test>", [Deviation(**base)])  # type: ignore[arg-type]


def case_named(name: str) -> CaseSpec:
    return next(c for c in error_cases() if c.name == name)


# -- the error suite -----------------------------------------------------------------------------


def test_error_suite_is_well_formed() -> None:
    cases = error_cases()
    assert len(cases) >= 30
    assert len({c.name for c in cases}) == len(cases)
    for case in cases:
        assert case.suite == "errors"
        assert case.expect_error in STATUS_CODES, case.name
        assert case.expect_stage in ("create", "setup"), case.name
        assert case.perturb is None or case.perturb in PERTURBATIONS, case.name
    used = {c.perturb for c in cases} - {None}
    assert used == set(PERTURBATIONS), f"perturbations no case uses: {set(PERTURBATIONS) - used}"
    # every expectation was read from ATB's source at one pinned commit
    assert {c.source_commit for c in cases} == {"ddcc8b6225b8b7d4703c69c319244bdea0f0c9a1"}


def test_source_commit_is_provenance_not_content() -> None:
    case = case_named("null-q")
    assert dataclasses.replace(case, source_commit="").case_id == case.case_id
    assert spec_from_json(case.to_json()).source_commit == case.source_commit
    with pytest.raises(SpecError, match=r"source_commit.*40-hex-digit"):
        build_case({"q_seqlen": [4], "head_num": 1, "source_commit": "ddcc8b622"}, source="<test>")


@pytest.mark.parametrize(
    ("family", "names"),
    [
        ("attenOut", ("out-other-dtype", "out-fp32", "out-rank-differs", "out-rows-short")),
        (
            "format",
            (
                "q-format-nz",
                "q-rope-format-nhwc",
                "k-format-nhwc",
                "k-rope-format-nhwc",
                "v-format-nchw",
                "mask-format-nz",
                "q-seqlen-format-nhwc",
                "kv-seqlen-format-nchw",
                "out-format-nz",
            ),
        ),
        ("seqlen dtype/rank", ("q-seqlen-int64", "kv-seqlen-fp32", "kv-seqlen-rank2", "q-seqlen-scalar")),
        ("null argument", ("null-q", "null-k-rope", "null-kv-seqlen", "null-out")),
    ],
)
def test_each_interface_failure_family_has_cases(family: str, names: tuple[str, ...]) -> None:
    """Each family's cases build calls that only the new MlaPrefillCall fields (or odd seqlens) express."""
    for name in names:
        call = error_call(case_named(name))
        extras = call.out_shape is not None or call.out_dtype is not None or bool(call.formats) or bool(call.null_args)
        odd_seqlens = any(t.dtype != torch.int32 or t.dim() != 1 for t in (call.q_seqlen, call.kv_seqlen))
        assert extras or odd_seqlens, f"{family}: {name} is a call the old fields already expressed"


@pytest.mark.parametrize("case", error_cases(), ids=lambda c: c.name)
def test_model_rejects_each_error_case_as_documented(case: CaseSpec) -> None:
    with pytest.raises(BackendError) as info:
        validate(error_call(case))
    assert (info.value.status_name, info.value.stage) == (case.expect_error, case.expect_stage), str(info.value)


#: Releases the model is checked at: the first with the C interface, around the mask fix, later ones.
RELEASES = ("8.2.RC1", "8.2.RC1.1", "8.3.RC1.alpha001", "8.3.RC1", "8.5.0", "9.0.0")


@pytest.mark.parametrize("release", RELEASES)
def test_model_at_each_release_rejects_each_error_case_as_that_release_does(release: str) -> None:
    """The model of a release and the cases' expect_by_release agree, and only where releases differ
    does the release matter (the rank-3 MASK_FREE mask)."""
    differs = []
    for case in error_cases():
        with pytest.raises(BackendError) as info:
            validate(error_call(case), installation=Installation(release=release))
        expected = case.expected_rejection(release)
        assert (info.value.status_name, info.value.stage) == expected, f"{case.name} at {release}: {info.value}"
        if expected != (case.expect_error, case.expect_stage):
            differs.append(case.name)
    before_fix = release.startswith("8.2") or release == "8.3.RC1.alpha001"
    assert differs == (["mask-free-mask-rank3"] if before_fix else [])


def test_error_cases_are_judged_by_the_backend_release() -> None:
    rank3 = case_named("mask-free-mask-rank3")
    old = model(installation=Installation(release="8.2.RC1"))
    new = model(installation=Installation(release="8.3.RC1"))
    assert old.info().version == "8.2.RC1"
    verdict = judge_error_case(rank3, old, no_deviations())
    assert (verdict.outcome, verdict.got, verdict.expected) == (
        "passed",
        ("ERROR_INVALID_TENSOR_DIM_NUM", "setup"),
        ("ERROR_INVALID_TENSOR_DIM_NUM", "setup"),
    )
    assert "(release 8.2.RC1)" in verdict.message
    assert judge_error_case(rank3, new, no_deviations()).outcome == "passed"
    # a release's model judged against another release's expectation fails: the split is needed
    pretends_new = ContractBackend(Zeros(), "model", installation=Installation(release="8.2.RC1"))
    pretends_new.info = lambda: BackendInfo("model", "cpu", {}, "8.5.0")  # type: ignore[method-assign]
    assert judge_error_case(rank3, pretends_new, no_deviations()).outcome == "failed"


@pytest.mark.parametrize(
    ("release", "accepts_old"),
    [("8.3.RC1", True), ("8.3.RC1.1", True), (None, True), ("8.5.0", False), ("8.2.RC1", True)],
)
def test_an_unconfirmed_boundary_or_an_unknown_release_accepts_each_rejection_and_records_which(
    release: str | None, accepts_old: bool
) -> None:
    """The rank-3 mask at 8.3.RC1 (a package may predate the cherry-picked fix) or at an unknown release:
    both ERROR_RT_FAIL and ERROR_INVALID_TENSOR_DIM_NUM meet the contract, the verdict keeps the one seen."""
    rank3 = case_named("mask-free-mask-rank3")
    assert rank3.unconfirmed_at == ("8.3.RC1",)
    old = ContractBackend(Zeros(), "model", installation=Installation(release="8.2.RC1"))  # answers DIM_NUM
    unknown = release is None  # an ATB that cannot name its release, not the documented model
    old.info = lambda: BackendInfo("model", "cpu", {}, release, release_unknown=unknown)  # type: ignore[method-assign]
    verdict = judge_error_case(rank3, old, no_deviations())
    assert verdict.outcome == ("passed" if accepts_old else "failed"), verdict.message
    if accepts_old:
        assert verdict.expected == ("ERROR_INVALID_TENSOR_DIM_NUM", "setup")  # which one the device gave
    if release is None:
        assert "ATB release unknown" in verdict.message and "MLA_ATB_VERSION" in verdict.message
    elif release.startswith("8.3.RC1"):
        assert f"release {release} is an unconfirmed boundary" in verdict.message
    new = ContractBackend(Zeros(), "model", installation=Installation(release="8.5.0"))  # answers RT_FAIL
    new.info = lambda: BackendInfo("model", "cpu", {}, release, release_unknown=unknown)  # type: ignore[method-assign]
    assert judge_error_case(rank3, new, no_deviations()).outcome == ("failed" if release == "8.2.RC1" else "passed")


def test_the_documented_model_has_no_unknown_release() -> None:
    """A backend with no release to name (the contract model, a CPU backend) is judged by the documented
    answer alone: a release-bound case accepts no older release's rejection, and nothing says the ATB
    release is unknown."""
    rank3 = case_named("mask-free-mask-rank3")
    documented = judge_error_case(rank3, model(), no_deviations())
    assert documented.outcome == "passed" and "release unknown" not in documented.message
    older = ContractBackend(Zeros(), "model", installation=Installation(release="8.2.RC1"))
    older.info = lambda: BackendInfo("model", "cpu", {}, None)  # type: ignore[method-assign]
    verdict = judge_error_case(rank3, older, no_deviations())
    assert verdict.outcome == "failed" and verdict.got == ("ERROR_INVALID_TENSOR_DIM_NUM", "setup")


def test_unconfirmed_at_is_validated() -> None:
    base = {"q_seqlen": [4], "head_num": 1, "expect_error": "ERROR_INVALID_PARAM"}
    with pytest.raises(SpecError, match=r"unconfirmed_at.*only allowed with expect_by_release"):
        build_case({**base, "unconfirmed_at": ["8.3.RC1"]}, source="<test>")
    by_release = [{"versions": "<9", "expect_error": "ERROR_RT_FAIL"}]
    with pytest.raises(SpecError, match=r"unconfirmed_at.*must be a list of releases"):
        build_case({**base, "expect_by_release": by_release, "unconfirmed_at": "8.3.RC1"}, source="<test>")


def test_expect_by_release_is_validated_and_round_trips() -> None:
    rank3 = case_named("mask-free-mask-rank3")
    assert spec_from_json(rank3.to_json()) == rank3
    assert spec_from_json(rank3.to_json()).unconfirmed_at == ("8.3.RC1",)
    assert rank3.expected_rejection("not-a-version") == (rank3.expect_error, rank3.expect_stage)
    base = {"q_seqlen": [4], "head_num": 1, "expect_error": "ERROR_INVALID_PARAM"}
    bad = {
        r"expect_by_release\[0\]\.versions": [{"versions": "later", "expect_error": "ERROR_RT_FAIL"}],
        r"expect_by_release\[0\]\.expect_error": [{"versions": "<9", "expect_error": "oops"}],
        r"expect_by_release\[0\]\.expect_stage": [
            {"versions": "<9", "expect_error": "ERROR_RT_FAIL", "expect_stage": "x"}
        ],
        r"expect_by_release\[0\]": [{"versions": "<9", "status": "ERROR_RT_FAIL"}],
    }
    for field_name, value in bad.items():
        with pytest.raises(SpecError, match=field_name):
            build_case({**base, "expect_by_release": value}, source="<test>")
    with pytest.raises(SpecError, match="only allowed with expect_error"):
        build_case({"q_seqlen": [4], "head_num": 1, "expect_by_release": [{"versions": "<9"}]}, source="<test>")


def test_valid_case_hashes_do_not_see_the_new_field() -> None:
    case = valid_cases()[0]
    assert "expect_by_release" not in case.content()


@pytest.mark.parametrize("soc", ["Ascend310P3", "Ascend910A", "Ascend910B", "Ascend910ProB", "Ascend950PR"])
def test_the_soc_gate_rejects_every_call_on_an_unsupported_chip(soc: str) -> None:
    """CreateOperation refuses MLA outside Atlas A2/A3 before it looks at any parameter."""
    on_chip = model(installation=Installation(soc=soc))
    assert on_chip.info().versions["soc"] == soc
    for case in valid_cases()[:5]:
        with pytest.raises(BackendError, match=f"soc: SoC '{soc}'") as info:
            on_chip.run(make_call(generate_inputs(case), case))
        assert (info.value.status_name, info.value.stage) == ("ERROR_INVALID_PARAM", "create")
    # first of all checks: even a call that breaks a later rule gets the chip's rejection
    with pytest.raises(BackendError, match="soc:"):
        on_chip.run(error_call(case_named("null-q")))
    # and a model that forgets the gate accepts them: the check can fail
    model(skip=frozenset({"soc"}), installation=Installation(soc=soc)).run(
        make_call(generate_inputs(valid_cases()[0]), valid_cases()[0])
    )


@pytest.mark.parametrize("soc", ["Ascend910B1", "Ascend910B4", "Ascend910_9382", "Ascend910_9391"])
def test_the_soc_gate_admits_atlas_a2_and_a3(soc: str) -> None:
    case = valid_cases()[0]
    model(installation=Installation(soc=soc)).run(make_call(generate_inputs(case), case))


@pytest.mark.parametrize("case", valid_cases(), ids=lambda c: c.case_id)
def test_model_accepts_every_valid_case(case: CaseSpec) -> None:
    validate(make_call(generate_inputs(case), case))


@pytest.mark.parametrize("check", [name for name in CHECK_NAMES if name != "soc"])
def test_every_check_is_needed_by_some_error_case(check: str) -> None:
    """A validator that forgets any one check fails at least one case: the suite can fail.  (The chip
    is no argument of a call, so the "soc" gate has its own tests below.)"""
    forgetful = model(skip=frozenset({check}))
    missed = []
    for case in error_cases():
        try:
            outcome = judge_error_case(case, forgetful, no_deviations()).outcome
        except Exception:  # a later check tripping over what the skipped one should have caught
            outcome = "failed"
        if outcome == "failed":
            missed.append(case.name)
    assert missed, f"no error case needs the {check!r} check"


# -- inputs of error cases -----------------------------------------------------------------------


def test_nearest_valid_keeps_shapes_and_clears_error_fields() -> None:
    spec = nearest_valid(case_named("head-num-129"))
    assert (spec.head_num, spec.kv_head_num, spec.expect_error, spec.perturb) == (128, 128, None, None)
    scale = nearest_valid(case_named("qk-scale-1.5"))
    assert 0 < scale.qk_scale <= 1 and scale.q_seqlen == case_named("qk-scale-1.5").q_seqlen
    assert nearest_valid(case_named("mask-type-spec")).mask_type == 0


def test_error_call_carries_the_case_scalars_and_perturbation() -> None:
    call = error_call(case_named("head-num-129"))
    assert (call.head_num, call.q.shape[1]) == (129, 128)
    assert math.isnan(error_call(case_named("qk-scale-nan")).qk_scale)
    assert error_call(case_named("mask-free-without-mask")).mask is None
    assert error_call(case_named("mask-free-mask-256")).mask.shape == (256, 256)  # type: ignore[union-attr]
    with pytest.raises(ValueError, match="unknown perturb"):
        error_call(dataclasses.replace(case_named("qk-scale-nan"), perturb="no-such"))


# -- judging -------------------------------------------------------------------------------------


def test_wrong_status_wrong_stage_and_acceptance_all_fail() -> None:
    nan_case = case_named("qk-scale-nan")
    accepted = judge_error_case(nan_case, model(skip=frozenset({"qk_scale"})), no_deviations())
    assert accepted.outcome == "failed" and accepted.got is None
    assert "the call was accepted" in accepted.message and "qk-scale-nan" in accepted.message
    wrong_stage = dataclasses.replace(nan_case, expect_stage="setup")
    assert judge_error_case(wrong_stage, model(), no_deviations()).outcome == "failed"
    wrong_status = dataclasses.replace(nan_case, expect_error="ERROR_INVALID_TENSOR_DIM")
    verdict = judge_error_case(wrong_status, model(), no_deviations())
    assert verdict.outcome == "failed" and verdict.got == ("ERROR_INVALID_PARAM", "create")


def test_known_deviation_turns_acceptance_into_xfail_and_rejection_into_xpass() -> None:
    nan_case = case_named("qk-scale-nan")
    predicted = deviation()
    assert judge_error_case(nan_case, model(skip=frozenset({"qk_scale"})), predicted).outcome == "xfailed"
    assert judge_error_case(nan_case, model(), predicted).outcome == "xpassed"
    other_error = deviation(outcome="error", error_status="ERROR_INVALID_TENSOR_DIM")
    assert judge_error_case(nan_case, model(), other_error).outcome == "xpassed"
    assert judge_error_case(nan_case, model(skip=frozenset({"qk_scale"})), other_error).outcome == "failed"


def test_deviation_predicting_the_documented_rejection_is_not_a_deviation() -> None:
    agrees = deviation(outcome="error", error_status="ERROR_INVALID_PARAM")
    assert judge_error_case(case_named("qk-scale-nan"), model(), agrees).outcome == "passed"


def test_shipped_atb_deviation_covers_the_nan_case() -> None:
    found = load_deviations().match("atb", "8.2.RC1", case_named("qk-scale-nan"))
    assert found is not None and found.id == "atb-nan-qk-scale-accepted"


@pytest.mark.parametrize("name", ["causal-kv-shorter-than-q", "causal-kv-zero"])
def test_causal_kv_below_q_is_asked_and_each_atb_answer_is_explained(name: str) -> None:
    """The loader refuses kv_b < q_b under CAUSAL, so the perturbation builds it; the documented model
    rejects it, a model that forgets the rule fails, and an ATB that hides it behind the C interface's
    in-tensor-count rejection, or accepts it as its source does, is each explained by its own entry."""
    case = case_named(name)
    call = error_call(case)
    assert call.mask_type == 3 and int(call.kv_seqlen[-1]) < int(call.q_seqlen[-1])
    assert int(call.kv_seqlen[-1]) == (0 if name == "causal-kv-zero" else int(call.q_seqlen[-1]) - 1)
    assert judge_error_case(case, model(), no_deviations()).outcome == "passed"
    forgets = judge_error_case(case, model(skip=frozenset({"seqlen_values"})), no_deviations())
    assert forgets.outcome == "failed" and forgets.got is None
    shipped = load_deviations()
    at_release = Installation(release="8.3.RC1")
    forgetful = frozenset({"seqlen_values"})
    hidden = judge_error_case(case, ContractBackend(CausalSlots(), "atb", forgetful, at_release), shipped)
    assert (hidden.outcome, hidden.deviation) == ("xfailed", "atb-c-causal-in-tensor-num")
    computed = judge_error_case(case, ContractBackend(Zeros(), "atb", forgetful, at_release), shipped)
    assert (computed.outcome, computed.deviation) == ("xfailed", "atb-causal-kv-below-q-accepted")
    documented = judge_error_case(case, ContractBackend(Zeros(), "atb", installation=at_release), shipped)
    assert documented.outcome == "xpassed"


# -- the backend ---------------------------------------------------------------------------------


def test_model_accepts_the_nulls_and_extras_the_interface_allows() -> None:
    """A null mask is fine except for MASK_FREE; a mask given with UNDEFINED is not attached."""
    undefined = next(c for c in valid_cases() if c.mask_type == 0)
    call = make_call(generate_inputs(undefined), undefined)
    validate(dataclasses.replace(call, mask=None))
    validate(dataclasses.replace(call, null_args=frozenset({"mask"})))
    validate(dataclasses.replace(call, mask=torch.zeros(3, dtype=torch.float64), formats={"mask": 29}))
    validate(dataclasses.replace(call, formats={"q": 2, "out": 2}, out_shape=tuple(call.q.shape)))


def test_rank3_mask_passes_the_operation_check_and_fails_in_the_kernel() -> None:
    """docs/operator.md §2: InTensorDimCheckPrefill lets a rank-3 mask through; the kernel's InferShape
    rejects it, which ATB's OpsRunner::PlanKernel reports as ERROR_RT_FAIL inside Setup."""
    with pytest.raises(BackendError, match="kernel_mask") as info:
        validate(error_call(case_named("mask-free-mask-rank3")))
    assert (info.value.status_name, info.value.stage) == ("ERROR_RT_FAIL", "setup")
    with pytest.raises(BackendError, match="ranks"):  # rank 4 is refused by the operation itself
        validate(
            dataclasses.replace(
                error_call(case_named("mask-free-mask-rank3")), mask=torch.zeros(1, 1, 512, 512, dtype=torch.float16)
            )
        )


def test_model_follows_documentation_where_atb_deviates() -> None:
    causal = next(c for c in valid_cases() if c.mask_type == 3)
    validate(make_call(generate_inputs(causal), causal))  # CAUSAL without a mask is documented as fine
    with pytest.raises(BackendError, match="qkScale nan"):
        validate(dataclasses.replace(make_call(generate_inputs(causal), causal), qk_scale=math.nan))


def test_unknown_check_names_are_refused() -> None:
    with pytest.raises(ValueError, match="unknown contract checks"):
        model(skip=frozenset({"no_such_check"}))


def test_strict_backend_computes_like_torch_cpu() -> None:
    from mlaconf.harness.torch_backend import torch_cpu

    strict = strict_torch_cpu()
    assert (strict.name, strict.error_contract, strict.deterministic) == ("torch-cpu-strict", True, True)
    case = valid_cases()[0]
    call = make_call(generate_inputs(case), case)
    assert torch.equal(strict.run(call), torch_cpu().run(call))
