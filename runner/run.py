"""``mlaconf run``: the main job, a conformance run of the selected suites on the best backend."""

from __future__ import annotations

import argparse
import importlib.resources
import subprocess
import sys
from pathlib import Path

from mlaconf.golden.spec import SUITES_PACKAGE
from mlaconf.harness.registry import AUTO_ORDER, BUILTIN
from mlaconf.runner.selection import DEFAULT_SUITE, suite_choices

#: ``mlaconf run``'s short spellings -> the plugin's options (namespaced, so they collide with no project's).
PLUGIN_OPTIONS = {
    "suite": "--mla-suite",
    "backend": "--mla-backend",
    "policy": "--mla-policy",
    "golden_dir": "--mla-golden-dir",
    "run_name": "--mla-run-name",
    "report_dir": "--mla-report-dir",
}


def pytest_command(args: argparse.Namespace) -> list[str]:
    """The pytest invocation ``run`` stands for (printed, so it can be rerun or adapted)."""
    suites = str(importlib.resources.files(SUITES_PACKAGE))  # the installed suites, from any directory
    # pytest's cache (--lf, --ff) in the working directory, not beside the installed suites
    cache = Path.cwd() / ".pytest_cache"
    command = [sys.executable, "-m", "pytest", suites, "-o", f"cache_dir={cache}", "-n", str(args.jobs)]
    defaults = {"suite": [DEFAULT_SUITE], "backend": ["auto"]}
    for dest, option in PLUGIN_OPTIONS.items():
        value = getattr(args, dest) or defaults.get(dest)
        for item in value if isinstance(value, list) else [value] if value else []:
            command += [option, item]
    return command + [a for a in args.pytest_args if a != "--"]


def run(args: argparse.Namespace) -> int:
    command = pytest_command(args)
    print("+ python " + " ".join(command[1:]), flush=True)
    child = subprocess.Popen(command)  # from the caller's directory: relative paths mean what they say
    while True:
        try:
            return child.wait()
        except KeyboardInterrupt:  # the terminal sent pytest the same SIGINT: wait for its own clean stop
            continue


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "run",
        help="conformance run (default: smoke suite on the best available backend, -n auto)",
        description="Runs the conformance suites under pytest; goldens missing from the store are "
        "generated on demand. Arguments after '--' go to pytest unchanged (e.g. -- --lf -k causal).",
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
    parser.add_argument("pytest_args", nargs=argparse.REMAINDER, help="extra pytest arguments after --")
    parser.set_defaults(func=run)
