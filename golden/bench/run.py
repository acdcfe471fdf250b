"""``mlaconf bench``'s work: every measurement in a fresh interpreter, the tables and the A/B ratios
(what each figure means: :mod:`mlaconf.golden.bench.verbs`, docs/benchmarks.md)."""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from mlaconf.facts.processes import usable_cpus

# bench_measure and bench_limits load numpy and ml_dtypes: imported where used, so every --help stays light.


def format_tile(result: dict[str, Any]) -> str:
    gemm = result["gemm_flops"] / min(v for k, v in result["seconds"].items() if k.startswith("GEMM"))
    lines = ["one thread, CPU time, min of repeats (256 rows x 4096 keys):"]
    for name, seconds in result["seconds"].items():
        rate = (result["tile_flops"] / seconds / gemm) if name.startswith("tile") else None
        lines.append(f"  {name:26s} {seconds * 1e3:7.2f} ms" + (f"  {rate:.2f} of GEMM" if rate else ""))
    return "\n".join(lines)


# -- the report -------------------------------------------------------------------------------------


def machine() -> dict[str, Any]:
    """What the numbers depend on: cores, CPU, numpy and its BLAS (and the kernel it picked)."""
    import numpy as np

    model = "unknown"
    try:
        with open("/proc/cpuinfo") as cpuinfo:
            model = next((line.split(":", 1)[1].strip() for line in cpuinfo if line.startswith("model name")), model)
    except OSError:
        pass
    info: dict[str, Any] = {
        "nproc": usable_cpus(),
        "cpu": model,
        "python": platform.python_version(),
        "numpy": np.__version__,
        "blas": "unknown (threadpoolctl not installed)",
        "OPENBLAS_CORETYPE": os.environ.get("OPENBLAS_CORETYPE"),
        "OPENBLAS_L2_SIZE": os.environ.get("OPENBLAS_L2_SIZE"),
    }
    try:
        from threadpoolctl import threadpool_info

        blas = [p for p in threadpool_info() if p.get("user_api") == "blas"]
        info["blas"] = ", ".join(f"{p.get('internal_api')} {p.get('version')} ({p.get('architecture')})" for p in blas)
    except ImportError:
        pass
    return info


