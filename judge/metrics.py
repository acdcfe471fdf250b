"""Error metrics of a backend's output against the float64 golden, on valid rows only (the verdict's evidence).

Everything is computed in float64, vectorised, and in row chunks (:mod:`mlaconf.golden.building.chunks`) so
that temporaries stay bounded and in cache for outputs of hundreds of millions of elements.
Definitions (``a`` = actual, ``g`` = golden, both over the valid rows; ``u`` = unit roundoff of the
output dtype):

* relative error ``|a - g| / max(|g|, floor)`` with the small-value floor of the msprobe/ATB
  benchmark standard, ``2**-11`` (fp16) and ``2**-8`` (bf16), so near-zero goldens do not blow up;
* ``eb_rel`` (error balance) ``= Σ(a - g) / max(Σ|g|, n*floor)``: a signed bias relative to the
  mean magnitude; ``mean_signed_err = Σ(a - g) / n`` is the same bias in output units;
* ULP error: the distance, counted in representable values of the output dtype, between ``a``
  rounded to the dtype and ``g`` correctly rounded to the dtype (bit patterns mapped to an ordered
  integer line, so ``+0 == -0`` and a sign crossing counts the values in between);
* ``atb_max_scaled_err = max |a - g| / max(1, |g|)``: the quantity ATB's rule bounds by ``e``
  (docs/operator.md §5); the element that maximises it is :attr:`Metrics.worst`.

A non-finite element in ``a`` (or in ``g``) has infinite error, so every error metric becomes
``inf`` and cosine becomes ``nan``: a NaN/Inf never yields a passing-looking number.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field, fields
from typing import Any, NamedTuple

import ml_dtypes
import numpy as np

from mlaconf.facts.processes import map_for
from mlaconf.golden.building.chunks import RowChunk, row_chunks
from mlaconf.golden.building.stats import REL_FLOOR, ErrorSums

#: Relative-error threshold of the "thousandth" rules (fp16 0.1%, bf16 0.4%).
THOUSANDTH = {"fp16": 0.001, "bf16": 0.004}


@dataclass(frozen=True)
class Location:
    """Where one element of a ``[T, H, D]`` output lives, in the case's terms."""

    batch: int
    row_in_batch: int
    token: int
    head: int
    column: int


@dataclass(frozen=True)
class Element:
    """The one output element a verdict names, in the judge's terms: the element furthest beyond its bound
    by the worst deciding check that bounds single elements (the failure text, the record's
    ``worst_element``, the report page and ``mlaconf repro`` all say it in :meth:`text`'s words).  Where it
    is, the golden and the backend's value (``expected``, ``actual``), its error ``|actual - golden|``
    (infinite for a NaN/Inf output), its own bound in the same units (NaN: the policy bounds no single
    element), and the measure that picked it (``located_by``: a check's ``rule:metric``, or
    ``metric:atb_max_scaled_err`` for the metrics' largest scaled error)."""

    batch: int
    row_in_batch: int
    token: int
    head: int
    column: int
    expected: float
    actual: float
    located_by: str
    error: float = math.nan
    bound: float = math.nan

    @classmethod
    def at(
        cls,
        token: int,
        head: int,
        column: int,
        q_seqlen: Sequence[int],
        values: tuple[float, float],
        by: str,
        bound: float = math.nan,
    ) -> Element:
        """The element at a ``[T, H, D]`` index, located in the case's batches; ``values`` is (golden, output)."""
        expected, actual = (float(v) for v in values)
        error = abs(actual - expected) if math.isfinite(actual) and math.isfinite(expected) else math.inf
        loc = locate(token, head, column, q_seqlen)
        return cls(loc.batch, loc.row_in_batch, token, head, column, expected, actual, by, error, float(bound))

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Element:
        """A record's ``worst_element`` back (one from before ``error`` and ``bound``: those NaN)."""
        return cls(**{f.name: data[f.name] for f in fields(cls) if f.name in data})

    def text(self) -> str:
        """The element in one line: the failure text's, the page's and the repro's words."""
        bound = f"bound {self.bound:.6g}" if math.isfinite(self.bound) else "no elementwise bound"
        return (
            f"batch {self.batch} row {self.row_in_batch} (token {self.token}) head {self.head} col {self.column}: "
            f"golden {self.expected:.6g}, got {self.actual:.6g}, error {self.error:.6g}, {bound} "
            f"(by {self.located_by})"
        )

    def to_dict(self) -> dict[str, Any]:
        """The record's ``worst_element``: the fields and their one line (``text``), which readers print as is."""
        return {**asdict(self), "text": self.text()}


