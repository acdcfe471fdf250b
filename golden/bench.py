"""``mlaconf bench``: the golden generator's speed against float64 GEMM and PyTorch SDPA.

Why: production goldens cost TFLOPs in float64, so the reference must run near the machine's
float64 GEMM rate and beat what a user would otherwise reach for (torch SDPA in float64).

Definitions (also in docs/benchmarks.md):

- GEMM GF/s: ``2 n^3 / t`` for a square float64 ``a @ b`` with BLAS on ``--threads`` threads;
  the median over all samples, taken before and after the attention measurements.
- useful FLOPs: :func:`mlaconf.facts.operator.useful_flops`, ``2 * (192 + 128) * pairs * H`` where
  ``pairs`` counts the (query, key) pairs the mask allows (``S (S + 1) / 2`` causal, ``S^2``
  bidirectional).  Effective GF/s = useful FLOPs / median seconds, for any implementation.
- generator: :func:`mlaconf.golden.reference.reference_attention` (the float64 golden) with
  ``threads=--threads``; the emulated baseline is timed separately (``build_golden`` runs both).
- SDPA: ``torch.nn.functional.scaled_dot_product_attention`` in float64 with ``is_causal`` for
  causal cases, the same scale and ``torch.set_num_threads(--threads)``.  Its CPU float64 path
  materialises ``H x S x S`` scores, so when they exceed 512 MiB it runs on as many heads as fit
  (and, when one head does not fit, on the first query rows that do; its math path costs
  ``rows x S`` whatever the mask) and the time is scaled by ``H / heads x S / rows`` (marked ``~``).
- end to end: ``build_golden`` (inputs, reference, baseline, statistics) plus writing the file
  (``write_golden`` into a temporary directory), once, in a fresh interpreter with torch already
  imported (a worker pays that once, not per case): "e2e s", its effective GF/s against GEMM, and
  "e2e MB" its peak memory.
- ``--ab``: A/B interleaved in one fresh interpreter: per round a square float64 GEMM, the fused
  reference, the unfused numpy reference it replaced and an end-to-end build, in rotating order; each
  arm's effective GF/s divided by the GEMM GF/s of the same round, median and range over rounds, with
  the load average per round (the figures docs/benchmarks.md reports on a shared machine).
- peak MB: every measurement runs in a fresh interpreter; peak is its ``VmHWM`` (which, unlike
  tracemalloc, sees BLAS and torch buffers) minus its ``VmRSS`` right after imports.  "ref MB" is
  the same over the reference call alone (peak reset through ``/proc/self/clear_refs``), with the
  inputs already resident; "all MB" also covers generating the inputs.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import os
import platform
import re
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from mlaconf.golden.inputs import generate_inputs
from mlaconf.golden.reference import DEFAULT_TILE, blas_threads, effective_scale, reference_attention
from mlaconf.golden.spec import CaseSpec, build_case

#: The benchmark's cases: name -> spec fields (one batch, 16 heads, bf16 inputs).
CASES: dict[str, dict[str, Any]] = {
    "causal-4096": {"q_seqlen": [4096], "head_num": 16, "mask_type": "mask_free"},
    "bidir-4096": {"q_seqlen": [4096], "head_num": 16, "mask_type": "undefined"},
    "causal-16384": {"q_seqlen": [16384], "head_num": 16, "mask_type": "mask_free"},
}
SDPA_SCORE_BUDGET = 512 << 20  # bytes of float64 scores one SDPA call may materialise (peak ~3x that)
ROOT = Path(__file__).resolve().parent.parent


def bench_spec(name: str) -> CaseSpec:
    return build_case({**CASES[name], "dtype": "bf16", "kv_layout": "padded", "seed": 11}, source="bench")


def cpu_count() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


# -- measurements, each run in a fresh interpreter by _worker ---------------------------------------


def _proc_status_mb(field: str) -> float:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024
    raise RuntimeError(f"/proc/self/status has no {field}")


def _reset_peak() -> bool:
    """Reset VmHWM to the current RSS (Linux >= 4.0); False where the kernel refuses."""
    try:
        with open("/proc/self/clear_refs", "w") as refs:
            refs.write("5")
        return True
    except OSError:
        return False


def _timed(fn: Callable[[], object], repeats: int) -> list[float]:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return times


def _measure_gemm(job: dict[str, Any]) -> dict[str, Any]:
    n, threads = job["n"], job["threads"]
    rng = np.random.default_rng(0)
    a, b = rng.random((n, n)), rng.random((n, n))
    with blas_threads(threads):
        a @ b  # warm-up: BLAS buffers, thread start
        return {"times": _timed(lambda: a @ b, job["repeats"])}


def _measure_reference(job: dict[str, Any]) -> dict[str, Any]:
    from mlaconf.golden.baseline import emulate_baseline

    idle = _proc_status_mb("VmRSS")
    spec = bench_spec(job["case"])
    inputs = generate_inputs(spec)
    input_peak = _proc_status_mb("VmHWM")
    resettable = _reset_peak()
    times = _timed(lambda: reference_attention(inputs, spec, tile=job["tile"], threads=job["threads"]), job["repeats"])
    ref_peak = _proc_status_mb("VmHWM")
    base_tile = job["tile"] or DEFAULT_TILE
    baseline = (
        _timed(lambda: emulate_baseline(inputs, spec, tile=base_tile, threads=job["threads"]), job["repeats"])
        if job["baseline"]
        else []
    )
    return {
        "times": times,
        "baseline_times": baseline,
        "ref_mb": ref_peak - idle if resettable else None,
        "all_mb": max(input_peak, ref_peak) - idle,
    }


def _measure_sdpa(job: dict[str, Any]) -> dict[str, Any]:
    import torch
    import torch.nn.functional as functional

    torch.set_num_threads(job["threads"])
    idle = _proc_status_mb("VmRSS")
    spec = bench_spec(job["case"])
    inputs = generate_inputs(spec)
    heads, t, rows = job["heads"], spec.total_q, job.get("rows", spec.total_q)

    def tensor(a: np.ndarray, b: np.ndarray | None) -> Any:
        x = a.reshape(t, spec.head_num, -1)[:, :heads].astype(np.float64)
        if b is not None:
            x = np.concatenate([x, b.reshape(t, spec.head_num, -1)[:, :heads].astype(np.float64)], axis=2)
        return torch.from_numpy(np.ascontiguousarray(x.transpose(1, 0, 2)))[None]

    q, k, v = tensor(inputs.q, inputs.q_rope), tensor(inputs.k, inputs.k_rope), tensor(inputs.v, None)
    del inputs
    q = q[:, :, :rows].contiguous()
    causal, scale = spec.mask_type in (2, 3), effective_scale(spec)
    times = _timed(
        lambda: functional.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=scale), job["repeats"]
    )
    return {"times": times, "all_mb": _proc_status_mb("VmHWM") - idle}


def _measure_build(job: dict[str, Any]) -> dict[str, Any]:
    """build_golden + write once, timed per stage in wall and process CPU seconds (all threads),
    next to a float64 GEMM timed the same way in the same process (CPU-time ratios survive a
    shared machine better than wall-clock ones)."""
    import tempfile

    from mlaconf.golden import progress
    from mlaconf.golden.generate import GENERATOR_VERSION, build_golden
    from mlaconf.golden.store import write_golden

    with contextlib.suppress(ImportError):  # once per worker process, not per case: not timed
        import torch  # noqa: F401
    idle = _proc_status_mb("VmRSS")
    spec = bench_spec(job["case"])
    n = job.get("gemm_n", 2048)
    a, b = np.random.default_rng(0).random((n, n)), np.random.default_rng(1).random((n, n))
    with blas_threads(job["threads"]):
        a @ b
        wall, cpu = time.perf_counter(), time.process_time()
        for _ in range(3):
            a @ b
        gemm = {
            "gflops": 6 * n**3 / (time.perf_counter() - wall) / 1e9,
            "cpu_gflops": 6 * n**3 / (time.process_time() - cpu) / 1e9,
        }
    del a, b
    marks: list[tuple[str, float, float]] = []

    def mark(work: progress.CaseWork) -> None:
        stage = "done" if work.finished else work.stage
        if not marks or marks[-1][0] != stage:
            marks.append((stage, time.perf_counter(), time.process_time()))

    remove = progress.add_listener(mark)
    with tempfile.TemporaryDirectory(prefix="mla-bench-") as tmp:
        start = time.perf_counter()
        golden = build_golden(spec, threads=job["threads"])
        remove()
        marks.append(("write", time.perf_counter(), time.process_time()))
        write_golden(golden, Path(tmp) / f"{spec.case_id}.h5", GENERATOR_VERSION)
        end = time.perf_counter()
        marks.append(("end", end, time.process_time()))
    stages = {name: [t1 - t0, c1 - c0] for (name, t0, c0), (_, t1, c1) in itertools.pairwise(marks) if name != "done"}
    return {"times": [end - start], "stages": stages, "gemm": gemm, "all_mb": _proc_status_mb("VmHWM") - idle}


def _measure_interleaved(job: dict[str, Any]) -> dict[str, Any]:
    """A/B interleaved in one process: per round a float64 GEMM, the fused reference, the unfused
    numpy reference it replaced, and an end-to-end build (``build_golden`` + write), in a rotating
    order; each arm's ratio to the GEMM sample of the same round, so a load change on this shared
    machine moves both sides of a ratio together.  ``os.getloadavg()`` is kept per round."""
    import tempfile

    from mlaconf.golden.generate import GENERATOR_VERSION, build_golden
    from mlaconf.golden.reference import attention, float64_tile
    from mlaconf.golden.store import write_golden

    with contextlib.suppress(ImportError):  # a worker pays the import once, not per case
        import torch  # noqa: F401
    spec = bench_spec(job["case"])
    inputs = generate_inputs(spec)
    n, threads = job["gemm_n"], job["threads"]
    a, b = np.random.default_rng(0).random((n, n)), np.random.default_rng(1).random((n, n))
    tmp = tempfile.TemporaryDirectory(prefix="mla-bench-")

    def end_to_end() -> None:
        golden = build_golden(spec, threads=threads)
        write_golden(golden, Path(tmp.name) / f"{spec.case_id}.h5", GENERATOR_VERSION)

    arms: dict[str, tuple[Callable[[], object], float]] = {
        "gemm": (lambda: a @ b, 2.0 * n**3),
        "reference": (lambda: reference_attention(inputs, spec, threads=threads), spec.useful_flops),
        "unfused": (lambda: attention(inputs, spec, float64_tile, np.float64, threads=threads), spec.useful_flops),
    }
    if job.get("end_to_end", True):
        arms["e2e"] = (end_to_end, spec.useful_flops)
    rounds: list[dict[str, float]] = []
    with tmp, blas_threads(threads):
        a @ b
        reference_attention(inputs, spec, threads=threads)  # warm-up: thread pools, page faults of buffers
        names = list(arms)
        for r in range(job["repeats"]):
            order = names[r % len(names) :] + names[: r % len(names)]
            rate = {name: arms[name][1] / (_timed(arms[name][0], 1)[0] * 1e9) for name in order}
            rates = {f"{name}_gflops": value for name, value in rate.items()}
            rounds.append({**rates, "load1": os.getloadavg()[0]})
    return {"rounds": rounds}


def _measure_tile(job: dict[str, Any]) -> dict[str, Any]:
    """One float64 tile and its parts on one thread, CPU time (min of ``repeats``): where the time goes."""
    import torch

    from mlaconf.golden.reference import float64_tile, pinned_threads

    rows, keys, n = job.get("rows", DEFAULT_TILE), job.get("keys", 4096), 1024
    rng = np.random.default_rng(0)
    q, kc, v = rng.uniform(-1, 1, (rows, 192)), rng.uniform(-1, 1, (keys, 192)), rng.uniform(-1, 1, (keys, 128))
    kf, a, b = np.asfortranarray(kc), rng.random((n, n)), rng.random((n, n))
    scores = q @ kc.T
    parts: dict[str, Callable[[], object]] = {
        "tile (keys C order)": lambda: float64_tile(q, kc, v, 0.07, None),
        "tile (keys Fortran order)": lambda: float64_tile(q, kf, v, 0.07, None),
        "q @ k.T (NT)": lambda: q @ kc.T,
        "q @ k.T (NN)": lambda: q @ kf.T,
        "P @ V": lambda: scores @ v,
        "exp (torch)": lambda: torch.from_numpy(scores.copy()).exp_(),
        "copy (subtract from exp)": scores.copy,
        "max + subtract + sum": lambda: (scores - scores.max(axis=1, keepdims=True)).sum(axis=1),
        f"GEMM {n}^3": lambda: a @ b,
    }
    best = dict.fromkeys(parts, float("inf"))
    with pinned_threads():
        for _ in range(job.get("repeats", 7)):
            for name, fn in parts.items():
                start = time.thread_time()
                fn()
                best[name] = min(best[name], time.thread_time() - start)
    return {"seconds": best, "tile_flops": 2 * 320 * rows * keys, "gemm_flops": 2 * n**3}


def format_tile(result: dict[str, Any]) -> str:
    gemm = result["gemm_flops"] / min(v for k, v in result["seconds"].items() if k.startswith("GEMM"))
    lines = ["one thread, CPU time, min of repeats (256 rows x 4096 keys):"]
    for name, seconds in result["seconds"].items():
        rate = (result["tile_flops"] / seconds / gemm) if name.startswith("tile") else None
        lines.append(f"  {name:26s} {seconds * 1e3:7.2f} ms" + (f"  {rate:.2f} of GEMM" if rate else ""))
    return "\n".join(lines)


def _worker(payload: str) -> int:
    job = json.loads(payload)
    measure = {
        "gemm": _measure_gemm,
        "reference": _measure_reference,
        "sdpa": _measure_sdpa,
        "build": _measure_build,
        "tile": _measure_tile,
        "interleaved": _measure_interleaved,
    }[job["kind"]]
    print(json.dumps(measure(job)))
    return 0


def run_job(job: dict[str, Any]) -> dict[str, Any]:
    """Run one measurement in a fresh interpreter (its own peak memory, no warm caches)."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    proc = subprocess.run(
        [sys.executable, "-m", "mlaconf.golden.bench", json.dumps(job)],
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    if proc.returncode != 0:
        raise RuntimeError(f"bench worker {job} failed:\n{proc.stderr[-2000:]}")
    result: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    return result


