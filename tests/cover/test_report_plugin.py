"""The report plugin under real pytest and real xdist: records, files, shards, summary, JUnit."""

from __future__ import annotations

import argparse
import json
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from mlaconf import verb_function
from mlaconf.reports import verbs
from mlaconf.reports.records import without_volatile
from mlaconf.reports.rundir import read_results

pytest_plugins = ["pytester"]

# run.json probes devices through torch and names the golden generator (ml_dtypes).  pytester restores
# sys.modules after every in-process run, so a torch or ml_dtypes first imported inside one would be
# imported again in the next (torch crashes the interpreter, ml_dtypes refuses to register its dtypes
# twice); importing them here keeps them in the snapshot.
pytest.importorskip("torch")
pytest.importorskip("ml_dtypes")

REPO = Path(__file__).resolve().parents[2]

#: A stand-in for the lead's conformance suite: 12 cases x 2 backends, every verdict kind,
#: timing that differs run to run, one unmarked test that attaches nothing.
FAKE_SUITE = """
import hashlib
import time

import pytest

BACKENDS = ["torch_cpu", "fake_npu"]
CASES = []
for i in range(12):
    dtype = ("fp16", "bf16")[i % 2]
    mask = ("undefined", "mask_free", "causal")[i % 3]
    case_id = f"c{i:02d}-{dtype}-{mask}"
    CASES.append((case_id, hashlib.sha256(case_id.encode()).hexdigest(), dtype, mask, i))


def make_record(case, backend):
    case_id, _, dtype, mask, i = case
    slack = ((i * 7 + len(backend)) % 10) / 8
    rel = 1e-4 * (1 + i) * (2 if backend == "fake_npu" else 1)
    return {
        "case_id": case_id, "suite": "fake", "backend": backend, "device": "cpu",
        "spec": {"q_seqlen": [16 * (i + 1)], "kv_seqlen": [16 * (i + 1)]},
        "backend_versions": {"fake": "1"}, "dtype": dtype, "mask": mask, "cache": "krope_ctkv",
        "policy": "atb", "worst_slack": slack,
        "checks": [{"rule": "atb", "metric": "max_rel_err", "value": rel, "bound": rel / max(slack, 1e-9),
                    "slack": slack, "passed": slack <= 1}],
        "metrics": {"max_rel_err": rel, "rmse": rel / 3},
        "failing": ["atb:max_rel_err"] if slack > 1 else [],
        "message": "", "output_sha256": hashlib.sha256(f"{case_id}{backend}".encode()).hexdigest(),
        "timing": {"latency_ms_median": time.perf_counter() % 1, "repeats": 3, "tflops": 1.5},
    }


PARAMS = [pytest.param(c, b, marks=pytest.mark.mla_case(case_id=c[0], content_hash=c[1]), id=f"{c[0]}-{b}")
          for c in CASES for b in BACKENDS]


@pytest.mark.parametrize("case,backend", PARAMS)
def test_case(case, backend, mla_report):
    rec = make_record(case, backend)
    if mla_report.outputs_dir is not None:
        (mla_report.outputs_dir / f"{case[0]}-{backend}.h5").write_bytes(b"x")
    i = case[4]
    if i == 3:
        mla_report.attach(rec | {"verdict": "skipped", "message": "not supported"})
        pytest.skip("not supported")
    if i == 5 and backend == "fake_npu":
        mla_report.attach(rec | {"verdict": "xfailed", "message": "known deviation"})
        pytest.xfail("known deviation")
    failed = rec["worst_slack"] > 1
    mla_report.attach(rec | {"verdict": "failed" if failed else "passed"})
    assert not failed, f"{case[0]} slack {rec['worst_slack']}"


def test_framework_detail():
    assert True
"""
N_RECORDS = 24


