"""Helpers for tests that edit golden files on purpose."""

from __future__ import annotations

from pathlib import Path

from mlaconf.facts.operator import V_DIM
from mlaconf.golden.integrity import seal
from mlaconf.golden.types import GoldenCase
from mlaconf.judge.metrics import Metrics, compute_metrics


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
