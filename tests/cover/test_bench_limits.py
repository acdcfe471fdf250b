"""The bench's derived build limits (golden/bench/limits.py) and how the bench prints them: the work
counted from the tiles must be the work the tiles do, and each stage's limit its own work at the rates."""

from __future__ import annotations

import numpy as np
import pytest

from mlaconf.facts.operator import SCORE_DIM, V_DIM
from mlaconf.golden.bench import run as bench_run
from mlaconf.golden.bench.limits import (
    BASELINE_BYTES_PER_SCORE,
    REFERENCE_BYTES_PER_SCORE,
    MachineRates,
    StageWork,
    build_work,
    computed_pairs,
    format_limits,
    limit_report,
    measure_rates,
    measure_tile_rates,
    stage_limit,
    tile_gemm_shapes,
)
from mlaconf.golden.building.generate import build_golden
from mlaconf.golden.building.reference import DEFAULT_TILE, FUSED_TILE, for_each_tile, tile_rows
from mlaconf.golden.specs.spec import CaseSpec
from mlaconf.golden.specs.spec_build import build_case

RATES = MachineRates(gemm64=1e10, gemm32=2e10, bandwidth=1e10, softmax=1e9)


def spec_of(mask: str, q: list[int], kv: list[int] | None = None, dtype: str = "bf16") -> CaseSpec:
    fields = {"q_seqlen": q, "head_num": 2, "mask_type": mask, "dtype": dtype, "kv_layout": "padded", "seed": 1}
    if kv is not None:
        fields["kv_seqlen"] = kv
    return build_case(fields, source="test")


def tiled_pairs(spec: CaseSpec, tile: int) -> int:
    """The pairs the real tile loop computes (rows x k_end per visited tile), counted by visiting it."""
    golden = build_golden(spec)
    seen: list[int] = []
    for_each_tile(
        golden.inputs,
        spec,
        lambda task, i0, i1, k_end, diag: seen.append((i1 - i0) * k_end),
        np.float64,
        tile=tile,
    )
    return sum(seen)


@pytest.mark.parametrize(
    "spec",
    [
        spec_of("mask_free", [700]),
        spec_of("undefined", [300, 129]),
        spec_of("causal", [300], [900]),
    ],
    ids=["causal", "bidirectional", "chunked"],
)
def test_computed_pairs_are_the_pairs_the_tile_loop_computes(spec: CaseSpec) -> None:
    for tile in (DEFAULT_TILE, FUSED_TILE, 64):
        assert computed_pairs(spec, tile) == tiled_pairs(spec, tile)


def test_build_work_counts_each_gemm_at_its_precision() -> None:
    spec = spec_of("mask_free", [1024])
    ref, base = computed_pairs(spec, FUSED_TILE), computed_pairs(spec, DEFAULT_TILE)
    works = {w.stage: w for w in build_work(spec, input_bytes=10, output_bytes=20, file_bytes=30)}
    assert list(works) == ["inputs", "reference + magnitudes", "baseline", "statistics", "write"]
    assert works["reference + magnitudes"].gemm64_flops == 2.0 * ref * (SCORE_DIM + 2 * V_DIM)
    assert works["reference + magnitudes"].gemm32_flops == 2.0 * ref * 2 * V_DIM
    assert works["reference + magnitudes"].bytes_moved == ref * REFERENCE_BYTES_PER_SCORE
    assert works["baseline"].gemm32_flops == 2.0 * base * (SCORE_DIM + V_DIM)
    assert works["baseline"].gemm64_flops == 0.0
    assert works["baseline"].bytes_moved == base * BASELINE_BYTES_PER_SCORE
    assert (works["inputs"].bytes_moved, works["statistics"].bytes_moved, works["write"].bytes_moved) == (10, 20, 30)
    fp16 = {
        w.stage: w
        for w in build_work(
            spec_of("mask_free", [1024], dtype="fp16"),
            **dict.fromkeys(("input_bytes", "output_bytes", "file_bytes"), 0),
        )
    }
    # fp16 with the compressed mask: the two S GEMMs and the flushed-keys GEMM, all float64
    assert fp16["reference + magnitudes"].gemm64_flops == 2.0 * ref * (SCORE_DIM + 5 * V_DIM)


