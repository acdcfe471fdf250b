"""Ray is optional: the local paths never import it, and ``--ray`` without it is one usage line naming
the extra (checked in a subprocess where ``import ray`` fails, whether or not Ray is installed here)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
WITHOUT_RAY = "import sys; sys.modules['ray'] = None\nfrom mlaconf import main\nsys.exit(main(sys.argv[1:]))\n"
LOCAL_PATH = """
import sys
from pathlib import Path
from mlaconf import build_parser
from mlaconf.golden import cli, regen, ray_regen
from mlaconf.runner import plugin, run, ray_run
build_parser()
suite = Path(sys.argv[1]) / "suite.toml"
suite.write_text("[[case]]\\nq_seqlen = [4]\\nhead_num = 1\\n")
assert cli.main(["regen", "--cases", str(suite), "--out", sys.argv[1] + "/store", "-j", "2"]) == 0
assert "ray" not in sys.modules, "the local path imported ray"
"""


@pytest.mark.parametrize("verb", [["regen", "smoke"], ["run"]])
def test_ray_flag_without_ray_is_one_usage_line(verb: list[str], tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-c", WITHOUT_RAY, *verb, "--ray"], capture_output=True, text=True, cwd=tmp_path, timeout=120
    )
    assert done.returncode == 2, (done.stdout, done.stderr)
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "--ray needs Ray" in lines[0] and "[ray]" in lines[0], done.stderr
    assert not list(tmp_path.iterdir()), "nothing may be written"


def test_the_local_paths_never_import_ray(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-c", LOCAL_PATH, str(tmp_path)], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]
