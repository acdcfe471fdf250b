"""From a backend's output and its golden to a verdict: metrics, the policy, known deviations."""

from __future__ import annotations

import math
import weakref
from collections.abc import Callable
from typing import Any, Generic, Literal, TypeVar

import numpy as np

from mlaconf.facts.operator import V_DIM
from mlaconf.facts.processes import map_for
from mlaconf.golden.building.chunks import RowChunk, row_chunks
from mlaconf.golden.building.stats import ErrorStats
from mlaconf.golden.specs.layout import out_shape
from mlaconf.golden.specs.spec import CaseSpec
from mlaconf.golden.specs.types import GoldenCase
from mlaconf.judge.deviations import Deviation
from mlaconf.judge.error_model import ModelBound
from mlaconf.judge.metrics import Metrics, compute_metrics
from mlaconf.judge.msprobe import BenchmarkMetrics, benchmark_metrics
from mlaconf.judge.policy import Check, Policy, PolicySet, Verdict, VerdictContext
from mlaconf.judge.systematic import format_check, near_tie_rows, temperature_check
from mlaconf.judge.whole_output import WholeOutput, check_whole_output

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
    return judge_resolved(golden, out, policy_set.resolve(policy, backend, spec.dtype, spec.mask_name, spec.case_id))


def judge_resolved(golden: GoldenCase, out: np.ndarray, resolved: Policy) -> tuple[Metrics, Verdict]:
    """:func:`judge_output` under a policy already resolved for the case (a caller that needs the
    resolved policy again resolves it once).  A sampled golden judges the output's sampled rows against
    it, and every row by the whole-output checks (judge.whole_output)."""
    spec = golden.spec
    shape = (spec.total_q, spec.head_num, V_DIM)
    if out.size != int(np.prod(shape)):
        raise ValueError(f"{spec.case_id}: backend output has shape {out.shape}, expected {out_shape(spec)}")
    judged, whole = judged_rows(golden, out), None
    if golden.sample is not None:
        whole = check_whole_output(out, golden.inputs, spec)
    metrics = compute_metrics(
        judged.reshape(-1, spec.head_num, V_DIM),
        golden.out.reshape(-1, spec.head_num, V_DIM),
        golden.row_valid,
        spec.dtype,
        spec.q_seqlen,
        golden.token_rows,
    )
    baseline = ErrorStats.from_dict(golden.baseline_stats) if golden.baseline_stats else None
    return metrics, resolved.evaluate(metrics, baseline, verdict_context(golden, judged, resolved, whole))


def judged_rows(golden: GoldenCase, out: np.ndarray) -> np.ndarray:
    """The rows of ``out`` (attenOut) that the golden holds, in its layout: all of them, or its sample's."""
    if golden.sample is None:
        return out
    spec = golden.spec
    rows: np.ndarray = out.reshape(spec.total_q, -1)[golden.sample.rows]
    return rows.reshape(golden.sample.rows.size, *out_shape(spec)[1:])


def outcome_of(conforms: bool, observed_status: str | None, deviation: Deviation | None) -> Outcome:
    """The one rule, for every suite, from what happened and a known deviation to a test outcome.

    ``conforms``: the documented behaviour happened (a numeric pass, a relation that holds, the
    documented rejection); ``observed_status``: the status the backend raised, or None.  Without a
    deviation that is passed or failed; with one, what it predicts is xfailed, conforming is xpassed
    (the deviation may be stale), anything else failed (see :meth:`Deviation.classify`)."""
    if deviation is None:
        return "passed" if conforms else "failed"
    return DEVIATION_OUTCOMES[deviation.classify(conforms, observed_status)]


def outcome_message(subject: str, outcome: Outcome, detail: str, deviation: Deviation | None) -> str:
    """``subject: detail``, prefixed for a known deviation's outcome and followed by the deviation."""
    prefix = {
        "passed": "",
        "failed": "",
        "xfailed": "known deviation: ",
        "xpassed": "UNEXPECTED PASS of known deviation: ",
    }[outcome]
    known = f" [{deviation.describe()}]" if deviation else ""
    return f"{prefix}{subject}: {detail}{known}"