def test_stage_limit_adds_every_part_at_its_rate() -> None:
    work = StageWork("x", gemm64_flops=1e10, gemm32_flops=4e10, softmax_scores=3e9, bytes_moved=5e10)
    assert stage_limit(work, RATES) == pytest.approx(1.0 + 2.0 + 3.0 + 5.0)


def test_limit_report_ratios_and_missing_stages() -> None:
    works = [StageWork("a", gemm64_flops=2e10), StageWork("b", bytes_moved=1e10)]
    report = limit_report(works, RATES, {"a": 4.0}, useful_flops=1.5e10)
    a, b = report["stages"]
    assert (a["limit_s"], a["of_limit"]) == (pytest.approx(2.0), pytest.approx(0.5))
    assert b["seconds"] is None and b["of_limit"] is None
    assert report["limit_s"] == pytest.approx(3.0)
    assert report["e2e_limit_ratio"] == pytest.approx(1.5e10 / 3.0 / 1e10)
    text = "\n".join(format_limits("case", report, 6.0))
    assert "0.50 of limit" in text and "0.50 of float64 GEMM" in text and "reached 0.50 of it" in text


def test_tile_shaped_limit_uses_the_tiles_gemm_rates_and_only_them() -> None:
    import dataclasses

    works = [StageWork("a", gemm64_flops=2e10, gemm32_flops=2e10, bytes_moved=1e10)]
    tiled = dataclasses.replace(RATES, tile_gemm64=5e9, tile_gemm32=1e10)
    assert stage_limit(works[0], tiled, tile_shaped=True) == pytest.approx(4.0 + 2.0 + 1.0)
    assert stage_limit(works[0], tiled) == pytest.approx(2.0 + 1.0 + 1.0)  # the square limit is unchanged
    report = limit_report(works, tiled, {"a": 14.0}, useful_flops=1.4e10)
    assert report["tile_limit_s"] == pytest.approx(7.0) and report["limit_s"] == pytest.approx(4.0)
    assert report["tile_e2e_limit_ratio"] == pytest.approx(1.4e10 / 7.0 / 1e10)
    text = "\n".join(format_limits("case", report, 14.0))
    assert "end to end limit (square GEMM) 4.00 s = 0.35 of float64 GEMM, reached 0.29 of it" in text
    assert "end to end limit (GEMMs at the tiles' shapes) 7.00 s = 0.20 of float64 GEMM, reached 0.50 of it" in text
    assert "tile-shaped 7.00 s" in text
    assert "tile_limit_s" not in limit_report(works, RATES, {}, useful_flops=1.0)  # not measured: not claimed
    with pytest.raises(ValueError, match="tile-shaped"):
        stage_limit(works[0], RATES, tile_shaped=True)


def test_tile_gemm_shapes_are_the_tile_loops_shapes() -> None:
    spec = spec_of("causal", [300, 700], [900, 700])
    seen: list[tuple[int, int]] = []
    golden = build_golden(spec)
    for_each_tile(
        golden.inputs,
        spec,
        lambda task, i0, i1, k_end, diag: seen.append((i1 - i0, k_end)) if task.head == 0 else None,
        np.float64,
        tile=FUSED_TILE,
    )
    assert tile_gemm_shapes(spec, FUSED_TILE) == seen


def test_causal_tiles_see_up_to_their_last_rows_key() -> None:
    """Every row once; a causal tile sees the keys its last row may (the masked corner computed whole)."""
    for q_len, kv_len in ((4096, 4096), (1000, 1000), (300, 900), (700, 700)):
        offset = kv_len - q_len
        tiles = list(tile_rows(q_len, kv_len, offset, FUSED_TILE))
        assert [r for i0, i1, _ in tiles for r in range(i0, i1)] == list(range(q_len))
        assert all(i1 - i0 <= FUSED_TILE and k_end == min(kv_len, i1 + offset) for i0, i1, k_end in tiles)
    assert list(tile_rows(4096, 4096, None, FUSED_TILE)) == [(i, i + 512, 4096) for i in range(0, 4096, 512)]


