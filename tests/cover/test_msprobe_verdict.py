"""judge.msprobe and the ``msprobe`` rule: msprobe's benchmark standard beside our verdict, its NaN blind
spot, the ``msprobe`` policy (its rules plus ours that NaN/Inf never passes), and, with mindstudio-probe
installed, agreement with msprobe's own comparator."""

from __future__ import annotations

import dataclasses
import importlib.util
from types import SimpleNamespace

import numpy as np
import pytest

from mlaconf.golden.building.generate import build_golden
from mlaconf.golden.specs.spec_build import build_case
from mlaconf.golden.specs.types import GoldenCase
from mlaconf.judge.metrics import round_to_dtype
from mlaconf.judge.msprobe import benchmark_metrics, ratio
from mlaconf.judge.policy import load_policies
from mlaconf.judge.verdict import judge_output

POLICIES = load_policies()
SPEC = build_case(
    dict(q_seqlen=[96, 64], head_num=2, kv_layout="packed", seed=5, dtype="bf16", mask_type=2), source="test"
)


@pytest.fixture(scope="module")
def golden() -> GoldenCase:
    return build_golden(SPEC)


def _msprobe_checks(golden: GoldenCase, out: np.ndarray, policy: str = "default") -> dict[str, bool]:
    _, verdict = judge_output(golden, out, POLICIES, policy, "b")
    return {c.metric: c.passed for c in verdict.checks if c.rule == "msprobe" and c.metric != "eb_ratio"}


def test_metrics_by_hand() -> None:
    """Five elements: one small value in error, one in bounds, a NaN dropped, two normal ones."""
    golden = np.array([[1e-4, 2e-4, 1.0, 2.0, 4.0]])
    out = np.array([[3e-4, 2e-4, np.nan, 2.5, 4.0]])
    m = benchmark_metrics(out, golden, np.ones(1, bool), small_value=2**-10, small_value_atol=1e-16, bench_eps=0.0)
    assert m.small_value_err_ratio == 0.5  # of the two small values, one beyond atol
    assert m.max_rel_err == 0.25 and m.mean_rel_err == pytest.approx(0.125)  # 0.5/2 and 0/4
    excluded = 3  # two small values, one NaN: error 0, the mean rescaled by n / (n - excluded + 1e-4) + 1e-4
    assert m.rmse == pytest.approx(np.sqrt(0.25 / 5 * (5 / (5 - excluded + 1e-4) + 1e-4)))
    assert m.eb == pytest.approx(abs(2 - 0) / 5)  # two above, none below; NaN compares neither way
    assert ratio(0.3, 1e-4, 2**-8) == pytest.approx(0.3 / 2**-8) and ratio(0.3, 0.5, 2**-8) == pytest.approx(0.6)
    assert np.isnan(ratio(np.inf, 1.0, 1e-3)) and ratio(np.nan, np.nan, 1e-3) == 0.0


def test_every_record_carries_it_without_deciding(golden: GoldenCase) -> None:
    for policy in ("default", "model", "atb", "benchmark", "thousandth", "relative", "strict"):
        _, verdict = judge_output(golden, golden.baseline_out, POLICIES, policy, "b")
        found = [c for c in verdict.checks if c.rule == "msprobe"]
        assert [c.metric for c in found] == [
            "small_value_err_ratio_ratio",
            "rmse_ratio",
            "max_rel_err_ratio",
            "mean_rel_err_ratio",
            "eb_ratio",
        ], policy
        assert all(not c.decisive for c in found) and all(c.passed for c in found), policy
        assert verdict.passed or policy in ("thousandth", "strict"), policy  # both fail correct bf16 kernels


def test_correct_outputs_pass_and_a_scale_error_fails(golden: GoldenCase) -> None:
    correct = round_to_dtype(golden.out, "bf16")
    for out in (golden.baseline_out, correct):
        _, verdict = judge_output(golden, out, POLICIES, "msprobe", "b")
        assert verdict.passed, verdict.summary()
        deciding = [c.metric for c in verdict.checks if c.decisive and c.rule == "msprobe"]
        assert deciding == ["small_value_err_ratio_ratio", "rmse_ratio", "max_rel_err_ratio", "mean_rel_err_ratio"]
    scaled = round_to_dtype(golden.out * 1.05, "bf16")
    _, wrong = judge_output(golden, scaled, POLICIES, "msprobe", "b")
    assert not wrong.passed and {"rmse_ratio", "mean_rel_err_ratio"} <= {c.metric for c in wrong.failing}


