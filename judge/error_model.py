"""Per-element error bound of a correct kernel on the documented precision path (docs/operator.md §4).

docs/conformance.md ("The error-model rule") derives it; in short, for output element e = (i, h, c)
of a case with N checked elements, u the unit roundoff of the case dtype, u32 = 2^-24, u16 = 2^-11,
n_i the keys row i attends to and the float64 magnitudes of :mod:`mlaconf.golden.building.magnitudes`
(A, R, S, T per element; M, C, rho per row):

    bound_e = F * ( u |g|                                          output rounded to the dtype
                  + u min(lam (R + rho |g|), A + |g|)              P rounded to the input dtype
                  + u_s min(lam S, 4 M (A + |g|))                  score roundings, each <= u_s w_ij
                  + lam sqrt(192) u32 C min(lam (R + rho |g|), A + |g|)   fp32 Q.K accumulation
                  + |eps| |T|                                      qkScale rounded to fp16 (systematic)
                  + min(lam sqrt(n_i), n_i) u32 (A + |g|) + u32 |g| )     fp32 P.V and row sums, divide

with u_s = u16 and eps = fp16(qkScale)/qkScale - 1 on the fp16 maskType 0/2 path (scores stored
and scaled in fp16), else u_s = u32 and eps = 0; off that path S and T are not stored and the
score term is its cap u32 4 M (A + |g|).  The random terms are Hoeffding bounds of sums of
independent bounded rounding errors, each capped by the term's worst case (every rounding aligned,
which short rows reach first); lam = sqrt(2 ln(2 K N / alpha)) makes the chance that any
of the K = 4 random terms of any of the N elements exceeds its bound at most alpha (the
``false_alarm`` parameter).  F (``safety``) covers what the first-order model leaves out.

On fp16 cases the bound adds (inside F) the exact worst case of a device that flushes subnormal fp16
values to zero: D (every key whose P is subnormal dropped) plus |g| where |g| < 2^-13 (an output
flushed to 0); docs/conformance.md "Flush-to-zero" gives the reasons.

The rule's statistic is ``max_e |a_e - g_e| / bound_e`` over checked elements (NaN/Inf -> inf).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from mlaconf.facts.operator import SCORE_DIM, U16, U32, UNIT_ROUNDOFF, V_DIM, scores_in_fp16
from mlaconf.facts.processes import map_for
from mlaconf.golden.building.chunks import RowChunk, row_chunks
from mlaconf.golden.specs.layout import visible_keys
from mlaconf.golden.specs.spec import CaseSpec
from mlaconf.golden.specs.types import ROW_MAGNITUDES, element_magnitudes
from mlaconf.judge.metrics import Element

#: Random (Hoeffding) terms per element; the union bound spreads ``false_alarm`` over them.
RANDOM_TERMS = 4
#: An fp16 output whose |g| is below this may come out 0 on a flush-to-zero device (twice the smallest
#: normal 2^-14, so a computed value that rounding moved below it is covered).
FTZ_OUTPUT_LIMIT = 2.0**-13


def scale_cast_error(spec: CaseSpec) -> float:
    """Relative error of qkScale applied in fp16 on the fp16 score path (fp16 with maskType 0/2, which
    stores and scales scores in fp16: docs/operator.md §4), else 0."""
    if not scores_in_fp16(spec.dtype, spec.mask_type):
        return 0.0
    scale = float(np.float32(spec.qk_scale))
    return float(np.float16(scale)) / scale - 1.0


@dataclass(frozen=True)
class ModelResult:
    """The rule's outcome on one output: the largest error/bound ratio and where it is."""

    max_ratio: float
    n_elements: int
    n_over: int
    lam: float
    #: The element of the largest ratio, with its error and its bound.
    element: Element | None
    terms: dict[str, float]

    @property
    def where(self) -> str:
        """The element of the largest ratio in one line."""
        return self.element.text() if self.element is not None else "no element checked"


#: A chunk's largest ratio: the ratio, token, head, column, golden, actual, bound and the bound's terms.
_Worst = tuple[float, int, int, int, float, float, float, dict[str, float]]


