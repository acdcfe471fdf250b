"""``mlaconf run``: the main job, a conformance run of the selected suites on the best backend."""

from __future__ import annotations

import argparse
import importlib.resources
import subprocess
import sys

from mlaconf.golden.spec import SUITES_PACKAGE
from mlaconf.harness.registry import AUTO_ORDER, BUILTIN


def pytest_command(args: argparse.Namespace) -> list[str]:
    """The pytest invocation ``run`` stands for (printed, so it can be rerun or adapted)."""
    suites = str(importlib.resources.files(SUITES_PACKAGE))  # the installed suites, from any directory
    command = [sys.executable, "-m", "pytest", suites, "-p", "no:cacheprovider", "-n", str(args.jobs)]
    for suite in args.suite or ["smoke"]:
        command += ["--suite", suite]
    for backend in args.backend or ["auto"]:
        command += ["--backend", backend]
    if args.policy:
        command += ["--policy", args.policy]
    if args.golden_dir:
        command += ["--golden-dir", args.golden_dir]
    if args.run_name:
        command += ["--run-name", args.run_name]
    if args.report_dir:
        command += ["--report-dir", args.report_dir]
    return command + [a for a in args.pytest_args if a != "--"]


def run(args: argparse.Namespace) -> int:
    if args.ray is not None:
        return run_on_cluster(args)
    command = pytest_command(args)
    print("+ python " + " ".join(command[1:]), flush=True)
    return subprocess.call(command)  # from the caller's directory: relative paths mean what they say


def run_on_cluster(args: argparse.Namespace) -> int:
    """``run --ray``: shards on the cluster's devices (runner.ray_run), one merged run directory."""
    from mlaconf.facts.cluster import ClusterUnavailable, connected

    try:
        with connected(args.ray) as ray:
            from mlaconf.runner.ray_run import run_on_ray

            return run_on_ray(ray, args, retries=args.ray_retries)
    except ClusterUnavailable as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "run",
        help="conformance run (default: smoke suite on the best available backend, -n auto)",
        description="Runs the conformance suites under pytest; goldens missing from the store are "
        "generated on demand. Arguments after '--' go to pytest unchanged.",
    )
    parser.add_argument("--suite", action="append", help="smoke (default), standard, deepseek, edge, all")
    parser.add_argument(
        "--backend",
        action="append",
        help=f"auto (default: the first available of {', '.join(AUTO_ORDER)}), "
        f"{', '.join(BUILTIN)}, or an external backend as pkg.module:factory; repeatable",
    )
    parser.add_argument("--policy", default=None, help="tolerance policy (default: 'default')")
    parser.add_argument("--golden-dir", default=None, help="golden store (default $MLA_GOLDEN_DIR or .golden/)")
    parser.add_argument(
        "--run-name", default=None, help="report folder name under reports/out/ in the working directory"
    )
    parser.add_argument("--report-dir", default=None, help="report folder (overrides --run-name)")
    parser.add_argument("-n", "--jobs", default="auto", help="xdist workers (default auto: one per accelerator)")
    parser.add_argument(
        "--ray",
        nargs="?",
        const="",
        default=None,
        metavar="ADDRESS",
        help="spread the run over a Ray cluster, one pytest shard per NPU/GPU/CPU slot (auto, HOST:PORT, "
        "ray://HOST:10001; none: $RAY_ADDRESS or a local cluster); needs the 'ray' extra; docs/cluster.md",
    )
    parser.add_argument(
        "--ray-retries",
        type=int,
        default=2,
        metavar="N",
        help="with --ray: times a shard whose worker or node died is run again (default 2)",
    )
    parser.add_argument("pytest_args", nargs=argparse.REMAINDER, help="extra pytest arguments after --")
    parser.set_defaults(func=run)
