"""Peak memory of one backend call on a large case: ``python -m mlaconf.tools.memprobe --heads 128 --seq 16384``.

Builds the case's inputs (chunked, as the golden generator does), then runs ``backend.run`` in a
thread while sampling the process's ``VmHWM`` every 0.5 s.  Backends that bound their working
memory reach their peak within the first blocks, so ``--seconds`` caps the run (the figure is
then labelled "after N s"); without a cap it runs to the end and also reports the time.
"""

from __future__ import annotations

import argparse
import os
import sys
import threading
import time

from mlaconf.golden.building.inputs import generate_inputs
from mlaconf.golden.specs.spec_build import build_case
from mlaconf.harness import registry
from mlaconf.runner.execution import make_call


def _status_mb(field: str) -> float:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024
    return float("nan")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m mlaconf.tools.memprobe", description=__doc__)
    parser.add_argument("--backend", default="torch-cpu")
    parser.add_argument("--heads", type=int, default=128)
    parser.add_argument("--seq", type=int, default=16384)
    parser.add_argument("--mask", default="mask_free")
    parser.add_argument("--dtype", default="bf16")
    parser.add_argument("--seconds", type=float, default=0.0, help="stop after this long (0: run to the end)")
    args = parser.parse_args(argv)
    spec = build_case(
        {
            "q_seqlen": [args.seq],
            "head_num": args.heads,
            "mask_type": args.mask,
            "dtype": args.dtype,
            "kv_layout": "padded",
            "seed": 1,
        },
        source="memprobe",
    )
    idle = _status_mb("VmRSS")
    inputs = generate_inputs(spec)
    call = make_call(inputs, spec)
    resident = _status_mb("VmRSS")
    backend = registry.create(args.backend)
    done = threading.Event()
    start = time.monotonic()

    def run() -> None:
        backend.run(call)
        done.set()

    threading.Thread(target=run, daemon=True).start()
    while not done.wait(0.5):
        if args.seconds and time.monotonic() - start > args.seconds:
            break
    elapsed = time.monotonic() - start
    state = "finished" if done.is_set() else f"stopped after {elapsed:.0f} s"
    print(
        f"{args.backend} {spec.case_id}: inputs {resident - idle:.0f} MB resident; peak RSS "
        f"{_status_mb('VmHWM'):.0f} MB ({_status_mb('VmHWM') - resident:.0f} MB above the inputs), "
        f"run {state} in {elapsed:.1f} s",
        flush=True,
    )
    os._exit(0)  # do not wait for a still-running backend thread


if __name__ == "__main__":
    sys.exit(main())