def test_an_all_nan_output_passes_msprobe_alone_but_no_policy(golden: GoldenCase) -> None:
    """msprobe's metrics drop non-finite elements: every msprobe check passes an all-NaN output (evidence,
    its blind spot); our finite rule fails it under every policy, ``msprobe`` included."""
    nan = np.full_like(golden.baseline_out, np.nan)
    for policy in ("msprobe", "default"):
        checks = _msprobe_checks(golden, nan, policy)
        assert checks and all(checks.values()), checks
        _, verdict = judge_output(golden, nan, POLICIES, policy, "b")
        assert not verdict.passed and "finite" in {c.rule for c in verdict.failing}
        assert policy != "msprobe" or {c.rule for c in verdict.failing} == {"finite"}


def test_a_deciding_msprobe_rule_without_an_output_fails(golden: GoldenCase) -> None:
    """Metrics alone give the rule nothing to score: deciding, that fails (never a vacuous pass)."""
    from mlaconf.judge.policy import VerdictContext
    from mlaconf.judge.verdict import judge_resolved

    metrics, _ = judge_resolved(golden, golden.baseline_out, POLICIES.resolve("msprobe", "b", "bf16", "m", "c"))
    policy = POLICIES.resolve("msprobe", "b", "bf16", "m", "c")
    verdict = policy.evaluate(metrics, None, VerdictContext(golden.spec.dtype, golden.spec.head_num, golden.spec.max_q))
    assert not verdict.passed and verdict.failing[0].rule == "msprobe"


#: How far each of our metrics (float64 golden as the bench) may be from msprobe's own (its bench: the float32
#: output a CPU or GPU computes for an fp16/bf16 API), relative (the share of small values: absolute).
#: Measured on fp16 and bf16, seeds 5-7, correct, scaled and noisy outputs: rmse 2.2e-6, mean_rel_err 1.5e-6,
#: max_rel_err 1.2e-4 (a float32 bench moves an element's |g| in its 24th bit, and the largest ratio with it).
AGREEMENT = {"rmse": 1e-5, "mean_rel_err": 1e-5, "max_rel_err": 5e-4, "small_value_err_ratio": 2e-3}


