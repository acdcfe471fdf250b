"""mlaconf.judge.policy: the shipped policies, every rule, overrides and load errors."""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import numpy as np
import pytest

from mlaconf.judge.error_model import ModelResult
from mlaconf.judge.metrics import Element, Metrics, compute_metrics, round_to_dtype
from mlaconf.judge.policy import DEFAULT_PATH, Check, PolicyError, PolicySet, VerdictContext, load_policies

POLICIES = load_policies()
SHIPPED = len(POLICIES.overrides)  # overrides appended by a test come after the shipped ones


def _model(ratio: float) -> ModelResult:
    """The error model's result as if measured at ``ratio``."""
    return ModelResult(
        ratio,
        100,
        int(ratio > 1),
        7.0,
        Element(0, 1, 1, 0, 2, 0.5, 0.5, "model:max_err_over_bound", 1e-4, 1e-4 / ratio if ratio else 1.0),
        {"p_round": 1e-4},
    )


CTX16 = VerdictContext(dtype="fp16", head_num=4, max_seq=64, model=_model(0.2))


def _metrics_of(actual: np.ndarray, expected: np.ndarray, dtype: str) -> Metrics:
    return compute_metrics(actual, expected, np.ones(expected.shape[0], bool), dtype, [expected.shape[0]])


def _golden(seed: int = 0) -> np.ndarray:
    expected = np.random.default_rng(seed).normal(scale=0.5, size=(64, 4, 16))
    expected[10, 2, 3] = 1.0
    return expected


def _judge(name: str, m: Metrics, baseline: Metrics | None, ctx: VerdictContext = CTX16) -> bool:
    return POLICIES.resolve(name, "backend", ctx.dtype, "causal", "case").evaluate(m, baseline, ctx).passed


def _base_metrics(**changes: float) -> Metrics:
    """A clean fp16 result (all errors small), with ``changes`` applied."""
    fields = dict(
        dtype="fp16",
        n_elements=20000,
        n_rows=160,
        max_abs_err=1e-4,
        max_rel_err=2**-11,
        mean_rel_err=2**-13,
        rmse=1e-4,
        eb_rel=0.0,
        mean_signed_err=0.0,
        cosine=1.0,
        max_ulp_err=1.0,
        frac_beyond_thousandth=0.0,
        atb_max_scaled_err=1e-4,
        max_abs_expected=1.0,
        rms_expected=0.5,
        nan_count=0,
        inf_count=0,
        expected_nan_count=0,
        expected_inf_count=0,
        nan_positions_match=True,
        inf_positions_match=True,
    )
    fields.update(changes)
    return Metrics(**fields)  # type: ignore[arg-type]


def test_shipped_file_has_the_documented_policies() -> None:
    assert {"default", "model", "atb", "benchmark", "thousandth", "relative", "strict"} <= set(POLICIES.policies)
    assert POLICIES.policies["default"].rules == ("model", "benchmark", "systematic")
    assert POLICIES.policies["default"].evidence == ("atb", "msprobe")
    default = POLICIES.policies["default"]
    assert default.param("model", "false_alarm", "fp16") == 1e-6 and default.param("model", "safety", "bf16") == 2
    assert default.param("benchmark", "min_elements", "fp16") == 16384
    assert default.param("atb", "eps_small", "fp16") == 2**-8
    assert default.param("atb", "eps_large", "bf16") == 2**-6
    assert default.param("benchmark", "mare", "bf16") == 10
    assert default.param("benchmark", "mere", "fp16") == 2


@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
def test_correctly_rounded_passes_atb_and_4pct_fails_it(dtype: str) -> None:
    expected = _golden()
    ctx = VerdictContext(dtype=dtype, head_num=4, max_seq=64)
    actual = round_to_dtype(expected, dtype)
    baseline = _metrics_of(actual, expected, dtype)
    verdict = POLICIES.resolve("atb", "atb", dtype, "causal", "c").evaluate(baseline, baseline, ctx)
    assert verdict.passed, verdict.summary()
    assert verdict.worst_slack < 1.0
    assert verdict.summary().startswith("PASS under policy 'atb'")

    actual[10, 2, 3] = round_to_dtype(np.array(1.04), dtype)
    bad = _metrics_of(actual, expected, dtype)
    verdict = POLICIES.resolve("atb", "atb", dtype, "causal", "c").evaluate(bad, baseline, ctx)
    assert not verdict.passed
    assert (verdict.failing[0].rule, verdict.failing[0].metric) == ("atb", "atb_max_scaled_err")
    summary = verdict.summary()
    assert "FAIL" in summary and "atb_max_scaled_err" in summary
    assert f"bound {2**-8 if dtype == 'fp16' else 2**-7:.4g}" in summary
    assert "batch 0 row 10 (token 10) head 2 col 3" in summary
    assert verdict.worst_slack > 4.0


