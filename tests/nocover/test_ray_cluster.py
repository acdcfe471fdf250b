"""``regen --ray`` and ``run --ray`` on a local Ray cluster (``ray.init(num_cpus=2)``, started and
stopped here): the same goldens and the same records as the local forms, lost tasks and killed workers
rerun or recorded, Ctrl-C cancels.  Skipped without the ``ray`` extra.

To keep CI short the regen checks cover two thirds of smoke (``--shard 1/3`` through a shared store,
``2/3`` written by the driver) against the session's shared smoke goldens, and the runs cover the smoke
subset ``-k "fp16 and causal or test_properties"`` with hypothesis's derandomized ``mla-ci`` profile (22
tests: conformance, metamorphic, error contract and the property test) over the same shared goldens; the
equality claims are made for exactly what they cover.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import pytest

from mlaconf import main
from mlaconf.golden import maintain
from mlaconf.golden.building import regen as rg
from mlaconf.golden.specs.spec import CaseSpec
from mlaconf.golden.specs.suites import load_suite
from mlaconf.golden.specs.types import GoldenCase
from mlaconf.golden.store.directory import GoldenStore
from mlaconf.golden.store.h5file import read_meta
from mlaconf.reports.diff import diff_dirs
from mlaconf.reports.records import without_volatile
from mlaconf.reports.rundir import read_results
from tests.machine import HANG_S, within

ray = pytest.importorskip("ray", reason="needs the optional 'ray' extra: pip install '.[ray]'")


HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
DIE_ONCE = "MLA_TEST_DIE_ONCE_DIR"
#: regen --ray builds two of smoke's shards this size (14 cases each): the Ray path, not smoke's bulk, is on trial.
SHARDS = 12
#: regen --ray in its other store mode: the goldens come back through the driver, which writes them.
DRIVER_STORE = ["--ray", "--ray-store", "driver"]
SUBSET = "fp16 and causal or test_properties"
#: pytest arguments of both runs: the subset, and hypothesis derandomized (the same examples in every run).
PYTEST_ARGS = ["-k", SUBSET, "--hypothesis-profile", "mla-ci"]
THREADS = {name: "1" for name in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")}


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """A local two-CPU cluster whose workers import this directory's builders (the environment at
    ``ray.init`` is theirs)."""
    saved = dict(os.environ)
    os.environ["PYTHONPATH"] = os.pathsep.join([str(HERE), str(REPO), os.environ.get("PYTHONPATH", "")])
    os.environ[DIE_ONCE] = str(tmp_path_factory.mktemp("die-once"))
    os.environ.pop("MLA_GOLDEN_DIR", None)
    ray.init(num_cpus=2, include_dashboard=False, logging_level="WARNING", log_to_driver=False)
    try:
        yield ray
    finally:
        ray.shutdown()
        os.environ.clear()
        os.environ.update(saved)


def dying_builder(spec: CaseSpec, *, threads: int = 1) -> GoldenCase:
    """Kills its worker process on a case's first attempt (a node lost mid-build), builds on the next."""
    from mlaconf.golden.building.generate import build_golden

    marker = Path(os.environ[DIE_ONCE]) / spec.case_id
    if not marker.exists():
        marker.write_text(str(os.getpid()))
        os._exit(1)
    return build_golden(spec, threads=threads)


def napping_builder(spec: CaseSpec, *, threads: int = 1) -> GoldenCase:
    from mlaconf.golden.building.generate import build_golden

    time.sleep(2.0)
    return build_golden(spec, threads=threads)


def _digests(store: Path, names: Iterable[str] | None = None) -> dict[str, tuple[str, str]]:
    """Per file (every one, or those ``names``): every dataset's SHA-256 and the baseline statistics' (what the
    content is)."""
    out = {}
    for path in sorted(store.glob("*.h5")) if names is None else [store / name for name in names]:
        attrs = read_meta(path).attrs
        out[path.name] = (str(attrs["checksums_json"]), str(attrs["baseline_stats_xxh3_128"]))
    return out


