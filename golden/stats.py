"""The error statistics of one output against the float64 golden that the baseline-relative rules divide by.

The golden stores them for its emulated baseline at generation time (the benchmark and relative rules'
denominators); :mod:`mlaconf.judge.metrics` folds the same sums, through the same :class:`ErrorSums`,
into the full metrics of a backend's output, so the two sides of every ratio are one computation.

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
from mlaconf.golden.chunks import RowChunk, row_chunks

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


class ErrorSums:
    """Running sums and maxima of :class:`ErrorStats` over chunks of elements: each chunk folded into
    its own, then merged in chunk order (:mod:`mlaconf.golden.chunks`)."""

    def __init__(self, dtype: str) -> None:
        if dtype not in REL_FLOOR:
            raise ValueError(f"dtype must be 'fp16' or 'bf16', got {dtype!r}")
        self.floor = REL_FLOOR[dtype]
        self.n = 0
        self.max_abs = self.max_rel = self.sum_rel = self.sum_sq = 0.0

    def fold(self, err: np.ndarray, abs_g: np.ndarray) -> np.ndarray:
        """Fold in one chunk of ``|a - g|`` (inf where either side is NaN/Inf) and ``|g|`` (finite);
        returns the chunk's relative errors for callers that derive more from them."""
        rel: np.ndarray = err / np.maximum(abs_g, self.floor)
        self.n += err.size
        if err.size:
            self.max_abs = max(self.max_abs, float(err.max()))
            self.max_rel = max(self.max_rel, float(rel.max()))
        self.sum_rel += float(rel.sum())
        self.sum_sq += float(np.square(err).sum())
        return rel

    def merge(self, other: ErrorSums) -> None:
        """Add a later chunk's sums: the same floats as folding its chunk here."""
        self.n += other.n
        self.max_abs = max(self.max_abs, other.max_abs)
        self.max_rel = max(self.max_rel, other.max_rel)
        self.sum_rel += other.sum_rel
        self.sum_sq += other.sum_sq

    def stats(self) -> ErrorStats:
        n = max(self.n, 1)
        return ErrorStats(self.n, self.max_abs, self.max_rel, self.sum_rel / n, float(np.sqrt(self.sum_sq / n)))


def error_stats(actual: np.ndarray, expected: np.ndarray, row_valid: np.ndarray, dtype: str) -> ErrorStats:
    """:class:`ErrorStats` of ``actual`` against ``expected`` (both ``[T, ...]``) over the valid rows."""

    def chunk_sums(chunk: RowChunk) -> ErrorSums:
        a = np.asarray(actual[chunk.pick], dtype=np.float64)
        g = np.asarray(expected[chunk.pick], dtype=np.float64)
        bad = ~(np.isfinite(a) & np.isfinite(g))
        sums = ErrorSums(dtype)
        with np.errstate(invalid="ignore", over="ignore"):
            err = np.where(bad, np.inf, np.abs(a - g))
            sums.fold(err, np.where(bad, 0.0, np.abs(g)))
        return sums

    total = ErrorSums(dtype)
    chunks = row_chunks(row_valid, int(np.prod(actual.shape[1:])))
    for part in map_for(len(chunks))(chunk_sums, chunks):
        total.merge(part)
    return total.stats()
