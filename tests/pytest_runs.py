"""One way for the framework's tests to start pytest in a child process: the command, its environment,
the timeout and what comes back.

A test that starts pytest tests what a user's command line does, so the child gets exactly the arguments
the test names, this checkout on ``PYTHONPATH`` and no cache writes into the repository; it never inherits
the variables an outer xdist worker sets (an inner run would take them for its own worker's)."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from mlaconf.reports.records import Record
from mlaconf.reports.rundir import read_results
from tests.machine import HANG_S

REPO = Path(__file__).resolve().parents[1]
#: The PATH of a clean child: no virtual environment's scripts, no user's tools.
CLEAN_PATH = "/usr/bin:/bin"
#: What an outer xdist session puts in its workers' environment; a child that inherited them would think
#: itself that worker.
_OUTER_SESSION = ("PYTEST_XDIST_WORKER", "PYTEST_XDIST_WORKER_COUNT", "PYTEST_XDIST_TESTRUNUID", "PYTEST_CURRENT_TEST")


def pytest_argv(*args: str, python: str | Path = sys.executable) -> list[str]:
    """``python -m pytest -p no:cacheprovider ARGS``: the cache would otherwise land in the repository."""
    return [str(python), "-m", "pytest", "-p", "no:cacheprovider", *args]


def child_env(
    *, paths: Sequence[Path | str] = (), inherit: bool = False, extra: Mapping[str, str | None] | None = None
) -> dict[str, str]:
    """``PYTHONPATH`` = ``paths`` then this checkout.  ``inherit``: this process's environment without an
    outer xdist worker's variables (thread caps, ``MLA_GOLDEN_DIR`` and the like pass); else only
    ``PATH`` = :data:`CLEAN_PATH`, so no variable of the developer's shell changes the child.  ``extra`` adds
    variables, ``None`` removes one (``CI`` picks the hypothesis profile)."""
    env = {k: v for k, v in os.environ.items() if k not in _OUTER_SESSION} if inherit else {"PATH": CLEAN_PATH}
    env["PYTHONPATH"] = os.pathsep.join([*(str(p) for p in paths), str(REPO)])
    for name, value in (extra or {}).items():
        if value is None:
            env.pop(name, None)
        else:
            env[name] = value
    return env


@dataclass(frozen=True)
class PytestRun:
    """A finished child pytest: its exit status, its output and the report directory it was given."""

    returncode: int
    stdout: str
    stderr: str
    report: Path | None = None

    @property
    def output(self) -> str:
        """The ends of stdout and stderr, for an assertion's message."""
        return self.stdout[-3000:] + self.stderr[-2000:]

    def records(self) -> list[Record]:
        """The records the run wrote to its report directory's ``results.jsonl``."""
        if self.report is None:
            raise ValueError("this run was given no report directory")
        return read_results(self.report / "results.jsonl")


def run_pytest(
    *args: str,
    report: Path | None = None,
    golden: Path | None = None,
    cwd: Path = REPO,
    paths: Sequence[Path | str] = (),
    inherit: bool = False,
    env: Mapping[str, str | None] | None = None,
    timeout: float = HANG_S,
) -> PytestRun:
    """Run ``python -m pytest ARGS`` in ``cwd`` under :func:`child_env` and wait at most ``timeout``
    seconds (an overrun raises ``subprocess.TimeoutExpired``: a hung run must not look like a result).
    ``report`` and ``golden`` add ``--mla-report-dir`` and ``--mla-golden-dir``."""
    argv = [*args]
    if report is not None:
        argv += ["--mla-report-dir", str(report)]
    if golden is not None:
        argv += ["--mla-golden-dir", str(golden)]
    done = subprocess.run(
        pytest_argv(*argv),
        cwd=cwd,
        env=child_env(paths=paths, inherit=inherit, extra=env),
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    return PytestRun(done.returncode, done.stdout, done.stderr, report)
