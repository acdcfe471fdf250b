"""``mlaconf power`` on a one- or two-case suite: kills, survivors with what they miss, suggestions that are
tried, the zoo's margin, the exit status, a clean partial stop; and every defect's trigger is sound (off its
trigger a defect computes exactly its correct path, so skipping those cases hides no kill)."""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any

import pytest
import torch

import mlaconf
from mlaconf.golden.building.inputs import generate_inputs
from mlaconf.golden.coverage.levels import case_levels
from mlaconf.golden.specs.spec import CaseSpec
from mlaconf.golden.specs.spec_build import build_case
from mlaconf.golden.specs.types import OpInputs
from mlaconf.harness import defects
from mlaconf.judge.deviations import load_deviations
from mlaconf.judge.policy import load_policies
from mlaconf.runner.execution import make_call
from mlaconf.tools import power

ONE_CASE = """\
[suite]
name = "mine"
description = "one small fp16 case"

[[case]]
name = "one"
dtype = "fp16"
head_num = 1
q_seqlen = [24]
seed = 1
"""


def _power(tmp_path: Path, *args: str) -> tuple[int, dict[str, Any]]:
    cases = tmp_path / "one.toml"
    cases.write_text(ONE_CASE)
    out = tmp_path / "out"
    argv = ["power", "--cases", str(cases), "--out", str(out), "--golden-dir", str(tmp_path / "golden"), *args]
    status = mlaconf.main(argv)
    return status, json.loads((out / "power.json").read_text())


