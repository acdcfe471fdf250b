"""A type error fails whichever way mypy is run.  Plain ``mypy`` cannot map the rooms to ``mlaconf.<room>``
(``.ci/mypy_rooms.py`` can, and is CI's check); it must then fail, not type every ``mlaconf.*`` import as Any
and report success over a planted error, as ``ignore_missing_imports`` alone made it do."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

PLANTED = """
from mlaconf.golden.specs.spec import CaseSpec


def show(spec: CaseSpec) -> None:
    print(spec.no_such_field)  # an error only mypy's own view of CaseSpec can see: as Any it passes
"""


def test_plain_mypy_fails_on_a_planted_error_it_cannot_see(tmp_path: Path) -> None:
    pytest.importorskip("mypy")
    (tmp_path / "planted.py").write_text(PLANTED)
    config = ["--config-file", str(REPO / "pyproject.toml"), "--cache-dir", str(tmp_path)]
    ran = subprocess.run(
        [sys.executable, "-m", "mypy", *config, str(tmp_path / "planted.py")],
        cwd=tmp_path,
        capture_output=True,
        text=True,
    )
    assert ran.returncode == 1, ran.stdout + ran.stderr
    assert '"mlaconf.golden.specs.spec"' in ran.stdout, ran.stdout  # not found, or found installed without types
    assert "[import-not-found]" in ran.stdout or "[import-untyped]" in ran.stdout, ran.stdout
