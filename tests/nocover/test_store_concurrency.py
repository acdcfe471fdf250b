"""Golden store under real processes: concurrent regens compute each case once; SIGKILL never leaves a
partial file under a final name.

Child processes run ``python -m mlaconf.golden.maintain regen --builder test_store_concurrency:<builder>`` with this
directory on PYTHONPATH; the builders below log every build to ``$MLA_TEST_BUILD_LOG``.
"""

from __future__ import annotations

import collections
import os
import random
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from mlaconf.golden.building.generate import build_golden
from mlaconf.golden.building.inputs import generate_inputs
from mlaconf.golden.building.magnitudes import round_up_bf16
from mlaconf.golden.building.regen import verify
from mlaconf.golden.specs.layout import out_shape, row_valid
from mlaconf.golden.specs.spec import CaseSpec
from mlaconf.golden.specs.suites import load_suite
from mlaconf.golden.specs.types import ROW_MAGNITUDES, GoldenCase, element_magnitudes
from mlaconf.golden.store.directory import GoldenStore
from mlaconf.golden.store.h5file import read_golden
from tests.machine import HANG_S

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
BUILD_LOG = "MLA_TEST_BUILD_LOG"

SMALL_SUITE = """
[suite]
name = "concurrency"
[defaults]
head_num = 2
[[matrix]]
dtype = ["fp16", "bf16"]
mask_type = [0, 2]
q_seqlen = [[5, 0, 7], [33]]
"""
BIG_SUITE = """
[suite]
name = "big"
[defaults]
head_num = 8
q_seqlen = [2048]
[[matrix]]
dtype = ["fp16", "bf16"]
seed = [1, 2]
"""


def _log_build(spec: CaseSpec) -> None:
    with open(os.environ[BUILD_LOG], "a") as fh:  # one short O_APPEND write per build
        fh.write(f"{spec.case_id} {os.getpid()}\n")


def counting_builder(spec: CaseSpec, *, threads: int = 1) -> GoldenCase:
    """The real builder, logged, with a pause that widens the window for a duplicate build."""
    _log_build(spec)
    time.sleep(0.3)
    return build_golden(spec, threads=threads)


def big_builder(spec: CaseSpec, *, threads: int = 1) -> GoldenCase:
    """Real inputs with a random stand-in reference: tens of MB per file, written in about a second."""
    _log_build(spec)
    inputs = generate_inputs(spec)
    out = np.random.default_rng(spec.seed).standard_normal(out_shape(spec))
    t, h = spec.total_q, spec.head_num
    magnitudes = {name: round_up_bf16(np.abs(out)) for name in element_magnitudes(spec)}
    magnitudes.update({name: np.ones((t, h), dtype=np.float32) for name in ROW_MAGNITUDES})
    return GoldenCase(
        spec,
        inputs,
        out,
        row_valid(spec),
        out.astype(inputs.q.dtype),
        {"stand_in": True},
        {"builder": f"big_builder threads={threads}"},
        magnitudes,
    )


def _env(tmp_path: Path) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(HERE), str(REPO), env.get("PYTHONPATH", "")])
    env[BUILD_LOG] = str(tmp_path / "builds.log")
    env.pop("MLA_GOLDEN_DIR", None)
    return env


def _regen(suite: Path, store: Path, builder: str, *extra: str) -> list[str]:
    return [
        sys.executable,
        "-m",
        "mlaconf.golden.maintain",
        "regen",
        "--cases",
        str(suite),
        "--out",
        str(store),
        "--builder",
        f"test_store_concurrency:{builder}",
        *extra,
    ]


def _builds(tmp_path: Path) -> collections.Counter[str]:
    log = tmp_path / "builds.log"
    lines = log.read_text().splitlines() if log.exists() else []
    return collections.Counter(line.split()[0] for line in lines)


def _suite(tmp_path: Path, text: str) -> tuple[Path, list[CaseSpec]]:
    path = tmp_path / "suite.toml"
    path.write_text(text)
    return path, load_suite(path)


