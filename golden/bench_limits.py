"""What one golden build must compute, and the fastest each stage could then be on this machine.

Why: an end-to-end ratio to GEMM means little without the ratio the work itself allows.  The golden's
content fixes the work (the float64 reference, T, the float32 magnitudes, the emulated baseline, the
statistics, the file); this module counts it per stage from the case's tiles (GEMM FLOPs per
precision, the elementwise passes over the scores, bytes read and written) and turns the counts into a
stage limit with rates measured in the same process: the float64 and float32 square GEMMs, the
streaming memory bandwidth and the compiled softmax pass (one exp per score).  docs/benchmarks.md
derives the same numbers by hand.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from mlaconf.facts.operator import SCORE_DIM, V_DIM, scores_in_fp16
from mlaconf.golden.layout import causal_offset
from mlaconf.golden.reference import DEFAULT_TILE, FUSED_TILE, blas_threads, gemm, tile_kernel
from mlaconf.golden.spec import CaseSpec

#: Bytes per score that a build cannot avoid moving between its GEMMs, once every elementwise step is
#: fused into one pass: the reference reads its float64 scores and writes the operands of its later
#: GEMMs (P and P s in float64, P and P^2 rounded up to float32); the baseline reads its float32
#: scores and writes P rounded to the input dtype in place.
REFERENCE_BYTES_PER_SCORE = 8 + 8 + 8 + 4 + 4
BASELINE_BYTES_PER_SCORE = 4 + 4


@dataclass(frozen=True)
class StageWork:
    """One build stage's unavoidable work: GEMM FLOPs per precision, softmax scores, bytes moved."""

    stage: str
    gemm64_flops: float = 0.0
    gemm32_flops: float = 0.0
    softmax_scores: float = 0.0  # scores that pass once through an exp (the compiled kernel's rate)
    bytes_moved: float = 0.0  # bytes read plus written outside the GEMMs


@dataclass(frozen=True)
class MachineRates:
    """Rates measured in the process that times the build, on the build's thread count."""

    gemm64: float  # FLOP/s, square float64 GEMM through the build's own BLAS (reference.gemm: torch's)
    gemm32: float  # FLOP/s, the same in float32
    bandwidth: float  # bytes/s read plus written by a large copy
    softmax: float  # scores/s through the compiled softmax pass, one thread times the threads


def computed_pairs(spec: CaseSpec, tile: int) -> int:
    """(query, key) pairs the tiles compute per head: whole ``rows x k_end`` blocks, masked corners included."""
    pairs = 0
    for b in range(spec.batch):
        q_len, kv_len, offset = spec.q_seqlen[b], spec.kv_seqlen[b], causal_offset(spec, b)
        if q_len == 0 or kv_len == 0:
            continue
        for i0 in range(0, q_len, tile):
            i1 = min(i0 + tile, q_len)
            pairs += (i1 - i0) * (kv_len if offset is None else max(0, min(kv_len, i1 + offset)))
    return pairs * spec.head_num


def build_work(spec: CaseSpec, *, input_bytes: int, output_bytes: int, file_bytes: int) -> list[StageWork]:
    """The stages of ``build_golden`` + write and what each must compute (see the module docstring)."""
    ref_pairs, base_pairs = computed_pairs(spec, FUSED_TILE), computed_pairs(spec, DEFAULT_TILE)
    # float64: q k^T, P V, (P s) V; fp16 score paths add the two S GEMMs, fp16 the flushed-keys GEMM
    ref64 = SCORE_DIM + 2 * V_DIM
    if scores_in_fp16(spec.dtype, spec.mask_type):
        ref64 += 2 * V_DIM
    if spec.dtype == "fp16":
        ref64 += V_DIM
    return [
        StageWork("inputs", bytes_moved=input_bytes),
        StageWork(
            "reference + magnitudes",
            gemm64_flops=2.0 * ref_pairs * ref64,
            gemm32_flops=2.0 * ref_pairs * 2 * V_DIM,  # P32 |V'| and P^2_32 V'^2
            softmax_scores=ref_pairs,
            bytes_moved=ref_pairs * REFERENCE_BYTES_PER_SCORE,
        ),
        StageWork(
            "baseline",
            gemm32_flops=2.0 * base_pairs * (SCORE_DIM + V_DIM),
            softmax_scores=base_pairs,
            bytes_moved=base_pairs * BASELINE_BYTES_PER_SCORE,
        ),
        StageWork("statistics", bytes_moved=output_bytes),
        StageWork("write", bytes_moved=file_bytes),
    ]