def run_bench(
    cases: list[str],
    *,
    repeats: int,
    threads: int,
    tile: int | None,
    gemm_n: int,
    baseline: bool = True,
    end_to_end: bool = True,
    log: Callable[[str], None] = print,
) -> dict[str, Any]:
    """All measurements; returns the JSON-able report."""
    from mlaconf.golden.bench.measure import SDPA_SCORE_BUDGET, bench_spec, run_job

    gemm_job = {"kind": "gemm", "n": gemm_n, "threads": threads, "repeats": repeats}
    log(f"float64 GEMM {gemm_n}^3 on {threads} threads ...")
    gemm_times = run_job(gemm_job)["times"]
    rows = []
    for name in cases:
        spec = bench_spec(name)
        flops = spec.useful_flops
        log(f"{name}: generator ...")
        ref = run_job(
            {
                "kind": "reference",
                "case": name,
                "threads": threads,
                "repeats": repeats,
                "tile": tile,
                "baseline": baseline,
            }
        )
        build = None
        if end_to_end:
            log(f"{name}: end to end (build_golden + write) ...")
            build = run_job({"kind": "build", "case": name, "threads": threads})
        heads = max(1, min(spec.head_num, SDPA_SCORE_BUDGET // (8 * spec.max_q * spec.max_kv)))
        q_rows = max(1, min(spec.max_q, SDPA_SCORE_BUDGET // (8 * heads * spec.max_kv)))
        log(f"{name}: torch SDPA on {heads} of {spec.head_num} heads, {q_rows} of {spec.max_q} rows ...")
        sdpa = run_job(
            {"kind": "sdpa", "case": name, "threads": threads, "repeats": repeats, "heads": heads, "rows": q_rows}
        )
        rows.append(
            {
                "case": name,
                "heads": spec.head_num,
                "seq": spec.max_q,
                "mask": spec.mask_name,
                "useful_gflop": flops / 1e9,
                "reference": ref,
                "sdpa": sdpa,
                "sdpa_heads": heads,
                "sdpa_rows": q_rows,
                "build": build,
                "e2e_s": build["times"][0] if build else None,
                "reference_s": statistics.median(ref["times"]),
                "baseline_s": statistics.median(ref["baseline_times"]) if ref["baseline_times"] else None,
                "sdpa_s": statistics.median(sdpa["times"]) * spec.head_num / heads * spec.max_q / q_rows,
            }
        )
    log("float64 GEMM again ...")
    gemm_times += run_job(gemm_job)["times"]
    gemm_gflops = 2 * gemm_n**3 / statistics.median(gemm_times) / 1e9
    for row in rows:
        row["reference_gflops"] = row["useful_gflop"] / row["reference_s"]
        row["ratio_to_gemm"] = row["reference_gflops"] / gemm_gflops
        row["sdpa_gflops"] = row["useful_gflop"] / row["sdpa_s"]
        row["speedup_vs_sdpa"] = row["sdpa_s"] / row["reference_s"]
        if row["e2e_s"]:
            row["e2e_gflops"] = row["useful_gflop"] / row["e2e_s"]
            row["e2e_ratio_to_gemm"] = row["e2e_gflops"] / gemm_gflops
    return {
        "machine": machine(),
        "threads": threads,
        "tile": tile,
        "repeats": repeats,
        "gemm": {"n": gemm_n, "times": gemm_times, "gflops": gemm_gflops},
        "cases": rows,
    }


def format_table(report: dict[str, Any]) -> str:
    from mlaconf.golden.bench.limits import format_limits

    m = report["machine"]
    lines = [
        f"machine: {m['nproc']} cores, {m['cpu']}; numpy {m['numpy']}; BLAS {m['blas']}",
        f"threads {report['threads']}, tile {report['tile']}, median of {report['repeats']} "
        f"(GEMM: {len(report['gemm']['times'])} samples)",
        f"float64 GEMM {report['gemm']['n']}^3: {report['gemm']['gflops']:.1f} GF/s",
        "",
    ]
    head = (
        "case",
        "H",
        "S",
        "mask",
        "GFLOP",
        "gen s",
        "GF/s",
        "/GEMM",
        "SDPA s",
        "SDPA GF/s",
        "speed-up",
        "base s",
        "ref MB",
        "all MB",
        "e2e s",
        "e2e/GEMM",
        "e2e MB",
    )
    table = [head]
    for r in report["cases"]:
        approx = "~" if r["sdpa_heads"] < r["heads"] or r.get("sdpa_rows", r["seq"]) < r["seq"] else ""
        e2e = r.get("build")
        ref_mb = r["reference"]["ref_mb"]
        table.append(
            (
                r["case"],
                str(r["heads"]),
                str(r["seq"]),
                r["mask"],
                f"{r['useful_gflop']:.1f}",
                f"{r['reference_s']:.2f}",
                f"{r['reference_gflops']:.1f}",
                f"{r['ratio_to_gemm']:.2f}",
                f"{approx}{r['sdpa_s']:.1f}",
                f"{approx}{r['sdpa_gflops']:.1f}",
                f"{approx}{r['speedup_vs_sdpa']:.1f}x",
                "-" if r["baseline_s"] is None else f"{r['baseline_s']:.2f}",
                "n/a" if ref_mb is None else f"{ref_mb:.0f}",
                f"{r['reference']['all_mb']:.0f}",
                f"{r['e2e_s']:.2f}" if e2e else "-",
                f"{r['e2e_ratio_to_gemm']:.2f}" if e2e else "-",
                f"{e2e['all_mb']:.0f}" if e2e else "-",
            )
        )
    widths = [max(len(row[i]) for row in table) for i in range(len(head))]
    for row in table:
        lines.append("  ".join(cell.rjust(w) for cell, w in zip(row, widths, strict=True)))
    for r in report["cases"]:
        build = r.get("build")
        if not build or "stages" not in build:
            continue
        g = build["gemm"]
        parts = ", ".join(f"{name} {wall:.2f}s/{cpu:.2f}cpu" for name, (wall, cpu) in build["stages"].items())
        ref_wall, ref_cpu = build["stages"].get("reference", [0.0, 0.0])
        ratio = (
            f"reference {r['useful_gflop'] / ref_wall / g['gflops']:.2f} wall, "
            f"{r['useful_gflop'] / ref_cpu / g['cpu_gflops']:.2f} CPU time; "
            if ref_wall and ref_cpu
            else ""
        )
        lines.append(f"{r['case']} end to end by stage (wall/CPU s): {parts}")
        lines.append(
            f"  against the in-process GEMM ({g['gflops']:.1f} GF/s wall, {g['cpu_gflops']:.1f} CPU): {ratio}"
            f"end to end {r['useful_gflop'] / build['times'][0] / g['gflops']:.2f} wall"
        )
        if "limits" in build:
            lines.extend(format_limits(r["case"], build["limits"], build["times"][0]))
    return "\n".join(lines)


def _median_range(values: list[float]) -> list[float]:
    """``[median, min, max]`` of per-round ratios."""
    return [statistics.median(values), min(values), max(values)]


def run_interleaved(cases: list[str], *, repeats: int, threads: int, gemm_n: int, end_to_end: bool) -> dict[str, Any]:
    """The A/B interleaved ratios (:func:`_measure_interleaved`) per case, with medians."""
    from mlaconf.golden.bench.measure import run_job

    rows = []
    for name in cases:
        result = run_job(
            {
                "kind": "interleaved",
                "case": name,
                "threads": threads,
                "repeats": repeats,
                "gemm_n": gemm_n,
                "end_to_end": end_to_end,
            }
        )
        arms = [key.removesuffix("_gflops") for key in result["rounds"][0] if key.endswith("_gflops")]
        ratios = {
            arm: [r[f"{arm}_gflops"] / r["gemm_gflops"] for r in result["rounds"]] for arm in arms if arm != "gemm"
        }
        rows.append(
            {
                "case": name,
                "rounds": result["rounds"],
                "gemm_gflops": statistics.median(r["gemm_gflops"] for r in result["rounds"]),
                "ratio_median": {arm: statistics.median(values) for arm, values in ratios.items()},
                "ratio_range": {arm: [min(values), max(values)] for arm, values in ratios.items()},
                "reference_vs_tile_gemm": _median_range(
                    [r["reference_gflops"] / r["tile_gemm_gflops"] for r in result["rounds"]]
                ),
                "load1": [r["load1"] for r in result["rounds"]],
                "limit": result.get("limit"),
            }
        )
    return {"machine": machine(), "threads": threads, "repeats": repeats, "gemm_n": gemm_n, "cases": rows}


def format_interleaved(report: dict[str, Any]) -> str:
    m = report["machine"]
    lines = [
        f"machine: {m['nproc']} cores, {m['cpu']}; BLAS {m['blas']}; threads {report['threads']}",
        f"A/B interleaved, {report['repeats']} rounds; ratio = arm GF/s (useful FLOPs; tile_gemm: the FLOPs it "
        f"computes) / GEMM {report['gemm_n']}^3 GF/s of the same round: median [min, max]",
    ]
    for row in report["cases"]:
        load = row["load1"]
        parts = [f"{row['case']}: GEMM {row['gemm_gflops']:.1f} GF/s"]
        for arm, median in row["ratio_median"].items():
            low, high = row["ratio_range"][arm]
            parts.append(f"{arm} {median:.2f} [{low:.2f}, {high:.2f}]")
        parts.append(f"load {min(load):.1f}-{max(load):.1f}")
        lines.append("  " + "; ".join(parts))
        median, low, high = row["reference_vs_tile_gemm"]
        lines.append(
            f"    reference against the same GEMMs at its tiles' shapes (tile_gemm above, masked corners counted): "
            f"{median:.2f} [{low:.2f}, {high:.2f}]"
        )
        limit = row.get("limit")
        if limit and "e2e" in row["ratio_median"]:
            for key, label in (("", "square GEMM"), ("tile_", "GEMMs at the tiles' shapes")):
                if f"{key}ratio" not in limit:
                    continue
                ratio = limit[f"{key}ratio"]
                low, high = (value / ratio for value in row["ratio_range"]["e2e"])
                seconds = limit[f"{key}limit_s"]
                lines.append(
                    f"    derived end-to-end limit ({label}) {ratio:.2f} of this GEMM ({seconds:.2f} s); "
                    f"e2e reaches {row['ratio_median']['e2e'] / ratio:.2f} [{low:.2f}, {high:.2f}] of it"
                )
    return "\n".join(lines)


def cmd_bench(args: argparse.Namespace) -> int:
    from mlaconf.golden.bench.measure import run_job

    if args.ab:
        ab = run_interleaved(
            args.cases,
            repeats=args.repeats,
            threads=args.threads,
            gemm_n=args.gemm_size,
            end_to_end=not args.no_end_to_end,
        )
        print(format_interleaved(ab))
        if args.json:
            Path(args.json).write_text(json.dumps(ab, indent=2) + "\n")
        return 0
    if args.tile_cost:
        for name in args.cases:
            for size in args.tile_cost:
                job = {"kind": "tile_cost", "case": name, "threads": args.threads, "repeats": args.repeats}
                job["tile"] = size
                print(format_tile_cost(name, size, run_job(job)), flush=True)
        return 0
    if args.tile_profile:
        print(format_tile(run_job({"kind": "tile", "repeats": max(args.repeats, 7)})))
        return 0
    report = run_bench(
        args.cases,
        repeats=args.repeats,
        threads=args.threads,
        tile=args.tile,
        gemm_n=args.gemm_size,
        baseline=not args.no_baseline,
        end_to_end=not args.no_end_to_end,
        log=lambda msg: print(msg, file=sys.stderr, flush=True),
    )
    print(format_table(report))
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2) + "\n")
    return 0


def format_tile_cost(case: str, tile: int, result: dict[str, Any]) -> str:
    """One ``--tile-cost`` line: the build's main stage at ``tile`` rows, its speed, memory and GEMM rate."""
    seconds = statistics.median(result["times"])
    useful = bench_useful_gflop(case)
    peak = "n/a" if result["peak_mb"] is None else f"{result['peak_mb']:.0f} MB"
    return (
        f"{case} tile {tile}: reference + magnitudes {seconds:.2f} s ({useful / seconds / result['square_gflops']:.2f} "
        f"of square GEMM {result['square_gflops']:.1f} GF/s), peak {peak} above the inputs; float64 GEMMs at "
        f"this tile's shapes {result['tile_gemm64_gflops'] / result['square_gflops']:.2f} of square; load "
        f"{os.getloadavg()[0]:.1f}"
    )


def bench_useful_gflop(case: str) -> float:
    from mlaconf.golden.bench.measure import bench_spec

    return bench_spec(case).useful_flops / 1e9
