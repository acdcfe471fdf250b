"""``mlaconf run -- ARGS``: paths or node ids after ``--`` replace the installed suites (no test is
collected twice); options and their values do not; ``--ray`` at an address where nothing answers is one
line, at once."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from mlaconf import build_parser
from mlaconf.tools.command import pytest_command
from tests.machine import HANG_S

REPO = Path(__file__).resolve().parents[2]


def command(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, *after: str) -> list[str]:
    monkeypatch.chdir(tmp_path)
    return pytest_command(build_parser().parse_args(["run", "--backend", "torch-cpu", "--", *after]))


def suites_named(argv: list[str]) -> bool:
    return any(arg.endswith("cases") and Path(arg).is_dir() for arg in argv[3:5])


@pytest.mark.parametrize(
    "after",
    [["cases/test_conformance.py"], ["-q", "x/test_a.py::test_b"], ["cases"], ["cases/test_x.py", "-k", "causal"]],
)
def test_paths_and_node_ids_replace_the_suites(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, after: list[str]
) -> None:
    (tmp_path / "cases").mkdir()
    argv = command(tmp_path, monkeypatch, *after)
    assert not suites_named(argv) and argv[-len(after) :] == after, argv


@pytest.mark.parametrize("after", [["--lf"], ["-k", "cases"], ["--mla-cases", "mine.toml"], ["-p", "no:cacheprovider"]])
def test_options_and_their_values_keep_the_suites(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, after: list[str]
) -> None:
    (tmp_path / "cases").mkdir()
    (tmp_path / "mine.toml").write_text("")
    assert suites_named(command(tmp_path, monkeypatch, *after))


def test_a_named_file_is_collected_once(tmp_path: Path) -> None:
    """The issue's case: ``-- cases/test_conformance.py`` collected the conformance tests twice."""
    argv = [sys.executable, "-m", "mlaconf", "run", "--backend", "torch-cpu", "-n", "0", "--report-dir", "r"]
    argv += ["--", "-p", "no:cacheprovider", "--collect-only", "-q", str(REPO / "cases" / "test_conformance.py")]
    done = subprocess.run(argv, cwd=tmp_path, capture_output=True, text=True, timeout=HANG_S)
    ids = [line for line in done.stdout.splitlines() if "::" in line]
    assert done.returncode == 0 and ids and len(ids) == len(set(ids)), done.stdout[-2000:] + done.stderr[-2000:]
    assert all("test_conformance.py::" in i for i in ids)


def test_ray_at_an_address_where_nothing_answers_is_one_line_at_once(capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("ray")
    from mlaconf import main

    with socket.socket() as free:  # a port nothing listens on
        free.bind(("127.0.0.1", 0))
        address = f"127.0.0.1:{free.getsockname()[1]}"
    start = time.monotonic()
    for verb in (["run", "--ray", address], ["regen", "--ray", address]):
        assert main(verb) == 2
    assert time.monotonic() - start < 15
    err = capsys.readouterr().err.strip().splitlines()
    assert (
        err
        == [
            f"error: --ray {address}: no Ray cluster answers there ([Errno 111] Connection refused); "
            "start one with 'ray start --head' (docs/cluster.md) or check the address"
        ]
        * 2
    )
