"""Not applicable is not missing evidence: a test the backend's own declarations rule out (no
error contract, ``Unsupported``, not deterministic) is recorded as such and never fails the gate
when both sides agree; every other skip still does."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from mlaconf.reports import diff
from mlaconf.reports.records import ResultRecord, not_applicable
from tests.machine import HANG_S
from tests.runs import record, write_run_dir

REPO = Path(__file__).resolve().parents[2]
NO_CONTRACT = "backend torch-cpu declares no error contract (error_contract = False); only backends promising ..."
UNAVAILABLE = "backend atb unavailable: no NPU visible"


def declared(case: str, reason: str = NO_CONTRACT, **fields: Any) -> dict[str, Any]:
    """An error-contract record the backend's declaration ruled out, as the runner writes it now."""
    return record(
        case, suite="error_contract", verdict="skipped", output_sha256=None, worst_slack=None, message=reason
    ) | {"not_applicable": reason, **fields}


def gate(base: list[dict[str, Any]], cand: list[dict[str, Any]], tmp_path: Path) -> tuple[int, str, dict[str, int]]:
    a = write_run_dir(tmp_path / "a", base, run_id="a")
    b = write_run_dir(tmp_path / "b", cand, run_id="b")
    result = diff.diff_dirs(a, b)
    return result.exit_status(False), result.verdict(), result.counts()


def test_declared_skips_on_both_sides_pass_the_gate(tmp_path: Path) -> None:
    records = [record("x"), record("y"), *(declared(f"e{i}") for i in range(5))]
    status, verdict, counts = gate(records, records, tmp_path)
    assert status == 0, verdict
    assert counts["not_applicable"] == 5 and counts["not_run"] == 0 and counts["identical"] == 2
    assert verdict.startswith("GATE PASSES: 2 identical") and "2 of 2 baseline pairs compared" in verdict
    assert "5 not applicable (declared by the backend on both sides)" in verdict


def test_other_skips_one_sided_runs_and_nothing_compared_still_fail(tmp_path: Path) -> None:
    # a skip whose reason is no declaration (the device gone, a golden missing) is no evidence
    unavailable = record("e0", verdict="skipped", output_sha256=None, message=UNAVAILABLE)
    assert gate([record("x"), unavailable], [record("x"), unavailable], tmp_path / "1")[0] == 1
    # ran in the base, declared not applicable in the candidate: a test the upgrade lost
    status, verdict, counts = gate([record("x"), record("e0")], [record("x"), declared("e0")], tmp_path / "2")
    assert status == 1 and counts["missing"] == 1 and "1 missing" in verdict
    # and the other way round: only in the candidate
    assert gate([record("x"), declared("e0")], [record("x"), record("e0")], tmp_path / "3")[2]["added"] == 1
    # a declared skip against a plain one is not a declaration on both sides
    plain = record("e0", verdict="skipped", output_sha256=None, message=UNAVAILABLE)
    assert gate([record("x"), declared("e0")], [record("x"), plain], tmp_path / "4")[0] == 1
    # everything not applicable: nothing was compared
    status, verdict, _ = gate([declared("e0")], [declared("e0")], tmp_path / "5")
    assert status == 1 and "nothing compared" in verdict


def test_records_written_before_the_field_diff_as_not_applicable(tmp_path: Path) -> None:
    """A results.jsonl of today's runs (the declaration only in the skip message) still diffs clean."""
    skipped = {"verdict": "skipped", "output_sha256": None}
    old = [record("x"), record("e0", suite="error_contract", message=NO_CONTRACT, **skipped)]
    old.append(record("bf", message="backend ring-mla cannot express case bf: fp32", **skipped))
    status, verdict, counts = gate(old, old, tmp_path)
    assert status == 0 and counts["not_applicable"] == 2, verdict
    assert not_applicable(ResultRecord.from_dict(old[1]).to_dict()) == NO_CONTRACT
    # a record that says it is applicable (the field present, null) is never inferred from its message
    assert ResultRecord.from_dict(old[1] | {"not_applicable": None}).not_applicable is None


def test_the_page_leads_with_what_changed_and_folds_not_applicable_away(tmp_path: Path) -> None:
    base = [record("x"), record("y"), *(declared(f"e{i}") for i in range(30))]
    cand = [record("x", output_sha256="1" * 64, worst_slack=0.3), record("y"), *(declared(f"e{i}") for i in range(30))]
    a = write_run_dir(tmp_path / "a", base, run_id="a")
    b = write_run_dir(tmp_path / "b", cand, run_id="b")
    env = dict(os.environ, PYTHONPATH=str(REPO))
    argv = [sys.executable, "-m", "mlaconf", "report", "diff", str(a), str(b), "--out", str(b / "d")]
    done = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=HANG_S, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    assert next(line for line in lines if line.startswith("--")).startswith("-- Changed (1)"), done.stdout
    assert "NOT_APPL  30 x " + NO_CONTRACT in lines and len(lines) < 12, done.stdout  # one line, not 30
    page = (b / "d" / "diff.html").read_text()
    assert page.index('id="changed"') < page.index('<details id="not_applicable">')
    assert json.loads((b / "d" / "diff.json").read_text())["counts"]["not_applicable"] == 30


PLUGIN = """
import torch

from mlaconf.backend import Unsupported
from mlaconf.harness.torch_backend import TorchSdpaBackend


class Partial(TorchSdpaBackend):
    deterministic = False  # and no error contract, as torch-cpu

    def __init__(self) -> None:
        super().__init__("cpu")
        self.name = "partial"

    def run(self, call):
        if call.q.dtype == torch.bfloat16:
            raise Unsupported("bf16 is outside this kernel")
        return super().run(call)


def factory() -> Partial:
    return Partial()
"""


def test_two_identical_runs_of_a_plugin_that_declares_limits_diff_clean(tmp_path: Path) -> None:
    """The README's claim for any plug-in: two identical runs, then ``report diff``, exit 0; each of
    the three declarations reaches the record as ``not_applicable``."""
    (tmp_path / "partial_kernel.py").write_text(PLUGIN)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO), str(tmp_path)]))
    runs = []
    for name in ("one", "two"):
        argv = [sys.executable, "-m", "mlaconf", "run", "--backend", "partial_kernel:factory", "-n", "0"]
        argv += ["--golden-dir", str(tmp_path / "golden"), "--report-dir", str(tmp_path / name), "--"]
        argv += ["-p", "no:cacheprovider", "-k", "b40-s8 or kvcache-b2-s16 or (determinism and b2)"]
        done = subprocess.run(argv, cwd=tmp_path, capture_output=True, text=True, env=env, timeout=HANG_S, check=False)
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
        runs.append(tmp_path / name)
    raw = [json.loads(line) for line in (runs[0] / "results.jsonl").read_text().splitlines()]
    reasons = " | ".join(str(r["not_applicable"]) for r in raw if r["not_applicable"])
    for declaration in ("cannot express case", "declares deterministic = False", "declares no error contract"):
        assert f"backend partial {declaration}" in reasons, reasons
    assert any(r["verdict"] == "passed" and r["not_applicable"] is None for r in raw)
    argv = [sys.executable, "-m", "mlaconf", "report", "diff", str(runs[0]), str(runs[1])]
    done = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=HANG_S, check=False)
    assert done.returncode == 0 and "GATE PASSES" in done.stdout, done.stdout + done.stderr
