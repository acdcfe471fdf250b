"""How far a recomputed golden may legitimately lie from the stored one: each array by its own yardstick.

``mlaconf verify --recompute`` rebuilds a case and compares (docs/golden-files.md, "Recompute"):

* ``golden/out``, the float64 reference, within its documented agreement: every element within
  :data:`REFERENCE_AGREEMENT` of its own scale ``|g| + A`` (A = sum_j P_j |V_j|, the ``pv_abs``
  magnitude: an output that cancels to near zero carries float64 rounding of its terms' size, not its
  own; tests/agreement.py holds the fused golden to the same yardstick).
* ``baseline/out``, the same-dtype emulation, within its rounding bound (:func:`baseline_bound`): its
  float32 GEMMs legitimately sum in another order on another BLAS code path (another CPU generation,
  ``MKL_CBWR``, another MKL), and an order change reaches the stored values through every rounding
  point downstream (scores, P, the output), each of which may then round the other way.
* the baseline's statistics, derived data, equal to what their own arrays give (:func:`stats_mismatch`, within
  float64 summation noise), stored and recomputed alike, and their move within what the two baselines'
  element-wise difference allows (:func:`stats_allowance`: the triangle inequality per statistic).

Every comparison reports its size against its yardstick, so a drift within bounds is named as well.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from mlaconf.facts.operator import SCORE_DIM, U16, U32, UNIT_ROUNDOFF, V_DIM, scores_in_fp16
from mlaconf.facts.processes import map_for
from mlaconf.golden.building.chunks import RowChunk, row_chunks
from mlaconf.golden.building.stats import REL_FLOOR, error_stats
from mlaconf.golden.specs.layout import visible_keys
from mlaconf.golden.specs.types import GoldenCase

#: Two float64 evaluations of the reference agree within this fraction of ``|g| + A`` per element.
REFERENCE_AGREEMENT = 1e-12
#: fp16 outputs below this may be flushed to 0 by one evaluation and not the other (twice the smallest normal).
FTZ_OUTPUT_LIMIT = 2.0**-13
#: Covers the second-order terms the first-order rounding bound leaves out.
BASELINE_SAFETY = 2.0
EPS64 = float(np.finfo(np.float64).eps)
TINY = float(np.finfo(np.float64).tiny)


@dataclass(frozen=True)
class ReferenceDrift:
    """The float64 reference's largest move, as a fraction of ``|g| + A`` (inf: NaN positions differ)."""

    worst: float
    moved: int

    @property
    def ok(self) -> bool:
        return self.worst <= REFERENCE_AGREEMENT

    def text(self) -> str:
        if not self.moved:
            return "bit-identical"
        return f"{self.moved} elements moved, largest {self.worst:.2e} of |g|+A (limit {REFERENCE_AGREEMENT:g})"


def _pick(arr: np.ndarray, spec_rows: int, chunk: RowChunk) -> np.ndarray:
    return np.asarray(arr.reshape(spec_rows, -1)[chunk.pick], dtype=np.float64)


def held_rows(golden: GoldenCase) -> int:
    """Rows the golden's arrays hold: every token row, or its sample's."""
    return int(golden.row_valid.shape[0])