def stage_limit(work: StageWork, rates: MachineRates) -> float:
    """Seconds the stage needs at best: its GEMMs at the square GEMM's rate plus its passes."""
    return (
        work.gemm64_flops / rates.gemm64
        + work.gemm32_flops / rates.gemm32
        + work.softmax_scores / rates.softmax
        + work.bytes_moved / rates.bandwidth
    )


def limit_report(
    works: list[StageWork], rates: MachineRates, measured: dict[str, float], useful_flops: float
) -> dict[str, Any]:
    """Per stage: measured seconds, limit seconds, limit / measured; and the end-to-end limit as a
    ratio to the float64 GEMM (useful FLOPs over the summed limits, divided by the GEMM rate)."""
    stages = []
    for work in works:
        limit = stage_limit(work, rates)
        seconds = measured.get(work.stage)
        stages.append(
            {**asdict(work), "seconds": seconds, "limit_s": limit, "of_limit": limit / seconds if seconds else None}
        )
    total_limit = sum(s["limit_s"] for s in stages)
    return {
        "rates": asdict(rates),
        "stages": stages,
        "limit_s": total_limit,
        "e2e_limit_ratio": useful_flops / total_limit / rates.gemm64,
    }


def format_limits(case: str, report: dict[str, Any], e2e_seconds: float | None) -> list[str]:
    """The limit lines of one case: each stage against its own limit, then the whole build."""
    rates = report["rates"]
    lines = [
        f"{case} stage limits (GEMM f64 {rates['gemm64'] / 1e9:.1f} GF/s, f32 {rates['gemm32'] / 1e9:.1f} GF/s, "
        f"copy {rates['bandwidth'] / 1e9:.1f} GB/s, softmax {rates['softmax'] / 1e9:.2f} G scores/s):"
    ]
    for s in report["stages"]:
        seconds, ratio = s["seconds"], s["of_limit"]
        lines.append(
            f"  {s['stage']:24s} {'-' if seconds is None else f'{seconds:.2f}':>6s} s  limit {s['limit_s']:.2f} s  "
            f"{'-' if ratio is None else f'{ratio:.2f}'} of limit"
        )
    limit_s = report["limit_s"]
    reached = f", reached {limit_s / e2e_seconds:.2f} of it" if e2e_seconds else ""
    lines.append(f"  end to end limit {limit_s:.2f} s = {report['e2e_limit_ratio']:.2f} of float64 GEMM{reached}")
    return lines


def _best_rate(fn: Callable[[], object], amount: float, repeats: int = 3) -> float:
    fn()
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return amount / best


def measure_rates(threads: int, gemm_n: int = 2048) -> MachineRates:
    """The four rates of :class:`MachineRates`, in this process (best of three, after a warm-up)."""
    rng = np.random.default_rng(0)
    a64, b64 = rng.random((gemm_n, gemm_n)), rng.random((gemm_n, gemm_n))
    a32, b32 = a64.astype(np.float32), b64.astype(np.float32)
    c64, c32 = np.empty_like(a64), np.empty_like(a32)
    big = rng.random(1 << 25)  # 256 MiB: far beyond the caches
    dest = np.empty_like(big)
    scores = rng.uniform(-4.0, 0.0, (FUSED_TILE, 4096))
    stats = np.empty((4, FUSED_TILE))
    work = np.empty_like(scores)
    kernel = tile_kernel()
    with blas_threads(threads):
        gemm64 = _best_rate(lambda: gemm(a64, b64, c64), 2.0 * gemm_n**3)
        gemm32 = _best_rate(lambda: gemm(a32, b32, c32), 2.0 * gemm_n**3)
    bandwidth = _best_rate(lambda: np.copyto(dest, big), 2.0 * big.nbytes)
    softmax = float("inf")
    for _ in range(4):  # the kernel works in place: each run on a fresh copy, the copy not timed
        np.copyto(work, scores)
        start = time.perf_counter()
        kernel.softmax_tile(work, stats, None, None, None, 2.0**-126)
        softmax = min(softmax, time.perf_counter() - start)
    return MachineRates(gemm64, gemm32, bandwidth, scores.size / softmax * threads)