@pytest.mark.skipif(importlib.util.find_spec("msprobe") is None, reason="mindstudio-probe is not installed")
@pytest.mark.parametrize("dtype", ["bf16", "fp16"])
def test_agrees_with_msprobes_own_comparator(dtype: str) -> None:
    """msprobe's BenchmarkCompare scores the output and the baseline against its float32 bench,
    BenchmarkPrecisionCompare decides at npu_fusion_attention's level (L1); our metrics (float64 bench) agree
    within :data:`AGREEMENT` per metric and our decision equals its decision on correct, wrong and NaN outputs."""
    import torch
    from msprobe.pytorch.api_accuracy_checker.compare.compare_utils import ApiPrecisionCompareColumn as Col
    from msprobe.pytorch.api_accuracy_checker.precision_standard.benchmark_compare import (
        BenchmarkCompare,
        BenchmarkPrecisionCompare,
    )

    golden = build_golden(dataclasses.replace(SPEC, dtype=dtype))
    valid = golden.row_valid
    bench = golden.out.reshape(valid.size, -1)[valid].astype(np.float32)  # msprobe's bench for an fp16/bf16 API
    torch_dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}[dtype]

    def theirs(out: np.ndarray) -> dict[str, float]:
        column: dict[str, float] = {}
        device = out.reshape(valid.size, -1)[valid].astype(np.float32)
        BenchmarkCompare(
            SimpleNamespace(bench_output=bench, device_output=device, compare_column=column, dtype=torch_dtype)
        ).compare()
        return column

    names = {  # ours: (BenchmarkCompare's key, the CSV column BenchmarkPrecisionCompare reads)
        "small_value_err_ratio": ("small_value_err_ratio", Col.SMALL_VALUE_ERROR_RATE),
        "rmse": ("rmse", Col.RMSE),
        "max_rel_err": ("max_rel_error", Col.MAX_REL_ERR),
        "mean_rel_err": ("mean_rel_error", Col.MEAN_REL_ERR),
        "eb": ("eb", Col.EB),
    }
    base = theirs(golden.baseline_out)
    outputs = {
        "baseline": golden.baseline_out,
        "correct": round_to_dtype(golden.out, dtype),
        "scaled": round_to_dtype(golden.out * 1.02, dtype),
        "noisy": round_to_dtype(golden.out + np.random.default_rng(0).normal(0, 0.02, golden.out.shape), dtype),
        "nan": np.full_like(golden.baseline_out, np.nan),
    }
    policy = POLICIES.resolve("msprobe", "b", dtype, "m", "c")  # the scoring the judge uses: msprobe's constants
    scoring = {n: policy.param("msprobe", n, dtype) for n in ("small_value", "small_value_atol", "bench_eps")}
    for label, out in outputs.items():
        mine = benchmark_metrics(out, golden.out, valid, **scoring)
        got = theirs(out)
        for ours, tolerance in AGREEMENT.items():  # eb apart: msprobe rounds the bench to the output dtype for it
            rel = 0.0 if ours == "small_value_err_ratio" else tolerance
            absolute = tolerance if ours == "small_value_err_ratio" else 1e-12
            assert getattr(mine, ours) == pytest.approx(got[names[ours][0]], rel=rel, abs=absolute), (label, ours)
        rows = [{column: str(v[key]) for key, column in names.values()} for v in (got, base)]
        status = BenchmarkPrecisionCompare(
            SimpleNamespace(
                row_npu=rows[0],
                row_gpu=rows[1],
                dtype=f"torch.{'bfloat16' if dtype == 'bf16' else 'float16'}",
                compare_column={},
                api_name="npu_fusion_attention",
            )
        ).compare()
        _, verdict = judge_output(golden, out, POLICIES, "msprobe", "b")
        ours_pass = all(c.passed for c in verdict.checks if c.rule == "msprobe" and c.metric != "eb_ratio")
        assert (status == "pass") == ours_pass, (label, status)


def test_a_temperature_error_passes_msprobe_but_not_ours(golden: GoldenCase) -> None:
    """The systematic class: qkScale 0.7 % off, correctly rounded otherwise.  msprobe's ratios of average
    errors stay within bounds; the default policy's systematic-error tests fail it."""
    import dataclasses

    from mlaconf.golden.building.reference import reference_attention

    spec = dataclasses.replace(golden.spec, qk_scale=golden.spec.qk_scale * 1.007)
    out, _ = reference_attention(golden.inputs, spec)
    warm = round_to_dtype(out, "bf16")
    assert all(_msprobe_checks(golden, warm).values())
    _, ours = judge_output(golden, warm, POLICIES, "default", "b")
    assert not ours.passed and {c.rule for c in ours.failing} == {"systematic"}, ours.summary()


def test_the_metrics_do_not_depend_on_the_blas_thread_count() -> None:
    """The sums are numpy's, not BLAS's: a BLAS dot splits its sum by its thread count, so `-n 0` (two BLAS
    threads) and `-n 2` (one each) once recorded msprobe RMSEs a last bit apart."""
    threadpoolctl = pytest.importorskip("threadpoolctl")
    rng = np.random.default_rng(7)
    golden = rng.standard_normal((200, 4, 128))  # one chunk of 102,400 elements: judged inline, on this thread
    out = (golden + rng.standard_normal(golden.shape) * 1e-3).astype(np.float32)
    valid = np.ones(200, bool)
    runs = []
    for threads in (1, 2):
        with threadpoolctl.threadpool_limits(limits=threads, user_api="blas"):
            m = benchmark_metrics(out, golden, valid, small_value=2**-10, small_value_atol=1e-16, bench_eps=2**-8)
        runs.append(m)
    assert runs[0] == runs[1]