def test_four_concurrent_regens_compute_each_case_once(tmp_path: Path) -> None:
    suite, specs = _suite(tmp_path, SMALL_SUITE)
    store = tmp_path / "store"
    env = _env(tmp_path)
    procs = [
        subprocess.Popen(
            _regen(suite, store, "counting_builder", "--jobs", str(1 + i % 2)),
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for i in range(4)
    ]
    results = [proc.communicate(timeout=HANG_S) for proc in procs]
    for proc, (out, err) in zip(procs, results, strict=True):
        assert proc.returncode == 0, err
        assert " 0 failed" in out
    assert _builds(tmp_path) == {spec.case_id: 1 for spec in specs}
    generated = sum(int(out.split("regen: ")[1].split(" generated")[0]) for out, _ in results)
    assert generated == len(specs)
    report = verify(GoldenStore(store), specs)
    assert report.checked == len(specs) and report.problems == []
    assert not list(store.glob(".*.tmp"))


def test_sigkill_during_write_leaves_no_final_file(tmp_path: Path) -> None:
    suite, specs = _suite(tmp_path, BIG_SUITE)
    store = tmp_path / "store"
    flag = tmp_path / "writing"
    argv = _regen(suite, store, "big_builder")[3:]
    # Stall the writer between its fsynced temp file and the rename, then kill it there.
    script = (
        "import os, sys, time\n"
        "real = os.replace\n"
        "def stalled(src, dst):\n"
        f"    open({str(flag)!r}, 'w').close()\n"
        "    time.sleep(300)\n"
        "os.replace = stalled\n"
        "from mlaconf.golden.maintain import main\n"
        f"sys.exit(main({argv!r}))\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", script], env=_env(tmp_path))
    deadline = time.monotonic() + 120
    while not flag.exists():
        assert proc.poll() is None and time.monotonic() < deadline, "writer never reached the rename"
        time.sleep(0.05)
    temps = list(store.glob(".*.tmp"))
    prefix = f".{specs[0].case_id}.h5.{proc.pid}."  # + a random part, then .tmp
    assert len(temps) == 1 and re.fullmatch(re.escape(prefix) + "[0-9a-f]{16}[.]tmp", temps[0].name), temps
    assert temps[0].stat().st_size > 10_000_000
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=HANG_S)
    assert list(store.glob("*.h5")) == []
    rerun = subprocess.run(
        _regen(suite, store, "big_builder"), env=_env(tmp_path), capture_output=True, text=True, timeout=HANG_S
    )
    assert rerun.returncode == 0, rerun.stderr
    assert f"{len(specs)} generated" in rerun.stdout
    assert verify(GoldenStore(store), specs).problems == []
    assert not list(store.glob(".*.tmp")), "the dead writer's temp file must be cleaned up"


def test_sigkill_at_random_moments_never_exposes_a_bad_file(tmp_path: Path) -> None:
    suite, specs = _suite(tmp_path, BIG_SUITE)
    store = tmp_path / "store"
    rng = random.Random(20240611)
    killed_running = left_temp = 0
    for _ in range(8):  # a full --force run takes ~2 s here: python start-up, 4 builds, ~190 MB written
        proc = subprocess.Popen(
            _regen(suite, store, "big_builder", "--force"),
            env=_env(tmp_path),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        time.sleep(rng.uniform(0.5, 2.0))
        killed_running += proc.poll() is None
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=HANG_S)
        left_temp += bool(list(store.glob(".*.tmp")))
        for path in store.glob("*.h5"):
            read_golden(path)  # raises GoldenCorruptError on any partial or damaged file
    assert killed_running > 0, "every regen finished before its kill: nothing was tested"
    final = subprocess.run(
        _regen(suite, store, "big_builder"), env=_env(tmp_path), capture_output=True, text=True, timeout=HANG_S
    )
    assert final.returncode == 0, final.stderr
    assert verify(GoldenStore(store), specs).problems == []
    print(f"kills of a running regen: {killed_running}/8, leaving a temp file: {left_temp}")
