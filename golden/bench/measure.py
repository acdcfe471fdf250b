"""The bench's measurements, each in a fresh interpreter (``python -m mlaconf.golden.bench.measure JOB``).

Why a module of its own: a worker process imports only what it measures, and the report
(:mod:`mlaconf.golden.bench.run`) stays apart from how its numbers are taken.  The definitions of every
figure are in :mod:`mlaconf.golden.bench.run` and docs/benchmarks.md.
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from mlaconf.facts.operator import SCORE_DIM, V_DIM
from mlaconf.golden.bench.cases import CASES
from mlaconf.golden.bench.limits import (
    MachineRates,
    build_work,
    computed_pairs,
    limit_report,
    measure_rates,
    measure_tile_rates,
)
from mlaconf.golden.building.inputs import generate_inputs
from mlaconf.golden.building.reference import (
    DEFAULT_TILE,
    FUSED_TILE,
    HeadTask,
    Workspace,
    blas_threads,
    effective_scale,
    for_each_tile,
    gemm,
    reference_attention,
    value_gemm,
)
from mlaconf.golden.specs.spec import CaseSpec
from mlaconf.golden.specs.spec_build import build_case
from mlaconf.golden.specs.types import OpInputs

SDPA_SCORE_BUDGET = 512 << 20  # bytes of float64 scores one SDPA call may materialise (peak ~3x that)
ROOT = Path(__file__).resolve().parent.parent


def bench_spec(name: str) -> CaseSpec:
    return build_case({**CASES[name], "dtype": "bf16", "kv_layout": "padded", "seed": 11}, source="bench")


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
    from mlaconf.golden.building.baseline import emulate_baseline

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

    from mlaconf.golden.building import progress
    from mlaconf.golden.building.generate import build_golden
    from mlaconf.golden.store.directory import write_golden
    from mlaconf.golden.store.integrity import GENERATOR_VERSION

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
        path = Path(tmp) / f"{spec.case_id}.h5"
        write_golden(golden, path, GENERATOR_VERSION)
        end = time.perf_counter()
        marks.append(("end", end, time.process_time()))
        file_bytes = path.stat().st_size
    stages = {name: [t1 - t0, c1 - c0] for (name, t0, c0), (_, t1, c1) in itertools.pairwise(marks) if name != "done"}
    works = build_work(
        spec,
        input_bytes=sum(a.nbytes for a in golden.inputs.arrays().values()),
        output_bytes=golden.out.nbytes + golden.baseline_out.nbytes,
        file_bytes=file_bytes,
    )
    stage_wall = {name: times[0] for name, times in stages.items()}
    limits = limit_report(works, _rates(spec, job["threads"], n), stage_wall, spec.useful_flops)
    return {
        "times": [end - start],
        "stages": stages,
        "gemm": gemm,
        "limits": limits,
        "all_mb": _proc_status_mb("VmHWM") - idle,
    }


def tile_gemms(inputs: OpInputs, spec: CaseSpec, threads: int) -> None:
    """The fused reference's two float64 GEMMs at its tiles' shapes (``q k^T`` and :func:`value_gemm`, same
    tiles, same workers) with nothing between them: the GEMM "at the size of the tiles'" that the
    reference is also measured against; its rate counts the FLOPs computed (masked corners included)."""
    work = Workspace()

    def visit(task: HeadTask, i0: int, i1: int, k_end: int, diag: tuple[int, int] | None) -> None:
        scores = gemm(task.q[i0:i1], task.k[:k_end].T, work.take("scores", (i1 - i0, k_end), np.float64))
        value_gemm(scores, task.vt[:, :k_end])

    for_each_tile(inputs, spec, visit, np.float64, tile=FUSED_TILE, threads=threads)


def _measure_interleaved(job: dict[str, Any]) -> dict[str, Any]:
    """A/B interleaved in one process: per round a float64 GEMM, the fused reference, the unfused
    numpy reference it replaced, an end-to-end build (``build_golden`` + write) and the reference's
    GEMMs alone at its tiles' shapes (:func:`tile_gemms`, whose rate counts the FLOPs it computes), in a
    rotating order; each arm's ratio to the GEMM sample of the same round, so a load change on this
    shared machine moves both sides of a ratio together.  ``os.getloadavg()`` is kept per round."""
    import tempfile

    from mlaconf.golden.building.generate import build_golden
    from mlaconf.golden.building.reference import attention, float64_tile
    from mlaconf.golden.store.directory import write_golden
    from mlaconf.golden.store.integrity import GENERATOR_VERSION

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

    computed_flops = 2.0 * (SCORE_DIM + V_DIM) * computed_pairs(spec, FUSED_TILE)
    arms: dict[str, tuple[Callable[[], object], float]] = {
        "gemm": (lambda: a @ b, 2.0 * n**3),
        "reference": (lambda: reference_attention(inputs, spec, threads=threads), spec.useful_flops),
        "unfused": (lambda: attention(inputs, spec, float64_tile, np.float64, threads=threads), spec.useful_flops),
        "tile_gemm": (lambda: tile_gemms(inputs, spec, threads), computed_flops),
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
        limit = _interleaved_limit(spec, threads, n, lambda: a @ b, Path(tmp.name))
    return {"rounds": rounds, "limit": limit}


def _interleaved_limit(spec: CaseSpec, threads: int, n: int, square: Callable[[], object], tmp: Path) -> dict[str, Any]:
    """The derived end-to-end limit (:mod:`mlaconf.golden.bench.limits`) as a ratio to the rounds' own
    square GEMM: the limit's rates and that GEMM measured back to back, after the rounds."""
    from mlaconf.golden.building.generate import build_golden
    from mlaconf.golden.store.directory import write_golden

    golden = build_golden(spec, threads=threads)
    path = tmp / "limit.h5"
    write_golden(golden, path, "limit")
    works = build_work(
        spec,
        input_bytes=sum(a.nbytes for a in golden.inputs.arrays().values()),
        output_bytes=golden.out.nbytes + golden.baseline_out.nbytes,
        file_bytes=path.stat().st_size,
    )
    del golden
    rates = _rates(spec, threads, n)
    square_rate = 2.0 * n**3 / min(_timed(square, 3))
    report = limit_report(works, rates, {}, spec.useful_flops)
    return {
        **report,
        "square_gflops": square_rate / 1e9,
        "ratio": spec.useful_flops / report["limit_s"] / square_rate,
        "tile_ratio": spec.useful_flops / report["tile_limit_s"] / square_rate,
    }


