"""msprobe's benchmark standard (PyPI ``mindstudio-probe``), rewritten from its documentation and source as
facts, so that its verdict stands beside ours on every record (the ``msprobe`` rule of judge/policy.py).

msprobe judges a device output by comparing two runs against one high-precision bench: the device's and a
trusted platform's (a GPU), each scored by five metrics, and the device passes when each metric's ratio
``|device| / max(|trusted|, minimum_err)`` stays within a threshold.  Here the bench is our float64 golden
and the trusted platform is the emulated ATB-precision baseline the golden carries.  The metrics, as msprobe
26.2.0 computes them (``api_accuracy_checker/compare/algorithm.py``, ``precision_standard/benchmark_compare.py``):

* small values are elements whose bench magnitude ``|g| <= small_value`` (2^-10 for fp16 and bf16); an
  element counts only where both values are finite;
* ``small_value_err_ratio``: the share of small values whose ``|out - g| > small_value_atol`` (1e-16);
* ``rmse``: ``sqrt(mean(err^2))`` over every element, with small values and non-finite elements counted as
  error 0 and the mean scaled by ``n / (n - excluded + 1e-4) + 1e-4``;
* ``max_rel_err`` / ``mean_rel_err``: of ``|out - g| / (|g| + eps)`` over the finite, non-small elements
  (``eps``: the bench dtype's machine epsilon, float32's for fp16 outputs, 2^-8 for bf16), 0 when none;
* ``eb`` (error balance): ``|#(out > g) - #(out < g)| / n``; recorded without a bound (msprobe rounds the
  bench to the output dtype before this count; here the float64 bench is compared).

Non-finite elements drop out of every metric: an output that is NaN everywhere scores 0 on each and passes
msprobe's standard (its blind spot; our implicit ``finite`` rule fails it in every policy).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from mlaconf.facts.operator import V_DIM
from mlaconf.facts.processes import map_for
from mlaconf.golden.building.chunks import RowChunk, row_chunks

#: The metrics msprobe decides on, in its order (``eb`` is computed but not in its status list).
DECIDING = ("small_value_err_ratio", "rmse", "max_rel_err", "mean_rel_err")


@dataclass(frozen=True)
class BenchmarkMetrics:
    """msprobe's five benchmark metrics of one output against the bench."""

    small_value_err_ratio: float
    rmse: float
    max_rel_err: float
    mean_rel_err: float
    eb: float


@dataclass(frozen=True)
class _Sums:
    """One chunk's share of the metrics, merged in chunk order."""

    n: int
    excluded: int
    squares: float
    small: int
    small_err: int
    rel_count: int
    rel_sum: float
    rel_max: float
    larger: int
    smaller: int

    def __add__(self, other: _Sums) -> _Sums:
        return _Sums(
            self.n + other.n,
            self.excluded + other.excluded,
            self.squares + other.squares,
            self.small + other.small,
            self.small_err + other.small_err,
            self.rel_count + other.rel_count,
            self.rel_sum + other.rel_sum,
            max(self.rel_max, other.rel_max),
            self.larger + other.larger,
            self.smaller + other.smaller,
        )


def benchmark_metrics(
    out: np.ndarray,
    golden: np.ndarray,
    row_valid: np.ndarray,
    *,
    small_value: float,
    small_value_atol: float,
    bench_eps: float,
) -> BenchmarkMetrics:
    """msprobe's metrics of ``out`` (the case dtype, ``[T, ...]``) against ``golden`` (float64) over the valid
    token rows, in row chunks (float64 throughout)."""
    rows = row_valid.shape[0]
    a, g = out.reshape(rows, -1), golden.reshape(rows, -1)

    def chunk_sums(chunk: RowChunk) -> _Sums:
        want = np.asarray(g[chunk.pick], dtype=np.float64).reshape(-1)
        with np.errstate(invalid="ignore", over="ignore"):
            diff = a[chunk.pick].reshape(-1).astype(np.float64)
            diff -= want
            err = np.abs(diff)
            finite = np.isfinite(diff)  # both values finite (NaN or an inf on either side makes it not)
            magnitude = np.abs(want)
            normal = finite & (magnitude > small_value)
            small = finite & ~normal
            kept = np.where(normal, err, 0.0)  # small and non-finite elements count as error 0
            magnitude += bench_eps
            rel = kept / magnitude
        return _Sums(
            n=err.size,
            excluded=err.size - int(np.count_nonzero(normal)),
            squares=float(np.square(kept).sum()),  # numpy's pairwise sum: BLAS's dot sums by its thread count
            small=int(np.count_nonzero(small)),
            small_err=int(np.count_nonzero(small & (err > small_value_atol))),
            rel_count=int(np.count_nonzero(normal)),
            rel_sum=float(rel.sum()),
            rel_max=float(rel.max()) if rel.size else 0.0,
            larger=int(np.count_nonzero(diff > 0)),
            smaller=int(np.count_nonzero(diff < 0)),
        )

    chunks = row_chunks(row_valid, a.shape[1] if a.ndim > 1 else V_DIM)
    parts = list(map_for(len(chunks))(chunk_sums, chunks))
    total = sum(parts[1:], parts[0]) if parts else _Sums(0, 0, 0.0, 0, 0, 0, 0.0, 0.0, 0, 0)
    n = max(total.n, 1)
    mse = total.squares / n * (total.n / (total.n - total.excluded + 1e-4) + 1e-4)
    return BenchmarkMetrics(
        small_value_err_ratio=total.small_err / total.small if total.small else 0.0,
        rmse=math.sqrt(mse),
        max_rel_err=total.rel_max,
        mean_rel_err=total.rel_sum / total.rel_count if total.rel_count else 0.0,
        eb=abs(total.larger - total.smaller) / total.n if total.n else 0.0,
    )


def ratio(device: float, trusted: float, minimum_err: float) -> float:
    """msprobe's ratio of a metric: ``|device| / max(|trusted|, minimum_err)``; NaN when either side is
    NaN or infinite and they differ (msprobe then reports an error), 0 when both are the same inf or NaN
    (msprobe then passes the metric)."""
    if math.isnan(device) or math.isinf(device) or math.isnan(trusted) or math.isinf(trusted):
        same = (math.isnan(device) and math.isnan(trusted)) or (device == trusted)
        return 0.0 if same else math.nan
    return abs(device) / max(abs(trusted), minimum_err)
