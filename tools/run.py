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
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mlaconf.facts.processes import kill_with_parent
from mlaconf.golden.store.locations import golden_dir_problem
from mlaconf.harness.registry import choices_text, name_problem
from mlaconf.reports import rundir
from mlaconf.runner.selection import policy_problem
from mlaconf.tools.command import pytest_command

#: Signals that stop the run: forwarded to pytest's process group as SIGINT (its clean stop).
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
#: Seconds pytest has after a stop signal to record what ran and stop its workers, before the group is killed.
STOP_GRACE_S = 15.0
#: pytest's exit status for a session stopped by Ctrl-C (KeyboardInterrupt).
PYTEST_INTERRUPTED = 2
#: The exit statuses of a pytest that ended its session (pytest.ExitCode: OK ... NO_TESTS_COLLECTED).
PYTEST_EXITS = range(6)
#: ``mlaconf run`` options that --resume takes from the run it continues (so none may be given with it).
RESUME_REPEATS = ("suite", "backend", "policy", "golden_dir", "run_name", "report_dir", "ray", "pytest_args")


@dataclass(frozen=True)
class PytestExit:
    """How pytest ended: its exit status (negative: the signal that killed it), the first stop
    signal ``mlaconf run`` received (None: none), and whether the grace ran out (the group was killed)."""

    status: int
    signal: int | None
    forced: bool

    @property
    def stopped(self) -> bool:
        """A stop signal actually stopped the run (not one that came after pytest had ended it)."""
        return self.signal is not None and (self.forced or self.status in (PYTEST_INTERRUPTED, -signal.SIGKILL))


def run(args: argparse.Namespace) -> int:
    if args.resume is not None:
        return resume(args)
    names = [name.strip() for value in args.backend or [] for name in value.split(",") if name.strip()]
    for unknown in filter(None, map(name_problem, names)):  # a typo fails here, before pytest and torch load
        print(f"mlaconf run: error: {unknown}\n{choices_text()}", file=sys.stderr)
        return 2
    if args.policy is not None:  # checked here, not in pytest: the message names the option typed
        problem = policy_problem(args.policy, option_value(args.pytest_args, "--mla-tolerances"), "--policy")
        if problem:
            print(f"mlaconf run: error: {problem}", file=sys.stderr)
            return 2
    problem = golden_dir_problem(Path(args.golden_dir)) if args.golden_dir else None
    if problem:  # checked here, not in pytest: the message names the option typed
        print(f"mlaconf run: error: --golden-dir {args.golden_dir}: {problem}", file=sys.stderr)
        return 2
    if args.ray is not None:
        return run_on_cluster(args)
    command = pytest_command(args)
    return launch(command, Path.cwd(), named_run_dir(command))


def resume(args: argparse.Namespace) -> int:
    """``run --resume DIR``: pytest again with the interrupted run's own arguments, in its working
    directory, plus ``--mla-resume`` (the plugin runs only the tests without a record and refuses,
    in one line, when the environment, goldens or arguments differ)."""
    given = [name for name in RESUME_REPEATS if getattr(args, name, None)] + (["jobs"] if args.jobs != "auto" else [])
    if given:
        print(
            f"mlaconf run: error: --resume repeats the run's own options; drop --{given[0].replace('_', '-')}",
            file=sys.stderr,
        )
        return 2
    directory = Path(args.resume).resolve()
    try:
        earlier = rundir.read_run(directory, required=True)
    except (ValueError, OSError) as exc:
        print(f"mlaconf run: error: --resume {args.resume}: {str(exc).splitlines()[0]}", file=sys.stderr)
        return 2
    saved, cwd = earlier.get("args"), Path(str(earlier.get("invocation_dir") or Path.cwd()))
    if not saved or not cwd.is_dir():
        print(
            f"mlaconf run: error: --resume {args.resume}: run.json names no arguments or working directory "
            "to repeat (a run from before --resume)",
            file=sys.stderr,
        )
        return 2
    command = [sys.executable, "-m", "pytest", *saved, "--mla-report-dir", str(directory), "--mla-resume"]
    return launch(command, cwd, directory)


