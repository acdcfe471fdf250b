"""The device command end to end on the CPU: ``mlaconf ascend`` with the fake torch_npu in every process.

A ``sitecustomize`` on PYTHONPATH installs ``tests.fake_torch_npu`` and points the torch_npu backends
at the CPU in each Python process the command starts, so the probe admits ring-mla and npu-fia (ATB
has no libatb here), then regen, three smoke runs over the same goldens, two diffs and the archive
all run for real.  The same rehearsal shows that ring-mla and npu-fia pass the whole smoke suite
(conformance and metamorphic; the error contract skips: neither has one) through the plugin: its runs'
records are read.  The goldens are the session's shared store's (``--golden-dir``): regen finds smoke's
there, or builds it once for every test that runs smoke; that the archive leaves a box's own store
behind is tests/cover/test_ascend_command.py's.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tarfile
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from mlaconf.golden.specs.suites import load_suites
from mlaconf.harness.npu_ops import FIA_MAX_GROUP
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


@pytest.fixture(scope="module")
def rehearsal(tmp_path_factory: pytest.TempPathFactory, shared_golden: Path) -> tuple[Path, str]:
    """The folder ``mlaconf ascend --out box`` ran in, and its exit status and output (asserted by the tests)."""
    work = tmp_path_factory.mktemp("ascend")
    site = work / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(SITE.format(root=str(ROOT)))
    env = {**os.environ, "PYTHONPATH": f"{site}:{ROOT}", "MLA_ATB_LIB": str(work / "no-libatb.so")}
    # each run in one process (-n 0): the session's own workers already keep the cores busy, and two more
    # workers per run would only add their start-up (torch and the suites imported again, twice per run)
    argv = [sys.executable, "-m", "mlaconf", "ascend", "--no-build", "--out", "box", "-n", "0"]
    argv += ["--golden-dir", str(shared_golden)]
    done = subprocess.run(argv, capture_output=True, text=True, cwd=work, env=env, timeout=HANG_S, check=False)
    text = done.stdout + done.stderr
    assert done.returncode == 0, text[-4000:]
    return work, text


def test_the_device_command_runs_through_on_the_fake(rehearsal: tuple[Path, str]) -> None:
    work, _ = rehearsal
    summary = json.loads((work / "box" / "summary.json").read_text())
    assert [(s["name"], s["exit"]) for s in summary["steps"]] == [
        ("regen", 0),
        ("smoke-ring-mla", 0),
        ("smoke-npu-fia", 0),
        ("smoke-torch-cpu", 0),
        ("diff-ring-mla-vs-npu-fia", 0),
        ("diff-ring-mla-vs-torch-cpu", 0),
    ]
    for backend in ("ring-mla", "npu-fia", "torch-cpu"):
        run = json.loads((work / "box" / "runs" / backend / "run.json").read_text())
        assert run["status"] == "complete", run
    with tarfile.open(work / "box.tar.gz") as tar:
        names = tar.getnames()
    assert "box/runs/npu-fia/results.jsonl" in names and "box/diffs/ring-mla-vs-torch-cpu/diff.json" in names
    assert "box/facts_report.md" in names and "box/facts_report.json" in names  # what settles each unconfirmed fact


def _records(work: Path, backend: str) -> list[dict[str, Any]]:
    lines = (work / "box" / "runs" / backend / "results.jsonl").read_text().splitlines()
    return [json.loads(line) for line in lines]


def test_smoke_passes_through_the_fake_on_both_backends(rehearsal: tuple[Path, str]) -> None:
    work, _ = rehearsal
    records = _records(work, "ring-mla") + _records(work, "npu-fia")
    verdicts = Counter((r["backend"], r["suite"], r["verdict"]) for r in records)
    smoke = len(load_suites(["smoke"]))
    assert verdicts[("ring-mla", "conformance", "passed")] == smoke, verdicts
    # npu-fia takes TND in bf16 only and GQA groups up to FIA_MAX_GROUP: those cases skip as Unsupported
    # (not applicable), every other case passes
    fia_skips = [
        r for r in records if r["backend"] == "npu-fia" and r["suite"] == "conformance" and r["verdict"] == "skipped"
    ]
    over_group = [r for r in fia_skips if r["dtype"] == "bf16" and f"> {FIA_MAX_GROUP}" in r.get("not_applicable", "")]
    assert fia_skips and all(r["dtype"] == "fp16" or r in over_group for r in fia_skips), fia_skips[:3]
    assert verdicts[("npu-fia", "conformance", "passed")] + len(fia_skips) == smoke, verdicts
    for backend in ("ring-mla", "npu-fia"):
        assert verdicts[(backend, "metamorphic", "passed")] > 0, verdicts
    assert not [r for r in records if r["verdict"] in ("failed", "error")]
