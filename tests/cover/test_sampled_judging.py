"""Judging against a sampled golden: the sampled rows by every rule, every row by the whole-output checks.

Correct kernels (the zoo) pass sampled cases with no false alarm; kernels that write rows at a wrapped offset
or leave rows of a query tile unwritten fail through the sample and the whole-output checks; the whole-output
checks alone catch unwritten rows the sample missed and values outside their visible V range; a record says
which rows were judged and why."""

from __future__ import annotations

import functools

import numpy as np
import pytest

from mlaconf.facts.mistakes import tile_rows_skipped
from mlaconf.golden.building.blocks import with_inputs
from mlaconf.golden.building.generate import build_golden
from mlaconf.golden.specs.layout import row_valid
from mlaconf.golden.specs.spec import CaseSpec
from mlaconf.golden.specs.spec_build import build_case
from mlaconf.golden.specs.types import GoldenCase
from mlaconf.harness import defects, zoo
from mlaconf.harness.backend import Backend
from mlaconf.harness.defects import SKIPPED_FIRST, SKIPPED_ROWS, TILE_ROWS
from mlaconf.judge.deviations import load_deviations
from mlaconf.judge.policy import Verdict, load_policies
from mlaconf.judge.verdict import error_map, judge_output
from mlaconf.judge.whole_output import check_whole_output
from mlaconf.runner.conformance import run_case
from mlaconf.runner.execution import execute, make_call
from mlaconf.runner.identity import conformance_identity

POLICIES = load_policies()
CASES = {
    "fp16-causal-gqa": dict(
        q_seqlen=[300, 140], kv_seqlen=[500, 140], head_num=4, kv_head_num=2, mask_type="causal", kv_layout="padded"
    ),
    "bf16-2d": dict(q_seqlen=[200, 77], head_num=3, dtype="bf16", q_layout="2d"),
    "fp16-mask_free": dict(q_seqlen=[600], head_num=4, mask_type="mask_free", distribution="near_tie"),
    "bf16-causal-vmean": dict(
        q_seqlen=[130],
        kv_seqlen=[400],
        head_num=2,
        dtype="bf16",
        mask_type="causal",
        kv_layout="padded",
        structure={"v_mean": 2.0},
    ),
    "fp16-one-head": dict(q_seqlen=[256], head_num=1),
    "bf16-strided": dict(q_seqlen=[129, 0, 300], head_num=2, mask_type="mask_free", kv_layout="strided", dtype="bf16"),
}


@functools.cache
def golden_of(name: str, rows: object = "sample") -> GoldenCase:
    return with_inputs(build_golden(build_case({**CASES[name], "rows": rows}, source="test_sampled_judging", index=0)))


def judged(golden: GoldenCase, backend: Backend) -> Verdict:
    out = execute(backend, make_call(golden.inputs, golden.spec), golden.spec).out
    return judge_output(golden, out, POLICIES, "default", backend.name)[1]


def failing(verdict: Verdict) -> set[str]:
    return {f"{c.rule}:{c.metric}" for c in verdict.failing}


@pytest.mark.parametrize("name", CASES)
def test_the_zoo_passes_sampled_cases(name: str) -> None:
    golden = golden_of(name)
    for member in [getattr(zoo, m)() for m in zoo.ZOO]:
        verdict = judged(golden, member)
        assert verdict.passed, f"{name} [{member.name}]: {verdict.summary()}"
        whole = {c.metric: c for c in verdict.checks if c.rule == "whole_output"}
        assert whole["nonfinite_elements"].value == 0 and whole["v_range_excess"].slack < 0.5, member.name


@pytest.mark.parametrize("name", ["fp16-causal-gqa", "bf16-2d", "fp16-mask_free"])
def test_a_wrapped_output_offset_fails_through_the_sample_and_the_whole_output(name: str) -> None:
    """Blocks past element 2^12 overwrite the first rows (a batch edge of the sample) and leave the rest NaN."""
    verdict = judged(golden_of(name), defects.out_offset_wrap())
    assert {"whole_output:nonfinite_elements", "finite:nan_count", "model:max_err_over_bound"} <= failing(verdict)


