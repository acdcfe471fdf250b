"""``mlaconf ascend`` / native/run_on_ascend.sh: the plan, the probe as the gate, the archive.

Here (no torch_npu, no NPU) a dry run gets as far as the probe and stops there with each backend's
reason; with the fake torch_npu the probe admits ring-mla and npu-fia and the plan runs and diffs them.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from mlaconf.harness import npu_ops
from mlaconf.tools import ascend
from tests import fake_torch_npu
from tests.machine import HANG_S

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "native" / "run_on_ascend.sh"


def _clean_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ATB_", "ASCEND_", "MLA_ATB"))}
    return {**env, "PYTHON": sys.executable}


def test_the_dry_run_stops_at_the_probe_and_says_why(tmp_path: Path) -> None:
    out = tmp_path / "box"
    done = subprocess.run(
        ["bash", str(SCRIPT), "--dry-run", "--out", str(out)],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=_clean_env(),
        timeout=HANG_S,
        check=False,
    )
    text = done.stdout + done.stderr
    assert done.returncode == ascend.STOPPED_AT_PROBE, text
    assert "== build (dry run, not run):" in text and "pip install -e" in text
    for name in ("atb", "ring-mla", "npu-fia"):
        assert f"   {name}: unavailable: torch_npu is missing or fails to import" in text, text
    assert "== stops at the probe: no NPU backend can run here" in text
    assert "== regen" not in text and "== smoke-" not in text  # nothing past the probe
    with tarfile.open(tmp_path / "box.tar.gz") as tar:
        names = set(tar.getnames())
        assert {"box/probe.json", "box/environment.json", "box/summary.json"} <= names
        probe = json.load(tar.extractfile("box/probe.json"))  # type: ignore[arg-type]
        summary = json.load(tar.extractfile("box/summary.json"))  # type: ignore[arg-type]
    assert {name: entry["available"] for name, entry in probe["backends"].items()} == {
        "atb": False,
        "ring-mla": False,
        "npu-fia": False,
    }
    assert set(probe["installation"]) >= {"cann_toolkit", "atb", "driver", "torch", "npu_smi"}
    assert (summary["dry_run"], summary["status"], summary["steps"]) == (True, 3, [])


def test_without_the_dry_run_the_script_wants_the_cann_environment(tmp_path: Path) -> None:
    done = subprocess.run(
        ["bash", str(SCRIPT), "--out", str(tmp_path / "x")],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=_clean_env(),
        timeout=HANG_S,
        check=False,
    )
    assert done.returncode != 0
    assert "source <nnal>/atb/set_env.sh first (ATB_HOME_PATH is unset)" in done.stderr
    assert not (tmp_path / "x").exists()


def test_with_npu_backends_the_plan_runs_smoke_on_each_and_diffs_them(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    fake_torch_npu.install(monkeypatch)
    monkeypatch.setattr(npu_ops._TorchNpuOpBackend, "device_type", "cpu")  # the probe's tiny call, on the fake
    monkeypatch.setenv("MLA_ATB_LIB", str(tmp_path / "no-libatb.so"))
    found = ascend.probe()
    assert found.available == ["ring-mla", "npu-fia"]
    assert found.backends["atb"]["reason"].startswith("libatb not found; tried")
    assert found.backends["ring-mla"]["device"] == "npu:0 (Ascend910B3)"
    args = argparse.Namespace(out=str(tmp_path / "box"), golden_dir=None, jobs="2", no_build=True, dry_run=True)
    assert ascend.ascend(args) == 0
    text = capsys.readouterr().out
    steps = [line.split(" (dry run")[0][3:] for line in text.splitlines() if "(dry run, not run)" in line]
    assert steps == [
        "regen",
        "smoke-ring-mla",
        "smoke-npu-fia",
        "smoke-torch-cpu",
        "diff-ring-mla-vs-npu-fia",
        "diff-ring-mla-vs-torch-cpu",
    ]
    assert f"--golden-dir {tmp_path / 'box' / 'golden'}" in text  # every run reads the same goldens


def test_atb_is_the_base_of_every_diff_and_brings_its_own_tests(tmp_path: Path) -> None:
    steps = ascend.run_steps(["atb", "ring-mla"], tmp_path, tmp_path / "g", "auto", root=ROOT)
    assert [s.name for s in steps] == [
        "npu-tests",
        "regen",
        "smoke-atb",
        "smoke-ring-mla",
        "smoke-torch-cpu",
        "diff-atb-vs-ring-mla",
        "diff-atb-vs-torch-cpu",
    ]
    assert [s.gates for s in steps][-2:] == [False, False]  # backends differ: a diff informs, never gates
    smoke_atb = steps[2].argv
    assert smoke_atb[smoke_atb.index("--report-dir") + 1] == str(tmp_path / "runs" / "atb")
    diff = steps[-1].argv  # two backends case by case: report diff pairs them by case, not by backend
    assert diff[diff.index("--base-backend") + 1 : diff.index("--base-backend") + 4] == [
        "atb",
        "--cand-backend",
        "torch-cpu",
    ]


def test_build_steps_check_the_headers_when_cann_is_sourced(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ATB_HOME_PATH", "/opt/atb")
    monkeypatch.setenv("ASCEND_HOME_PATH", "/opt/cann")
    steps = ascend.build_steps(ROOT)
    assert [s.name for s in steps] == ["build", "check-headers"]
    assert steps[1].argv[-3:] == ["/opt/atb/include", "/opt/cann/include", "/opt/cann/include/aclnn"]
    assert ascend.build_steps(None) == []  # an installed package has nothing to build


def test_the_archive_never_writes_through_a_symlink(tmp_path: Path) -> None:
    out = tmp_path / "box"
    out.mkdir()
    (out / "probe.json").write_text("{}")
    target = tmp_path / "elsewhere"
    (tmp_path / "box.tar.gz").symlink_to(target)
    with pytest.raises(OSError, match="is a symlink"):
        ascend.pack(out)
    assert not target.exists()


def test_the_archive_leaves_the_goldens_behind(tmp_path: Path) -> None:
    """OUT/golden (the default store) is not packed: regen rebuilds it from the case specs."""
    out = tmp_path / "box"
    (out / "golden").mkdir(parents=True)
    (out / "golden" / "case.h5").write_bytes(b"large")
    (out / "runs").mkdir()
    (out / "runs" / "results.jsonl").write_text("{}")
    with tarfile.open(ascend.pack(out)) as tar:
        names = tar.getnames()
    assert "box/runs/results.jsonl" in names and not [n for n in names if n.startswith("box/golden")]


def test_a_missing_build_requirement_is_one_line_and_exit_3(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """pip's --no-build-isolation uses the venv's own pybind11: without it the command says what to
    install in one line and exits 3, instead of a 48-line pip error and exit 1."""
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "pybind11" else real(name, *a))
    assert ascend.missing_build_requirements(ROOT) == ["pybind11>=2.12"]
    assert ascend.missing_build_requirements(None) == []  # an installed package builds nothing
    args = argparse.Namespace(out=str(tmp_path / "box"), golden_dir=None, jobs="1", no_build=False, dry_run=False)
    assert ascend.ascend(args) == ascend.STOPPED_AT_PROBE
    lines = [line for line in capsys.readouterr().out.splitlines() if "pybind11" in line]
    assert lines == [
        f"== stopped before the build: install 'pybind11>=2.12' first ({sys.executable} -m pip install "
        "'pybind11>=2.12')"
    ]
    summary = json.loads((tmp_path / "box" / "summary.json").read_text())
    assert summary["missing_build_requirements"] == ["pybind11>=2.12"] and summary["steps"] == []
    assert (tmp_path / "box.tar.gz").is_file()


def _write_records(run: Path, records: list[dict[str, object]]) -> None:
    run.mkdir(parents=True)
    (run / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records) + "{broken\n")


def test_the_facts_report_says_what_the_device_did_to_each_unconfirmed_fact(tmp_path: Path) -> None:
    from mlaconf.golden.specs.suites import load_suites
    from mlaconf.tools.facts_report import REPORT_JSON, write_facts_report

    rank3 = next(c for c in load_suites(["errors"]) if c.name == "mask-free-mask-rank3")
    device = "npu:0 (Ascend910B3)"
    at = {"backend": "atb", "device": device, "backend_versions": {"atb": "8.3.RC1"}}
    _write_records(
        tmp_path / "runs" / "atb",
        [
            {**at, "verdict": "xfailed", "deviation": "atb-padded-kv-ragged", "case_id": "a"},
            {**at, "verdict": "xpassed", "deviation": "atb-padded-kv-capacity", "case_id": "b"},
            {
                **at,
                "verdict": "passed",
                "case_id": rank3.case_id,
                "error": {"observed_status": "ERROR_INVALID_TENSOR_DIM_NUM"},
            },
        ],
    )
    path = write_facts_report(tmp_path)
    report = json.loads((tmp_path / REPORT_JSON).read_text())
    by_fact = {f["fact"]: f for f in report["facts"]}
    ragged = by_fact["known deviation atb-padded-kv-ragged"]
    assert ragged["change"].startswith(
        'judge/known_deviations.toml, [[deviation]] id = "atb-padded-kv-ragged": status = "confirmed"'
    )
    assert "did not happen on ATB 8.3.RC1" in by_fact["known deviation atb-padded-kv-capacity"]["change"]
    assert by_fact["known deviation atb-nan-qk-scale-accepted"]["change"].startswith("none: no case")
    boundary = by_fact["error case mask-free-mask-rank3 unconfirmed at 8.3.RC1"]
    assert "answers ERROR_INVALID_TENSOR_DIM_NUM: this package predates the fix" in boundary["change"]
    assert by_fact["torch_npu rule fia-tnd-bf16"]["device_did"].startswith("not exercised")
    assert report["problems"] == [f"{tmp_path / 'runs' / 'atb' / 'results.jsonl'}:4: not a JSON record"]
    assert report["release_unknown"] is None
    assert "## known deviation atb-padded-kv-ragged" in path.read_text()