def test_a_one_case_suite_names_its_survivors_and_what_they_need(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    status, report = _power(tmp_path, "--defects", "scale_twice", "batch_swap", "--zoo", "--no-suggest")
    assert status == 1  # a survivor
    assert report["complete"] and report["cases_done"] == 1
    rows = {row["name"]: row for row in report["defects"]}
    assert rows["scale_twice"]["killed"] and rows["scale_twice"]["failed_cases"] == 1
    assert rows["scale_twice"]["largest_failing_slack"] > 1 and rows["scale_twice"]["deciding_check"]
    assert not rows["batch_swap"]["killed"] and rows["batch_swap"]["skipped_cases"] == 1
    assert report["survivors"]["batch_swap"]["missing"] == "no case has batch in {two, many}"
    assert {row["name"] for row in report["zoo"]} == set(power.zoo.ZOO)
    assert all(not row["false_alarms"] and 0 < row["largest_slack"] < 1 for row in report["zoo"])
    printed = capsys.readouterr().out
    first = printed.splitlines()[0]
    assert "1 of 2 defects killed, 1 survived (batch_swap), 1 thin kill(s) on one case (scale_twice)" in first
    assert "zoo: 0 false alarm(s) in 12 members, margin" in first
    assert "SURVIVED  batch_swap: no case has batch in {two, many}, 1 skipped (trigger unreachable)" in printed
    page = (tmp_path / "out" / "power.html").read_text()
    assert "SURVIVED" in page and "batch_swap" in page
    # the verdict first, as a run's page opens; no machine's absolute path in the title (tmp_path is outside the
    # working directory: the file's name)
    assert '<div class="banner fail" id="verdict">FAIL: 1 defect(s) survived, 0 correct kernel(s) failed' in page
    assert "<title>Power of cases file one.toml</title>" in page and str(tmp_path) not in page.split("<body>")[0]
    assert "| `scale_twice` |" in (tmp_path / "out" / "power.md").read_text()


def test_every_defect_killed_and_no_zoo_run_exits_zero(tmp_path: Path) -> None:
    status, report = _power(tmp_path, "--defects", "scale_twice", "tail_row_unwritten")
    assert status == 0 and report["zoo"] == [] and not report["survivors"]
    page = (tmp_path / "out" / "power.html").read_text()
    assert '<div class="banner pass" id="verdict">PASS: all 2 defects killed' in page


def test_an_unknown_defect_is_one_line_and_status_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cases = tmp_path / "one.toml"
    cases.write_text(ONE_CASE)
    assert mlaconf.main(["power", "--cases", str(cases), "--defects", "no_such", "--out", str(tmp_path)]) == 2
    assert "no defect named no_such" in capsys.readouterr().err


def test_ctrl_c_stops_cleanly_with_a_partial_report(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls = []
    real_wait = power.wait

    def interrupted_wait(*args: Any, **kwargs: Any) -> Any:
        calls.append(1)
        if len(calls) == 1:
            raise KeyboardInterrupt
        return real_wait(*args, **kwargs)

    monkeypatch.setattr(power, "wait", interrupted_wait)
    status, report = _power(tmp_path, "--defects", "scale_twice")
    assert status == 130
    assert not report["complete"] and report["summary"].startswith("PARTIAL")


def test_a_case_that_raises_ends_the_run_with_a_partial_report(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A full disk while a golden is built (any error of a case) still leaves power.json, partial, naming it."""

    def full_disk(self: power.PowerRunner, spec: CaseSpec) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(power.PowerRunner, "case", full_disk)
    status, report = _power(tmp_path, "--defects", "scale_twice")
    assert status == 3
    assert not report["complete"] and "No space left on device" in report["error"]
    assert report["summary"].startswith("PARTIAL") and "stopped by an error" in report["summary"]
    assert "No space left on device" in capsys.readouterr().err


def test_each_job_computes_on_its_share_of_the_threads(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``-j 2`` with eight threads to share: each job's torch calls fan out over four, not all of them."""
    seen: list[int] = []
    monkeypatch.setenv("OMP_NUM_THREADS", "8")
    monkeypatch.setattr(power.PowerRunner, "case", lambda self, spec: seen.append(torch.get_num_threads()))
    _power(tmp_path, "--defects", "scale_twice", "-j", "2")  # the stand-in case does no work: a partial run
    assert seen == [4]


def _spec(**fields: Any) -> CaseSpec:
    return build_case({"head_num": 2, "seed": 1, **fields}, source="test_power")


def test_a_survivor_gets_shipped_cases_tried_on_it(tmp_path: Path) -> None:
    """The suggestions are run: the two-batch candidate kills batch_swap, the one-batch one cannot reach it."""
    own = _spec(dtype="fp16", q_seqlen=[20])
    two = _spec(dtype="fp16", q_seqlen=[20, 12])
    run = power.PowerRun("test", [own], {"batch_swap": power.SubjectResult(power.subjects(["batch_swap"], False)[0])})
    runner = power.PowerRunner(
        run, golden_dir=str(tmp_path), policy_set=load_policies(), deviations=load_deviations(), progress=False
    )
    runner.execute()
    assert run.complete and [r.subject.name for r in run.survivors()] == ["batch_swap"]
    runner.suggest([_spec(dtype="bf16", q_seqlen=[20]), two])
    (suggested,) = run.suggestions["batch_swap"]
    assert suggested["case"] == two.case_id and suggested["kills"] and suggested["slack"] > 1


#: Small cases on both sides of every trigger: batch 1/2, every mask, prefix 0 / <128 / 128 / 200 / >512,
#: group 1 / 2 / 16 heads over one kv head, padded and packed kv, both dtypes, q 1 and 129.
SOUNDNESS_SPECS = [
    _spec(dtype="fp16", q_seqlen=[20]),
    _spec(dtype="bf16", q_seqlen=[20, 12], kv_layout="padded"),
    _spec(dtype="bf16", mask_type="mask_free", q_seqlen=[20, 12], kv_layout="padded"),
    _spec(dtype="fp16", mask_type="causal", q_seqlen=[20], kv_seqlen=[20], kv_layout="padded"),
    _spec(dtype="bf16", mask_type="causal", q_seqlen=[20], kv_seqlen=[70], kv_layout="padded"),
    _spec(dtype="bf16", mask_type="causal", q_seqlen=[8], kv_seqlen=[136], kv_layout="padded"),
    _spec(dtype="fp16", mask_type="causal", q_seqlen=[8], kv_seqlen=[208], kv_layout="padded"),
    _spec(dtype="fp16", mask_type="causal", q_seqlen=[3, 5], kv_seqlen=[603, 5], kv_layout="padded"),
    _spec(
        dtype="bf16", mask_type="causal", q_seqlen=[1], kv_seqlen=[300], head_num=4, kv_head_num=2, kv_layout="padded"
    ),
    _spec(
        dtype="fp16",
        mask_type="causal",
        q_seqlen=[129],
        kv_seqlen=[129],
        head_num=16,
        kv_head_num=1,
        kv_layout="padded",
    ),
    _spec(dtype="bf16", mask_type="mask_free", q_seqlen=[9], kv_layout="packed"),
]


#: The correct paths a defect builds on: torch's SDPA (the torch CPU backend) or the defects' float32 path.
CORRECT_PATHS = (defects.Defect("reference"), defects.control_math())


@functools.cache
def _correct_outputs(spec: CaseSpec) -> tuple[OpInputs, list[torch.Tensor]]:
    inputs = generate_inputs(spec)
    return inputs, [path.run(make_call(inputs, spec)).view(torch.int16) for path in CORRECT_PATHS]


@pytest.mark.parametrize("name", [n for n, e in defects.ENTRIES.items() if e.trigger])
def test_off_its_trigger_a_defect_computes_its_correct_path(name: str) -> None:
    entry = defects.ENTRIES[name]
    outside = [s for s in SOUNDNESS_SPECS if not power.reaches(entry.trigger, case_levels(s))]
    assert outside, f"{name}: no test case lies off its trigger {entry.trigger}"
    for spec in outside:
        inputs, rights = _correct_outputs(spec)
        wrong = entry.make().run(make_call(inputs, spec)).view(torch.int16)
        assert any(torch.equal(wrong, right) for right in rights), (
            f"{name} differs from its correct path on {spec.case_id}, which its trigger {entry.trigger} skips"
        )