@dataclass(frozen=True)
class Metrics:
    """Error statistics of one output; every field is a plain float, int, bool or str.

    ``worst`` is the element of largest ATB-scaled error (None when nothing was checked): the atb rule's
    element, and the one a verdict names when no deciding check bounds single elements; it is no metric
    (not in :meth:`to_dict`), so a record names one element, its ``worst_element``.
    """

    dtype: str
    n_elements: int
    n_rows: int
    max_abs_err: float
    max_rel_err: float
    mean_rel_err: float
    rmse: float
    eb_rel: float
    mean_signed_err: float
    cosine: float
    max_ulp_err: float
    frac_beyond_thousandth: float
    atb_max_scaled_err: float
    max_abs_expected: float
    rms_expected: float
    nan_count: int
    inf_count: int
    expected_nan_count: int
    expected_inf_count: int
    nan_positions_match: bool
    inf_positions_match: bool
    worst: Element | None = field(default=None, compare=False, repr=False)

    @property
    def finite(self) -> bool:
        """No NaN or Inf in the checked actual values."""
        return self.nan_count == 0 and self.inf_count == 0

    def to_dict(self) -> dict[str, float | int | bool | str]:
        """JSON- and HDF5-attribute-friendly copy (plain Python scalars only; the element is not a metric)."""
        return {f.name: getattr(self, f.name) for f in fields(self) if f.name != "worst"}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Metrics:
        """Inverse of :meth:`to_dict`; accepts numpy scalars (as read back from HDF5 attributes)."""
        kwargs: dict[str, Any] = {}
        for f in fields(cls):
            if f.name not in data or f.name == "worst":
                continue
            value = data[f.name]
            value = value.item() if isinstance(value, np.generic) else value
            if isinstance(value, bytes):
                value = value.decode()
            kwargs[f.name] = value
        return cls(**kwargs)


def locate(token: int, head: int, column: int, q_seqlen: Sequence[int]) -> Location:
    """Map a ``[T, H, D]`` index to its batch and row in batch (batch b starts at Σ q_seqlen[:b])."""
    starts = np.cumsum([0, *q_seqlen])
    if not 0 <= token < starts[-1]:
        raise IndexError(f"token row {token} outside [0, {int(starts[-1])})")
    batch = int(np.searchsorted(starts, token, side="right")) - 1
    return Location(batch, token - int(starts[batch]), token, head, column)


def round_to_dtype(values: np.ndarray, dtype: str) -> np.ndarray:
    """Correctly round float64 values to the output dtype (single rounding).

    numpy rounds float64 -> float16 directly, but ml_dtypes goes float64 -> float32 -> bfloat16
    and so double-rounds; for bf16 we round to float32 *to odd* first, which makes the second
    rounding exact (float32 keeps more than two extra bits).
    """
    if dtype not in REL_FLOOR:
        raise ValueError(f"dtype must be 'fp16' or 'bf16', got {dtype!r}")
    x = np.asarray(values, dtype=np.float64)
    with np.errstate(over="ignore", invalid="ignore"):  # out of range -> inf, as intended
        if dtype == "fp16":
            return x.astype(np.float16)
        f32 = x.astype(np.float32)
        bits = f32.view(np.uint32).copy()
        inexact = np.isfinite(x) & (f32.astype(np.float64) != x)
        bits[inexact & (np.abs(f32) > np.abs(x))] -= 1  # truncate toward zero
    bits[inexact] |= 1  # then mark "inexact" in the last bit: round to odd
    rounded: np.ndarray = bits.view(np.float32).astype(ml_dtypes.bfloat16)
    return rounded


def ordered_bits(values: np.ndarray) -> np.ndarray:
    """Map 16-bit floats to integers that count representable values (``+0`` and ``-0`` -> 0)."""
    bits = values.view(np.uint16).astype(np.int32)
    magnitude = bits & 0x7FFF
    return np.where(bits & 0x8000, -magnitude, magnitude)


#: Exponent field of a 16-bit float (all ones: Inf or NaN).
EXPONENT_BITS = {"fp16": 0x7C00, "bf16": 0x7F80}


