"""ring-mla and npu-fia pass the whole smoke suite through the plugin, on the CPU, with the fake torch_npu.

One pytest process with the fake installed (``tests.fake_torch_npu.install_for_process``) runs every
smoke test module (conformance, metamorphic, properties; error contract skipped: neither backend has
one) for both backends via their CPU factories; every record must pass.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

from mlaconf.golden.specs.suites import load_suites
from mlaconf.harness.npu_ops import FIA_MAX_GROUP
from tests.machine import HANG_S

ROOT = Path(__file__).resolve().parents[2]
RUN = """
import sys
sys.path.insert(0, {root!r})
from tests.fake_torch_npu import install_for_process
install_for_process()
import pytest
sys.exit(pytest.main(sys.argv[1:]))
"""


def test_smoke_passes_through_the_fake_on_both_backends(tmp_path: Path, shared_golden: Path) -> None:
    report = tmp_path / "report"
    argv = [sys.executable, "-c", RUN.format(root=str(ROOT)), str(ROOT / "cases"), "-p", "no:cacheprovider", "-q"]
    argv += ["-n", "0", "--mla-suite", "smoke", "--mla-suite", "metamorphic", "--mla-report-dir", str(report)]
    argv += [
        "--mla-backend",
        "tests.fake_torch_npu:ring_mla_on_cpu",
        "--mla-backend",
        "tests.fake_torch_npu:npu_fia_on_cpu",
    ]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "MLA_GOLDEN_DIR": str(shared_golden)}
    done = subprocess.run(argv, capture_output=True, text=True, cwd=tmp_path, env=env, timeout=HANG_S, check=False)
    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
    records = [json.loads(line) for line in (report / "results.jsonl").read_text().splitlines()]
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