# -- the report -------------------------------------------------------------------------------------


def machine() -> dict[str, Any]:
    """What the numbers depend on: cores, CPU, numpy and its BLAS (and the kernel it picked)."""
    model = "unknown"
    try:
        with open("/proc/cpuinfo") as cpuinfo:
            model = next((line.split(":", 1)[1].strip() for line in cpuinfo if line.startswith("model name")), model)
    except OSError:
        pass
    info: dict[str, Any] = {
        "nproc": cpu_count(),
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
    return "\n".join(lines)


def run_interleaved(cases: list[str], *, repeats: int, threads: int, gemm_n: int, end_to_end: bool) -> dict[str, Any]:
    """The A/B interleaved ratios (:func:`_measure_interleaved`) per case, with medians."""
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
                "load1": [r["load1"] for r in result["rounds"]],
            }
        )
    return {"machine": machine(), "threads": threads, "repeats": repeats, "gemm_n": gemm_n, "cases": rows}


def format_interleaved(report: dict[str, Any]) -> str:
    m = report["machine"]
    lines = [
        f"machine: {m['nproc']} cores, {m['cpu']}; BLAS {m['blas']}; threads {report['threads']}",
        f"A/B interleaved, {report['repeats']} rounds; ratio = arm GF/s (useful FLOPs) / GEMM {report['gemm_n']}^3 GF/s"
        " of the same round: median [min, max]",
    ]
    for row in report["cases"]:
        load = row["load1"]
        parts = [f"{row['case']}: GEMM {row['gemm_gflops']:.1f} GF/s"]
        for arm, median in row["ratio_median"].items():
            low, high = row["ratio_range"][arm]
            parts.append(f"{arm} {median:.2f} [{low:.2f}, {high:.2f}]")
        parts.append(f"load {min(load):.1f}-{max(load):.1f}")
        lines.append("  " + "; ".join(parts))
    return "\n".join(lines)


