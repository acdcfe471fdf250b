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

import functools
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from mlaconf.facts.operator import SCORE_DIM, V_DIM, scores_in_fp16
from mlaconf.facts.processes import pin_worker_threads, shared_pool
from mlaconf.golden.building.reference import (
    DEFAULT_TILE,
    FUSED_TILE,
    Workspace,
    blas_threads,
    gemm,
    tile_kernel,
    tile_rows,
)
from mlaconf.golden.specs.layout import causal_offset
from mlaconf.golden.specs.spec import CaseSpec

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
    # the same GEMMs at the build's own tile shapes (:func:`measure_tile_rates`): what the memory budget's tiles allow
    tile_gemm64: float | None = None
    tile_gemm32: float | None = None


def computed_pairs(spec: CaseSpec, tile: int) -> int:
    """(query, key) pairs the tiles compute per head: whole ``rows x k_end`` blocks (:func:`tile_rows`), the
    masked corners they still hold included."""
    pairs = 0
    for b in range(spec.batch):
        q_len, kv_len = spec.q_seqlen[b], spec.kv_seqlen[b]
        if q_len == 0 or kv_len == 0:
            continue
        pairs += sum((i1 - i0) * k_end for i0, i1, k_end in tile_rows(q_len, kv_len, causal_offset(spec, b), tile))
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


def stage_limit(work: StageWork, rates: MachineRates, *, tile_shaped: bool = False) -> float:
    """Seconds the stage needs at best: its GEMMs at the square GEMM's rate (``tile_shaped``: at the rates
    measured at the tiles' own shapes) plus its passes."""
    gemm64, gemm32 = rates.gemm64, rates.gemm32
    if tile_shaped:
        if rates.tile_gemm64 is None or rates.tile_gemm32 is None:
            raise ValueError("tile-shaped limit asked of rates measured without the tiles' GEMMs")
        gemm64, gemm32 = rates.tile_gemm64, rates.tile_gemm32
    return (
        work.gemm64_flops / gemm64
        + work.gemm32_flops / gemm32
        + work.softmax_scores / rates.softmax
        + work.bytes_moved / rates.bandwidth
    )


def limit_report(
    works: list[StageWork], rates: MachineRates, measured: dict[str, float], useful_flops: float
) -> dict[str, Any]:
    """Per stage: measured seconds, limit seconds, limit / measured; and the end-to-end limit as a
    ratio to the float64 GEMM (useful FLOPs over the summed limits, divided by the GEMM rate).  With
    tile-shaped rates also the second limit, its GEMMs at the tiles' rates (``tile_*``; still a ratio to
    the square GEMM, so the two limits and the measured ratio compare directly)."""
    tiled = rates.tile_gemm64 is not None and rates.tile_gemm32 is not None
    stages = []
    for work in works:
        limit = stage_limit(work, rates)
        seconds = measured.get(work.stage)
        stage = {**asdict(work), "seconds": seconds, "limit_s": limit, "of_limit": limit / seconds if seconds else None}
        if tiled:
            stage["tile_limit_s"] = stage_limit(work, rates, tile_shaped=True)
        stages.append(stage)
    total_limit = sum(s["limit_s"] for s in stages)
    report = {
        "rates": asdict(rates),
        "stages": stages,
        "limit_s": total_limit,
        "e2e_limit_ratio": useful_flops / total_limit / rates.gemm64,
    }
    if tiled:
        tile_limit = sum(s["tile_limit_s"] for s in stages)
        report |= {"tile_limit_s": tile_limit, "tile_e2e_limit_ratio": useful_flops / tile_limit / rates.gemm64}
    return report


def format_limits(case: str, report: dict[str, Any], e2e_seconds: float | None) -> list[str]:
    """The limit lines of one case: each stage against its own limit, then the whole build (and, when the
    tiles' GEMM rates were measured, the same at those rates)."""
    rates = report["rates"]
    tiled = "tile_limit_s" in report
    tile_rates = (
        f"; at the tiles' shapes f64 {rates['tile_gemm64'] / 1e9:.1f}, f32 {rates['tile_gemm32'] / 1e9:.1f} GF/s"
        if tiled
        else ""
    )
    lines = [
        f"{case} stage limits (GEMM f64 {rates['gemm64'] / 1e9:.1f} GF/s, f32 {rates['gemm32'] / 1e9:.1f} GF/s, "
        f"copy {rates['bandwidth'] / 1e9:.1f} GB/s, softmax {rates['softmax'] / 1e9:.2f} G scores/s{tile_rates}):"
    ]
    for s in report["stages"]:
        seconds, ratio = s["seconds"], s["of_limit"]
        tile = f"  (tile-shaped {s['tile_limit_s']:.2f} s)" if tiled else ""
        lines.append(
            f"  {s['stage']:24s} {'-' if seconds is None else f'{seconds:.2f}':>6s} s  limit {s['limit_s']:.2f} s  "
            f"{'-' if ratio is None else f'{ratio:.2f}'} of limit{tile}"
        )
    for key, label in (("", "square GEMM"), ("tile_", "GEMMs at the tiles' shapes")):
        if f"{key}limit_s" not in report:
            continue
        limit_s = report[f"{key}limit_s"]
        reached = f", reached {limit_s / e2e_seconds:.2f} of it" if e2e_seconds else ""
        lines.append(
            f"  end to end limit ({label}) {limit_s:.2f} s = {report[f'{key}e2e_limit_ratio']:.2f} of float64 GEMM"
            f"{reached}"
        )
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


