"""Systematic-error checks beside the element bound: errors every element shares a little of.

A wrong temperature or an output rounded through a coarser format can stay inside every element's
bound and still be certain over the whole output.  Two tests look for them; docs/conformance.md
("Systematic-error checks") derives both.  Each returns an estimate, its significance as a
statistic ``z`` on the Gaussian-tail scale and the critical value at the case's false-alarm rate
``alpha``: ``z > critical`` has probability at most ``alpha / 2`` for a correct kernel.

* **Temperature.**  A kernel whose scores are scaled by qkScale (1 + eps) outputs
  g + eps T + O(eps^2), T = dg / d log qkScale the stored magnitude ``pv_scale``.  The estimate is
  the least-squares projection eps_hat = sum e T / sum T^2 of the error e = out - g.  Legitimate
  kernels have eps between 0, eps_L (qkScale cast to fp16 on ATB's fp16 score path, else 0) and the
  emulated baseline's own estimate (the documented path's roundings projected on T), widened by
  SCALE_SLACK for a scale rounded once more in fp32 and by the spread of that estimate over the
  path's rounding variants (``variant_spread``).  Under that null,
  with eps0 the interval's nearest end, the per-(row, head) sums u_c = sum_c T (e - eps0 T) are
  independent (every rounding of the model is shared by the elements of one row and head at most)
  and symmetric, so z = sum u_c / sqrt(sum u_c^2) exceeds x with probability at most exp(-x^2 / 2)
  (Hoeffding over the signs, whatever the clusters' variances).  z grows like sqrt(rows), so it
  decides only beside a materiality floor: the effect |eps_hat - eps0| rms(T) / (u rms(g)) must
  reach TEMPERATURE_FLOOR (rounding-sized biases of legitimate paths stay below it).  A row whose
  scaled logits span less than NEAR_TIE_ULPS rounding steps of the dtype is a near tie: a legitimate
  kernel that rounds P to the dtype rounds its P values alike, which moves the row along T by up to its
  whole temperature (every P equal: eps = -1), so such rows are set aside and the test decides on the
  others (docs/conformance.md, "Near-tie rows").
* **Format signature.**  The low LOW_BITS mantissa bits of a correctly rounded fp16 (or bf16) value
  of a continuous quantity are all zero about once in 2^LOW_BITS; an output rounded through bf16 (or
  fp8) on the way has them zero always (normal values only: a subnormal keeps no coarser format's
  zeros).  Per head and over all heads, the count k of such outputs among n normal ones is compared
  with the chance rate p = CHANCE_MARGIN * max(2^-LOW_BITS, r_g), r_g the same rate of the golden
  rounded to the dtype (a golden whose values are coarse, e.g. rows that copy one input value,
  raises the chance accordingly); the Chernoff bound P(K >= k) <= exp(-n KL(k/n || p)) gives
  z = sqrt(2 n KL); it decides only when the rate is also FORMAT_FLOOR times the chance rate.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import ml_dtypes
import numpy as np

from mlaconf.facts.operator import U32, UNIT_ROUNDOFF, V_DIM
from mlaconf.facts.processes import map_for
from mlaconf.golden.building.chunks import RowChunk, row_chunks
from mlaconf.golden.specs.layout import kv_views, offsets, q_views, visible_keys
from mlaconf.golden.specs.spec import CaseSpec
from mlaconf.golden.specs.types import OpInputs
from mlaconf.judge.error_model import scale_cast_error
from mlaconf.judge.metrics import EXPONENT_BITS, bits16_finite

#: A scale rounded once more in fp32 (qkScale * log2 e, say) is legitimate: this much relative error.
SCALE_SLACK = 4.0 * U32
#: Mantissa bits tested by the format signature (bf16 has 3 fewer than fp16, fp8 e4m3 3 fewer than bf16).
LOW_BITS = 3
#: The chance rate of all-zero low bits times this: a margin for the slightly non-uniform low bits of
#: real outputs (their density varies across a binade), so that millions of elements never alarm.
CHANCE_MARGIN = 1.5
#: Standard errors of the baseline's own estimate added to the legitimate interval: its rounding noise
#: is one draw, another emulation of the same path another (docs/conformance.md, "Baseline spread").
BASELINE_NOISE = 3.0
#: Materiality floor of the temperature test: |eps_hat - eps0| rms(T) in units of u rms(g).  Split-KV
#: partials rounded to the dtype before the merge reach 0.14 where each part's softmax is sharp (one key
#: dominates, the partial snaps to its V: smoke's fp16 CAUSAL 128-head large-raw-score case, 4 or 8
#: parts); one rounding of a normalised partial can reach at most 0.5 (docs/conformance.md, "Materiality
#: floor").
TEMPERATURE_FLOOR = 0.3
#: A row's scaled logits must span this many rounding steps 2u of the dtype for its P values, rounded to the
#: dtype, to round independently of the logits (a sawtooth over many steps projects on T by at most ~3 /
#: NEAR_TIE_ULPS of the row's temperature, and with no common sign across rows); narrower rows are near ties.
NEAR_TIE_ULPS = 16
#: Score elements per pass when the logit spans are computed (float32: a few of these arrays).
SPAN_ELEMENTS = 1 << 22
#: Materiality floor of the format signature: the zero-low-bits rate over its chance rate (a
#: correct output reached 0.79; an output rounded through a coarser format 1 / (3/16) = 5.3).
FORMAT_FLOOR = 2.0
OWN_DTYPE = {"fp16": np.dtype(np.float16), "bf16": np.dtype(ml_dtypes.bfloat16)}


@dataclass(frozen=True)
class Significance:
    """One systematic test's outcome: ``z`` against ``critical`` (nan: not computable, see ``text``)."""

    name: str
    estimate: float
    standard_error: float
    z: float
    critical: float
    text: str
    #: The effect's size on the test's materiality scale, and the floor it must reach to decide.
    effect: float = math.nan
    floor: float = math.nan

    @property
    def significant(self) -> bool:
        """Certain (z over its critical value) and material (effect at its floor): a tiny bias made
        certain by many rows is a legitimate rounding path, not a defect."""
        return self.z > self.critical and self.effect >= self.floor