def _rates(spec: CaseSpec, threads: int, n: int) -> MachineRates:
    """:func:`measure_rates` with the GEMM rates at ``spec``'s tile shapes (both limits' rates)."""
    tile64, tile32 = measure_tile_rates(spec, threads)
    return dataclasses.replace(measure_rates(threads, n), tile_gemm64=tile64, tile_gemm32=tile32)


def _measure_tile_cost(job: dict[str, Any]) -> dict[str, Any]:
    """What one reference tile size costs and gains: ``reference_and_magnitudes`` (the build's main stage) at
    ``tile`` rows, best of ``repeats``, its peak memory above the inputs (VmHWM reset after generating them)
    and the float64 GEMM rate at that tile's shapes, next to a square GEMM in the same process."""
    from mlaconf.golden.building.magnitudes import reference_and_magnitudes

    with contextlib.suppress(ImportError):
        import torch  # noqa: F401
    spec, threads, tile = bench_spec(job["case"]), job["threads"], job["tile"]
    inputs = generate_inputs(spec)
    resident = _proc_status_mb("VmRSS")
    resettable = _reset_peak()
    times = _timed(lambda: reference_and_magnitudes(inputs, spec, tile=tile, threads=threads), job["repeats"])
    peak = _proc_status_mb("VmHWM") - resident if resettable else None
    n = job.get("gemm_n", 2048)
    a, b = np.random.default_rng(0).random((n, n)), np.random.default_rng(1).random((n, n))
    with blas_threads(threads):
        a @ b
        square = 2.0 * n**3 / min(_timed(lambda: a @ b, 3))
    tile64, _ = measure_tile_rates(spec, threads, tile=tile)
    return {"times": times, "peak_mb": peak, "square_gflops": square / 1e9, "tile_gemm64_gflops": tile64 / 1e9}


def _measure_tile(job: dict[str, Any]) -> dict[str, Any]:
    """One float64 tile and its parts on one thread, CPU time (min of ``repeats``): where the time goes."""
    import torch

    from mlaconf.golden.building.reference import float64_tile, pinned_threads

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


def _worker(payload: str) -> int:
    job = json.loads(payload)
    measure = {
        "gemm": _measure_gemm,
        "reference": _measure_reference,
        "sdpa": _measure_sdpa,
        "build": _measure_build,
        "tile": _measure_tile,
        "interleaved": _measure_interleaved,
        "tile_cost": _measure_tile_cost,
    }[job["kind"]]
    print(json.dumps(measure(job)))
    return 0


def run_job(job: dict[str, Any]) -> dict[str, Any]:
    """Run one measurement in a fresh interpreter (its own peak memory, no warm caches)."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    proc = subprocess.run(
        [sys.executable, "-m", "mlaconf.golden.bench.measure", json.dumps(job)],
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    if proc.returncode != 0:
        raise RuntimeError(f"bench worker {job} failed:\n{proc.stderr[-2000:]}")
    result: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    return result


if __name__ == "__main__":
    sys.exit(_worker(sys.argv[1]))
