"""``mlaconf run``: the main job, a conformance run of the selected suites on the best backend."""

from __future__ import annotations

import argparse
import contextlib
import os
import shlex
import signal
import subprocess
import sys
import time
from typing import Any

from mlaconf.facts.processes import kill_with_parent
from mlaconf.harness.registry import AUTO_ORDER, BUILTIN, choices_text, name_problem
from mlaconf.runner.command import pytest_command
from mlaconf.runner.selection import DEFAULT_SUITE, policy_problem, suite_choices

#: Signals that stop the run: forwarded to pytest's process group as SIGINT (its clean stop).
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
#: Seconds pytest has after a stop signal to record what ran and stop its workers, before the group is killed.
STOP_GRACE_S = 15.0


def run(args: argparse.Namespace) -> int:
    names = [name.strip() for value in args.backend or [] for name in value.split(",") if name.strip()]
    for unknown in filter(None, map(name_problem, names)):  # a typo fails here, before pytest and torch load
        print(f"mlaconf run: error: {unknown}\n{choices_text()}", file=sys.stderr)
        return 2
    if args.policy is not None:  # checked here, not in pytest: the message names the option typed
        problem = policy_problem(args.policy, option_value(args.pytest_args, "--mla-tolerances"), "--policy")
        if problem:
            print(f"mlaconf run: error: {problem}", file=sys.stderr)
            return 2
    if args.ray is not None:
        return run_on_cluster(args)
    command = pytest_command(args)
    print("+ python " + shlex.join(command[1:]), flush=True)  # quoted: it can be pasted back into a shell
    # its own session: a signal reaches the whole run (pytest and every xdist worker) only through us
    child = subprocess.Popen(command, start_new_session=True, preexec_fn=kill_with_parent)
    return wait_forwarding_stops(child)


def option_value(argv: list[str], option: str) -> str | None:
    """The value of ``option`` among pytest arguments (``OPTION VALUE`` or ``OPTION=VALUE``; the last wins)."""
    value = None
    for i, arg in enumerate(argv):
        if arg == option and i + 1 < len(argv):
            value = argv[i + 1]
        elif arg.startswith(f"{option}="):
            value = arg.partition("=")[2]
    return value


def wait_forwarding_stops(child: subprocess.Popen[Any]) -> int:
    """pytest's exit status, or ``128 + signal`` when a stop signal came: the first is forwarded to
    pytest's process group as SIGINT (it records what ran and ends run.json ``interrupted``); a second
    one, or :data:`STOP_GRACE_S` without an end, kills the group.  No process of the run outlives this."""
    received: list[int] = []

    def stop(signum: int, frame: object) -> None:
        received.append(signum)
        _signal_group(child.pid, signal.SIGINT if len(received) == 1 else signal.SIGKILL)

    previous = {signum: signal.signal(signum, stop) for signum in STOP_SIGNALS}
    try:
        deadline = None
        while True:
            try:
                status = child.wait(timeout=0.2)
                break
            except subprocess.TimeoutExpired:
                pass
            if received and deadline is None:
                deadline = time.monotonic() + STOP_GRACE_S
            if deadline is not None and time.monotonic() > deadline:
                _signal_group(child.pid, signal.SIGKILL)
    finally:
        _signal_group(child.pid, signal.SIGKILL)  # workers left behind by a controller that ended early
        for signum, handler in previous.items():
            signal.signal(signum, handler)
    if received:
        print(f"mlaconf run: stopped by {signal.Signals(received[0]).name}", file=sys.stderr)
        return 128 + received[0]
    return status


def _signal_group(pgid: int, signum: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signum)


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
        "generated on demand. Arguments after '--' go to pytest (e.g. -- --lf -k causal); paths or node ids "
        "among them replace the installed suites (-- cases/test_conformance.py).",
    )
    parser.add_argument(
        "--suite", action="append", choices=suite_choices(), help=f"a suite (default {DEFAULT_SUITE}); repeatable"
    )
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