def critical_value(alpha: float, tests: int = 1) -> float:
    """x with ``tests`` * exp(-x^2 / 2) = alpha: one-sided Gaussian-tail bound, union over the tests."""
    return math.sqrt(2.0 * math.log(tests / alpha))


def _projections(
    actual: np.ndarray, golden: np.ndarray, row_valid: np.ndarray, direction: np.ndarray, spec: CaseSpec
) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    """Per valid (row, head): sum_c T^2, sum_c T (actual - golden) and sum_c g^2; None when ``actual`` is
    not finite."""
    shape = (row_valid.shape[0], spec.head_num, V_DIM)  # every token row, or a sample's
    a_all, g_all, d_all = actual.reshape(shape), golden.reshape(shape), direction.reshape(shape)

    def chunk_sums(chunk: RowChunk) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
        g = np.asarray(g_all[chunk.pick], dtype=np.float64)
        with np.errstate(invalid="ignore", over="ignore"):  # a NaN/Inf output: None
            err = a_all[chunk.pick].astype(np.float64) - g
        if not np.isfinite(err).all():
            return None
        d = d_all[chunk.pick].astype(np.float64)
        return np.einsum("rhc,rhc->rh", d, d), np.einsum("rhc,rhc->rh", d, err), np.einsum("rhc,rhc->rh", g, g)

    chunks = row_chunks(row_valid, spec.head_num * V_DIM)
    parts = list(map_for(len(chunks))(chunk_sums, chunks))
    if any(part is None for part in parts):
        return None
    done = [part for part in parts if part is not None]
    empty = np.zeros((0, spec.head_num))
    tt, te, gg = (np.concatenate([part[i] for part in done]) if done else empty for i in range(3))
    return tt, te, gg


