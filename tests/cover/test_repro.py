"""``mlaconf shrink`` and ``mlaconf repro`` on a planted defect and on a correct backend."""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from mlaconf import main
from mlaconf.golden.specs.sample import choose_rows
from mlaconf.golden.specs.spec import CaseSpec
from mlaconf.golden.specs.suites import load_suite, load_suites
from mlaconf.harness import registry
from mlaconf.harness.npu_ops import FIA_MAX_GROUP
from mlaconf.judge.causes import relative_error
from mlaconf.judge.metrics import Element
from mlaconf.reports.records import ResultRecord
from mlaconf.tools.repro import attempt, resolve, score_elements, shrink, write_repro
from tests import fake_torch_npu
from tests.fake_torch_npu import CpuFusedInferAttention, CpuRingMla

ROOT = Path(__file__).resolve().parents[2]

#: A shipped smoke case: two CAUSAL batches with prefixes, GQA 4/2, padded kv.
CASE = "fp16-causal-krope_ctkv-b2-s130-kv258-h4-g2-q3d-padded-99377e85"


def test_shrink_reaches_an_eighth_failing_by_the_same_check() -> None:
    spec, name = resolve(
        f"mlaconf/cases/test_conformance.py::test_conformance[{CASE}-mlaconf.harness.defects:causal_top_left]",
        None,
        None,
    )
    backend = registry.create(name)
    first = attempt(spec, backend, "default")
    best, finished = shrink(first, backend, "default", budget_s=120, report=lambda _: None)
    assert finished and best.failed and first.check in best.failing_checks
    assert score_elements(best.spec) * 8 <= score_elements(first.spec)
    assert best.record.likely_cause is not None
    assert best.record.likely_cause["name"] == "causal_top_left"
    assert "Likely cause: output matches the golden with a top-left causal mask" in best.result.message
    record = best.record
    assert ResultRecord.from_dict(record.to_dict()).likely_cause == record.likely_cause  # the record field round-trips


def test_a_correct_backend_has_nothing_to_shrink(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["shrink", f"{CASE}-torch-cpu"]) == 0
    assert "passes on torch-cpu: nothing to shrink" in capsys.readouterr().out


def test_repro_of_a_passing_test_says_so_and_reruns_standalone(tmp_path: Path) -> None:
    assert main(["repro", CASE, "--backend", "torch-cpu", "--out", str(tmp_path)]) == 0
    assert "does not fail (passed)" in (tmp_path / "README").read_text()
    assert len((tmp_path / "README").read_text().splitlines()) == 4
    verdict = json.loads((tmp_path / "verdict.json").read_text())
    printed = subprocess.run(
        [sys.executable, "repro.py"], cwd=tmp_path, capture_output=True, text=True, check=True
    ).stdout
    value = float(printed.split("relative_error ")[1].split()[0])
    assert value == pytest.approx(verdict["repro_numbers"]["relative_error"], rel=1e-5)


#: A tiny smoke case (one query row over 128 keys after an empty batch, 14 heads) a top-left causal mask
#: fails by the error model, whose worst element (the largest error over its bound) is not the element of
#: largest |out - g|.
TINY = "fp16-causal-krope_ctkv-b2-s1-kv128-h14-g2-q3d-padded-near_tie-vmean-49163822"


def test_the_failure_text_and_the_repro_name_one_worst_element(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The element the failure text names is the record's ``worst_element``, in the same words as verdict.json's,
    the README's, ``mlaconf repro``'s and the standalone repro.py's (which prints its own run's value there):
    the error model's, not the element of largest |out - g|."""
    assert main(["repro", f"{TINY}-tests.standalone_defect:top_left", "--out", str(tmp_path)]) == 0
    verdict = json.loads((tmp_path / "verdict.json").read_text())
    named = verdict["worst_element"]
    assert verdict["verdict"] == "failed" and named["located_by"] == "model:max_err_over_bound"
    line = named["text"]
    assert line == Element.from_dict(named).text() and f"error {named['error']:.6g}, bound {named['bound']:.6g}" in line
    assert f". Worst element: {line}." in verdict["message"], verdict["message"]  # a likely cause may follow
    assert f"Worst element: {line}.\n" in (tmp_path / "README").read_text()
    assert f"worst element: {line}\n" in capsys.readouterr().out
    env = {**os.environ, "PYTHONPATH": str(ROOT)}  # the plug-in backend is this checkout's tests.standalone_defect
    printed = subprocess.run(
        [sys.executable, "repro.py"], cwd=tmp_path, env=env, capture_output=True, text=True, check=True
    ).stdout
    assert f"worst element: {line}\n" in printed
    spec, name = resolve(f"{TINY}-tests.standalone_defect:top_left", None, None)
    again = attempt(spec, registry.create(name), "default")
    assert again.result.output is not None
    err = np.abs(again.result.output.astype(np.float64) - again.golden.out).reshape(spec.total_q, -1)
    token, column = divmod(int(np.argmax(err)), err.shape[1])
    assert (token, column) != (named["token"], named["head"] * 128 + named["column"])  # not the largest |out - g|