def test_tile_rates_are_positive_and_finite() -> None:
    spec = spec_of("mask_free", [300])
    for rate in measure_tile_rates(spec, 2, tile=64, base_tile=32):
        assert 0 < rate < float("inf")


def test_measured_rates_are_positive_and_finite() -> None:
    rates = measure_rates(1, gemm_n=128)
    for value in (rates.gemm64, rates.gemm32, rates.bandwidth, rates.softmax):
        assert 0 < value < float("inf")


def test_interleaved_table_states_the_limit_and_how_much_of_it_e2e_reached() -> None:
    row = {
        "case": "c",
        "gemm_gflops": 50.0,
        "ratio_median": {"reference": 0.9, "e2e": 0.2},
        "ratio_range": {"reference": [0.8, 1.0], "e2e": [0.1, 0.3]},
        "load1": [0.5, 0.7],
        "limit": {"ratio": 0.4, "limit_s": 3.0, "tile_ratio": 0.25, "tile_limit_s": 4.8},
        "reference_vs_tile_gemm": [0.93, 0.9, 0.97],
    }
    report = {"machine": {"nproc": 2, "cpu": "x", "blas": "y"}, "threads": 2, "repeats": 3, "gemm_n": 2048}
    text = bench_run.format_interleaved({**report, "cases": [row]})
    square = "derived end-to-end limit (square GEMM) 0.40 of this GEMM (3.00 s); e2e reaches 0.50 [0.25, 0.75] of it"
    assert square in text
    assert "limit (GEMMs at the tiles' shapes) 0.25 of this GEMM (4.80 s); e2e reaches 0.80 [0.40, 1.20] of it" in text
    assert "same GEMMs at its tiles' shapes (tile_gemm above, masked corners counted): 0.93 [0.90, 0.97]" in text


def test_judge_share_line_states_the_share_and_the_target() -> None:
    from mlaconf.tools.overhead import format_share, judge_spec

    row = {"case": "ds1", "wall:overhead": 0.05, "wall:backend": 2.0, "cpu:overhead": 0.04}
    assert "2.5 % (target <= 5 %)" in format_share(row)
    spec = judge_spec("ds1")
    assert (spec.q_seqlen, spec.kv_seqlen, spec.head_num) == ((4096, 4096), (16384, 4096), 16)


def test_tile_gemms_compute_the_flops_their_rate_counts(monkeypatch: pytest.MonkeyPatch) -> None:
    """The tile_gemm arm's GEMM calls add up to the FLOPs its rate divides by (whole tiles, masked corners)."""
    from mlaconf.golden.bench import measure as bench_measure
    from mlaconf.golden.building.inputs import generate_inputs

    spec = build_case({"q_seqlen": [700, 90], "head_num": 2, "mask_type": 2, "dtype": "bf16"}, source="test")
    done: list[float] = []
    real_gemm, real_value = bench_measure.gemm, bench_measure.value_gemm

    def counted_gemm(a: np.ndarray, b: np.ndarray, out: np.ndarray) -> np.ndarray:
        done.append(2.0 * a.shape[0] * a.shape[1] * b.shape[1])
        return real_gemm(a, b, out)

    def counted_value(p: np.ndarray, vt: np.ndarray) -> np.ndarray:
        done.append(2.0 * p.shape[0] * p.shape[1] * vt.shape[0])
        return real_value(p, vt)

    monkeypatch.setattr(bench_measure, "gemm", counted_gemm)
    monkeypatch.setattr(bench_measure, "value_gemm", counted_value)
    bench_measure.tile_gemms(generate_inputs(spec), spec, threads=1)
    assert sum(done) == 2.0 * (SCORE_DIM + V_DIM) * computed_pairs(spec, FUSED_TILE) > spec.useful_flops
