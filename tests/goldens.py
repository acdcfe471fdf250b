"""Helpers for tests that edit golden files on purpose."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import numpy as np

from mlaconf.facts.operator import V_DIM
from mlaconf.golden.building.stats import error_stats
from mlaconf.golden.specs.types import GoldenCase
from mlaconf.golden.store.integrity import seal
from mlaconf.judge.metrics import Metrics, compute_metrics


def consistent(golden: GoldenCase, **changes: Any) -> GoldenCase:
    """``golden`` with fields replaced and its baseline statistics recomputed from the result, as a
    generator that computed those arrays would have written them."""
    changed = dataclasses.replace(golden, **changes)
    out = changed.baseline_out.reshape(changed.out.shape)
    stats = error_stats(out, changed.out, changed.row_valid, changed.spec.dtype)
    return dataclasses.replace(changed, baseline_stats=stats.to_dict())


def split_sum_gemm(a: np.ndarray, b: np.ndarray, out: np.ndarray) -> np.ndarray:
    """The baseline's float32 GEMM summed in another order (two halves of the inner dimension), as
    another BLAS code path (MKL_CBWR, another CPU generation) sums it."""
    half = a.shape[1] // 2
    np.matmul(a[:, :half], b[:half], out=out)
    out += np.matmul(a[:, half:], b[half:])
    return out


def reseal(path: Path) -> None:
    """Rewrite a file's integrity header in place, to reach the checks behind the header."""
    with open(path, "r+b") as fh:
        seal(fh)


def baseline_metrics(golden: GoldenCase) -> Metrics:
    """The metrics of a golden's own emulated baseline against its float64 output."""
    shape = (golden.spec.total_q, golden.spec.head_num, V_DIM)
    return compute_metrics(
        golden.baseline_out.reshape(shape),
        golden.out.reshape(shape),
        golden.row_valid,
        golden.spec.dtype,
        golden.spec.q_seqlen,
    )