@pytest.fixture
def suite(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> pytest.Pytester:
    monkeypatch.setenv("PYTHONPATH", str(REPO))  # the fake suite imports this checkout
    pytester.makepyfile(test_fake_suite=FAKE_SUITE)
    return pytester


def run(pytester: pytest.Pytester, out: Path, *args: str) -> pytest.RunResult:
    return pytester.runpytest(
        "-p",
        "no:cacheprovider",
        "-W",
        "ignore::pytest.PytestAssertRewriteWarning",
        "--mla-report-dir",
        str(out),
        *args,
    )


def canonical(directory: Path) -> list[str]:
    return [json.dumps(without_volatile(r), sort_keys=True) for r in read_results(directory / "results.jsonl")]


def mlaconf(*argv: str) -> int:
    parser = argparse.ArgumentParser()
    verbs.register(parser.add_subparsers(dest="verb", required=True))
    args = parser.parse_args(argv)
    return int(verb_function(args.func)(args))


def test_serial_and_xdist_runs_write_equal_results(suite: pytest.Pytester, tmp_path: Path) -> None:
    serial = run(suite, tmp_path / "serial", "-n", "0")
    serial.assert_outcomes(passed=20, failed=2, skipped=2, xfailed=1)
    junit = tmp_path / "junit.xml"
    parallel = run(suite, tmp_path / "parallel", "-n", "2", "--mla-save-outputs", f"--junitxml={junit}")
    parallel.assert_outcomes(passed=20, failed=2, skipped=2, xfailed=1)

    a, b = canonical(tmp_path / "serial"), canonical(tmp_path / "parallel")
    assert len(a) == N_RECORDS and a == b
    raw = (tmp_path / "parallel" / "results.jsonl").read_text().splitlines()
    keys = [(json.loads(line)["case_id"], json.loads(line)["backend"]) for line in raw]
    assert keys == sorted(keys)
    assert raw != (tmp_path / "serial" / "results.jsonl").read_text().splitlines()  # timing did differ

    run_doc = json.loads((tmp_path / "parallel" / "run.json").read_text())
    assert run_doc["records"] == N_RECORDS and run_doc["workers"] == 2
    assert run_doc["status"] == "complete" and run_doc["counts"]["recorded"] == N_RECORDS
    assert run_doc["counts"]["run"] == run_doc["counts"]["selected"] == N_RECORDS  # the plain test is no MLA test
    assert run_doc["verdicts"] == {
        "passed": 19,
        "failed": 2,
        "xfailed": 1,
        "xpassed": 0,
        "skipped": 2,
        "error": 0,
    }
    assert {"packages", "ascend", "devices", "git", "host"} <= set(run_doc["environment"])
    assert run_doc["environment"]["packages"]["numpy"]
    assert (tmp_path / "parallel" / "report.html").stat().st_size > 1000
    assert len(list((tmp_path / "parallel" / "outputs").glob("*.h5"))) == N_RECORDS

    props = {}
    for case in ET.parse(junit).getroot().iter("testcase"):
        props[case.get("name")] = {p.get("name"): p.get("value") for p in case.iter("property")}
    failing = props["test_case[c00-fp16-undefined-torch_cpu]"]
    assert failing["verdict"] == "failed" and float(failing["worst_slack"]) == pytest.approx(9 / 8)
    assert failing["backend"] == "torch_cpu" and failing["policy"] == "atb"
    assert float(failing["max_rel_err"]) == pytest.approx(1e-4) and "rmse" in failing
    assert json.loads(failing["mla_result"])["case_id"] == "c00-fp16-undefined"
    assert props["test_framework_detail"] == {}


def test_shards_merge_to_the_unsharded_run(suite: pytest.Pytester, tmp_path: Path) -> None:
    run(suite, tmp_path / "full")
    selected = 0
    for k in (1, 2, 3):
        result = run(suite, tmp_path / f"s{k}", f"--mla-shard={k}/3", f"--mla-run-name=s{k}", "-v")
        outcomes = result.parseoutcomes()
        selected += sum(outcomes.get(name, 0) for name in ("passed", "failed", "skipped", "xfailed"))
        assert outcomes.get("deselected", 0) > 0
        assert ("test_framework_detail PASSED" in result.stdout.str()) == (k == 1)
    assert selected == N_RECORDS + 1  # every case once; the unmarked test only on shard 1

    shard_dirs = [str(tmp_path / f"s{k}") for k in (1, 2, 3)]  # each shard holds some cases
    assert mlaconf("report", "merge", str(tmp_path / "merged"), *shard_dirs) == 0
    assert canonical(tmp_path / "merged") == canonical(tmp_path / "full")
    merged_run = json.loads((tmp_path / "merged" / "run.json").read_text())
    assert sorted(s["shard"] for s in merged_run["shards"]) == ["1/3", "2/3", "3/3"]


def test_merge_conflict_fails(suite: pytest.Pytester, tmp_path: Path) -> None:
    run(suite, tmp_path / "a", "-k", "c00")
    other = tmp_path / "b"
    other.mkdir()
    lines = (tmp_path / "a" / "results.jsonl").read_text().splitlines()
    changed = json.loads(lines[0]) | {"output_sha256": "0" * 64}
    (other / "results.jsonl").write_text(json.dumps(changed) + "\n")
    one = {
        "status": "complete",
        "counts": {"selected": 1, "run": 1, "recorded": 1},
        "verdicts": {changed["verdict"]: 1},
    }
    (other / "run.json").write_text(json.dumps(json.loads((tmp_path / "a" / "run.json").read_text()) | one))
    assert mlaconf("report", "merge", str(tmp_path / "m"), str(tmp_path / "a"), str(other)) == 1


def test_terminal_summary_fits_80_columns(suite: pytest.Pytester, tmp_path: Path) -> None:
    result = run(suite, tmp_path / "out")
    text = result.stdout.str()
    assert "MLA conformance: groups" in text and "worst cases by slack" in text
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if "MLA conformance: groups" in line)
    assert lines[start + 1] == "all groups: cache=krope_ctkv"  # constant label moved out to fit 80 cols
    header = lines[start + 2].split()
    assert header == [
        "backend",
        "dtype",
        "mask",
        "pass",
        "fail",
        "xf",
        "xp",
        "skip",
        "err",
        "slack",
        "max_rel",
        "med_rmse",
    ]
    block = lines[start : start + 40]
    assert all(len(line) <= 80 for line in block), block
    assert not any("~" in line for line in block[:15])  # no truncated label in the group table
    row = next(line.split() for line in block if line.startswith("fake_npu  bf16  causal"))
    # bf16+causal on fake_npu is c05 (xfailed) and c11: slack (77+8)%10/8 = 0.625, passed.
    assert row[3:9] == ["1", "0", "1", "0", "0", "0"] and row[9] == "0.625"
    skipped_row = next(line.split() for line in block if line.startswith("fake_npu  bf16  undefined"))
    assert skipped_row[3:9] == ["1", "0", "0", "0", "1", "0"] and skipped_row[9] == "0.125"  # skip unranked
    first = next(i for i, line in enumerate(lines) if "worst cases by slack" in line) + 2
    assert lines[first].split() == ["1", "1.125", "failed", "torch_cpu", "atb:max_rel_err"]
    assert lines[first + 1].strip() == "c00-fp16-undefined"


