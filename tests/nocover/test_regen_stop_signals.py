"""``mlaconf regen`` stops on SIGTERM and SIGHUP as on Ctrl-C (what `timeout`, `docker stop`, systemd and
CI cancels send to the one pid): queued cases cancelled, workers gone, the summary printed, exit 130."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from test_store_faults import PID_LOG, _env, _kill, _wait_gone

from tests.machine import HANG_S, within


@pytest.mark.parametrize("stop", [signal.SIGTERM, signal.SIGHUP], ids=lambda s: s.name)
def test_a_stop_signal_to_regen_stops_it_as_ctrl_c_does(tmp_path: Path, stop: signal.Signals) -> None:
    suite = tmp_path / "suite.toml"
    suite.write_text("[[matrix]]\nhead_num = 1\nq_seqlen = [[4]]\nseed = [1, 2, 3, 4, 5, 6, 7, 8, 9, 10]\n")
    store, log = tmp_path / "store", tmp_path / "pids.log"
    command = [sys.executable, "-m", "mlaconf", "regen", "--cases", str(suite), "--out", str(store)]
    command += ["-j", "2", "--builder", "test_store_faults:napping_builder"]
    parent = subprocess.Popen(
        command,
        env=_env(**{PID_LOG: str(log)}),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        # as from a terminal: under nohup the test run's own SIGHUP is ignored, and regen keeps it ignored
        preexec_fn=lambda: signal.signal(stop, signal.SIG_DFL),
    )
    workers: list[int] = []
    try:
        deadline = time.monotonic() + HANG_S
        while len(list(store.glob("*.h5"))) < 2 and time.monotonic() < deadline and parent.poll() is None:
            time.sleep(0.05)
        assert parent.poll() is None and len(list(store.glob("*.h5"))) >= 2, parent.poll()
        sent = time.monotonic()
        parent.send_signal(stop)  # the regen pid alone
        out, err = parent.communicate(timeout=HANG_S)
        took = time.monotonic() - sent
        workers = [int(line) for line in log.read_text().split()]
        assert parent.returncode == 130, (parent.returncode, out, err[-2000:])
        assert took < within(10), f"exit {took:.1f}s after {stop.name}"
        assert "Traceback" not in err, err[-3000:]
        assert out.strip().splitlines()[-1].startswith("regen: interrupted: "), out
        assert not _wait_gone(workers, 3.0), "workers outlived the stopped regen"
        assert not list(store.glob(".*.tmp")), "a temp file was left behind"
    finally:
        if parent.poll() is None:
            parent.kill()
        _kill(workers)
