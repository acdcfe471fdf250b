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
from typing import Any

import numpy as np

from mlaconf.facts.operator import SCORE_DIM, U16, U32, UNIT_ROUNDOFF, V_DIM, scores_in_fp16
from mlaconf.facts.processes import map_for
from mlaconf.golden.building.chunks import row_chunks
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


class ModelBound:
    """The golden's side of the rule, the same for every output judged against it: the checked row chunks,
    ``lam`` and each chunk's per-element bound.  ``keep``: hold each chunk's golden rows and bound once made
    (memory as large as the golden, for a golden judged many times: power's subjects); else each is made when
    asked, one chunk at a time.  ``token_rows``: the token of each row when the arrays (magnitudes included) hold a
    sample of rows.  :meth:`ratio` judges one output."""

    def __init__(
        self,
        golden: np.ndarray,
        row_valid: np.ndarray,
        magnitudes: Mapping[str, np.ndarray],
        spec: CaseSpec,
        *,
        false_alarm: float,
        safety: float,
        token_rows: np.ndarray | None = None,
        keep: bool = False,
    ) -> None:
        self.rows, self.heads = row_valid.shape[0], spec.head_num
        shape = (self.rows, self.heads, V_DIM)
        self.spec, self.safety, self.keep = spec, safety, keep
        self._golden = golden.reshape(shape)
        self._element = {n: magnitudes[n].reshape(shape) for n in element_magnitudes(spec)}
        self._row = {n: magnitudes[n].reshape(self.rows, self.heads) for n in ROW_MAGNITUDES}
        self._keys = visible_keys(spec)
        self.chunks = row_chunks(row_valid, self.heads * V_DIM, token_rows)
        self.n_elements = sum(chunk.tokens.size for chunk in self.chunks) * self.heads * V_DIM
        # lam with 2 exp(-lam^2 / 2) * RANDOM_TERMS * n_elements = false_alarm (Hoeffding + union bound)
        self.lam = math.sqrt(2.0 * math.log(2.0 * RANDOM_TERMS * max(self.n_elements, 1) / false_alarm))
        self._made: dict[int, tuple[np.ndarray, np.ndarray]] = {}

    def _terms(self, pick: slice | np.ndarray, tok: np.ndarray, heads: slice, cols: slice) -> dict[str, Any]:
        """The bound's terms (before ``safety``) of rows ``pick`` (tokens ``tok``), ``heads`` and ``cols``."""
        spec, lam, elem = self.spec, self.lam, self._element

        def element(name: str) -> np.ndarray:
            return elem[name][pick][:, heads, cols].astype(np.float64)

        def row(name: str) -> np.ndarray:  # a row's quantity, broadcast over its columns
            return self._row[name][pick][:, heads].astype(np.float64)[:, :, None]

        u = UNIT_ROUNDOFF[spec.dtype]
        u_s = U16 if scores_in_fp16(spec.dtype, spec.mask_type) else U32
        eps = abs(scale_cast_error(spec))
        ag = np.abs(np.asarray(self._golden[pick][:, heads, cols], dtype=np.float64))
        spread = element("pv_rss") + row("p_rss") * ag  # >= ||P o (V - g)||_2
        total = element("pv_abs") + ag  # >= sum_j P |V - g|: the worst case
        # a random term never exceeds its worst case (all roundings aligned): min(lam * 2-norm, 1-norm)
        p_terms = np.minimum(lam * spread, total)
        dot = (lam * math.sqrt(SCORE_DIM) * U32) * row("score_dot")
        n = self._keys[tok].astype(np.float64)[:, None, None]
        score_cap = 4.0 * row("score_absmax") * total
        found: dict[str, Any] = {
            "output": u * ag,
            "p_round": u * p_terms,
            "score_round": u_s
            * (score_cap if "pvs_rss" not in elem else np.minimum(lam * element("pvs_rss"), score_cap)),
            "qk_accum": dot * p_terms,
            "scale_cast": eps * np.abs(element("pv_scale")) if eps else 0.0,
            "pv_accum": U32 * np.minimum(lam * np.sqrt(n), n) * total + U32 * ag,
        }
        if "pv_sub" in elem:  # exact; inside F too, so a flushing device uses at most half the bound
            found["flush_to_zero"] = element("pv_sub") + np.where(ag < FTZ_OUTPUT_LIMIT, ag, 0.0)
        return found

    def chunk(self, index: int) -> tuple[np.ndarray, np.ndarray]:
        """Chunk ``index``'s golden rows (float64, ``[rows, H, 128]``) and the bound of each element."""
        made = self._made.get(index)
        if made is None:
            chunk = self.chunks[index]
            golden = np.asarray(self._golden[chunk.pick], dtype=np.float64)
            bound = np.zeros_like(golden)
            for term in self._terms(chunk.pick, chunk.tokens, slice(None), slice(None)).values():
                bound += term
            bound *= self.safety
            made = (golden, bound)
            if self.keep:
                self._made[index] = made
        return made

    def terms_at(self, index: int, where: tuple[int, int, int]) -> dict[str, float]:
        """The terms (times ``safety``) of one element of chunk ``index``, by the same operations on it alone:
        the same values as in the chunk's bound."""
        chunk, (r, h, c) = self.chunks[index], where
        pick = np.arange(self.rows)[chunk.pick][r : r + 1]
        found = self._terms(pick, chunk.tokens[r : r + 1], slice(h, h + 1), slice(c, c + 1))
        return {k: self.safety * float(np.broadcast_to(v, (1, 1, 1))[0, 0, 0]) for k, v in found.items()}

    def ratio(self, actual: np.ndarray, cells: np.ndarray | None = None) -> ModelResult:
        """max |actual - golden| / bound over the valid rows, ``actual`` in any layout of [T, H*128].  ``cells`` (a
        [T, H] float array), when given, receives each valid (token, head)'s largest ratio: the rule's slack per
        cell, for the report's error map."""
        a_all = actual.reshape(self.rows, self.heads, V_DIM)

        def chunk_ratio(index: int) -> tuple[int, _Worst]:
            """The chunk's count over 1 and its largest ratio (the first of equal ones), with its terms."""
            chunk, (g, limit) = self.chunks[index], self.chunk(index)
            a = a_all[chunk.pick].astype(np.float64)
            with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
                err = np.abs(a - g)  # NaN for a NaN output, inf for an infinite one
                ratio = err / limit  # err > 0 over a zero bound: inf
            ratio[err == 0.0] = 0.0  # including 0 / 0
            ratio[np.isnan(ratio)] = np.inf
            if cells is not None:  # the chunks' rows are disjoint
                cells[chunk.tokens] = ratio.max(axis=2)
            flat = int(np.argmax(ratio))
            r, h, c = (int(i) for i in np.unravel_index(flat, ratio.shape))
            at = (float(g[r, h, c]), float(a[r, h, c]), float(limit[r, h, c]))
            worst = (float(ratio.flat[flat]), int(chunk.tokens[r]), h, c, *at, self.terms_at(index, (r, h, c)))
            return int(np.count_nonzero(ratio > 1.0)), worst

        n_over = 0
        worst: _Worst | None = None
        for over, candidate in map_for(len(self.chunks))(chunk_ratio, range(len(self.chunks))):
            n_over += over
            if worst is None or candidate[0] > worst[0]:
                worst = candidate
        if worst is None:
            return ModelResult(0.0, 0, 0, self.lam, None, {})
        best, token, head, col, g0, a0, b0, parts = worst
        element = Element.at(token, head, col, self.spec.q_seqlen, (g0, a0), "model:max_err_over_bound", b0)
        return ModelResult(best, self.n_elements, n_over, self.lam, element, parts)