def bits16_finite(values: np.ndarray, dtype: str) -> np.ndarray:
    """Bit patterns of finite float64 ``values`` correctly rounded to the dtype (as :func:`round_to_dtype`).

    bf16: round to float32 *to odd*, then to nearest-even on the bit pattern with integers (exact
    for finite values, several times faster than ml_dtypes' cast); overflow gives Inf's pattern.
    """
    if dtype == "fp16":
        with np.errstate(over="ignore"):
            return values.astype(np.float16).view(np.uint16)
    with np.errstate(over="ignore"):
        f32 = values.astype(np.float32)
    bits = f32.view(np.uint32)
    back = f32.astype(np.float64)
    inexact = back != values
    bits -= (inexact & (np.abs(back) > np.abs(values))).view(np.uint8).astype(np.uint32)  # toward zero
    bits |= inexact.view(np.uint8).astype(np.uint32)  # round to odd
    bits += 0x7FFF + ((bits >> 16) & 1)  # then to nearest even on the upper half
    return (bits >> 16).astype(np.uint16)


def ulp_distance(actual: np.ndarray, expected: np.ndarray, dtype: str) -> np.ndarray:
    """Elementwise distance in dtype ULPs between ``actual`` and ``expected`` rounded to the dtype.

    Returned as float64 with ``inf`` wherever either side is NaN or Inf.
    """
    a = round_to_dtype(np.asarray(actual, dtype=np.float64), dtype)
    e = round_to_dtype(np.asarray(expected, dtype=np.float64), dtype)
    dist = np.abs(ordered_bits(a) - ordered_bits(e)).astype(np.float64)
    finite = np.isfinite(a.astype(np.float64)) & np.isfinite(e.astype(np.float64))
    return np.where(finite, dist, np.inf)


class WorstElement(NamedTuple):
    """The element of largest ATB-scaled error in a chunk (or over chunks): its error and where it is."""

    scaled_error: float
    token: int
    head: int
    column: int
    expected: float
    actual: float


#: Before any element was checked: no worst element yet.
NO_ELEMENT = WorstElement(-1.0, -1, -1, -1, math.nan, math.nan)


@dataclass
class _ChunkSums:
    """Sums and maxima of valid rows: one per chunk (:meth:`_Comparison.chunk_sums`), folded in chunk order
    into the total (:meth:`fold`).  ``errors`` are the baseline's statistics' sums
    (:class:`~mlaconf.golden.building.stats.ErrorSums`, the same floats as
    :func:`~mlaconf.golden.building.stats.error_stats`)."""

    errors: ErrorSums = field(default_factory=ErrorSums)
    max_ulp: float = 0.0
    max_scaled: float = 0.0
    max_abs_expected: float = 0.0
    sum_signed: float = 0.0
    sum_abs_e: float = 0.0
    sum_sq_e: float = 0.0
    sum_sq_a: float = 0.0
    dot: float = 0.0
    beyond: int = 0
    nan: int = 0
    inf: int = 0
    e_nan: int = 0
    e_inf: int = 0
    nan_match: bool = True
    inf_match: bool = True
    worst: WorstElement = NO_ELEMENT

    def fold(self, part: _ChunkSums) -> None:
        """Add a later chunk's sums: the same numbers as summing its chunk here."""
        self.errors.fold(part.errors)
        self.max_ulp = max(self.max_ulp, part.max_ulp)
        self.max_scaled = max(self.max_scaled, part.max_scaled)
        self.max_abs_expected = max(self.max_abs_expected, part.max_abs_expected)
        self.sum_signed += part.sum_signed
        self.sum_abs_e += part.sum_abs_e
        self.sum_sq_e += part.sum_sq_e
        self.sum_sq_a += part.sum_sq_a
        self.dot += part.dot
        self.beyond += part.beyond
        self.nan += part.nan
        self.inf += part.inf
        self.e_nan += part.e_nan
        self.e_inf += part.e_inf
        self.nan_match &= part.nan_match
        self.inf_match &= part.inf_match
        if part.worst.scaled_error > self.worst.scaled_error:  # strictly: the first of equal errors stays
            self.worst = part.worst