def launch(command: list[str], cwd: Path, directory: Path | None) -> int:
    """Run pytest (printed first), forward stops, and end its run directory if pytest could not."""
    print("+ python " + shlex.join(command[1:]), flush=True)  # quoted: it can be pasted back into a shell
    # its own session: a signal reaches the whole run (pytest and every xdist worker) only through us
    child = subprocess.Popen(command, cwd=cwd, start_new_session=True, preexec_fn=_child_setup)
    exited = wait_forwarding_stops(child)
    if exited.status not in PYTEST_EXITS or exited.forced:  # pytest could not have ended the run itself
        end_for_pytest(exited, child.pid, directory, cwd)
    if exited.stopped:
        print(f"mlaconf run: stopped by {signal.Signals(exited.signal or 0).name}", file=sys.stderr)
        return 128 + (exited.signal or 0)
    if exited.signal is not None:
        name = signal.Signals(exited.signal).name
        print(f"mlaconf run: {name} came after pytest had ended the run; nothing was stopped", file=sys.stderr)
    return 128 - exited.status if exited.status < 0 else exited.status


def _child_setup() -> None:
    """In pytest's process before exec: die with ``mlaconf run``, and take Ctrl-C (a background job of
    a non-interactive shell inherits SIGINT ignored, and an ignored signal stays ignored across exec)."""
    kill_with_parent()
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def named_run_dir(command: list[str]) -> Path | None:
    """The run directory pytest will claim, as its options name it (the plugin's rule; the last one
    wins), else None (a default, timestamped name: found by pytest's pid when needed)."""
    named = option_value(command, "--mla-report-dir")
    if named:
        return Path(named).resolve()
    name = option_value(command, "--mla-run-name")
    return (rundir.REPORTS_DIR / name).resolve() if name else None


def end_for_pytest(exited: PytestExit, pid: int, directory: Path | None, cwd: Path) -> None:
    """pytest died before it could end its run (killed after the grace, or by a signal from elsewhere):
    end run.json from the journal, ``interrupted`` if a stop was asked for, else ``killed``."""
    how = f"was killed by {signal.Signals(-exited.status).name}" if exited.status < 0 else f"exited {exited.status}"
    status = "interrupted" if exited.signal is not None else "killed"
    why = f"pytest {how} before it ended the run: its journal holds every test that ended before"
    candidates = [directory] if directory else sorted((cwd / rundir.REPORTS_DIR).glob("*/"), reverse=True)
    for candidate in candidates:
        try:
            state = rundir.end_abandoned(candidate, pid, status, why)
        except (ValueError, OSError) as exc:
            print(f"mlaconf run: {candidate}: could not end the run: {exc}", file=sys.stderr)
            return
        if state is not None:
            c = state.counts
            print(
                f"mlaconf run: {why}; {candidate} ended {status}: {c.run} of {c.selected} selected tests recorded; "
                f"mlaconf run --resume {candidate} runs the rest",
                file=sys.stderr,
            )
            return


def option_value(argv: list[str], option: str) -> str | None:
    """The value of ``option`` among pytest arguments (``OPTION VALUE`` or ``OPTION=VALUE``; the last wins)."""
    value = None
    for i, arg in enumerate(argv):
        if arg == option and i + 1 < len(argv):
            value = argv[i + 1]
        elif arg.startswith(f"{option}="):
            value = arg.partition("=")[2]
    return value


def wait_forwarding_stops(child: subprocess.Popen[Any]) -> PytestExit:
    """How pytest ended.  The first stop signal is forwarded to pytest's process group as SIGINT (it
    records what ran and ends run.json ``interrupted``); a second one, or :data:`STOP_GRACE_S` without
    an end, kills the group.  No process of the run outlives this."""
    received: list[int] = []
    forced = False

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
                forced = True
                _signal_group(child.pid, signal.SIGKILL)
    finally:
        _signal_group(child.pid, signal.SIGKILL)  # workers left behind by a controller that ended early
        for signum, handler in previous.items():
            signal.signal(signum, handler)
    return PytestExit(status, received[0] if received else None, forced or len(received) > 1)


def _signal_group(pgid: int, signum: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signum)


def run_on_cluster(args: argparse.Namespace) -> int:
    """``run --ray``: shards on the cluster's devices (tools.ray_run), one merged run directory."""
    from mlaconf.facts.cluster import ClusterUnavailable, connected

    try:
        with connected(args.ray) as ray:
            from mlaconf.tools.ray_run import run_on_ray

            return run_on_ray(ray, args, retries=args.ray_retries)
    except ClusterUnavailable as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