@pytest.mark.parametrize("policy", sorted(POLICIES.policies))
@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_nonfinite_fails_every_policy(policy: str, bad: float) -> None:
    expected = _golden()
    actual = round_to_dtype(expected, "fp16")
    baseline = _metrics_of(actual, expected, "fp16")
    actual[5, 1, 1] = bad
    verdict = POLICIES.resolve(policy, "x", "fp16", "causal", "c").evaluate(
        _metrics_of(actual, expected, "fp16"), baseline, CTX16
    )
    assert not verdict.passed
    assert any(c.rule == "finite" for c in verdict.failing)
    assert verdict.worst_slack == math.inf


def test_default_is_decided_by_the_model_and_records_atb_as_evidence() -> None:
    policy = POLICIES.resolve("default", "x", "fp16", "causal", "c")
    over_atb = _base_metrics(atb_max_scaled_err=2**-8 * 1.5)
    verdict = policy.evaluate(over_atb, _base_metrics(), CTX16)
    assert verdict.passed, verdict.summary()
    atb = next(c for c in verdict.checks if c.rule == "atb")
    assert not atb.passed and not atb.decisive and verdict.failing == [] and verdict.evidence_over == [atb]
    assert "Evidence over its bound: atb" in verdict.summary() and "[evidence, not deciding]" in verdict.summary()
    assert verdict.worst_slack < 1.0  # the deciding checks only, not atb's 1.5
    ctx = dataclasses.replace(CTX16, model=_model(1.25))
    failed = policy.evaluate(_base_metrics(), _base_metrics(), ctx)
    assert not failed.passed and [(c.rule, c.metric) for c in failed.failing] == [("model", "max_err_over_bound")]
    assert failed.worst_slack == pytest.approx(1.25)
    assert "batch 0 row 1 (token 1) head 0 col 2" in failed.summary()


def test_model_rule_without_magnitudes_fails_rather_than_pass() -> None:
    ctx = VerdictContext(dtype="fp16", head_num=4, max_seq=64)
    verdict = POLICIES.resolve("model", "x", "fp16", "m", "c").evaluate(_base_metrics(), None, ctx)
    assert not verdict.passed and "no stored magnitudes" in verdict.failing[0].note


def test_benchmark_does_not_decide_on_small_samples() -> None:
    perfect = _base_metrics(max_rel_err=0.0, mean_rel_err=0.0, rmse=0.0, max_abs_err=0.0)
    awful = _base_metrics(max_rel_err=1.0, mean_rel_err=1.0, rmse=1.0)
    policy = POLICIES.resolve("benchmark", "x", "fp16", "m", "c")
    assert not policy.evaluate(awful, perfect, CTX16).passed  # 20000 elements: decides
    small = dataclasses.replace(awful, n_elements=16383)
    verdict = policy.evaluate(small, perfect, CTX16)
    assert verdict.passed and len(verdict.evidence_over) == 3
    assert all("16383 elements < min_elements 16384: not deciding" in c.note for c in verdict.evidence_over)
    nan = dataclasses.replace(small, nan_count=1)
    assert not policy.evaluate(nan, perfect, CTX16).passed  # finite always decides


def test_nonfinite_golden_fails() -> None:
    m = _base_metrics(expected_nan_count=1)
    verdict = POLICIES.resolve("atb", "x", "fp16", "m", "c").evaluate(m, None, CTX16)
    assert [c.metric for c in verdict.failing] == ["golden_nonfinite"]


@pytest.mark.parametrize(("heads", "seq", "eps"), [(1, 2043, 2**-8), (1, 2044, 2**-7), (16, 128, 2**-7)])
def test_atb_eps_depends_on_problem_size(heads: int, seq: int, eps: float) -> None:
    ctx = VerdictContext(dtype="fp16", head_num=heads, max_seq=seq)
    verdict = POLICIES.resolve("atb", "x", "fp16", "m", "c").evaluate(_base_metrics(), None, ctx)
    check = next(c for c in verdict.checks if c.rule == "atb")
    assert check.bound == eps
    m = _base_metrics(atb_max_scaled_err=eps * 1.01)
    assert not POLICIES.resolve("atb", "x", "fp16", "m", "c").evaluate(m, None, ctx).passed