@dataclass(frozen=True)
class _Comparison:
    """An output and its float64 golden, compared one row chunk at a time (:meth:`chunk_sums`)."""

    actual: np.ndarray
    expected: np.ndarray
    dtype: str

    def chunk_sums(self, chunk: RowChunk) -> _ChunkSums:
        """One chunk's sums: the signed sums and the ULP distance (a chunk without NaN/Inf takes fewer passes;
        an overflowing sum only costs speed: it takes the NaN/Inf path, which is exact), then what both
        paths take from ``|a - g|`` (inf where either side is NaN/Inf) and ``|g|`` (NaN/Inf cleaned to 0)."""
        part = self.actual[chunk.pick]
        with np.errstate(over="ignore"):
            a, g = np.asarray(part, dtype=np.float64), np.asarray(self.expected[chunk.pick], dtype=np.float64)
            if np.isfinite(a.sum()) and np.isfinite(g.sum()):
                sums, err, abs_g = self._finite_terms(part, a, g)
            else:
                sums, err, abs_g = self._nonfinite_terms(a, g)
            self._error_terms(sums, err, abs_g, chunk, a, g)
        return sums

    def _finite_terms(
        self, part: np.ndarray, a: np.ndarray, g: np.ndarray
    ) -> tuple[_ChunkSums, np.ndarray, np.ndarray]:
        """Signed sums and ULP distance of a chunk without NaN/Inf; ``|a - g|`` and ``|g|``."""
        sums = _ChunkSums()
        diff = a - g
        sums.sum_signed = float(diff.sum())
        err = np.abs(diff, out=diff)
        abs_g = np.abs(g)
        sums.dot = float((a * g).sum())
        sums.sum_sq_a = float(np.square(a).sum())
        own = np.dtype(np.float16) if self.dtype == "fp16" else np.dtype(ml_dtypes.bfloat16)
        a_bits = part.view(np.uint16) if part.dtype == own else bits16_finite(a, self.dtype)
        e_bits = bits16_finite(g, self.dtype)
        inf_bits = EXPONENT_BITS[self.dtype]
        if ((a_bits & inf_bits) == inf_bits).any() or ((e_bits & inf_bits) == inf_bits).any():
            sums.max_ulp = float(ulp_distance(a, g, self.dtype).max())  # overflow to Inf: the general path
        else:
            sums.max_ulp = float(np.abs(ordered_bits(a_bits) - ordered_bits(e_bits)).max())
        return sums, err, abs_g

    def _nonfinite_terms(self, a: np.ndarray, g: np.ndarray) -> tuple[_ChunkSums, np.ndarray, np.ndarray]:
        """A chunk with NaN/Inf on either side: their counts and whether their positions match, signed
        sums and ULP distance with the bad elements infinite; ``|a - g|`` and ``|g|``."""
        sums = _ChunkSums()
        a_nan, g_nan = np.isnan(a), np.isnan(g)
        a_inf, g_inf = np.isinf(a), np.isinf(g)
        sums.nan, sums.inf = int(a_nan.sum()), int(a_inf.sum())
        sums.e_nan, sums.e_inf = int(g_nan.sum()), int(g_inf.sum())
        sums.nan_match = bool(np.array_equal(a_nan, g_nan))
        sums.inf_match = bool(np.array_equal(np.isposinf(a), np.isposinf(g)))
        sums.inf_match &= bool(np.array_equal(np.isneginf(a), np.isneginf(g)))
        bad = a_nan | g_nan | a_inf | g_inf
        with np.errstate(invalid="ignore", over="ignore"):
            diff = np.where(bad, np.inf, a - g)
            err = np.abs(diff)
            abs_g = np.abs(np.where(bad, 0.0, g))
            sums.sum_signed = float(diff.sum())
            sums.dot = float(np.where(bad, np.nan, a * g).sum())
        sums.sum_sq_a = float(np.square(np.where(bad, 0.0, a)).sum())
        sums.max_ulp = float(ulp_distance(a, g, self.dtype).max())
        return sums, err, abs_g

    def _error_terms(
        self, sums: _ChunkSums, err: np.ndarray, abs_g: np.ndarray, chunk: RowChunk, a: np.ndarray, g: np.ndarray
    ) -> None:
        """What both paths sum from the errors: the baseline's five sums, the elements beyond a thousandth,
        the golden's magnitudes and the element of largest scaled error."""
        rel = err / np.maximum(abs_g, REL_FLOOR[self.dtype])
        scaled = err / np.maximum(abs_g, 1.0)
        sums.errors = ErrorSums.of(err, rel)
        sums.beyond = int(np.count_nonzero(rel > THOUSANDTH[self.dtype]))
        sums.sum_abs_e = float(abs_g.sum())
        sums.sum_sq_e = float(np.square(abs_g).sum())
        sums.max_abs_expected = float(abs_g.max())
        flat = int(np.argmax(scaled))
        sums.max_scaled = value = float(scaled.flat[flat])
        row, head, col = (int(i) for i in np.unravel_index(flat, scaled.shape))
        sums.worst = WorstElement(
            value, int(chunk.tokens[row]), head, col, float(g[row, head, col]), float(a[row, head, col])
        )


