"""From a backend's output and its golden to a verdict: metrics, the policy, known deviations."""

from __future__ import annotations

import functools
from typing import Any, Literal

import numpy as np

from mlaconf.facts.operator import V_DIM
from mlaconf.golden.spec import CaseSpec
from mlaconf.golden.stats import CHUNK_ELEMENTS, ErrorStats
from mlaconf.golden.types import GoldenCase
from mlaconf.judge.deviations import Deviation
from mlaconf.judge.error_model import ModelResult, model_ratio
from mlaconf.judge.metrics import Metrics, compute_metrics
from mlaconf.judge.policy import PolicySet, Verdict, VerdictContext
from mlaconf.judge.systematic import Significance, format_check, temperature_check

#: An error map has at most this many token rows x heads (each cell the largest error it covers).
MAP_ROWS, MAP_HEADS = 256, 128

Outcome = Literal["passed", "failed", "xfailed", "xpassed"]
#: How a known deviation's classification of what happened becomes a test outcome.
DEVIATION_OUTCOMES: dict[str, Outcome] = {"expected": "xfailed", "unexpected_pass": "xpassed", "different": "failed"}


def mode_text(spec: CaseSpec, backend: str) -> str:
    return f"{spec.case_id} [backend {backend}, dtype {spec.dtype}, mask {spec.mask_name}, cache {spec.cache_name}]"


def judge_output(
    golden: GoldenCase, out: np.ndarray, policy_set: PolicySet, policy: str, backend: str
) -> tuple[Metrics, Verdict]:
    """Metrics of ``out`` against the golden and the verdict under the resolved policy."""
    spec = golden.spec
    shape = (spec.total_q, spec.head_num, V_DIM)
    if out.size != int(np.prod(shape)):
        raise ValueError(f"{spec.case_id}: backend output has shape {out.shape}, expected {golden.out.shape}")
    metrics = compute_metrics(
        out.reshape(shape), golden.out.reshape(shape), golden.row_valid, spec.dtype, spec.q_seqlen
    )
    baseline = ErrorStats.from_dict(golden.baseline_stats) if golden.baseline_stats else None
    resolved = policy_set.resolve(policy, backend, spec.dtype, spec.mask_name, spec.case_id)
    return metrics, resolved.evaluate(metrics, baseline, verdict_context(golden, out))


def outcome_of(passed: bool, error_status: str | None, deviation: Deviation | None) -> Outcome:
    """The outcome of a numeric verdict (``passed``) or a rejection (``error_status``), deviations applied."""
    if deviation is None:
        return "passed" if passed and error_status is None else "failed"
    return DEVIATION_OUTCOMES[deviation.classify(error_status, None if error_status else passed)]


def outcome_message(spec: CaseSpec, backend: str, outcome: Outcome, detail: str, deviation: Deviation | None) -> str:
    prefix = {
        "passed": "",
        "failed": "",
        "xfailed": "known deviation: ",
        "xpassed": "UNEXPECTED PASS of known deviation: ",
    }[outcome]
    known = f" [{deviation.describe()}]" if deviation else ""
    return f"{prefix}{mode_text(spec, backend)}: {detail}{known}"


def error_map(golden: GoldenCase, out: np.ndarray, bound: float | None) -> dict[str, Any]:
    """Where the error sits, for the report: ``max_v |out - g| / max(1, |g|)`` per (token row, head)
    divided by ``bound`` (the atb rule's e, so a cell above 1 fails; without it, by the largest
    value), max-pooled to at most MAP_ROWS x MAP_HEADS cells.  NaN/Inf outputs are inf, rows of
    zero-length batches None.  Values keep 3 significant digits: the record stays small."""
    spec = golden.spec
    rows, heads = spec.total_q, spec.head_num
    a, g = out.reshape(rows, heads, V_DIM), golden.out.reshape(rows, heads, V_DIM)
    row_stride, head_stride = -(-rows // MAP_ROWS), -(-heads // MAP_HEADS)
    grid = np.full((-(-rows // row_stride) * row_stride, -(-heads // head_stride) * head_stride), np.nan)
    step = max(CHUNK_ELEMENTS // (heads * V_DIM) // row_stride, 1) * row_stride
    for start in range(0, rows, step):
        stop = min(start + step, rows)
        got, want = a[start:stop].astype(np.float64), g[start:stop]
        with np.errstate(invalid="ignore", over="ignore"):
            err = np.abs(got - want) / np.maximum(np.abs(want), 1.0)
        err = np.where(np.isfinite(err), err, np.inf).max(axis=2)
        grid[start:stop, :heads] = np.where(golden.row_valid[start:stop, None], err, np.nan)
    pooled = np.fmax.reduce(grid.reshape(grid.shape[0] // row_stride, row_stride, -1, head_stride), axis=(1, 3))
    finite = pooled[np.isfinite(pooled)]
    scale = bound if bound else float(finite.max()) if finite.size and finite.max() > 0 else 1.0
    values = [[None if np.isnan(v) else float(f"{v / scale:.3g}") for v in row] for row in pooled]
    return {
        "values": values,
        "row_stride": row_stride,
        "head_stride": head_stride,
        "q_seqlen": list(spec.q_seqlen),
        "bound": bound,
        "quantity": "max_v |out - g| / max(1, |g|) / " + ("the atb bound e" if bound else "its largest value"),
    }


def verdict_context(golden: GoldenCase, out: np.ndarray) -> VerdictContext:
    """The case's context, with the error-model rule and the systematic tests bound to ``out`` and the
    golden's magnitudes (no model when the golden carries none: that rule then fails rather than pass
    vacuously)."""
    spec = golden.spec

    @functools.cache
    def systematic(false_alarm: float) -> tuple[Significance, ...]:
        each = false_alarm / 2.0  # two tests share the case's false-alarm rate
        return (
            temperature_check(out, golden.out, golden.row_valid, golden.magnitudes, spec, each),
            format_check(out, golden.out, golden.row_valid, spec, each),
        )

    if not golden.magnitudes:
        return VerdictContext.from_spec(spec, systematic=systematic)

    @functools.cache
    def model(false_alarm: float, safety: float) -> ModelResult:
        return model_ratio(
            out, golden.out, golden.row_valid, golden.magnitudes, spec, false_alarm=false_alarm, safety=safety
        )

    return VerdictContext.from_spec(spec, model, systematic)