def test_regen_through_ray_equals_local_regen(
    cluster: Any, tmp_path: Path, shared_golden: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Each golden Ray builds is the file local regen builds: the session's shared store (regen builds there
    what no test built yet) is the local side; two of smoke's :data:`SHARDS` shards, one per store mode."""
    shared, driver = tmp_path / "shared", tmp_path / "driver"
    assert maintain.main(["regen", "smoke", "--out", str(shared_golden)]) == 0
    assert maintain.main(["regen", "smoke", "--shard", f"1/{SHARDS}", "--out", str(shared), "--ray"]) == 0
    assert maintain.main(["regen", "smoke", "--shard", f"2/{SHARDS}", "--out", str(driver), *DRIVER_STORE]) == 0
    capsys.readouterr()
    for store, shard in ((shared, (1, SHARDS)), (driver, (2, SHARDS))):
        specs = rg.select_cases(["smoke"], shard=shard)
        report = rg.verify(GoldenStore(store), specs)
        assert report.checked == len([s for s in specs if s.expect_error is None]) > 5
        assert not report.problems, report.format()
        built = _digests(store)
        assert len(built) == report.checked and built == _digests(shared_golden, built)
        assert not list(store.glob(".*.tmp")) and not list(store.glob(".ray-store-*"))
    # incremental, like local regen: nothing to do the second time, in either mode
    assert maintain.main(["regen", "smoke", "--shard", f"1/{SHARDS}", "--out", str(shared), "--ray"]) == 0
    assert " 0 generated, " in capsys.readouterr().out
    assert maintain.main(["regen", "smoke", "--shard", f"2/{SHARDS}", "--out", str(driver), *DRIVER_STORE]) == 0
    assert " 0 generated, " in capsys.readouterr().out
    # a case no node can hold is refused before any task
    huge = tmp_path / "huge.toml"
    huge.write_text("[[case]]\nq_seqlen = [1000000000]\nhead_num = 1\n")
    assert maintain.main(["regen", "--cases", str(huge), "--out", str(tmp_path / "huge"), "--ray"]) == 2
    assert "exceeds the largest Ray node's" in capsys.readouterr().err
    assert not (tmp_path / "huge").exists()