def all_rows(golden: GoldenCase) -> list[RowChunk]:
    """Every row the golden holds (valid or not), in the statistics' chunks (``tokens`` the token rows)."""
    rows = held_rows(golden)
    return row_chunks(np.ones(rows, dtype=bool), golden.out.size // max(rows, 1), golden.token_rows)


def reference_drift(stored: GoldenCase, fresh: GoldenCase) -> ReferenceDrift:
    """Every element of the recomputed reference against the stored one, in units of ``|g| + A``
    (A the smaller of the two ``pv_abs``, both upper bounds of the float64 value); rows of zero-length
    batches included (both 0: any difference is a drift)."""
    t = held_rows(stored)
    a_old, a_new = stored.magnitudes.get("pv_abs"), fresh.magnitudes.get("pv_abs")

    def chunk(part: RowChunk) -> tuple[float, int]:
        old, new = _pick(stored.out, t, part), _pick(fresh.out, t, part)
        if a_old is None or a_new is None or a_old.shape != a_new.shape:  # reported as a magnitude problem
            scale = np.abs(old)
        else:
            scale = np.abs(old) + np.minimum(_pick(a_old, t, part), _pick(a_new, t, part))
        nan_old, nan_new = np.isnan(old), np.isnan(new)
        if not np.array_equal(nan_old, nan_new):
            return float("inf"), int(np.count_nonzero(nan_old != nan_new))
        with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
            diff = np.where(nan_old | (old == new), 0.0, np.abs(new - old))
            ratio = np.where(diff == 0.0, 0.0, diff / np.maximum(scale, TINY))
        return worst_ratio(ratio), int(np.count_nonzero(diff))

    rows = all_rows(stored)
    results = list(map_for(len(rows))(chunk, rows))
    return ReferenceDrift(max((r[0] for r in results), default=0.0), sum(r[1] for r in results))


def worst_ratio(ratio: np.ndarray) -> float:
    """The largest ratio of a chunk, a NaN counted as infinitely far (Python's ``max`` over the chunks would
    drop a NaN that does not come first, and numpy's ``max`` returns one that ``<=`` then passes)."""
    return float(np.where(np.isnan(ratio), np.inf, ratio).max(initial=0.0))


def baseline_bound(golden: GoldenCase, rows: RowChunk) -> np.ndarray:
    """How far two emulations of the baseline that differ only in their float32 summation order (and
    so in which way each later rounding goes) may lie apart, per element of ``rows`` (``[rows, H*128]``).

    Each evaluation's rounding error is at most (u the output dtype's unit roundoff, u_s that of the
    scores: 2^-11 where they are stored in fp16, else 2^-24; A, M, C, n the magnitudes of
    :mod:`mlaconf.golden.building.magnitudes`)::

        u |g|  +  u (A + |g|)  +  4 u_s M (A + |g|)  +  192 u32 C (A + |g|)  +  (n + 1) u32 (A + |g|)  +  u32 |g|
        output    P rounded      score roundings       Q.K accumulation        P.V and row sums        divide

    (a rounding that goes the other way moves a value by one step, 2u of it: hence the factor 2 for
    two evaluations), times :data:`BASELINE_SAFETY`; on fp16 also D (``pv_sub``, keys whose P may be
    flushed to zero in one and not the other) and |g| below 2^-13 (an output flushed in one)."""
    spec, t = golden.spec, held_rows(golden)
    h = spec.head_num
    mags = golden.magnitudes
    g = np.abs(_pick(golden.out, t, rows)).reshape(-1, h, V_DIM)
    total = _pick(mags["pv_abs"], t, rows).reshape(g.shape) + g
    m = _pick(mags["score_absmax"], t, rows)[:, :, None]
    c = _pick(mags["score_dot"], t, rows)[:, :, None]
    n = visible_keys(spec)[rows.tokens].astype(np.float64)[:, None, None]
    u = UNIT_ROUNDOFF[spec.dtype]
    u_s = U16 if scores_in_fp16(spec.dtype, spec.mask_type) else U32
    per_run = (u + U32) * g + (u + 4.0 * u_s * m + SCORE_DIM * U32 * c + (n + 1.0) * U32) * total
    bound = 2.0 * BASELINE_SAFETY * per_run
    if "pv_sub" in mags:
        flush = _pick(mags["pv_sub"], t, rows).reshape(g.shape) + np.where(g < FTZ_OUTPUT_LIMIT, g, 0.0)
        bound += BASELINE_SAFETY * flush
    result: np.ndarray = bound.reshape(len(rows.tokens), -1)
    return result


@dataclass(frozen=True)
class BaselineDrift:
    """The recomputed baseline against the stored one: elements moved, the largest move as a fraction
    of its bound, and per statistic (stored, recomputed, allowed change)."""

    moved: int
    elements: int
    worst: float  # largest |fresh - stored| / bound (inf: a move where the bound is 0, or NaN/Inf moved)
    largest: float  # largest |fresh - stored|
    stats: dict[str, tuple[object, object, float]]

    def stat_problems(self) -> list[str]:
        """Statistics that moved beyond what the baselines' difference allows."""
        return [
            f"{key} {old!r} -> {new!r} (change {_change(old, new):.3g}, allowed {allowed:.3g})"
            for key, (old, new, allowed) in sorted(self.stats.items())
            if not _change(old, new) <= allowed
        ]

    def stats_text(self) -> str:
        moved = {k: v for k, v in self.stats.items() if _change(v[0], v[1]) > 0}
        if not moved:
            return "statistics unchanged"
        parts = [
            f"{key} {_relative(old, new):.2g} relative ({_change(old, new) / allowed if allowed else 0.0:.2g} of "
            f"its allowance)"
            for key, (old, new, allowed) in sorted(moved.items())
        ]
        return "statistics moved: " + ", ".join(parts)

    def text(self) -> str:
        return (
            f"{self.moved} of {self.elements} elements moved, largest {self.largest:.3g} "
            f"({self.worst:.2g} of its rounding bound); {self.stats_text()}"
        )


def _change(old: object, new: object) -> float:
    """|new - old| for numbers (0 for equal non-finite values, inf for unequal ones or non-numbers)."""
    if isinstance(old, bool) or isinstance(new, bool) or not isinstance(old, int | float):
        return 0.0 if old == new else math.inf
    if not isinstance(new, int | float):
        return math.inf
    if old == new or (math.isnan(old) and math.isnan(new)):
        return 0.0
    if not (math.isfinite(old) and math.isfinite(new)):
        return math.inf
    return abs(float(new) - float(old))


def _relative(old: object, new: object) -> float:
    change = _change(old, new)
    return change / abs(float(old)) if isinstance(old, int | float) and old else change


def baseline_drift(stored: GoldenCase, fresh: GoldenCase) -> BaselineDrift:
    """Compare the baselines element by element against :func:`baseline_bound` (of the stored golden,
    whose magnitudes the recompute checks separately) and their statistics against
    :func:`stats_allowance`."""
    spec = stored.spec
    t = held_rows(stored)
    floor = REL_FLOOR[spec.dtype]

    def chunk(part: RowChunk) -> tuple[int, float, float, np.ndarray, int]:
        b_old, b_new = _pick(stored.baseline_out, t, part), _pick(fresh.baseline_out, t, part)
        g_old, g_new = _pick(stored.out, t, part), _pick(fresh.out, t, part)
        with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
            same = (b_old == b_new) | (np.isnan(b_old) & np.isnan(b_new))
            move = np.where(same, 0.0, np.abs(b_new - b_old))  # NaN where one side is NaN: never within
            move = np.where(np.isnan(move), np.inf, move)
            bound = baseline_bound(stored, part)
            ratio = np.where(move == 0.0, 0.0, move / bound)
            # per element: |e_new - e_old| <= d, and the relative errors' change (floor-denominators)
            dg = np.where(np.isnan(g_old) & np.isnan(g_new), 0.0, np.abs(g_new - g_old))
            d = move + dg
            den_old, den_new = np.maximum(np.abs(g_old), floor), np.maximum(np.abs(g_new), floor)
            rel_old = np.abs(b_old - g_old) / den_old
            d_rel = (d + rel_old * dg) / den_new
        valid = stored.row_valid[part.pick]
        sums = np.array([np.square(d[valid]).sum(), d_rel[valid].sum(), d[valid].max(initial=0.0)])
        sums = np.append(sums, d_rel[valid].max(initial=0.0))
        moved = int(np.count_nonzero(move))
        return moved, worst_ratio(ratio), float(move.max(initial=0.0)), sums, int(valid.sum()) * d.shape[1]

    rows = all_rows(stored)
    results = list(map_for(len(rows))(chunk, rows))
    moved = sum(r[0] for r in results)
    worst = max((r[1] for r in results), default=0.0)
    largest = max((r[2] for r in results), default=0.0)
    n = sum(r[4] for r in results)
    sq, rel_sum = sum(float(r[3][0]) for r in results), sum(float(r[3][1]) for r in results)
    d_max = max((float(r[3][2]) for r in results), default=0.0)
    d_rel_max = max((float(r[3][3]) for r in results), default=0.0)
    allowance = stats_allowance(n, d_max, d_rel_max, rel_sum, sq)
    old_stats, new_stats = stored.baseline_stats, fresh.baseline_stats
    stats: dict[str, tuple[object, object, float]] = {}
    for key in sorted(set(old_stats) | set(new_stats)):
        old, new = old_stats.get(key), new_stats.get(key)
        allowed = allowance.get(key, 0.0)
        if isinstance(old, float) and isinstance(new, float):  # each evaluation's own float64 rounding
            allowed += summation_noise(n) * max(abs(old), abs(new))
        stats[key] = (old, new, allowed)
    return BaselineDrift(moved, int(stored.baseline_out.size), worst, largest, stats)


def stats_allowance(n: int, d_max: float, d_rel_max: float, d_rel_sum: float, d_sq_sum: float) -> dict[str, float]:
    """How far each :class:`ErrorStats` may move when every element's error moves by at most d
    (relative error by at most d_rel): the maxima by the largest d, the mean relative error by the
    mean d_rel, the RMSE by the RMS of d (Minkowski); the element count not at all."""
    count = max(n, 1)
    allowance = {
        "n_elements": 0.0,
        "max_abs_err": d_max,
        "max_rel_err": d_rel_max,
        "mean_rel_err": d_rel_sum / count,
        "rmse": math.sqrt(d_sq_sum / count),
    }
    return allowance


def stats_mismatch(golden: GoldenCase) -> list[str]:
    """The golden's baseline statistics that are not what its own baseline and reference give (each
    within :func:`summation_noise`): derived data, so they are held to their arrays, not to a drift."""
    spec = golden.spec
    own = error_stats(golden.baseline_out.reshape(golden.out.shape), golden.out, golden.row_valid, spec.dtype)
    recomputed = own.to_dict()
    noise = summation_noise(own.n_elements)
    found = []
    for key in sorted(set(recomputed) | set(golden.baseline_stats)):
        kept, again = golden.baseline_stats.get(key), recomputed.get(key)
        both = [abs(float(x)) for x in (kept, again) if isinstance(x, int | float) and not isinstance(x, bool)]
        allowed = noise * max(both) if len(both) == 2 and math.isfinite(max(both)) else 0.0
        if not _change(kept, again) <= allowed:
            found.append(f"{key} {kept!r} (its arrays give {again!r})")
    return found


def summation_noise(n: int) -> float:
    """Relative float64 error between two evaluations of a statistic over ``n`` elements: the elements'
    own roundings and a sum of ``n`` non-negative terms in any order (each within gamma_n)."""
    return 2.0 * (n + 2) * EPS64