def compute_metrics(
    actual: np.ndarray,
    expected: np.ndarray,
    row_valid: np.ndarray,
    dtype: str,
    q_seqlen: Sequence[int],
    token_rows: np.ndarray | None = None,
) -> Metrics:
    """Compare ``actual`` (any float dtype, ``[T, H, D]``) with the float64 golden on valid rows.

    ``row_valid`` (bool ``[T]``) drops rows of zero-length batches; ``q_seqlen`` locates the worst
    element; ``token_rows``: the token of each row when the arrays hold a sample of rows ``[n, H, D]``.
    Rows are processed in chunks (:func:`mlaconf.golden.building.chunks.row_chunks`)."""
    row_valid = _checked_rows(actual, expected, row_valid, dtype, q_seqlen, token_rows)
    total = _ChunkSums()
    chunks = row_chunks(row_valid, actual.shape[1] * actual.shape[2], token_rows)
    for part in map_for(len(chunks))(_Comparison(actual, expected, dtype).chunk_sums, chunks):
        total.fold(part)
    return _metrics_of(total, dtype, int(np.count_nonzero(row_valid)), q_seqlen)


def _checked_rows(
    actual: np.ndarray,
    expected: np.ndarray,
    row_valid: np.ndarray,
    dtype: str,
    q_seqlen: Sequence[int],
    token_rows: np.ndarray | None,
) -> np.ndarray:
    """``row_valid`` as booleans, once the dtype and every shape agree (else ValueError)."""
    if dtype not in REL_FLOOR:
        raise ValueError(f"dtype must be 'fp16' or 'bf16', got {dtype!r}")
    if actual.shape != expected.shape or actual.ndim != 3:
        raise ValueError(f"actual {actual.shape} and expected {expected.shape} must both be [T, H, D]")
    row_valid = np.asarray(row_valid, dtype=bool)
    if row_valid.shape != (actual.shape[0],):
        raise ValueError(f"row_valid has shape {row_valid.shape}, expected ({actual.shape[0]},)")
    if token_rows is not None:
        if token_rows.shape != (actual.shape[0],) or (token_rows.size and token_rows.max() >= sum(q_seqlen)):
            raise ValueError(f"token_rows must name a token of the {sum(q_seqlen)} for each of {actual.shape[0]} rows")
    elif sum(q_seqlen) != actual.shape[0]:
        raise ValueError(f"sum(q_seqlen) = {sum(q_seqlen)} differs from the {actual.shape[0]} output rows")
    return row_valid


def _cosine(total: _ChunkSums) -> float:
    """Cosine similarity of output and golden: NaN when a NaN/Inf made the dot product so, 1 when both are 0."""
    denom = np.sqrt(total.sum_sq_a) * np.sqrt(total.sum_sq_e)
    if not np.isfinite(total.dot):
        return float("nan")
    if denom == 0.0:
        return 1.0 if total.sum_sq_a == total.sum_sq_e else 0.0  # both zero: identical
    return float(total.dot / denom)


def _worst_of(worst: WorstElement, q_seqlen: Sequence[int]) -> Element | None:
    """The element of largest scaled error (None when nothing was checked)."""
    if worst.token < 0:
        return None
    values = (worst.expected, worst.actual)
    return Element.at(worst.token, worst.head, worst.column, q_seqlen, values, "metric:atb_max_scaled_err")


def _metrics_of(total: _ChunkSums, dtype: str, n_rows: int, q_seqlen: Sequence[int]) -> Metrics:
    """The metrics the folded sums give: means over the elements checked (1 when none was)."""
    errors, n = total.errors, max(total.errors.n, 1)
    stats = errors.stats()
    return Metrics(
        dtype=dtype,
        n_elements=errors.n,
        n_rows=n_rows,
        max_abs_err=errors.max_abs,
        max_rel_err=errors.max_rel,
        mean_rel_err=stats.mean_rel_err,
        rmse=stats.rmse,
        eb_rel=total.sum_signed / max(total.sum_abs_e, n * REL_FLOOR[dtype]),
        mean_signed_err=total.sum_signed / n,
        cosine=_cosine(total),
        max_ulp_err=total.max_ulp,
        frac_beyond_thousandth=total.beyond / n,
        atb_max_scaled_err=total.max_scaled,
        max_abs_expected=total.max_abs_expected,
        rms_expected=float(np.sqrt(total.sum_sq_e / n)),
        nan_count=total.nan,
        inf_count=total.inf,
        expected_nan_count=total.e_nan,
        expected_inf_count=total.e_inf,
        nan_positions_match=total.nan_match,
        inf_positions_match=total.inf_match,
        worst=_worst_of(total.worst, q_seqlen),
    )