def model_ratio(
    actual: np.ndarray,
    golden: np.ndarray,
    row_valid: np.ndarray,
    magnitudes: Mapping[str, np.ndarray],
    spec: CaseSpec,
    *,
    false_alarm: float,
    safety: float,
    cells: np.ndarray | None = None,
    token_rows: np.ndarray | None = None,
) -> ModelResult:
    """max |actual - golden| / bound over valid rows; ``actual``/``golden`` in any layout of [T, H*128].
    ``cells`` (a [T, H] float array), when given, receives each valid (token, head)'s largest
    ratio: the rule's slack per cell, for the report's error map.  ``token_rows``: the token of each row
    when the arrays (magnitudes included) hold a sample of rows."""
    t, h = row_valid.shape[0], spec.head_num
    shape = (t, h, V_DIM)
    a_all = actual.reshape(shape)
    g_all = golden.reshape(shape)
    elem = {n: magnitudes[n].reshape(shape) for n in element_magnitudes(spec)}
    rows = {n: magnitudes[n].reshape(t, h) for n in ROW_MAGNITUDES}
    keys = visible_keys(spec)
    chunks = row_chunks(row_valid, h * V_DIM, token_rows)
    n_elements = sum(chunk.tokens.size for chunk in chunks) * h * V_DIM
    # lam with 2 exp(-lam^2 / 2) * RANDOM_TERMS * n_elements = false_alarm (Hoeffding + union bound)
    lam = math.sqrt(2.0 * math.log(2.0 * RANDOM_TERMS * max(n_elements, 1) / false_alarm))
    u = UNIT_ROUNDOFF[spec.dtype]
    u_s = U16 if scores_in_fp16(spec.dtype, spec.mask_type) else U32
    eps = abs(scale_cast_error(spec))

    def chunk_ratio(chunk: RowChunk) -> tuple[int, _Worst]:
        """The chunk's count over 1 and its largest ratio (the first of equal ones), with its terms."""
        tok, pick = chunk.tokens, chunk.pick
        a = a_all[pick].astype(np.float64)
        g = np.asarray(g_all[pick], dtype=np.float64)
        ag = np.abs(g)
        rho = rows["p_rss"][pick].astype(np.float64)[:, :, None]
        absmax = rows["score_absmax"][pick].astype(np.float64)[:, :, None]
        spread = elem["pv_rss"][pick].astype(np.float64) + rho * ag  # >= ||P o (V - g)||_2
        total = elem["pv_abs"][pick].astype(np.float64) + ag  # >= sum_j P |V - g|: the worst case
        # a random term never exceeds its worst case (all roundings aligned): min(lam * 2-norm, 1-norm)
        p_terms = np.minimum(lam * spread, total)
        dot = (lam * math.sqrt(SCORE_DIM) * U32) * rows["score_dot"][pick].astype(np.float64)[:, :, None]
        n = keys[tok].astype(np.float64)[:, None, None]
        score_cap = 4.0 * absmax * total
        terms: dict[str, np.ndarray | float] = {
            "output": u * ag,
            "p_round": u * p_terms,
            "score_round": u_s
            * (
                score_cap
                if "pvs_rss" not in elem
                else np.minimum(lam * elem["pvs_rss"][pick].astype(np.float64), score_cap)
            ),
            "qk_accum": dot * p_terms,
            "scale_cast": eps * np.abs(elem["pv_scale"][pick].astype(np.float64)) if eps else 0.0,
            "pv_accum": U32 * np.minimum(lam * np.sqrt(n), n) * total + U32 * ag,
        }
        if "pv_sub" in elem:  # exact; inside F too, so a flushing device uses at most half the bound
            terms["flush_to_zero"] = elem["pv_sub"][pick].astype(np.float64) + np.where(ag < FTZ_OUTPUT_LIMIT, ag, 0.0)
        bound = np.zeros_like(ag)
        for term in terms.values():
            bound += term
        bound *= safety
        with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
            err = np.abs(a - g)  # NaN for a NaN output, inf for an infinite one
            ratio = err / bound  # err > 0 over a zero bound: inf
        ratio[err == 0.0] = 0.0  # including 0 / 0
        ratio[np.isnan(ratio)] = np.inf
        if cells is not None:  # the chunks' rows are disjoint
            cells[tok] = ratio.max(axis=2)
        flat = int(np.argmax(ratio))
        r, hh, c = (int(i) for i in np.unravel_index(flat, ratio.shape))
        parts = {k: safety * float(np.broadcast_to(v, ratio.shape)[r, hh, c]) for k, v in terms.items()}
        value = float(ratio.flat[flat])
        worst = (value, int(tok[r]), hh, c, float(g[r, hh, c]), float(a[r, hh, c]), float(bound[r, hh, c]), parts)
        return int(np.count_nonzero(ratio > 1.0)), worst

    n_over = 0
    worst: _Worst | None = None
    for over, candidate in map_for(len(chunks))(chunk_ratio, chunks):
        n_over += over
        if worst is None or candidate[0] > worst[0]:
            worst = candidate
    if worst is None:
        return ModelResult(0.0, 0, 0, lam, None, {})
    best, token, head, col, g0, a0, b0, parts = worst
    element = Element.at(token, head, col, spec.q_seqlen, (g0, a0), "model:max_err_over_bound", b0)
    return ModelResult(best, n_elements, n_over, lam, element, parts)
