"""Framework overhead per conformance case, by stage: ``python -m mlaconf.tools.overhead --suite smoke``.

Everything the conformance test does besides ``backend.run``: loading and verifying the golden,
hashing the inputs (before and after the call, to catch a backend that writes into them),
building the call, converting the output, the metrics, the verdict, and the record.  Each case is
run once to warm caches (the golden is generated if missing), then ``--repeats`` times measured;
the table gives per-stage medians over cases in wall and process CPU time (every thread's: the
judge's chunks and the backend run on several threads).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from mlaconf.golden.building.generate import build_golden
from mlaconf.golden.specs.spec import CaseSpec
from mlaconf.golden.specs.spec_build import build_case
from mlaconf.golden.specs.suites import load_suite, load_suites
from mlaconf.golden.store.directory import GoldenStore
from mlaconf.harness import registry
from mlaconf.judge.deviations import load_deviations
from mlaconf.judge.policy import load_policies

STAGES = ("load", "digests", "call", "backend", "metrics+verdict", "record")


class Timer:
    """Wall and process-CPU seconds per stage for one case."""

    def __init__(self) -> None:
        self.wall: dict[str, float] = defaultdict(float)
        self.cpu: dict[str, float] = defaultdict(float)

    @contextmanager
    def stage(self, name: str) -> Iterator[None]:
        wall, cpu = time.perf_counter(), time.process_time()
        try:
            yield
        finally:
            self.wall[name] += time.perf_counter() - wall
            self.cpu[name] += time.process_time() - cpu


def _wrap(module: Any, name: str, timer_ref: list[Timer], stage: str) -> Callable[[], None]:
    original = getattr(module, name)

    def timed(*args: Any, **kwargs: Any) -> Any:
        with timer_ref[0].stage(stage):
            return original(*args, **kwargs)

    setattr(module, name, timed)
    return lambda: setattr(module, name, original)


def measure(specs: list[CaseSpec], backend_name: str, repeats: int, store: GoldenStore) -> list[dict[str, Any]]:
    """Per case: median per-stage seconds (wall and CPU) over ``repeats`` runs."""
    import mlaconf.runner.conformance as conformance
    import mlaconf.runner.execution as execution
    from mlaconf.runner.identity import conformance_identity

    backend = registry.create(backend_name)
    policies, deviations = load_policies(), load_deviations()
    timer_ref = [Timer()]
    original_run = backend.run

    def run(call: Any) -> Any:
        with timer_ref[0].stage("backend"):
            return original_run(call)

    backend.run = run  # type: ignore[method-assign]
    restores = [
        _wrap(conformance, "input_digests", timer_ref, "digests"),
        _wrap(conformance, "make_call", timer_ref, "call"),
        _wrap(conformance, "judge_resolved", timer_ref, "metrics+verdict"),
        _wrap(conformance, "output_digest", timer_ref, "record"),
        _wrap(execution, "to_numpy", timer_ref, "call"),
    ]

    def one_case(spec: CaseSpec) -> None:
        """What one conformance test does; its golden dies with the call, as with the test."""
        with timer_ref[0].stage("load"):
            golden = store.load(spec)
        result = conformance.run_case(golden, backend, policy_set=policies, policy="default", deviations=deviations)
        with timer_ref[0].stage("record"):
            json.dumps(result.ending.record(conformance_identity(spec, backend.name, "default")).to_dict(), default=str)

    rows = []
    try:
        for spec in specs:
            if spec.expect_error is not None:
                continue
            store.ensure(spec)
            samples: list[Timer] = []
            for attempt in range(repeats + 1):
                timer = timer_ref[0] = Timer()
                with timer.stage("total"):
                    one_case(spec)
                if attempt:
                    samples.append(timer)
            row: dict[str, Any] = {"case": spec.case_id}
            for kind in ("wall", "cpu"):
                for stage in (*STAGES, "total"):
                    row[f"{kind}:{stage}"] = statistics.median(getattr(t, kind)[stage] for t in samples)
                row[f"{kind}:overhead"] = statistics.median(
                    getattr(t, kind)["total"] - getattr(t, kind)["backend"] for t in samples
                )
            rows.append(row)
    finally:
        for restore in restores:
            restore()
    return rows


def format_rows(rows: list[dict[str, Any]]) -> str:
    lines = [f"{len(rows)} cases; medians over cases, milliseconds (wall / process CPU)"]
    for stage in (*STAGES, "overhead", "total"):
        wall = statistics.median(r[f"wall:{stage}"] for r in rows) * 1e3
        cpu = statistics.median(r[f"cpu:{stage}"] for r in rows) * 1e3
        worst = max(r[f"wall:{stage}"] for r in rows) * 1e3
        lines.append(f"  {stage:16s} {wall:8.2f} / {cpu:8.2f}   (max wall {worst:.1f})")
    return "\n".join(lines)


#: ``--judge`` cases: the deepseek suite's chunked-prefill case (docs/benchmarks.md, "ds1") and a small one.
JUDGE_CASES: dict[str, dict[str, Any]] = {
    "ds1": {"q_seqlen": [4096, 4096], "kv_seqlen": [16384, 4096], "head_num": 16, "kv_head_num": 16},
    "small": {"q_seqlen": [256], "kv_seqlen": [512], "head_num": 2, "kv_head_num": 2},
}


def judge_spec(name: str) -> CaseSpec:
    """A ``--judge`` case: bf16, causal, padded kv."""
    fields = {**JUDGE_CASES[name], "mask_type": "causal", "dtype": "bf16", "kv_layout": "padded", "seed": 3}
    return build_case(fields, source="overhead")


def format_share(row: dict[str, Any]) -> str:
    """One case's judging overhead against its backend call, with the 5 % target (docs/benchmarks.md)."""
    backend = row["wall:backend"]
    share = f"{100 * row['wall:overhead'] / backend:.1f} %" if backend else "-"
    return (
        f"{row['case']}: overhead {row['wall:overhead'] * 1e3:.0f} ms wall ({row['cpu:overhead'] * 1e3:.0f} ms "
        f"process CPU) against the backend's {backend:.2f} s: {share} (target <= 5 %)"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m mlaconf.tools.overhead",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--suite", default="smoke")
    parser.add_argument("--cases", default=None, help="a suite file to measure instead of --suite")
    parser.add_argument("--backend", default="torch-cpu")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--golden-dir", default=None)
    parser.add_argument("--json", default=None, help="write per-case rows as JSON")
    parser.add_argument(
        "--judge",
        choices=list(JUDGE_CASES),
        help="measure this one case instead (ds1: deepseek-sized) and print its overhead as a share of the call",
    )
    args = parser.parse_args(argv)
    if args.judge:
        specs = [judge_spec(args.judge)]
    else:
        specs = load_suite(args.cases) if args.cases else load_suites([args.suite])
    rows = measure(specs, args.backend, args.repeats, GoldenStore(args.golden_dir, builder=build_golden))
    print(format_rows(rows))
    for row in rows if args.judge else ():
        print(format_share(row))
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(rows, fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