def cmd_bench(args: argparse.Namespace) -> int:
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


def help_text(doc: str | None) -> str:
    """A docstring as --help prose: reST roles (``:func:`x```) and literals (````x````) as plain text."""
    return re.sub(r":\w+:`~?([^`]+)`", r"\1", doc or "").replace("``", "")


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "bench",
        help="measure the float64 golden generator against GEMM and torch SDPA",
        description=help_text(__doc__),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--cases", nargs="+", choices=list(CASES), default=list(CASES), help="cases to run (default: all)"
    )
    parser.add_argument("--repeats", type=int, default=3, help="timed runs per measurement (median)")
    parser.add_argument("--threads", type=int, default=cpu_count(), help="threads for every implementation")
    parser.add_argument("--tile", type=int, default=None, help="reference query tile (default: the path's own)")
    parser.add_argument("--gemm-size", type=int, default=4096, help="n of the square GEMM")
    parser.add_argument("--no-baseline", action="store_true", help="skip timing the emulated baseline")
    parser.add_argument(
        "--tile-profile",
        action="store_true",
        help="only profile one reference tile and its parts (one thread, CPU time)",
    )
    parser.add_argument("--no-end-to-end", action="store_true", help="skip the end-to-end build_golden run")
    parser.add_argument(
        "--ab",
        action="store_true",
        help="A/B interleaved ratios in one process: GEMM, fused reference, unfused reference, end to end",
    )
    parser.add_argument("--json", metavar="OUT", help="also write the full report as JSON")
    parser.set_defaults(func=cmd_bench)


if __name__ == "__main__":
    sys.exit(_worker(sys.argv[1]))
