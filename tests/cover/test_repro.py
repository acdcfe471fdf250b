"""``mlaconf shrink`` and ``mlaconf repro`` on a planted defect and on a correct backend."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from mlaconf import main
from mlaconf.harness import registry
from mlaconf.reports.records import ResultRecord
from mlaconf.runner.repro import attempt, resolve, score_elements, shrink

#: A shipped smoke case: two CAUSAL batches with prefixes, GQA 4/2, padded kv.
CASE = "fp16-causal-krope_ctkv-b2-s130-kv258-h4-g2-q3d-padded-99377e85"


def test_shrink_reaches_an_eighth_failing_by_the_same_check() -> None:
    spec, name = resolve(
        f"mlaconf/cases/test_conformance.py::test_conformance[{CASE}-tests.defects:causal_top_left]", None, None
    )
    backend = registry.create(name)
    first = attempt(spec, backend, "default")
    best, finished = shrink(first, backend, "default", budget_s=120, report=lambda _: None)
    assert finished and best.failed and first.check in best.failing_checks
    assert score_elements(best.spec) * 8 <= score_elements(first.spec)
    assert best.result.record.likely_cause is not None
    assert best.result.record.likely_cause["name"] == "causal_top_left"
    assert "Likely cause: output matches the golden with a top-left causal mask" in best.result.message
    record = best.result.record
    assert ResultRecord.from_dict(record.to_dict()).likely_cause == record.likely_cause  # the record field round-trips


def test_a_correct_backend_has_nothing_to_shrink(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["shrink", f"{CASE}-torch-cpu"]) == 0
    assert "passes on torch-cpu: nothing to shrink" in capsys.readouterr().out


def test_repro_of_a_passing_test_says_so_and_reruns_standalone(tmp_path: Path) -> None:
    assert main(["repro", CASE, "--backend", "torch-cpu", "--out", str(tmp_path)]) == 0
    assert "does not fail (passed)" in (tmp_path / "README").read_text()
    assert len((tmp_path / "README").read_text().splitlines()) == 3
    verdict = json.loads((tmp_path / "verdict.json").read_text())
    printed = subprocess.run(
        [sys.executable, "repro.py"], cwd=tmp_path, capture_output=True, text=True, check=True
    ).stdout
    value = float(printed.split("relative_error ")[1].split()[0])
    assert value == pytest.approx(verdict["repro_numbers"]["relative_error"], rel=1e-5)


def test_an_unknown_case_is_one_line(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    assert main(["repro", "fp16-nothing-0123abcd-torch-cpu", "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("mlaconf repro: case 'fp16-nothing-0123abcd'") and "\n" not in err
