"""How a test that did not reach a verdict failed: an exception, a timeout or a crashed worker, as
a record's :class:`mlaconf.reports.records.Failure` (where it happened, how long it ran)."""

from __future__ import annotations

import contextlib
import signal
import subprocess

import pytest

from mlaconf import ROOMS
from mlaconf.reports.records import Failure

#: Where a timeout or exception happened, when a backend method is on the stack.
BACKEND_METHODS = ("run", "synchronize", "available", "info")
#: Our rooms that run under a test, as the second part of a module name (``mlaconf.golden.store.directory``): not the
#: test modules themselves (cases) nor reports, which never runs inside a test.
_FRAMEWORK = frozenset(ROOMS) - {"cases", "reports"}
_MESSAGE_LIMIT = 2000
#: pytest-timeout's failure message starts with this.
TIMEOUT_PREFIX = "Timeout (>"


def short_text(text: str) -> str:
    """A failure text cut to what a record keeps."""
    text = text.strip()
    return text if len(text) <= _MESSAGE_LIMIT else text[: _MESSAGE_LIMIT - 3] + "..."


def _where(excinfo: pytest.ExceptionInfo[BaseException]) -> str:
    """The backend method on the stack (``backend.run``), else the innermost framework function."""
    framework = ""
    for entry in reversed(excinfo.traceback):
        frame = entry.frame
        name = frame.code.name
        owner = frame.f_locals.get("self")
        if (
            name in BACKEND_METHODS
            and owner is not None
            and all(hasattr(owner, m) for m in ("run", "available", "info"))
        ):
            return f"backend.{name}"
        module = str(frame.f_globals.get("__name__", ""))
        room = module.split(".")[1] if module.startswith("mlaconf.") else ""
        if not framework and room in _FRAMEWORK:
            framework = f"{module}.{name}"
    return framework


def _timeout_seconds(item: pytest.Item, message: str) -> float | None:
    marker = item.get_closest_marker("timeout")
    if marker is not None and marker.args:
        try:
            return float(marker.args[0])
        except (TypeError, ValueError):
            pass
    digits = message[len(TIMEOUT_PREFIX) :].split("s)", 1)[0]
    try:
        return float(digits)
    except ValueError:
        return None


def failure_of(item: pytest.Item, excinfo: pytest.ExceptionInfo[BaseException]) -> Failure:
    """An exception that ended a test, as a record's failure (a pytest-timeout failure as a timeout)."""
    message = str(excinfo.value)
    if excinfo.typename == "Failed" and message.startswith(TIMEOUT_PREFIX):
        return Failure("timeout", "Timeout", short_text(message), _where(excinfo), _timeout_seconds(item, message))
    return Failure("exception", excinfo.typename, short_text(message), _where(excinfo))


#: pytest-timeout's thread method ends a hung test's process with this exit status (``os._exit(1)``).
TIMEOUT_EXIT_STATUS = 1
#: How long the controller waits for a worker whose connection closed to be reaped (it is exiting then).
REAP_S = 10.0


def worker_exit_status(worker: object) -> int | None:
    """The exit status of a crashed xdist worker's process (negative: the signal that killed it), None where it
    cannot be read: xdist hands the crash report its worker, whose execnet gateway started the process
    (``gateway._io.popen``: execnet's own handle, which its ``Group.terminate`` waits on and kills too)."""
    popen = getattr(getattr(getattr(worker, "gateway", None), "_io", None), "popen", None)
    if not isinstance(popen, subprocess.Popen):
        return None
    try:
        return popen.wait(timeout=REAP_S)
    except subprocess.TimeoutExpired:
        return None


def exit_text(status: int) -> str:
    """How a process ended, in words: ``exited with status 3``, ``was killed by SIGKILL``."""
    if status < 0:
        with contextlib.suppress(ValueError):
            return f"was killed by {signal.Signals(-status).name}"
        return f"was killed by signal {-status}"
    return f"exited with status {status}"


def crash_failure(
    report: pytest.TestReport, elapsed: float | None, timeout: float | None, method: str, exit_status: int | None
) -> tuple[str, Failure]:
    """The message and failure of a test whose xdist worker died under it.  A worker pytest-timeout's thread
    method ended (its exit status 1, or an unknown one, at the test's time limit) timed out; any other death
    is a crash with its exit status, whatever other tests did."""
    text = str(report.longrepr or "worker crashed")
    killed_by_timeout = exit_status in (None, TIMEOUT_EXIT_STATUS)
    if killed_by_timeout and timeout and method == "thread" and elapsed is not None and elapsed >= 0.9 * timeout:
        failure = Failure("timeout", "Timeout", text, "", timeout, exit_status)
        return f"{failure.text()} (pytest-timeout's thread method killed the worker)", failure
    if exit_status is not None:
        text = f"{text}: it {exit_text(exit_status)}"
    failure = Failure("crash", "WorkerCrash", text, "", None, exit_status)
    return failure.text(), failure