def error_map(
    golden: GoldenCase, out: np.ndarray, deciding: Check | None, model: tuple[float, float] | None = None
) -> dict[str, Any]:
    """Where the error sits, for the report, in units of the deciding check's slack (above 1 fails):
    per (token row, head), max-pooled to at most MAP_ROWS x MAP_HEADS cells.

    * deciding rule ``model`` (``model`` = its ``(false_alarm, safety)``): the largest
      ``|out - g| / bound_e`` of the error model, i.e. the rule's own per-element slack;
    * ``atb``: ``max_v |out - g| / max(1, |g|)`` divided by the rule's e;
    * any other rule (benchmark ratios, ...), which has no per-element bound: that quantity scaled
      so the worst cell equals the check's slack (``scaled``: true), so it shows where, not how much.

    NaN/Inf outputs are inf, rows of zero-length batches None.  Values keep 3 significant digits."""
    spec = golden.spec
    rows, heads = spec.total_q, spec.head_num
    row_stride, head_stride = -(-rows // MAP_ROWS), -(-heads // MAP_HEADS)
    grid = np.full((-(-rows // row_stride) * row_stride, -(-heads // head_stride) * head_stride), np.nan)
    rule = f"{deciding.rule}:{deciding.metric}" if deciding is not None else ""
    out = judged_rows(golden, out)  # a sampled golden's map shows its sampled rows, the others None
    if deciding is not None and deciding.rule == "model" and model is not None and golden.magnitudes:
        cells = np.full((rows, heads), np.nan)
        golden_bound(golden, *model).ratio(out, cells)
        grid[:rows, :heads] = cells
        bound, scale, quantity = 1.0, 1.0, "max_v |out - g| / bound_e (the error model's per-element bound)"
    else:
        _scaled_error(golden, out, grid)
        finite = grid[np.isfinite(grid)]
        largest = float(finite.max()) if finite.size and finite.max() > 0 else 1.0
        if deciding is not None and deciding.rule == "atb":
            bound, scale, quantity = deciding.bound, deciding.bound, "max_v |out - g| / max(1, |g|) / the atb bound e"
        elif deciding is not None and math.isfinite(deciding.slack) and deciding.slack > 0:
            bound, scale = None, largest / deciding.slack
            quantity = f"max_v |out - g| / max(1, |g|), scaled so the worst cell is {rule}'s slack"
        else:
            bound, scale, quantity = None, largest, "max_v |out - g| / max(1, |g|) / its largest value"
    pooled = np.fmax.reduce(grid.reshape(grid.shape[0] // row_stride, row_stride, -1, head_stride), axis=(1, 3))
    values = [[None if np.isnan(v) else float(f"{v / scale:.3g}") for v in row] for row in pooled]
    return {
        "values": values,
        "row_stride": row_stride,
        "head_stride": head_stride,
        "q_seqlen": list(spec.q_seqlen),
        "bound": bound,
        "rule": rule,
        "slack": float(deciding.slack) if deciding is not None else None,
        "scaled": bound is None,
        "quantity": quantity,
    }


def _scaled_error(golden: GoldenCase, out: np.ndarray, grid: np.ndarray) -> None:
    """``max_v |out - g| / max(1, |g|)`` per valid (token, head) into ``grid`` (inf for NaN/Inf)."""
    heads = golden.spec.head_num
    rows = golden.row_valid.shape[0]  # every token row, or a sample's
    a, g = out.reshape(rows, heads, V_DIM), golden.out.reshape(rows, heads, V_DIM)

    def chunk_error(chunk: RowChunk) -> None:
        got, want = a[chunk.pick].astype(np.float64), g[chunk.pick]
        with np.errstate(invalid="ignore", over="ignore"):
            err = np.abs(got - want) / np.maximum(np.abs(want), 1.0)
        err = np.where(np.isfinite(err), err, np.inf).max(axis=2)
        grid[chunk.tokens, :heads] = np.where(golden.row_valid[chunk.pick, None], err, np.nan)  # disjoint rows

    chunks = row_chunks(np.ones(rows, dtype=bool), heads * V_DIM, golden.token_rows)
    list(map_for(len(chunks))(chunk_error, chunks))


T = TypeVar("T")


class PerGolden(Generic[T]):
    """Values computed once from a golden (or one of its arrays) and shared by every verdict on it (power judges
    every subject against one golden): keyed by the owner's id and parameters, held while the owner lives (an
    entry goes with its owner, so a value as large as the golden is never kept past it); the ``kept`` latest
    stay.  A golden is never edited in place once judged: an edit is a new golden (``dataclasses.replace``)."""

    def __init__(self, kept: int) -> None:
        self.kept = kept
        self._values: dict[tuple[Any, ...], tuple[weakref.ref[Any], T]] = {}

    def get(self, owner: Any, parameters: tuple[Any, ...], compute: Callable[[], T]) -> T:
        key = (id(owner), *parameters)
        found = self._values.get(key)
        if found is None or found[0]() is not owner:
            found = (weakref.ref(owner, lambda _: self._values.pop(key, None)), compute())
            self._values[key] = found
            while len(self._values) > self.kept:
                self._values.pop(next(iter(self._values)), None)
        return found[1]

    def __len__(self) -> int:
        return len(self._values)


#: msprobe's scores of the baselines of the goldens judged last (every record of a golden shares its baseline's).
BASELINE_SCORES = PerGolden[BenchmarkMetrics](16)
#: The near-tie rows of the goldens judged last (the temperature test asks once per golden, not per subject).
NEAR_TIES = PerGolden[np.ndarray](16)
#: The error model's bound of the goldens being judged (as large as a golden: one per power job).
MODEL_BOUNDS = PerGolden[ModelBound](4)
#: Largest golden whose bound is kept for the next verdict on it (the bound is as large as the golden).
KEPT_BOUND_BYTES = 128 << 20


def golden_bound(golden: GoldenCase, false_alarm: float, safety: float) -> ModelBound:
    """The error model's bound of ``golden`` under these parameters: made once per golden and kept while the
    golden lives, up to :data:`KEPT_BOUND_BYTES`; a larger golden's is made chunk by chunk in each verdict, so
    judging a production-sized golden takes no more memory than before."""

    def make(keep: bool) -> ModelBound:
        return ModelBound(
            golden.out,
            golden.row_valid,
            golden.magnitudes,
            golden.spec,
            false_alarm=false_alarm,
            safety=safety,
            token_rows=golden.token_rows,
            keep=keep,
        )

    if golden.out.nbytes > KEPT_BOUND_BYTES:
        return make(False)
    return MODEL_BOUNDS.get(golden, (false_alarm, safety), lambda: make(True))


def verdict_context(
    golden: GoldenCase, out: np.ndarray, policy: Policy, whole_output: WholeOutput | None = None
) -> VerdictContext:
    """The case's context with what ``policy``'s rules measure on ``out`` (the rows the golden holds) against
    the golden, each with the rule's parameters: the error model over the golden's magnitudes (none when the
    golden carries none: that rule then fails rather than pass vacuously), the systematic tests, msprobe's
    scores; and the whole-output checks made on the whole output (a sampled golden's)."""
    spec, wanted = golden.spec, {*policy.rules, *policy.evidence}
    model = systematic = msprobe = None
    if "model" in wanted and golden.magnitudes:
        false_alarm, safety = (policy.param("model", name, spec.dtype) for name in ("false_alarm", "safety"))
        model = golden_bound(golden, false_alarm, safety).ratio(out)
    if "systematic" in wanted:
        each = policy.param("systematic", "false_alarm", spec.dtype) / 2.0  # two tests share the case's rate
        systematic = (
            temperature_check(
                out,
                golden.out,
                golden.row_valid,
                golden.magnitudes,
                spec,
                each,
                golden.baseline_out,
                near_ties=lambda: NEAR_TIES.get(
                    golden.out, (), lambda: near_tie_rows(golden.inputs, spec, golden.row_valid, golden.token_rows)
                ),
            ),
            format_check(out, golden.out, golden.row_valid, spec, each),
        )
    if "msprobe" in wanted:
        small, atol, eps = (
            policy.param("msprobe", n, spec.dtype) for n in ("small_value", "small_value_atol", "bench_eps")
        )
        scoring = dict(small_value=small, small_value_atol=atol, bench_eps=eps)
        documented = BASELINE_SCORES.get(
            golden.baseline_out,
            (small, atol, eps),
            lambda: benchmark_metrics(golden.baseline_out, golden.out, golden.row_valid, **scoring),
        )
        msprobe = (benchmark_metrics(out, golden.out, golden.row_valid, **scoring), documented)
    return VerdictContext(spec.dtype, spec.head_num, spec.max_q, model, systematic, msprobe, whole_output)