def test_no_records_no_files(pytester: pytest.Pytester, tmp_path: Path) -> None:
    pytester.makepyfile(test_plain="def test_x():\n    pass\n")
    run(pytester, tmp_path / "none").assert_outcomes(passed=1)
    assert not (tmp_path / "none").exists()


def test_attach_rejects_records_without_identity(pytester: pytest.Pytester, tmp_path: Path) -> None:
    pytester.makepyfile(test_bad="def test_x(mla_report):\n    mla_report.attach({'backend': 'b'})\n")
    result = run(pytester, tmp_path / "bad")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*record lacks 'case_id'*"])


def test_record_attached_in_a_skipping_setup_is_kept(pytester: pytest.Pytester, tmp_path: Path) -> None:
    pytester.makepyfile(
        test_setup="""
import pytest

@pytest.fixture
def unsupported(mla_report):
    mla_report.attach({"case_id": "c1", "backend": "npu", "message": "dtype unsupported"})
    pytest.skip("dtype unsupported")

def test_x(unsupported):
    pass
"""
    )
    run(pytester, tmp_path / "setup").assert_outcomes(skipped=1)
    (record,) = read_results(tmp_path / "setup" / "results.jsonl")
    assert record["verdict"] == "skipped" and "outcome" not in record  # one key: verdict
    assert record["test"] == "test_setup.py::test_x" and record["schema_version"] == 2
