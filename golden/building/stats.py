"""The error statistics of one output against the float64 golden that the baseline-relative rules divide by.

The golden stores them for its emulated baseline at generation time (the benchmark and relative rules'
denominators); :mod:`mlaconf.judge.metrics` folds the same sums, in the same order, into the full metrics
of a backend's output, so the two sides of every ratio are the same floats (tests/cover/test_metrics.py
holds the two to it).

Definitions (``a`` = actual, ``g`` = golden, over valid rows, in float64): relative error
``|a - g| / max(|g|, floor)`` with the msprobe/ATB small-value floor ``2**-11`` (fp16) / ``2**-8`` (bf16);
``rmse = sqrt(mean (a - g)^2)``; a NaN/Inf on either side is an infinite error.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields
from typing import Any

import numpy as np

from mlaconf.facts.processes import map_for
from mlaconf.golden.building.chunks import RowChunk, row_chunks

#: Small-value floor of relative errors (msprobe / ATB benchmark standard).
REL_FLOOR = {"fp16": 2.0**-11, "bf16": 2.0**-8}


@dataclass(frozen=True)
class ErrorStats:
    """What a baseline-relative rule reads of an output's error; plain floats and ints."""

    n_elements: int
    max_abs_err: float
    max_rel_err: float
    mean_rel_err: float
    rmse: float

    def to_dict(self) -> dict[str, float | int | bool | str]:
        """JSON- and HDF5-attribute-friendly copy (plain Python scalars only)."""
        return dict(asdict(self))

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ErrorStats:
        """Inverse of :meth:`to_dict`; accepts numpy scalars (as read back from HDF5 attributes)."""
        missing = [f.name for f in fields(cls) if f.name not in data]
        if missing:
            raise KeyError(f"error statistics lack {missing}")
        values = {f.name: data[f.name] for f in fields(cls)}
        return cls(**{k: v.item() if isinstance(v, np.generic) else v for k, v in values.items()})


@dataclass
class ErrorSums:
    """The sums and maxima behind :class:`ErrorStats`, of one row chunk or folded over several: n, max |a - g|,
    the largest and the summed relative error, and the sum of (a - g)^2.  The judge's metrics fold the same
    sums (:mod:`mlaconf.judge.metrics`), so both sides of a baseline ratio are the same floats."""

    n: int = 0
    max_abs: float = 0.0
    max_rel: float = 0.0
    sum_rel: float = 0.0
    sum_sq: float = 0.0

    @classmethod
    def of(cls, err: np.ndarray, rel: np.ndarray) -> ErrorSums:
        """The sums of one chunk's absolute errors ``err`` (inf where either side is NaN/Inf) and their
        relative errors ``rel``."""
        largest = (float(err.max()), float(rel.max())) if err.size else (0.0, 0.0)
        return cls(err.size, *largest, float(rel.sum()), float(np.square(err).sum()))

    def fold(self, part: ErrorSums) -> None:
        """Add a later chunk's sums: the same numbers as summing its chunk here."""
        self.n += part.n
        self.max_abs = max(self.max_abs, part.max_abs)
        self.max_rel = max(self.max_rel, part.max_rel)
        self.sum_rel += part.sum_rel
        self.sum_sq += part.sum_sq

    def stats(self) -> ErrorStats:
        """The statistics the sums give: means over n (1 when nothing was summed)."""
        count = max(self.n, 1)
        return ErrorStats(self.n, self.max_abs, self.max_rel, self.sum_rel / count, float(np.sqrt(self.sum_sq / count)))


def error_stats(actual: np.ndarray, expected: np.ndarray, row_valid: np.ndarray, dtype: str) -> ErrorStats:
    """:class:`ErrorStats` of ``actual`` against ``expected`` (both ``[T, ...]``) over the valid rows: sums and
    maxima per row chunk, added in chunk order (the same floats as :func:`mlaconf.judge.metrics.compute_metrics`)."""
    if dtype not in REL_FLOOR:
        raise ValueError(f"dtype must be 'fp16' or 'bf16', got {dtype!r}")
    floor = REL_FLOOR[dtype]

    def chunk_sums(chunk: RowChunk) -> ErrorSums:
        a = np.asarray(actual[chunk.pick], dtype=np.float64)
        g = np.asarray(expected[chunk.pick], dtype=np.float64)
        bad = ~(np.isfinite(a) & np.isfinite(g))
        with np.errstate(invalid="ignore", over="ignore"):
            err = np.where(bad, np.inf, np.abs(a - g))  # a NaN/Inf on either side: an infinite error
            rel = err / np.maximum(np.where(bad, 0.0, np.abs(g)), floor)
            return ErrorSums.of(err, rel)

    total = ErrorSums()
    chunks = row_chunks(row_valid, int(np.prod(actual.shape[1:])))
    for part in map_for(len(chunks))(chunk_sums, chunks):
        total.fold(part)
    return total.stats()
