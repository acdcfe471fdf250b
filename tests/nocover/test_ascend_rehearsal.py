"""The device command end to end on the CPU: ``mlaconf ascend`` with the fake torch_npu in every process.

A ``sitecustomize`` on PYTHONPATH installs ``tests.fake_torch_npu`` and points the torch_npu backends
at the CPU in each Python process the command starts, so the probe admits ring-mla and npu-fia (ATB
has no libatb here), then regen, three smoke runs over the same goldens, two diffs and the archive
all run for real.  The goldens are the session's shared store's (``--golden-dir``): regen finds smoke's
there, or builds it once for every test that runs smoke; that the archive leaves a box's own store
behind is tests/cover/test_ascend_command.py's.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path

from tests.machine import HANG_S

ROOT = Path(__file__).resolve().parents[2]
SITE = """
import sys
sys.path.insert(0, {root!r})
from tests.fake_torch_npu import install_for_process
install_for_process()
from mlaconf.harness import npu_ops
npu_ops._TorchNpuOpBackend.device_type = "cpu"
"""


def test_the_device_command_runs_through_on_the_fake(tmp_path: Path, shared_golden: Path) -> None:
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(SITE.format(root=str(ROOT)))
    env = {**os.environ, "PYTHONPATH": f"{site}:{ROOT}", "MLA_ATB_LIB": str(tmp_path / "no-libatb.so")}
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "mlaconf",
            "ascend",
            "--no-build",
            "--out",
            "box",
            "-n",
            "2",
            "--golden-dir",
            str(shared_golden),
        ],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=env,
        timeout=HANG_S,
        check=False,
    )
    text = done.stdout + done.stderr
    assert done.returncode == 0, text[-4000:]
    summary = json.loads((tmp_path / "box" / "summary.json").read_text())
    assert [(s["name"], s["exit"]) for s in summary["steps"]] == [
        ("regen", 0),
        ("smoke-ring-mla", 0),
        ("smoke-npu-fia", 0),
        ("smoke-torch-cpu", 0),
        ("diff-ring-mla-vs-npu-fia", 0),
        ("diff-ring-mla-vs-torch-cpu", 0),
    ]
    for backend in ("ring-mla", "npu-fia", "torch-cpu"):
        run = json.loads((tmp_path / "box" / "runs" / backend / "run.json").read_text())
        assert run["status"] == "complete", run
    with tarfile.open(tmp_path / "box.tar.gz") as tar:
        names = tar.getnames()
    assert "box/runs/npu-fia/results.jsonl" in names and "box/diffs/ring-mla-vs-torch-cpu/diff.json" in names
    assert "box/facts_report.md" in names and "box/facts_report.json" in names  # what settles each unconfirmed fact
