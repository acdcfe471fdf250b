"""A test whose xdist worker died is a timeout only when pytest-timeout's thread method ended the worker (exit
status 1 at the test's limit); any other exit is a crash that says its status, however long the test ran."""

from __future__ import annotations

import subprocess
import sys
from types import SimpleNamespace

import pytest

from mlaconf.runner.failures import crash_failure, worker_exit_status

#: xdist's report of a test whose worker died.
CRASH = pytest.TestReport(
    "t.py::test", ("t.py", None, "t.py"), {}, "failed", "worker 'gw0' crashed while running", "???"
)


def _worker(code: str) -> SimpleNamespace:
    """What xdist hands a crash report: a worker whose execnet gateway started its process."""
    process = subprocess.Popen([sys.executable, "-c", code])
    return SimpleNamespace(gateway=SimpleNamespace(_io=SimpleNamespace(popen=process)))


def test_the_workers_exit_status_is_read_from_its_process() -> None:
    assert worker_exit_status(_worker("import os; os._exit(3)")) == 3
    assert worker_exit_status(_worker("import os, signal; os.kill(os.getpid(), signal.SIGKILL)")) == -9
    assert worker_exit_status(SimpleNamespace()) is None  # no process to read: unknown


def test_an_exit_at_the_time_limit_is_a_crash_with_its_status() -> None:
    message, failure = crash_failure(CRASH, 9.5, 10.0, "thread", 3)
    assert failure.kind == "crash" and failure.exit_status == 3
    assert message == "crashed: worker 'gw0' crashed while running: it exited with status 3"
    assert "was killed by SIGKILL" in crash_failure(CRASH, 0.1, 10.0, "thread", -9)[0]


def test_the_thread_methods_exit_at_the_limit_is_a_timeout() -> None:
    for status in (1, None):  # pytest-timeout's os._exit(1), or a status that could not be read
        message, failure = crash_failure(CRASH, 9.5, 10.0, "thread", status)
        assert failure.kind == "timeout" and "thread method killed the worker" in message
    assert crash_failure(CRASH, 1.0, 10.0, "thread", 1)[1].kind == "crash"  # long before the limit
    assert crash_failure(CRASH, 9.5, 10.0, "signal", None)[1].kind == "crash"  # the signal method kills nothing