@pytest.mark.parametrize("name", ["fp16-causal-gqa", "bf16-2d", "fp16-mask_free"])
def test_rows_left_unwritten_in_a_query_tile_fail(name: str) -> None:
    verdict = judged(golden_of(name), defects.tile_rows_unwritten())
    assert "whole_output:nonfinite_elements" in failing(verdict), verdict.summary()


@pytest.mark.parametrize("name", ["bf16-causal-vmean", "fp16-one-head"])
def test_the_whole_output_checks_catch_unwritten_rows_the_sample_missed(name: str) -> None:
    """Without random rows these samples hold none of the skipped rows: only the whole-output check can fail."""
    golden = golden_of(name, rows=0)
    skipped = tile_rows_skipped(golden.spec.total_q, TILE_ROWS, SKIPPED_FIRST, SKIPPED_ROWS)
    assert golden.sample is not None and skipped and not set(skipped) & set(golden.sample.rows.tolist())
    verdict = judged(golden, defects.tile_rows_unwritten())
    assert failing(verdict) == {"whole_output:nonfinite_elements"}, verdict.summary()
    assert verdict.worst is not None and verdict.worst.row_in_batch == SKIPPED_FIRST


@pytest.mark.parametrize("name", ["bf16-2d", "bf16-causal-vmean"])
def test_a_row_outside_its_visible_v_range_fails_and_the_range_itself_passes(name: str) -> None:
    golden = golden_of(name)
    spec = golden.spec
    out = execute(defects.control_math(), make_call(golden.inputs, spec), spec).out
    rows = out.reshape(spec.total_q, spec.head_num, 128).astype(np.float64)
    unsampled = int(np.setdiff1d(np.flatnonzero(row_valid(spec)), golden.sample.rows)[5])
    planted = rows.copy()
    planted[unsampled, 1] = planted[unsampled, 1] + 4.0  # a row read from elsewhere: finite, out of range
    verdict = judge_output(golden, planted.astype(out.dtype).reshape(out.shape), POLICIES, "default", "planted")[1]
    assert failing(verdict) == {"whole_output:v_range_excess"}, verdict.summary()
    assert verdict.worst is not None and (verdict.worst.token, verdict.worst.head) == (unsampled, 1)
    whole = check_whole_output(out, golden.inputs, spec)
    assert whole.nonfinite == 0 and whole.outside == 0


def test_a_record_says_which_rows_were_judged_and_why() -> None:
    golden = golden_of("fp16-causal-gqa")
    result = run_case(
        golden, defects.control_math(), policy_set=POLICIES, policy="default", deviations=load_deviations(None)
    )
    record = result.ending.record(conformance_identity(golden.spec, "control", "default")).to_dict()
    assert record["verdict"] == "passed"
    judged_rows = record["judged_rows"]
    assert judged_rows["rows"] == golden.sample.rows.size and judged_rows["of"] == golden.spec.total_q
    assert judged_rows["reasons"] == golden.sample.counts() and judged_rows["reasons"]["random"] == 64
    assert record["metrics"]["n_rows"] == golden.sample.rows.size


def test_a_failing_sampled_case_maps_its_sampled_rows_only() -> None:
    golden = golden_of("fp16-one-head")  # 256 rows: one map row per token
    spec: CaseSpec = golden.spec
    out = execute(defects.scale_twice(), make_call(golden.inputs, spec), spec).out
    verdict = judge_output(golden, out, POLICIES, "default", "planted")[1]
    assert not verdict.passed
    emap = error_map(golden, out, verdict.worst_check(), (1e-6, 2.0))
    assert emap["row_stride"] == 1
    shown = [row for row, cells in enumerate(emap["values"]) if any(v is not None for v in cells)]
    assert shown == golden.sample.rows.tolist()