def test_benchmark_ratios_and_floors() -> None:
    perfect = _base_metrics(max_rel_err=0.0, mean_rel_err=0.0, rmse=0.0, max_abs_err=0.0)
    u = 2**-11
    # ratios against the floors: MARE floor u, MERE floor u/2, RMSE floor u * rms(golden)
    ok = _base_metrics(max_rel_err=9.9 * u, mean_rel_err=0.99 * u, rmse=1.99 * u * 0.5)
    assert _judge("benchmark", ok, perfect)
    for field, value in (("max_rel_err", 10.1 * u), ("mean_rel_err", 1.01 * u), ("rmse", 2.01 * u * 0.5)):
        verdict = POLICIES.resolve("benchmark", "x", "fp16", "m", "c").evaluate(
            dataclasses.replace(ok, **{field: value}), perfect, CTX16
        )
        assert not verdict.passed
        assert len(verdict.failing) == 1 and verdict.failing[0].rule == "benchmark"
    # a worse baseline loosens the bound proportionally
    baseline = _base_metrics(mean_rel_err=0.01)
    assert _judge("benchmark", _base_metrics(mean_rel_err=0.0199), baseline)
    assert not _judge("benchmark", _base_metrics(mean_rel_err=0.0201), baseline)


def test_baseline_rules_fail_without_baseline() -> None:
    for policy in ("benchmark", "relative"):
        verdict = POLICIES.resolve(policy, "x", "fp16", "m", "c").evaluate(_base_metrics(), None, CTX16)
        assert not verdict.passed
        assert all("no emulated baseline" in c.note for c in verdict.failing)
    bad_baseline = _base_metrics(mean_rel_err=math.nan)
    assert not _judge("benchmark", _base_metrics(), bad_baseline)


def test_thousandth_ulp_relative_rules() -> None:
    assert _judge("thousandth", _base_metrics(frac_beyond_thousandth=0.001), None)
    assert not _judge("thousandth", _base_metrics(frac_beyond_thousandth=0.0011), None)
    bf16 = VerdictContext(dtype="bf16", head_num=4, max_seq=64)
    assert _judge("thousandth", _base_metrics(frac_beyond_thousandth=0.004), None, bf16)
    assert not _judge("thousandth", _base_metrics(frac_beyond_thousandth=0.0041), None, bf16)

    strict = POLICIES.resolve("strict", "x", "fp16", "m", "c")
    ulp = strict.param("ulp", "max_ulp", "fp16")
    base = _base_metrics()
    checks = {c.metric: c for c in strict.evaluate(_base_metrics(max_ulp_err=ulp + 1), base, CTX16).checks}
    assert not checks["max_ulp_err"].passed and checks["frac_beyond_thousandth"].passed

    # relative: max_abs_err <= 2 * baseline + 2 * u * max|g|
    bound = 2 * 1e-3 + 2 * 2**-11 * 1.0
    baseline = _base_metrics(max_abs_err=1e-3)
    assert _judge("relative", _base_metrics(max_abs_err=bound * 0.999), baseline)
    assert not _judge("relative", _base_metrics(max_abs_err=bound * 1.001), baseline)


def test_check_slack() -> None:
    assert Check("r", "m", 0.5, 2.0, True).slack == 0.25
    assert Check("r", "m", 0.0, 0.0, True).slack == 0.0
    assert Check("r", "m", 1.0, 0.0, False).slack == math.inf
    assert Check("r", "m", math.nan, 1.0, False).slack == math.inf


def test_checks_are_json() -> None:
    policy = POLICIES.resolve("default", "x", "fp16", "m", "c")
    verdict = policy.evaluate(_base_metrics(), _base_metrics(), CTX16)
    assert verdict.passed and verdict.policy == "default"
    checks = json.loads(json.dumps([c.to_dict() for c in verdict.checks]))
    assert {c["rule"] for c in checks} == {"finite", "model", "atb", "benchmark"}
    assert {c["rule"] for c in checks if not c["decisive"]} == {"atb"}
    measured = [c for c in checks if c["value"] and math.isfinite(c["value"])]
    assert all(c["slack"] == pytest.approx(c["value"] / c["bound"]) for c in measured)


# -- overrides and load errors ------------------------------------------------------------------

OVERRIDE = """
[[override]]
backend = "torch-*"
dtype = "bf16"
rules = { benchmark = { mere = 3 }, thousandth = { max_fraction = { bf16 = 0.01 } } }
reason = "torch CPU bf16 rounds P differently"

[[override]]
case = "*-s4097-*"
rules = { atb = { eps_large = 0.5 } }
reason = "tail block"
"""


def _with(tmp_path: Path, extra: str, base: str | None = None) -> Path:
    path = tmp_path / "tolerances.toml"
    path.write_text((DEFAULT_PATH.read_text() if base is None else base) + extra)
    return path


