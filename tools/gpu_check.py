"""GPU check: the float64 golden on CUDA against the same device's float64 GEMM, and torch-cuda.

``python -m mlaconf.tools.gpu_check`` (or ``bash harness/run_cuda.sh``) on a machine with an NVIDIA GPU:

1. float64 GEMM GF/s of the device (``torch.matmul``, square n = 8192, median of 5);
2. agreement: the CUDA golden (``reference_attention(device="cuda")``) against the numpy/BLAS
   one on a small case of every mask mode, relative difference <= 1e-12;
3. per case (``--cases``; bench cases and two DeepSeek shapes): the CUDA golden's time, effective
   GF/s (useful FLOPs / s) and its ratio to the GEMM; ``build_golden`` end to end with
   ``MLA_GOLDEN_DEVICE=cuda`` (inputs and the emulated baseline stay on the CPU); and the
   torch-cuda backend (bf16 SDPA) on the same inputs: time and GF/s.

Prints one table and, with ``--json``, writes every figure.  Exit 1 when the agreement fails.
``--device cpu`` runs the same script through torch's CPU path (a dry run of the script itself).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from typing import Any

import numpy as np

from mlaconf.golden.bench.cases import CASES
from mlaconf.golden.bench.measure import bench_spec
from mlaconf.golden.building.inputs import generate_inputs
from mlaconf.golden.building.reference import DEVICE_ENV, reference_attention, torch_attention
from mlaconf.golden.building.regen import relative_difference
from mlaconf.golden.specs.spec import CaseSpec
from mlaconf.golden.specs.spec_build import build_case

EXTRA_CASES: dict[str, dict[str, Any]] = {
    "deepseek-h128-4096": {"q_seqlen": [4096], "head_num": 128, "mask_type": "mask_free"},
    "deepseek-h32-16384": {"q_seqlen": [16384], "head_num": 32, "mask_type": "mask_free"},
}
AGREEMENT_CASES = [
    {"q_seqlen": [300, 0, 77], "head_num": 4, "mask_type": 0},
    {"q_seqlen": [513], "head_num": 2, "mask_type": 2, "kv_layout": "padded"},
    {
        "q_seqlen": [200, 64],
        "kv_seqlen": [900, 64],
        "head_num": 4,
        "kv_head_num": 2,
        "mask_type": 3,
        "kv_layout": "padded",
    },
]


def case_spec(name: str) -> CaseSpec:
    if name in CASES:
        return bench_spec(name)
    return build_case({**EXTRA_CASES[name], "dtype": "bf16", "kv_layout": "padded", "seed": 11}, source="gpu")


DEVICE = "cuda"


def _sync() -> None:
    import torch

    if DEVICE.startswith("cuda"):
        torch.cuda.synchronize()


def gemm_gflops(n: int, repeats: int = 5) -> float:
    import torch

    a = torch.rand(n, n, dtype=torch.float64, device=DEVICE)
    b = torch.rand(n, n, dtype=torch.float64, device=DEVICE)
    a @ b
    _sync()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        a @ b
        _sync()
        times.append(time.perf_counter() - start)
    return 2 * n**3 / statistics.median(times) / 1e9


def agreement() -> list[float]:
    diffs = []
    for fields in AGREEMENT_CASES:
        spec = build_case({**fields, "seed": 5}, source="gpu-agreement")
        inputs = generate_inputs(spec)
        cpu, valid = reference_attention(inputs, spec, threads=os.cpu_count() or 1)
        gpu = torch_attention(inputs, spec, device=DEVICE).reshape(cpu.shape)
        diffs.append(relative_difference(gpu[valid], cpu[valid]))
    return diffs


def measure_case(name: str, repeats: int) -> dict[str, Any]:
    from mlaconf.golden.building.generate import build_golden
    from mlaconf.harness.torch_backend import TorchSdpaBackend
    from mlaconf.runner.execution import make_call

    spec = case_spec(name)
    inputs = generate_inputs(spec)
    torch_attention(inputs, spec, device=DEVICE)  # warm-up: context, kernels
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        torch_attention(inputs, spec, device=DEVICE)
        _sync()
        times.append(time.perf_counter() - start)
    os.environ[DEVICE_ENV] = DEVICE  # "cpu" (dry run): build_golden's numpy path
    try:
        start = time.perf_counter()
        build_golden(spec, threads=os.cpu_count() or 1)
        e2e = time.perf_counter() - start
    finally:
        os.environ.pop(DEVICE_ENV, None)
    backend, call = TorchSdpaBackend(DEVICE), make_call(inputs, spec)
    backend.run(call)
    backend.synchronize()
    sdpa = []
    for _ in range(repeats):
        start = time.perf_counter()
        backend.run(call)
        backend.synchronize()
        sdpa.append(time.perf_counter() - start)
    flops = spec.useful_flops
    golden_s = statistics.median(times)
    return {
        "case": name,
        "heads": spec.head_num,
        "seq": spec.max_q,
        "useful_gflop": flops / 1e9,
        "golden_s": golden_s,
        "golden_gflops": flops / golden_s / 1e9,
        "e2e_s": e2e,
        "torch_cuda_s": statistics.median(sdpa),
        "torch_cuda_gflops": flops / statistics.median(sdpa) / 1e9,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m mlaconf.tools.gpu_check",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    names = [*CASES, *EXTRA_CASES]
    parser.add_argument("--cases", nargs="+", choices=names, default=names)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--gemm-size", type=int, default=8192)
    parser.add_argument("--json", default=None)
    parser.add_argument("--device", default="cuda", help="cuda (default), cuda:N, or cpu for a dry run")
    args = parser.parse_args(argv)
    import torch

    global DEVICE
    DEVICE = args.device
    if DEVICE.startswith("cuda") and not torch.cuda.is_available():
        print("no CUDA device visible to torch", file=sys.stderr)
        return 2
    device = torch.cuda.get_device_name(torch.device(DEVICE)) if DEVICE.startswith("cuda") else "cpu (dry run)"
    gemm = gemm_gflops(args.gemm_size)
    print(f"device: {device}; torch {torch.__version__}; float64 GEMM {args.gemm_size}^3: {gemm:.0f} GF/s", flush=True)
    diffs = agreement()
    ok = all(d <= 1e-12 for d in diffs)
    print(
        f"CUDA golden vs numpy golden, relative difference per mask mode: "
        f"{', '.join(f'{d:.2e}' for d in diffs)} ({'ok' if ok else 'FAIL'}, bound 1e-12)",
        flush=True,
    )
    rows = []
    print(
        f"{'case':20s} {'H':>4s} {'S':>6s} {'GFLOP':>8s} {'golden s':>9s} {'GF/s':>8s} {'/GEMM':>6s} "
        f"{'e2e s':>7s} {'torch-cuda s':>12s} {'GF/s':>8s}",
        flush=True,
    )
    for name in args.cases:
        row = measure_case(name, args.repeats)
        row["ratio_to_gemm"] = row["golden_gflops"] / gemm
        rows.append(row)
        print(
            f"{name:20s} {row['heads']:4d} {row['seq']:6d} {row['useful_gflop']:8.1f} {row['golden_s']:9.3f} "
            f"{row['golden_gflops']:8.0f} {row['ratio_to_gemm']:6.2f} {row['e2e_s']:7.1f} "
            f"{row['torch_cuda_s']:12.4f} {row['torch_cuda_gflops']:8.0f}",
            flush=True,
        )
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(
                {
                    "device": device,
                    "gemm_gflops": gemm,
                    "agreement": diffs,
                    "cases": rows,
                    "numpy": np.__version__,
                    "torch": torch.__version__,
                },
                fh,
                indent=1,
            )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
