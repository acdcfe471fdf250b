"""Fixtures shared by the framework's own tests: the CPU test double of libatb, built per run."""

from __future__ import annotations

import ctypes
import json
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from mlaconf.golden.store.locations import chosen_root

ROOT = Path(__file__).resolve().parents[1]
DOUBLE_SOURCE = ROOT / "native" / "testing" / "libatb_double.cpp"


def _compiler() -> str | None:
    return os.environ.get("CXX") or shutil.which("g++") or shutil.which("c++")


def _build_shared(source: Path, output: Path) -> Path:
    compiler = _compiler()
    if compiler is None:
        pytest.skip("no C++ compiler (g++/c++ or $CXX) to build the libatb test double")
    command = [
        compiler,
        "-std=c++17",
        "-shared",
        "-fPIC",
        "-O0",
        "-Wall",
        "-Wextra",
        "-Werror",
        f"-I{ROOT / 'native' / 'src'}",
        str(source),
        "-o",
        str(output),
    ]
    result = subprocess.run(command, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        pytest.fail(f"building {output.name} failed:\n{' '.join(command)}\n{result.stderr}")
    return output


class AtbDouble:
    """ctypes view of native/testing/libatb_double.cpp: its call record and its knobs."""

    def __init__(self, path: Path) -> None:
        self.path = str(path)
        lib = ctypes.CDLL(self.path)  # the same loaded image the extension dlopens by this path
        lib.atb_double_record.restype = ctypes.c_char_p
        lib.atb_double_inject.argtypes = [ctypes.c_char_p, ctypes.c_int32]
        lib.atb_double_set_workspace_size.argtypes = [ctypes.c_uint64]
        lib.atb_double_fail_create_tensor.argtypes = [ctypes.c_long]
        self._lib = lib

    def reset(self) -> None:
        self._lib.atb_double_reset()

    def abandon_live(self) -> None:
        """Forget handles the harness leaked on purpose (never destroyed), so later counts start at 0."""
        self._lib.atb_double_abandon_live()

    def inject(self, stage: str, status: int) -> None:
        self._lib.atb_double_inject(stage.encode(), status)

    def set_workspace_size(self, size: int) -> None:
        self._lib.atb_double_set_workspace_size(size)

    def fail_create_tensor(self, index: int) -> None:
        self._lib.atb_double_fail_create_tensor(index)

    def record(self) -> dict[str, Any]:
        raw: bytes = self._lib.atb_double_record()
        result: dict[str, Any] = json.loads(raw.decode())
        return result


#: Set by the xdist controller in each worker's input when it schedules by tests/scheduling.py.
ORDER_KEY = "mla_tests_slowest_first"


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """xdist's ``load`` mode for our tests: slowest first, a module with a module fixture on one worker."""
    if config.getvalue("dist") != "load":
        return None
    from tests.scheduling import SharedSetupScheduling

    return SharedSetupScheduling(config, log)


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node: Any) -> None:
    """xdist controller: tell the workers to collect slowest first when the scheduler above is in use."""
    node.workerinput[ORDER_KEY] = node.config.getvalue("dist") == "load"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """On an xdist worker scheduled by tests/scheduling.py, the slowest modules first (every worker alike)."""
    if getattr(config, "workerinput", {}).get(ORDER_KEY):
        from tests.scheduling import slowest_first

        slowest_first(items)


@pytest.fixture(scope="session")
def shared_golden(pytestconfig: pytest.Config) -> Path:
    """The golden store of every test of the session that runs cases of the shipped suites (or their
    metamorphic relations) as a user would: the store this session's own ``cases/`` run uses
    (``--mla-golden-dir``, else ``$MLA_GOLDEN_DIR``, else ``.golden`` where pytest was started), which is also
    the main job's (``mlaconf run``).  So each golden is built once whichever test or run needs it, on demand,
    under the store's lock per case (xdist workers and their child runs share the folder safely), and a
    checkout whose main job ran already builds none.  A test whose point is building, finding missing or
    damaging goldens, or inputs of other seeds, keeps a store of its own."""
    named = pytestconfig.getoption("mla_golden_dir")
    path = pytestconfig.invocation_params.dir / chosen_root(named)
    path.mkdir(parents=True, exist_ok=True)
    return path


@pytest.fixture(scope="session")
def atb_double_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """libatb_double.so compiled from source with the system compiler."""
    return _build_shared(DOUBLE_SOURCE, tmp_path_factory.mktemp("atb_double") / "libatb_double.so")


@pytest.fixture(scope="session")
def symbolless_lib(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A loadable shared library that exports none of ATB's symbols (an ATB older than 8.2.RC1)."""
    directory = tmp_path_factory.mktemp("symbolless")
    source = directory / "empty.cpp"
    source.write_text("int mla_conformance_unrelated_symbol = 0;\n")
    return _build_shared(source, directory / "libempty.so")


@pytest.fixture
def atb_double(atb_double_path: Path) -> AtbDouble:
    """The double with its record and injections cleared."""
    double = AtbDouble(atb_double_path)
    double.reset()
    return double


@pytest.fixture
def tiny_tmpfs(tmp_path: Path) -> Iterator[Path]:
    """A 2 MiB tmpfs for disk-full tests; skips with the reason where mounting is not permitted."""
    mount_point = tmp_path / "tiny"
    mount_point.mkdir()
    try:
        done = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(mount_point)],
            capture_output=True,
            text=True,
            timeout=30,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        pytest.skip(f"cannot mount a tmpfs here: {exc}")
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip() or done.returncode}")
    try:
        yield mount_point
    finally:
        subprocess.run(["umount", "-l", str(mount_point)], capture_output=True, timeout=30)