def logit_spans(inputs: OpInputs, spec: CaseSpec, row_valid: np.ndarray, token_rows: np.ndarray | None) -> np.ndarray:
    """float32 ``[valid rows, H]``: max - min of each judged row's scaled logits qkScale q.k over the keys it
    sees (0 for a row that sees none), in the judged rows' order (``row_valid``'s true entries; ``token_rows``
    the token of each array row when sampled); float32 products are far finer than the steps spans are held to."""
    q_nope, q_rope = q_views(inputs, spec)
    keys, starts = visible_keys(spec), offsets(spec.q_seqlen)
    tokens = np.flatnonzero(row_valid) if token_rows is None else np.asarray(token_rows)[np.asarray(row_valid, bool)]
    spans = np.zeros((tokens.size, spec.head_num), dtype=np.float32)
    group = spec.head_num // spec.kv_head_num
    for b in range(spec.batch):
        picked = np.flatnonzero((tokens >= starts[b]) & (tokens < starts[b + 1]))
        if picked.size == 0 or spec.kv_seqlen[b] == 0:
            continue
        k, k_rope, _ = kv_views(inputs, spec, b)
        step = max(1, SPAN_ELEMENTS // max(1, spec.kv_seqlen[b]))
        for head in range(spec.head_num):
            kv = np.concatenate([k[:, head // group], k_rope[:, head // group]], axis=1).astype(np.float32)
            for first in range(0, picked.size, step):
                at = picked[first : first + step]
                rows = tokens[at]
                q = np.concatenate([q_nope[rows, head], q_rope[rows, head]], axis=1).astype(np.float32)
                scores = (q @ kv.T) * np.float32(spec.qk_scale)
                seen = np.arange(kv.shape[0])[None, :] < keys[rows][:, None]
                top, bottom = np.where(seen, scores, -np.inf).max(axis=1), np.where(seen, scores, np.inf).min(axis=1)
                spans[at, head] = np.where(keys[rows] > 0, top - bottom, 0.0)
    return spans


def near_tie_rows(inputs: OpInputs, spec: CaseSpec, row_valid: np.ndarray, token_rows: np.ndarray | None) -> np.ndarray:
    """bool ``[valid rows, H]``: the judged (row, head) whose logits span under NEAR_TIE_ULPS rounding steps
    of the dtype (:func:`logit_spans`)."""
    return logit_spans(inputs, spec, row_valid, token_rows) < NEAR_TIE_ULPS * 2.0 * UNIT_ROUNDOFF[spec.dtype]


def variant_spread(documented: float, residuals: np.ndarray, total: float) -> float:
    """How far another emulation of the documented path may land from its estimate ``documented``:
    its own bias once more (the same quantities rounded once at the same precision, the clustered
    values that made the bias rounding the other way) plus BASELINE_NOISE of its standard error
    (``residuals`` per row and head about it, over ``total`` = sum T^2)."""
    return abs(documented) + BASELINE_NOISE * math.sqrt(float(np.square(residuals).sum())) / total


def temperature_check(
    actual: np.ndarray,
    golden: np.ndarray,
    row_valid: np.ndarray,
    magnitudes: Mapping[str, np.ndarray],
    spec: CaseSpec,
    alpha: float,
    baseline: np.ndarray | None = None,
    near_ties: Callable[[], np.ndarray] | None = None,
) -> Significance:
    """The temperature error's estimate, its standard error and significance (two-sided, ``alpha``).

    ``baseline`` (the golden's emulation of ATB's documented path) widens the legitimate interval to
    its own estimate: where the inputs make the documented roundings project on T (scores within a
    few fp16 ulps of each other round alike: a flatter softmax), a kernel on that path does too.
    ``near_ties`` (the judged rows' near-tie mask, :func:`near_tie_rows`; computed only when the test
    decides on every row) sets those rows aside: the test decides only if it still decides without them."""
    critical = critical_value(alpha, 2)
    if "pv_scale" not in magnitudes:
        return Significance("temperature", math.nan, math.nan, math.nan, critical, "no stored T (pv_scale)")
    sums = _projections(actual, golden, row_valid, magnitudes["pv_scale"], spec)
    if sums is None:
        return Significance("temperature", math.nan, math.nan, math.nan, critical, "output not finite")
    documented = None if baseline is None else _projections(baseline, golden, row_valid, magnitudes["pv_scale"], spec)
    result = _temperature(*sums, None if documented is None else documented[1], spec, critical, "")
    if result.significant and near_ties is not None:
        keep = ~near_ties()
        if not keep.any():
            text = f"each of {keep.size} rows x heads a near tie (logits under {NEAR_TIE_ULPS} steps): no evidence"
            return Significance("temperature", math.nan, math.nan, 0.0, critical, text)
        if not keep.all():
            note = f"; {int(keep.size - np.count_nonzero(keep))} near-tie rows x heads set aside"
            tt, te, gg = (a[keep] for a in sums)
            result = _temperature(tt, te, gg, None if documented is None else documented[1][keep], spec, critical, note)
    return result


def _temperature(
    tt: np.ndarray,
    te: np.ndarray,
    gg: np.ndarray,
    documented: np.ndarray | None,
    spec: CaseSpec,
    critical: float,
    note: str,
) -> Significance:
    """The test on per-(row, head) sums: T^2, T e, g^2 and the baseline's T e (``documented``)."""
    total = float(tt.sum())
    if total == 0.0:
        return Significance("temperature", math.nan, math.nan, 0.0, critical, "T is 0 on every element" + note)
    estimate = float(te.sum()) / total
    ends = [0.0, scale_cast_error(spec)]
    spread = 0.0
    if documented is not None:
        ends.append(float(documented.sum()) / total)
        spread = variant_spread(ends[-1], documented - ends[-1] * tt, total)
    low, high = min(ends) - SCALE_SLACK - spread, max(ends) + SCALE_SLACK + spread
    nearest = min(max(estimate, low), high)
    fitted = te - estimate * tt
    standard_error = math.sqrt(float(np.square(fitted).sum())) / total
    u = te - nearest * tt
    norm = math.sqrt(float(np.square(u).sum()))
    z = abs(float(u.sum())) / norm if norm > 0.0 and nearest != estimate else 0.0  # inside: no evidence
    # rms(T) / rms(g) = sqrt(total / sum g^2): the element count cancels
    squares = float(gg.sum())
    effect = (
        abs(estimate - nearest) * math.sqrt(total / squares) / UNIT_ROUNDOFF[spec.dtype] if squares > 0.0 else math.inf
    )
    text = (
        f"qkScale error estimate {estimate:.3g} +- {standard_error:.2g} (legitimate [{low:.3g}, {high:.3g}]), "
        f"z {z:.3g} over {tt.size} rows x heads, effect {effect:.3g} u rms(g) (floor {TEMPERATURE_FLOOR:g}){note}"
    )
    return Significance("temperature", estimate, standard_error, z, critical, text, effect, TEMPERATURE_FLOOR)


def format_check(
    actual: np.ndarray, golden: np.ndarray, row_valid: np.ndarray, spec: CaseSpec, alpha: float
) -> Significance:
    """Whether the output's low mantissa bits are zero more often than chance, per head and overall."""
    h = spec.head_num
    critical = critical_value(alpha, h + 1)
    shape = (row_valid.shape[0], h, V_DIM)
    a_all, g_all = actual.reshape(shape), golden.reshape(shape)

    def chunk_counts(chunk: RowChunk) -> np.ndarray:
        """Per head: normal outputs, those with zero low bits, the same two of the golden rounded (a value
        in another float dtype, or the float64 golden, counted as rounded to the case's dtype)."""
        counts = []
        for values in (a_all[chunk.pick], np.asarray(g_all[chunk.pick], dtype=np.float64)):
            if values.dtype == OWN_DTYPE[spec.dtype]:
                bits = values.view(np.uint16)
            else:
                wide = values.astype(np.float64)
                bits = bits16_finite(np.where(np.isfinite(wide), wide, np.inf), spec.dtype)  # NaN/Inf: Inf's
            exponent = bits & EXPONENT_BITS[spec.dtype]
            normal = (exponent != 0) & (exponent != EXPONENT_BITS[spec.dtype])
            zero = (bits & ((1 << LOW_BITS) - 1)) == 0
            counts += [normal.sum(axis=(0, 2)), (normal & zero).sum(axis=(0, 2))]
        return np.stack(counts)

    counts = np.zeros((4, h), dtype=np.int64)
    chunks = row_chunks(row_valid, h * V_DIM)
    for part in map_for(len(chunks))(chunk_counts, chunks):
        counts += part
    n, k, n_g, k_g = counts
    chance = 2.0**-LOW_BITS
    # per group: its count, its normal outputs and the chance rate (raised by a golden whose values are coarse)
    groups = [("all heads", int(k.sum()), int(n.sum()), int(k_g.sum()), int(n_g.sum()))]
    groups += [(f"head {i}", int(k[i]), int(n[i]), int(k_g[i]), int(n_g[i])) for i in range(h)]
    rated = [
        (label, kk, nn, min(1.0, CHANCE_MARGIN * max(chance, kg / ng if ng else 0.0)))
        for label, kk, nn, kg, ng in groups
    ]
    z, label, kk, nn, p = 0.0, *rated[0]
    for group in rated:  # the most significant group (the first of equal ones); none: all heads
        _, k_i, n_i, p_i = group
        if n_i == 0 or p_i >= 1.0 or k_i <= n_i * p_i:  # not above the chance rate: z 0
            continue
        # z = sqrt(2 n KL(k/n || p)): P(K >= k) <= exp(-z^2 / 2) for K ~ Bin(n, p) (Chernoff)
        q = k_i / n_i
        kl = q * math.log(q / p_i) + ((1.0 - q) * math.log((1.0 - q) / (1.0 - p_i)) if q < 1.0 else 0.0)
        group_z = math.sqrt(2.0 * n_i * max(kl, 0.0))
        if group_z > z:
            z, label, kk, nn, p = group_z, *group
    rate = kk / nn if nn else math.nan
    effect = rate / p if nn else math.nan
    text = (
        f"low {LOW_BITS} mantissa bits zero in {rate:.3g} of {nn} normal outputs ({label}; chance {p:.3g}), z {z:.3g}, "
        f"rate / chance {effect:.3g} (floor {FORMAT_FLOOR:g})"
    )
    se = math.sqrt(p * (1 - p) / nn) if nn else math.nan
    return Significance("format", rate, se, z, critical, text, effect, FORMAT_FLOOR)