def test_an_unknown_case_is_one_line(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    assert main(["repro", "fp16-nothing-0123abcd-torch-cpu", "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("mlaconf repro: case 'fp16-nothing-0123abcd'") and "\n" not in err


def _atb_repro_dir(tmp_path: Path, case: str) -> Path:
    """``write_repro`` for ``atb`` on a shipped case, judged on torch-cpu (the atb backend needs an NPU)."""
    spec, _ = resolve(case, "torch-cpu", None)
    first = attempt(spec, registry.create("torch-cpu"), "default")
    out = tmp_path / "repro"
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr("mlaconf.tools.repro._backend", lambda name: registry.create("torch-cpu"))
        write_repro(first, "atb", out)
    return out


def test_atb_repro_builds_and_makes_the_harness_call(tmp_path: Path, atb_double_path: Path) -> None:
    """repro.cpp compiles against stand-ins of CANN's and ATB's headers (native/testing/standin_include), links
    the libatb double and a CPU runtime double, and passes the call the harness makes; the double computes
    nothing, so attenOut stays NaN and the program says so (relative_error inf, worst element the first)."""
    compiler = shutil.which("g++")
    if compiler is None:
        pytest.skip("no g++ to build repro.cpp")
    out = _atb_repro_dir(tmp_path, CASE)
    assert "Run: g++ -std=c++17" in (out / "README").read_text()
    testing = ROOT / "native" / "testing"
    build = [compiler, "-std=c++17", "-Wall", "-Wextra", "-Werror", f"-I{testing / 'standin_include'}"]
    build += [f"-I{ROOT / 'native' / 'src'}", "repro.cpp", str(testing / "acl_runtime_double.cpp")]
    build += [str(atb_double_path), f"-Wl,-rpath,{atb_double_path.parent}", "-o", "repro"]
    subprocess.run(build, cwd=out, check=True, capture_output=True, text=True)
    env = {**os.environ, "MLA_ATB_DOUBLE_RECORD": str(tmp_path / "record.json")}
    printed = subprocess.run(["./repro"], cwd=out, env=env, capture_output=True, text=True, check=True).stdout
    assert "AtbMLAPreFillGetWorkspaceSize status 0" in printed and "AtbMLAPreFill status 0" in printed
    assert "relative_error inf" in printed and ", got nan, error inf, bound " in printed
    record = json.loads((tmp_path / "record.json").read_text())
    call = record["workspace_calls"][0]
    spec, _ = resolve(CASE, "torch-cpu", None)
    assert (call["head_num"], call["kv_head_num"], call["mask_type"]) == (spec.head_num, spec.kv_head_num, 3)
    assert call["q_seqlen_read"] == list(spec.q_seqlen) and call["kv_seqlen_read"] == list(spec.kv_seqlen)
    npz = np.load(out / "case.npz")
    for name in ("q", "q_rope", "k", "k_rope", "v"):
        assert call[name]["dims"] == list(npz[name].shape), name
        assert call[name]["dtype"] == 1, name  # ACL_FLOAT16: the case is fp16
    assert call["mask"] is None and call["atten_out"]["dims"] == [*npz["q"].shape[:2], 128]  # q3d
    # The kernel's answer (here torch-cpu's output, fed through the runtime double): the program's numbers are
    # verdict.json's, fp16 decoding, relative error and worst element alike.
    first = attempt(spec, registry.create("torch-cpu"), "default")
    answer = np.asarray(first.result.output, dtype=np.float16)
    answer.flat[12345] = 7.0  # one element far off: the program still names the verdict's element, not this one
    (tmp_path / "answer.bin").write_bytes(answer.tobytes())
    env["MLA_ACL_DOUBLE_ANSWER"] = str(tmp_path / "answer.bin")
    printed = subprocess.run(["./repro"], cwd=out, env=env, capture_output=True, text=True, check=True).stdout
    golden, valid = first.golden.out, first.golden.row_valid
    value = float(printed.split("relative_error ")[1].split()[0])
    assert value == pytest.approx(relative_error(answer, golden, valid), rel=1e-5)
    named = first.record.worst_element  # the element the verdict named, in its words, with the answer's value there
    assert named is not None and named["located_by"] == "model:max_err_over_bound"
    value = float(answer.reshape(len(valid), -1)[named["token"], named["head"] * 128 + named["column"]])
    there = dataclasses.replace(Element.from_dict(named), actual=value, error=abs(value - named["expected"]))
    assert f"worst element: {there.text()}\n" in printed


def _bf16_causal_with_prefix() -> CaseSpec:
    """A shipped bf16 CAUSAL case with a cached prefix: npu-fia takes bf16 only in TND, GQA groups up to 64."""
    specs = [
        s
        for s in load_suites(["smoke"])
        if s.dtype == "bf16" and s.mask_type == 3 and s.head_num // s.kv_head_num <= FIA_MAX_GROUP
    ]
    with_prefix = [s for s in specs if any(kv > q for q, kv in zip(s.q_seqlen, s.kv_seqlen, strict=True))]
    return min(with_prefix, key=score_elements)


@pytest.mark.parametrize("route", ["ring-mla", "npu-fia"])
def test_torch_npu_repro_replays_the_op_calls_standalone(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, route: str
) -> None:
    """The route's op calls are recorded (ring-mla: the newest keys, then the prefix merged in) and repro.py,
    importing only numpy, torch and torch_npu (here the fake, on the CPU), replays them and prints the
    relative error verdict.json recorded."""
    fake_torch_npu.install(monkeypatch)
    backend = CpuRingMla() if route == "ring-mla" else CpuFusedInferAttention()
    spec = resolve(CASE, route, None)[0] if route == "ring-mla" else _bf16_causal_with_prefix()
    first = attempt(spec, backend, "default")
    assert first.result.outcome == "passed", first.result.message
    monkeypatch.setattr("mlaconf.tools.repro._backend", lambda name: backend)
    out = tmp_path / "repro"
    assert "npu_calls.pt" in write_repro(first, route, out)
    assert "torch_npu on an Ascend device" in (out / "README").read_text()
    script = "import runpy; from tests import fake_torch_npu; fake_torch_npu.install_for_process(); "
    script += "runpy.run_path('repro.py', run_name='__main__')"
    env = {**os.environ, "REPRO_DEVICE": "cpu", "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-c", script], cwd=out, env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    calls = [line for line in done.stdout.splitlines() if line.startswith("call ")]
    assert len(calls) == (2 if route == "ring-mla" else 1)  # CASE has prefixes: ring-mla merges them in
    assert all(line.endswith(" 0") for line in calls)  # the replay gives the reporter's outputs
    value = float(done.stdout.split("relative_error ")[1].split()[0])
    verdict = json.loads((out / "verdict.json").read_text())
    assert value == pytest.approx(verdict["repro_numbers"]["relative_error"], rel=1e-5)


def test_repro_of_a_sampled_case_compares_the_sampled_rows_and_reruns_standalone(tmp_path: Path) -> None:
    """A sampled golden holds a row sample: case.npz carries the inputs drawn whole and, beside the golden's rows,
    the token row of each, and the standalone repro.py prints the recorded relative error over those rows."""
    suite = tmp_path / "sampled.toml"
    suite.write_text('[suite]\nname = "s"\n\n[[case]]\nq_seqlen = [300, 40]\nhead_num = 2\nrows = 8\n')
    spec = load_suite(suite)[0]
    out = tmp_path / "repro"
    assert main(["repro", f"{spec.case_id}-torch-cpu", "--cases", str(suite), "--out", str(out)]) == 0
    data = np.load(out / "case.npz")
    rows = choose_rows(spec).rows
    assert np.array_equal(data["golden_rows"], rows) and data["golden"].shape == (rows.size, 2, 128)
    assert data["q"].shape == (340, 2, 128) and data["row_valid"].shape == rows.shape
    verdict = json.loads((out / "verdict.json").read_text())
    printed = subprocess.run([sys.executable, "repro.py"], cwd=out, capture_output=True, text=True, check=True).stdout
    value = float(printed.split("relative_error ")[1].split()[0])
    assert 0 < value == pytest.approx(verdict["repro_numbers"]["relative_error"], rel=1e-5)
