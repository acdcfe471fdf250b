"""Checks of every output element at O(output): what a sampled golden's unjudged rows are still held to.

A sampled golden (golden/specs/sample.py) compares chosen rows with float64; the other rows are not blind:

* **finite**: every element of every valid row is finite.  The harness hands a kernel an attenOut filled
  with NaN (harness/atb.py ``output_buffer``), so a row the kernel never writes fails here.
* **within its visible V**: attention is a convex combination of the rows of V a query row sees, so every
  element lies between the minimum and the maximum of its V column over those keys (a running minimum and
  maximum along the keys: a causal row sees a prefix), widened by what the documented precision path may
  move it: P rounded to the input dtype in the numerator but not the sum (u), the output rounded (u),
  fp32 sums of the row's n keys in numerator and denominator (n u32 each), with a factor 2
  (:data:`SAFETY`), in units of the column's largest |V|.  fp16's ranges also hold 0: a device that flushes
  subnormal P (or outputs) to zero shrinks the combination toward 0 (docs/conformance.md "Flush-to-zero").
  A row read from another head, batch or offset, or garbage memory, leaves the range.

Both are exact statements about correct kernels, not statistics: a correct kernel never fails them (the zoo
shows no false alarm, tests/cover/test_sampled_judging.py).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from mlaconf.facts.operator import U32, UNIT_ROUNDOFF, V_DIM
from mlaconf.golden.specs.layout import kv_views, offsets, visible_keys
from mlaconf.golden.specs.spec import CaseSpec
from mlaconf.golden.specs.types import OpInputs
from mlaconf.judge.metrics import Element

#: Multiplies the widening of each range (the first-order rounding terms it adds up).
SAFETY = 2.0
#: Query rows per pass (bounds the gathered ranges: rows x heads x 128 float64, a few arrays).
ROWS_PER_PASS = 1024


@dataclass(frozen=True)
class WholeOutput:
    """What the checks found over every valid row: the elements checked, the non-finite ones (the first one
    located), and the largest distance outside an element's visible V range in units of its widening
    (at most 1 passes; 0 when every element lies inside the range itself) with the element it was at."""

    elements: int
    nonfinite: int
    first_nonfinite: Element | None
    outside: int
    excess: float
    worst: Element | None

    def nonfinite_note(self) -> str:
        if self.first_nonfinite is None:
            return f"{self.elements} elements of every valid row"
        return f"{self.nonfinite} of {self.elements} elements, the first at {self.first_nonfinite.text()}"

    def range_note(self) -> str:
        return f"{self.outside} of {self.elements} elements beyond their visible V range widened by rounding"


def _widening(dtype: str, keys: np.ndarray) -> np.ndarray:
    """Per row: how far past its V range a correct kernel may land, in units of the column's largest |V|."""
    u = UNIT_ROUNDOFF[dtype]
    return SAFETY * (3.0 * u + 2.0 * (keys.astype(np.float64) + 2.0) * U32)


def check_whole_output(out: np.ndarray, inputs: OpInputs, spec: CaseSpec) -> WholeOutput:
    """Both checks over every valid row of ``out`` (attenOut, any layout of ``[T, H*128]``), in float32: exact
    for the dtype's values and their ranges, and a rounding of a distance far below its widening."""
    if inputs.v.size == 0 and spec.total_kv:
        raise ValueError(f"{spec.case_id}: the whole-output checks read v: draw a sampled golden's inputs first")
    h, g = spec.head_num, spec.head_num // spec.kv_head_num
    values = out.reshape(spec.total_q, h, V_DIM)
    keys = visible_keys(spec)
    starts = offsets(spec.q_seqlen)
    found = _Found(spec)
    for b in range(spec.batch):
        q_len = spec.q_seqlen[b]
        if q_len == 0 or spec.kv_seqlen[b] == 0:
            continue
        _, _, v = kv_views(inputs, spec, b)
        for kv_head in range(spec.kv_head_num):
            column = np.asarray(v[:, kv_head], dtype=np.float32)
            low, high = np.minimum.accumulate(column, axis=0), np.maximum.accumulate(column, axis=0)
            if spec.dtype == "fp16":  # a flush to zero moves the combination toward 0
                low, high = np.minimum(low, 0.0), np.maximum(high, 0.0)
            for first in range(int(starts[b]), int(starts[b]) + q_len, ROWS_PER_PASS):
                rows = slice(first, min(first + ROWS_PER_PASS, int(starts[b]) + q_len))
                last = keys[rows] - 1
                part = np.asarray(values[rows, kv_head * g : (kv_head + 1) * g], dtype=np.float32)
                found.add(part, low[last][:, None, :], high[last][:, None, :], keys[rows], first, kv_head * g)
    return found.result()


class _Found:
    """The checks' running counts and worst elements, pass by pass."""

    def __init__(self, spec: CaseSpec) -> None:
        self.spec = spec
        self.elements = self.nonfinite = self.outside = 0
        self.first_nonfinite: Element | None = None
        self.excess = 0.0
        self.worst: Element | None = None

    def add(self, a: np.ndarray, lo: np.ndarray, hi: np.ndarray, keys: np.ndarray, token0: int, head0: int) -> None:
        """One pass: ``a`` [rows, heads, 128] (rows from token ``token0``, heads from ``head0``) against its
        ranges ``[lo, hi]`` [rows, 1, 128]; ``keys``: each row's visible keys (its widening)."""
        self.elements += a.size
        finite = np.isfinite(a)
        if not finite.all():
            self.nonfinite += int(a.size - np.count_nonzero(finite))
            if self.first_nonfinite is None:
                r, hh, c = (int(i) for i in np.unravel_index(int(np.argmin(finite)), a.shape))
                self.first_nonfinite = self._element(token0 + r, head0 + hh, c, a[r, hh, c], "nonfinite")
        with np.errstate(invalid="ignore"):
            distance = np.maximum(lo - a, a - hi)  # > 0 outside [lo, hi]; NaN where a is NaN
        if not (distance > 0.0).any():  # the common case: every element inside its range
            return
        widen = _widening(self.spec.dtype, keys)[:, None, None].astype(np.float32) * np.maximum(-lo, hi)
        with np.errstate(invalid="ignore", divide="ignore"):
            ratio = np.where(distance > 0.0, distance / np.broadcast_to(widen, a.shape), 0.0)  # NaN a: not > 0
        self.outside += int(np.count_nonzero(ratio > 1.0))
        flat = int(np.argmax(ratio))
        if ratio.flat[flat] > self.excess:
            r, hh, c = (int(i) for i in np.unravel_index(flat, a.shape))
            self.excess = float(ratio.flat[flat])
            self.worst = self._element(token0 + r, head0 + hh, c, a[r, hh, c], "v_range_excess")

    def _element(self, token: int, head: int, column: int, actual: float, metric: str) -> Element:
        """An element the checks located; no golden value is known there (expected NaN)."""
        q_seqlen = self.spec.q_seqlen
        return Element.at(int(token), head, column, q_seqlen, (math.nan, float(actual)), f"whole_output:{metric}")

    def result(self) -> WholeOutput:
        return WholeOutput(self.elements, self.nonfinite, self.first_nonfinite, self.outside, self.excess, self.worst)
