"""Overhead of ``--ray`` against the local forms, A/B interleaved in one process (docs/benchmarks.md).

Starts a local Ray cluster (``ray.init(num_cpus=CPUS)``), then per round, in alternating order:
``mlaconf regen smoke -j CPUS`` against ``mlaconf regen smoke --ray ADDRESS`` (fresh stores), and
``mlaconf run --backend torch-cpu -n CPUS`` against ``mlaconf run --ray ADDRESS`` (goldens built).  Each
command is a fresh process, so the ``--ray`` figures include connecting to the cluster.  Prints the
medians and the overhead per case / per test.  Usage::

    PYTHONPATH=. python tests/bench_cluster.py --rounds 3
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def timed(command: list[str]) -> float:
    start = time.monotonic()
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(command)}: exit {done.returncode}\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}")
    return time.monotonic() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--cpus", type=int, default=2)
    args = parser.parse_args()
    import ray

    work = Path(tempfile.mkdtemp(prefix="bench-cluster-"))
    os.environ.pop("MLA_GOLDEN_DIR", None)
    start = time.monotonic()
    ray.init(num_cpus=args.cpus, include_dashboard=False, logging_level="WARNING", log_to_driver=False)
    started = time.monotonic() - start
    address = ray.get_runtime_context().gcs_address
    mla = [sys.executable, "-m", "mlaconf"]
    jobs = str(args.cpus)
    times: dict[str, list[float]] = {"regen local": [], "regen ray": [], "run local": [], "run ray": []}
    goldens = work / "goldens"
    timed([*mla, "regen", "smoke", "--out", str(goldens), "-j", jobs])
    cases, tests = len(list(goldens.glob("*.h5"))), 0
    try:
        for round_ in range(args.rounds):
            pairs = [
                ("regen local", [*mla, "regen", "smoke", "-j", jobs, "--out"]),
                ("regen ray", [*mla, "regen", "smoke", "--ray", address, "--out"]),
            ]
            runs = [
                ("run local", [*mla, "run", "--backend", "torch-cpu", "-n", jobs]),
                ("run ray", [*mla, "run", "--backend", "torch-cpu", "--ray", address]),
            ]
            if round_ % 2:
                pairs.reverse()
                runs.reverse()
            for name, command in pairs:
                store = work / f"{name.replace(' ', '-')}-{round_}"
                times[name].append(timed([*command, str(store)]))
                shutil.rmtree(store)
            for name, command in runs:
                out = work / f"{name.replace(' ', '-')}-{round_}"
                times[name].append(timed([*command, "--golden-dir", str(goldens), "--report-dir", str(out)]))
                tests = json.loads((out / "run.json").read_text())["records"]
            print(f"round {round_ + 1}: " + ", ".join(f"{k} {v[-1]:.1f}s" for k, v in times.items()), flush=True)
    finally:
        ray.shutdown()
        shutil.rmtree(work, ignore_errors=True)
    median = {name: statistics.median(values) for name, values in times.items()}
    print(f"local cluster start (ray.init, {args.cpus} CPUs): {started:.1f}s; load average {os.getloadavg()[0]:.2f}")
    for name, value in median.items():
        print(f"{name}: median {value:.1f}s over {args.rounds} rounds ({', '.join(f'{t:.1f}' for t in times[name])})")
    regen = median["regen ray"] - median["regen local"]
    run = median["run ray"] - median["run local"]
    print(
        f"regen --ray: {median['regen ray'] / median['regen local']:.2f}x local, "
        f"{regen:+.1f}s = {1000 * regen / cases:+.0f} ms per case ({cases} cases)"
    )
    print(
        f"run --ray: {median['run ray'] / median['run local']:.2f}x local, "
        f"{run:+.1f}s = {1000 * run / tests:+.0f} ms per test ({tests} tests, {args.cpus} shards)"
    )


if __name__ == "__main__":
    main()