def test_a_task_lost_with_its_worker_is_retried(
    cluster: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    suite = tmp_path / "suite.toml"
    suite.write_text("[[matrix]]\nhead_num = 1\nq_seqlen = [[4]]\nseed = [1, 2]\n")
    store = tmp_path / "store"
    rc = maintain.main(
        ["regen", "--cases", str(suite), "--out", str(store), "--ray", "--builder", "test_ray_cluster:dying_builder"]
    )
    out = capsys.readouterr().out
    assert rc == 0, out
    assert "2 generated, 0 up-to-date, 0 failed" in out
    died = sorted(Path(os.environ[DIE_ONCE]).iterdir())
    assert len(died) == 2  # each case's first worker died
    for spec in load_suite(suite):
        GoldenStore(store).load(spec)


def test_one_ctrl_c_cancels_a_ray_regen(cluster: Any, tmp_path: Path) -> None:
    suite = tmp_path / "suite.toml"
    suite.write_text("[[matrix]]\nhead_num = 1\nq_seqlen = [[4]]\nseed = [1, 2, 3, 4, 5, 6, 7, 8]\n")
    store = tmp_path / "store"
    address = ray.get_runtime_context().gcs_address
    command = [sys.executable, "-m", "mlaconf.golden.maintain", "regen", "--cases", str(suite), "--out", str(store)]
    command += ["--ray", address, "--builder", "test_ray_cluster:napping_builder"]
    child = subprocess.Popen(
        command,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    try:
        deadline = time.monotonic() + HANG_S
        while len(list(store.glob("*.h5"))) < 2 and time.monotonic() < deadline and child.poll() is None:
            time.sleep(0.05)
        assert child.poll() is None and len(list(store.glob("*.h5"))) >= 2, child.poll()
        sent = time.monotonic()
        os.killpg(child.pid, signal.SIGINT)
        out, err = child.communicate(timeout=HANG_S)
        took = time.monotonic() - sent
        assert child.returncode == 130, (child.returncode, out, err[-3000:])
        assert took < within(15), f"exit {took:.1f}s after one Ctrl-C"
        assert "Traceback" not in err, err[-3000:]
        summary = out.strip().splitlines()[-1]
        assert summary.startswith("regen: interrupted: ") and " cancelled" in summary, (out, took)
        generated = int(summary.split("interrupted: ")[1].split(" generated")[0])
        time.sleep(3.0)  # cancelled tasks must not write after the driver is gone
        files = list(store.glob("*.h5"))
        assert 2 <= len(files) == generated < 8, (summary, files)
        assert not list(store.glob(".*.tmp"))
        for spec in load_suite(suite):
            if GoldenStore(store).path_for(spec).exists():
                GoldenStore(store).load(spec)
    finally:
        if child.poll() is None:
            os.killpg(child.pid, signal.SIGKILL)


# -- run --ray -------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def golden_dir(shared_golden: Path) -> Path:
    return shared_golden


@pytest.fixture(scope="module")
def local_run(cluster: Any, golden_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The subset run locally, one process with one BLAS/torch thread (as each Ray shard runs)."""
    out = tmp_path_factory.mktemp("local") / "run"
    command = [sys.executable, "-m", "mlaconf", "run", "--backend", "torch-cpu", "--golden-dir", str(golden_dir)]
    command += ["--report-dir", str(out), "-n", "0", "--", *PYTEST_ARGS]
    done = subprocess.run(command, env=os.environ | THREADS, capture_output=True, text=True, timeout=HANG_S)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return out


def _ray_run(golden_dir: Path, out: Path, *extra: str) -> int:
    argv = ["run", "--ray", "--backend", "torch-cpu", "--golden-dir", str(golden_dir), "--report-dir", str(out)]
    return main([*argv, *extra, "--", *PYTEST_ARGS])


def _records(run: Path) -> dict[tuple[str, str], dict[str, Any]]:
    return {(r["test"], r["backend"]): without_volatile(r) for r in read_results(run / "results.jsonl")}


def _assert_same_report(local: Path, cand: Path) -> None:
    expected, got = _records(local), _records(cand)
    assert len(expected) >= 15 and {r["suite"] for r in expected.values()} >= {"conformance", "metamorphic", "property"}
    assert got == expected
    local_run_json = json.loads((local / "run.json").read_text())
    ray_run_json = json.loads((cand / "run.json").read_text())
    assert ray_run_json["verdicts"] == local_run_json["verdicts"] and ray_run_json["records"] == len(expected)
    assert ray_run_json["counts"] == local_run_json["counts"] and ray_run_json["status"] == "complete"
    result = diff_dirs(local, cand)  # `mlaconf report diff`: identical, or skipped on both sides
    counts = result.counts()
    skipped = sum(r["verdict"] == "skipped" for r in expected.values())
    assert counts["identical"] == len(expected) - skipped, counts
    assert counts["not_run"] + counts["not_applicable"] == skipped, counts
    assert sum(counts.values()) == len(expected) and not result.perf, (counts, result.perf)
    assert result.exit_status(fail_on_perf=True, skips_expected=True) == 0


def test_run_through_ray_gives_the_local_records(local_run: Path, golden_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "ray-run"
    assert _ray_run(golden_dir, out) == 0
    _assert_same_report(local_run, out)
    run = json.loads((out / "run.json").read_text())
    assert run["ray"]["shards"] == 2 and run["problems"] == [] and not run["merge_warnings"]
    assert sorted(p.name for p in (out / "shards").iterdir()) == ["1-of-2", "2-of-2"]


def _shard_worker(shard: str, golden_dir: Path) -> int | None:
    """The Ray worker process running ``shard`` of this test's run (its store names it among parallel
    test runs): the parent of the shard's pytest process."""
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        with contextlib.suppress(OSError, ValueError, IndexError):
            argv = (proc / "cmdline").read_bytes().split(b"\0")
            ours = str(golden_dir).encode() in argv and any(b"mla-ray-shard-" in a for a in argv)
            if ours and argv[argv.index(b"--mla-shard") + 1] == shard.encode():
                return int((proc / "stat").read_text().rsplit(")", 1)[1].split()[1])
    return None


def _run_killing_shard_1(golden_dir: Path, out: Path, *extra: str) -> int:
    """A run --ray during which the worker of shard 1/2 is SIGKILLed once its pytest has started."""
    status: list[int] = []
    thread = threading.Thread(target=lambda: status.append(_ray_run(golden_dir, out, *extra)))
    thread.start()
    try:
        deadline = time.monotonic() + HANG_S
        worker = None
        while worker is None and time.monotonic() < deadline and thread.is_alive():
            time.sleep(0.1)
            worker = _shard_worker("1/2", golden_dir)
        assert worker is not None, "shard 1/2 never started"
        time.sleep(1.0)
        os.kill(worker, signal.SIGKILL)
    finally:
        thread.join(300)
    assert status, "run --ray did not return"
    return status[0]


def test_a_killed_ray_worker_has_its_shard_rerun(local_run: Path, golden_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "ray-run"
    assert _run_killing_shard_1(golden_dir, out) == 0
    _assert_same_report(local_run, out)
    attempts = json.loads((out / "run.json").read_text())["ray"]["attempts"]
    assert len(attempts["1/2"]) == 2 and len(attempts["2/2"]) == 1, attempts
    killed = attempts["1/2"][0].rsplit(":", 1)[1]  # its temp directory was removed by the rerun
    assert not list(Path(tempfile.gettempdir()).glob(f"mla-ray-shard-{killed}-*"))


def test_a_shard_lost_for_good_is_recorded_as_not_run(local_run: Path, golden_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "ray-run"
    assert _run_killing_shard_1(golden_dir, out, "--ray-retries", "0") == 1
    expected, got = _records(local_run), _records(out)
    assert set(got) == set(expected)  # every selected test has its record
    lost = {key for key, r in got.items() if (r.get("failure") or {}).get("kind") == "not_run"}
    assert lost and all(got[key]["verdict"] == "error" and "shard 1/2 was lost" in got[key]["message"] for key in lost)
    assert all(got[key] == expected[key] for key in set(got) - lost)  # shard 2 as it ran locally
    run = json.loads((out / "run.json").read_text())
    assert any("shard 1/2 lost" in p and "recorded as not run" in p for p in run["problems"]), run["problems"]
    assert run["records"] == len(expected) and run["verdicts"]["error"] == len(lost) and run["status"] == "crashed"


@pytest.mark.parametrize("stop", [signal.SIGINT, signal.SIGTERM], ids=lambda s: s.name)
def test_a_stop_signal_to_a_ray_run_driver_cancels_every_shard(
    cluster: Any, golden_dir: Path, tmp_path: Path, stop: signal.Signals
) -> None:
    out = tmp_path / "ray-run"
    command = [sys.executable, "-m", "mlaconf", "run", "--ray", ray.get_runtime_context().gcs_address]
    command += ["--backend", "torch-cpu", "--golden-dir", str(golden_dir), "--report-dir", str(out), "--", *PYTEST_ARGS]
    child = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        deadline = time.monotonic() + HANG_S
        while _shard_worker("1/2", golden_dir) is None and time.monotonic() < deadline and child.poll() is None:
            time.sleep(0.1)
        assert child.poll() is None and _shard_worker("1/2", golden_dir) is not None, "shard 1/2 never started"
        sent = time.monotonic()
        os.kill(child.pid, stop)  # the driver's pid alone, as Ctrl-C's SIGINT or `timeout`'s SIGTERM reach it
        stdout, stderr = child.communicate(timeout=HANG_S)
        assert time.monotonic() - sent < 45, "the driver took more than seconds to stop"
    finally:
        if child.poll() is None:
            os.killpg(child.pid, signal.SIGKILL)
    assert child.returncode == 130, (child.returncode, stdout[-2000:], stderr[-3000:])
    assert "Traceback" not in stderr, stderr[-3000:]
    run = json.loads((out / "run.json").read_text())
    assert run["status"] == "interrupted" and run["ray"]["interrupted"], run
    deadline = time.monotonic() + 20
    while (_shard_worker("1/2", golden_dir) or _shard_worker("2/2", golden_dir)) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert _shard_worker("1/2", golden_dir) is None and _shard_worker("2/2", golden_dir) is None, "a shard outlived it"


def test_a_pytest_argument_pytest_refuses_ends_the_ray_run_like_a_plain_one(
    cluster: Any, golden_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Every shard would refuse it alike: no retry as a crash, one line, exit 4, the run marked usage_error."""
    out = tmp_path / "ray-run"
    argv = ["run", "--ray", "--backend", "torch-cpu", "--golden-dir", str(golden_dir), "--report-dir", str(out)]
    assert main([*argv, "--", "--no-such-pytest-option"]) == 4
    err = capsys.readouterr().err
    assert "Traceback" not in err and "lost after" not in err
    assert sum("pytest refused the run's arguments" in line for line in err.splitlines()) == 1, err
    assert json.loads((out / "run.json").read_text())["status"] == "usage_error"
