"""The pytest command line ``mlaconf run`` stands for: shared by the local run (tools.run) and the Ray
shards (tools.ray_run), which is why it lives apart from both."""

from __future__ import annotations

import argparse
import importlib.resources
import sys
from collections.abc import Sequence
from pathlib import Path

from mlaconf.golden.specs.suites import SUITES_PACKAGE

#: ``mlaconf run``'s short spellings -> the plugin's options (namespaced, so they collide with no project's).
PLUGIN_OPTIONS = {
    "suite": "--mla-suite",
    "backend": "--mla-backend",
    "policy": "--mla-policy",
    "golden_dir": "--mla-golden-dir",
    "run_name": "--mla-run-name",
    "report_dir": "--mla-report-dir",
}
#: pytest options whose value is the next argument (so that value is never read as a path to collect).
VALUE_OPTIONS = frozenset(
    {"-k", "-m", "-p", "-o", "-n", "-c", "-W", "-r", "--deselect", "--ignore", "--ignore-glob", "--rootdir"}
    | {"--basetemp", "--confcutdir", "--junitxml", "--timeout", "--maxfail", "--dist", "--max-worker-restart"}
    | {"--tb", "--override-ini", "--numprocesses", "--hypothesis-profile", "--hypothesis-seed"}
)


def names_tests(pytest_args: Sequence[str], cwd: Path) -> bool:
    """Whether the arguments after ``--`` name what to collect (a node id, a ``.py`` file or a directory):
    then they replace the installed suites' path, so no test is collected twice."""
    after_option = False
    for arg in pytest_args:
        if after_option:
            after_option = False
            continue
        if arg.startswith("-"):
            after_option = arg in VALUE_OPTIONS
            continue
        target = arg.split("::", 1)[0]
        if "::" in arg or target.endswith(".py") or (cwd / target).is_dir():
            return True
    return False


def pytest_command(args: argparse.Namespace) -> list[str]:
    """The pytest invocation ``run`` stands for (printed, so it can be rerun or adapted)."""
    extra = [a for a in args.pytest_args if a != "--"]
    suites = str(importlib.resources.files(SUITES_PACKAGE))  # the installed suites, from any directory
    # pytest's cache (--lf, --ff) in the working directory, not beside the installed suites
    cache = Path.cwd() / ".pytest_cache"
    targets = [] if names_tests(extra, Path.cwd()) else [suites]
    command = [sys.executable, "-m", "pytest", *targets, "-o", f"cache_dir={cache}", "-n", str(args.jobs)]
    defaults = {"backend": ["auto"]}  # no --suite passes no filter: the plugin's default selection
    for dest, option in PLUGIN_OPTIONS.items():
        value = getattr(args, dest) or defaults.get(dest)
        for item in value if isinstance(value, list) else [value] if value else []:
            command += [option, item]
    return command + extra
