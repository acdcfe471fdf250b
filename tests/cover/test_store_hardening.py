"""Golden writers never follow a planted symlink and never reuse a temp name; the store opens only
regular files, so a FIFO named like a golden neither hangs a load nor ``mlaconf verify``."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from mlaconf.golden.building.generate import build_golden
from mlaconf.golden.specs.spec_build import build_case
from mlaconf.golden.store import directory as gs
from mlaconf.golden.store.directory import GoldenStore, write_golden
from mlaconf.golden.store.integrity import GENERATOR_VERSION, GoldenCorruptError, GoldenWriteError
from tests.machine import within

SMALL = build_case({"q_seqlen": [3, 2], "head_num": 1, "dtype": "bf16", "name": "harden"}, source="test")
ROOT = Path(__file__).resolve().parents[2]
VICTIM_TEXT = b"not yours to overwrite\n"


@pytest.fixture()
def victim(tmp_path: Path) -> Path:
    path = tmp_path / "victim.txt"
    path.write_bytes(VICTIM_TEXT)
    return path


def test_a_symlink_at_the_pid_temp_name_is_not_followed(tmp_path: Path, victim: Path) -> None:
    """The temp name once was ``.<name>.<pid>.tmp``: a link planted there got the whole golden written through it."""
    path = tmp_path / "store" / f"{SMALL.case_id}.h5"
    path.parent.mkdir()
    planted = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    planted.symlink_to(victim)
    write_golden(build_golden(SMALL), path, GENERATOR_VERSION)
    assert victim.read_bytes() == VICTIM_TEXT
    assert path.is_file() and not path.is_symlink()
    GoldenStore(path.parent).load(SMALL)


def test_a_symlink_at_the_chosen_temp_name_is_refused_not_followed(
    tmp_path: Path, victim: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / f"{SMALL.case_id}.h5"
    monkeypatch.setattr(gs.secrets, "token_hex", lambda n: "0" * (2 * n))
    planted = gs.temp_path(path)
    planted.symlink_to(victim)
    with pytest.raises(GoldenWriteError, match=f"{SMALL.case_id}.*File exists"):
        write_golden(build_golden(SMALL), path, GENERATOR_VERSION)
    assert victim.read_bytes() == VICTIM_TEXT and planted.is_symlink()  # left as found, never removed
    assert not path.exists()


def test_temp_names_are_unique_per_write(tmp_path: Path) -> None:
    path = tmp_path / "x.h5"
    names = {gs.temp_path(path) for _ in range(100)}
    assert len(names) == 100 and all(n.name.startswith(f".x.h5.{os.getpid()}.") for n in names)


def test_a_symlink_at_the_final_name_is_replaced_not_written_through(tmp_path: Path, victim: Path) -> None:
    store = GoldenStore(tmp_path / "store", builder=build_golden)
    store.root.mkdir()
    store.path_for(SMALL).symlink_to(victim)
    store.ensure(SMALL)
    assert victim.read_bytes() == VICTIM_TEXT
    assert store.path_for(SMALL).is_file() and not store.path_for(SMALL).is_symlink()


def _run(args: list[str], timeout: float) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run(args, capture_output=True, text=True, timeout=timeout, env=env, check=False)


def test_a_fifo_named_like_a_golden_is_corrupt_not_a_hang(tmp_path: Path) -> None:
    store = GoldenStore(tmp_path / "store", builder=build_golden)
    store.root.mkdir()
    fifo = store.path_for(SMALL)
    os.mkfifo(fifo)
    code = (
        "from mlaconf.golden.store.integrity import GoldenCorruptError\n"
        "from mlaconf.golden.specs.spec_build import spec_from_json\n"
        "from mlaconf.golden.store.directory import GoldenStore\n"
        f"spec = spec_from_json({SMALL.to_json()!r})\n"
        "try:\n"
        f"    GoldenStore({str(store.root)!r}).load(spec)\n"
        "except GoldenCorruptError as exc:\n"
        "    print('corrupt:', exc)\n"
    )
    try:
        done = _run([sys.executable, "-c", code], timeout=within(60))  # a hang, on any machine
    except subprocess.TimeoutExpired:
        pytest.fail(f"loading a FIFO at {fifo} hung")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == f"corrupt: {fifo}: not a regular file (a FIFO): not a golden"
    with pytest.raises(GoldenCorruptError, match="a FIFO"):
        store.load(SMALL)  # in this process too (no writer ever opens the other end)
    assert store.ensure_result(SMALL).action == "generated" and fifo.is_file()  # rebuilt in its place


def test_verify_reports_a_fifo_in_the_store_in_one_line(tmp_path: Path) -> None:
    store = GoldenStore(tmp_path / "store", builder=build_golden)
    store.ensure(SMALL)
    fifo = store.root / "zz-not-a-golden.h5"
    os.mkfifo(fifo)
    try:
        done = _run([sys.executable, "-m", "mlaconf", "verify", "--out", str(store.root)], timeout=within(120))
    except subprocess.TimeoutExpired:
        pytest.fail("mlaconf verify hung on a FIFO in the store")
    lines = [line for line in done.stdout.splitlines() if "zz-not-a-golden" in line]
    assert len(lines) == 1 and "not a regular file (a FIFO)" in lines[0], done.stdout
    assert done.returncode == 1