def test_override_applies_and_records_reason(tmp_path: Path) -> None:
    policies = load_policies(_with(tmp_path, OVERRIDE))
    policy = policies.resolve("default", "torch-cpu", "bf16", "causal", "bf16-causal-s128-abc")
    assert policy.param("benchmark", "mere", "bf16") == 3
    assert policy.param("thousandth", "max_fraction", "bf16") == 0.01
    assert policy.param("thousandth", "max_fraction", "fp16") == 0.001  # table merged, not replaced
    assert [(o.index, o.reason) for o in policy.overrides] == [(SHIPPED, "torch CPU bf16 rounds P differently")]
    ctx = VerdictContext(dtype="bf16", head_num=4, max_seq=64, model=_model(0.1))
    m = _base_metrics(dtype="bf16", mean_rel_err=2.5 * 2**-9)  # ratio 2.5 vs the MERE floor u/2
    verdict = policy.evaluate(m, _base_metrics(dtype="bf16", mean_rel_err=0.0), ctx)
    assert verdict.passed
    assert "torch CPU bf16 rounds P differently" in verdict.summary()
    assert verdict.overrides[0].to_dict()["reason"] == "torch CPU bf16 rounds P differently"
    untouched = policies.resolve("default", "atb", "bf16", "causal", "bf16-causal-s128-abc")
    assert untouched.overrides == () and untouched.param("benchmark", "mere", "bf16") == 2
    assert not untouched.evaluate(m, _base_metrics(dtype="bf16", mean_rel_err=0.0), ctx).passed
    assert policies.resolve("default", "torch-cpu", "fp16", "causal", "x").overrides == ()
    both = policies.resolve("atb", "torch-cpu", "bf16", "causal", "bf16-causal-s4097-h1")
    assert [o.index for o in both.overrides] == [SHIPPED, SHIPPED + 1]
    assert both.param("atb", "eps_large", "bf16") == 0.5


def test_unknown_policy_is_named() -> None:
    with pytest.raises(PolicyError, match="no policy named 'nope'"):
        POLICIES.resolve("nope", "x", "fp16", "m", "c")


@pytest.mark.parametrize(
    ("extra", "where", "field"),
    [
        ('[[override]]\nbackend = "x"\nrules = { atb = { eps_small = 0.1 } }\n', "override #0", "reason"),
        ('[[override]]\nreason = "r"\nrules = { atb = { eps = 1 } }\n', "override #0", "rules.atb.eps"),
        ('[[override]]\nreason = "r"\nrules = { bogus = { x = 1 } }\n', "override #0", "rules.bogus"),
        ('[[override]]\nreason = "r"\nrules = { atb = { eps_small = -1 } }\n', "override #0", "rules.atb.eps_small"),
        ('[[override]]\nreason = "r"\nbackends = "x"\nrules = {}\n', "override #0", "backends"),
        ('[policy.mine]\nrules = ["atb", "nonesuch"]\n', "policy 'mine'", "rules"),
        ('[policy.mine]\nrules = ["atb"]\nlimit = 3\n', "policy 'mine'", "limit"),
        ("[extra]\n", "<file>", "extra"),
        ("this is = = not toml\n", "<file>", "<toml>"),
    ],
)
def test_load_errors_name_file_and_field(tmp_path: Path, extra: str, where: str, field: str) -> None:
    path = _with(tmp_path, extra)
    with pytest.raises(PolicyError) as info:
        load_policies(path)
    where = where.replace("override #0", f"override #{SHIPPED}")
    assert str(path) in str(info.value) and where in str(info.value)
    assert info.value.field_name == field


def test_rule_tables_need_every_parameter_and_both_dtypes(tmp_path: Path) -> None:
    text = DEFAULT_PATH.read_text()
    path = _with(tmp_path, "", text.replace("mere_floor_u = 0.5\n", ""))
    with pytest.raises(PolicyError, match=r"\[rules\]: field 'rules.benchmark.mere_floor_u': is required"):
        load_policies(path)
    path = _with(tmp_path, "", text.replace("max_ulp = { fp16 = 4, bf16 = 2 }", "max_ulp = { fp16 = 4 }"))
    with pytest.raises(PolicyError, match=r"rules\.ulp\.max_ulp"):
        load_policies(path)


def test_policy_set_is_plain_data() -> None:
    assert isinstance(POLICIES, PolicySet) and POLICIES.source == str(DEFAULT_PATH)


def test_no_shipped_overrides_v_outliers_judged_like_any_case() -> None:
    assert POLICIES.overrides == ()
    case = "bf16-mask_free-krope_ctkv-b2-s256-h4-q3d-packed"
    outliers = POLICIES.resolve("default", "atb", "bf16", "mask_free", f"{case}-v_outliers-1234abcd")
    plain = POLICIES.resolve("default", "atb", "bf16", "mask_free", f"{case}-1234abcd")
    assert outliers.overrides == () and outliers.params == plain.params