def tile_gemm_shapes(spec: CaseSpec, tile: int) -> list[tuple[int, int]]:
    """``(rows, keys)`` of every tile of one head of ``spec`` (:func:`tile_rows`, masked corners included)."""
    shapes = []
    for b in range(spec.batch):
        q_len, kv_len = spec.q_seqlen[b], spec.kv_seqlen[b]
        if q_len and kv_len:
            offset = causal_offset(spec, b)
            shapes += [(i1 - i0, k_end) for i0, i1, k_end in tile_rows(q_len, kv_len, offset, tile) if k_end > 0]
    return shapes


def measure_tile_rates(
    spec: CaseSpec, threads: int, *, tile: int = FUSED_TILE, base_tile: int = DEFAULT_TILE
) -> tuple[float, float]:
    """float64 and float32 GEMM FLOP/s at the shapes the build runs them (one head's tiles, each shape's
    GEMMs on ``threads`` workers side by side as the build runs them, best of two after a warm-up):
    float64 ``q k^T`` and the transposed ``P V`` at ``tile`` rows (the reference; the magnitudes' float64
    GEMMs have ``P V``'s shape), float32 ``P |V'|`` at ``tile`` rows and the baseline's ``q k^T`` and ``P V``
    at ``base_tile`` rows.  Random operands of the same shapes: a GEMM's speed does not depend on its values."""
    rng = np.random.default_rng(0)
    kv, rows = max(max(spec.kv_seqlen), 1), max(tile, base_tile)
    q64, k64 = rng.uniform(-1, 1, (rows, SCORE_DIM)), np.asfortranarray(rng.uniform(-1, 1, (kv, SCORE_DIM)))
    vt64 = rng.uniform(-1, 1, (V_DIM, kv))
    q32, k32 = q64.astype(np.float32), k64.astype(np.float32)
    v32, p32 = rng.uniform(0, 1, (kv, V_DIM)).astype(np.float32), rng.uniform(0, 1, (rows, kv)).astype(np.float32)
    work = Workspace()  # per-thread outputs, reused as the build reuses its own (fresh pages cost page faults)

    def f64_tile(rows: int, keys: int) -> float:
        scores = gemm(q64[:rows], k64[:keys].T, work.take("s64", (rows, keys), np.float64))
        gemm(vt64[:, :keys], scores.T, work.take("o64", (V_DIM, rows), np.float64))
        return 2.0 * rows * keys * (SCORE_DIM + V_DIM)

    def f32_tile(rows: int, keys: int, base: bool) -> float:
        out = work.take("o32", (rows, V_DIM), np.float32)
        if base:
            scores = gemm(q32[:rows], k32[:keys].T, work.take("s32", (rows, keys), np.float32))
            gemm(scores, v32[:keys], out)
            return 2.0 * rows * keys * (SCORE_DIM + V_DIM)
        gemm(p32[:rows, :keys], v32[:keys], out)
        return 2.0 * rows * keys * V_DIM

    jobs64 = [functools.partial(f64_tile, r, k) for r, k in tile_gemm_shapes(spec, tile)]
    jobs32 = [functools.partial(f32_tile, r, k, False) for r, k in tile_gemm_shapes(spec, tile)]
    jobs32 += [functools.partial(f32_tile, r, k, True) for r, k in tile_gemm_shapes(spec, base_tile)]

    def run(job: functools.partial[float]) -> float:
        pin_worker_threads()
        return job()

    def rate(jobs: list[functools.partial[float]]) -> float:
        best, flops = float("inf"), 0.0
        pool = shared_pool() if threads > 1 else None  # the pool the build's tiles run on
        with blas_threads(1):
            for attempt in range(3):  # the first is the warm-up
                start = time.perf_counter()
                flops = sum((map if pool is None else pool.map)(run, jobs * max(threads, 1)))
                if attempt:
                    best = min(best, time.perf_counter() - start)
        return flops / best

    return rate(jobs64), rate(jobs32)
