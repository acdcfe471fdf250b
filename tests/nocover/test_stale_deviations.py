"""One rule turns a known deviation into an outcome in every suite: a deviation that no longer
reproduces is an unexpected pass (``xpassed``, a warning) in conformance, metamorphic relations and
the error contract alike, never a silent pass."""

from __future__ import annotations

from pathlib import Path

from mlaconf.reports.rundir import read_results
from tests.machine import HANG_S
from tests.pytest_runs import run_pytest

#: Stale entries for correct backends: torch-cpu computes these cases right, torch-cpu-strict rejects
#: the error case with the documented status, not the one the entry predicts.
STALE = """
[[deviation]]
id = "stale-numeric"
backend = "torch-cpu"
outcome = "fail"
status = "unconfirmed"
reason = "a numeric bug that was fixed"
reference = "test"
[deviation.select]
case = "*-{meta}"

[[deviation]]
id = "stale-numeric-case"
backend = "torch-cpu"
outcome = "fail"
status = "unconfirmed"
reason = "a numeric bug that was fixed"
reference = "test"
[deviation.select]
case = "*-{case}"

[[deviation]]
id = "stale-error"
backend = "torch-cpu-strict"
outcome = "error"
error_status = "ERROR_RT_FAIL"
status = "unconfirmed"
reason = "an error path that was fixed"
reference = "test"
[deviation.select]
mask = "causal"
"""
META, CASE = "33abb953", "caf53b9f"


def test_a_stale_deviation_is_an_unexpected_pass_in_every_suite(tmp_path: Path, shared_golden: Path) -> None:
    deviations = tmp_path / "stale.toml"
    deviations.write_text(STALE.format(meta=META, case=CASE))
    report = tmp_path / "report"
    result = run_pytest(
        "cases/test_conformance.py",
        "cases/test_metamorphic.py",
        "cases/test_error_contract.py",
        "-q",
        "-rA",
        "-k",
        f"(determinism and {META}) or (test_conformance and {CASE}) or (test_error_contract and causal)",
        "--mla-backend",
        "torch-cpu",
        "--mla-backend",
        "torch-cpu-strict",
        "--mla-deviations",
        str(deviations),
        "--mla-golden-dir",
        str(shared_golden),
        "--mla-report-dir",
        str(report),
        timeout=HANG_S,
    )
    assert result.returncode == 0, result.stdout[-4000:]
    records = read_results(report / "results.jsonl")
    stale = {(r["suite"], r["backend"]): r for r in records if r["verdict"] == "xpassed"}
    assert ("metamorphic", "torch-cpu") in stale, result.stdout[-4000:]
    assert ("conformance", "torch-cpu") in stale
    assert ("error_contract", "torch-cpu-strict") in stale
    for record in stale.values():
        assert record["message"].startswith("UNEXPECTED PASS of known deviation"), record["message"]
        assert record["deviation"] in ("stale-numeric", "stale-numeric-case", "stale-error")
    assert result.stdout.count("UnexpectedPassWarning") >= 3
