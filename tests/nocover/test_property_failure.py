"""A failing property test reads as the verdict and the shrunk case, not as pages of fixture reprs, and
its record keeps the shrunk case: one run of the property suite on a backend wrong on bf16 only, so the
shrunk case must be a bf16 one."""

from __future__ import annotations

from pathlib import Path

import pytest

from mlaconf.reports.records import ResultRecord
from tests.machine import HANG_S
from tests.pytest_runs import run_pytest


@pytest.mark.timeout(4 * HANG_S)
def test_a_property_failure_ends_with_its_verdict_and_records_the_shrunk_spec(tmp_path: Path) -> None:
    done = run_pytest(
        "cases/test_properties.py",
        "-q",
        "-n",
        "0",
        "--mla-backend",
        "tests.plugin_backends:bf16_broken",
        "--hypothesis-profile",
        "mla-ci",
        "--hypothesis-seed",
        "1",
        "-W",
        "ignore",
        report=tmp_path / "report",
        timeout=HANG_S,
    )
    assert done.returncode == 1, done.output
    lines = done.stdout.splitlines()
    start = next(i for i, line in enumerate(lines) if "test_random_case_matches_float64_golden" in line)
    # the failure ends at the next section: the MLA summary (the property record), else pytest's own
    end = next(i for i, line in enumerate(lines) if i > start and line.startswith("=") and line.endswith("="))
    assert "MLA conformance" in lines[end] or "short test summary info" in lines[end]
    failure = lines[start + 1 : end]
    assert "FAIL under policy 'default'" in failure[0] and "bf16-broken" in failure[0]
    assert failure[1] == "Paste into a suite to keep it:" and failure[2] == "[[case]]"
    assert all(" = " in line for line in failure[3:] if line)  # the TOML snippet, and nothing after it
    assert len(failure) < 30 and "policies={" not in done.stdout  # no fixture dumped field by field
    assert 'dtype = "bf16"' in failure  # the terminal's snippet is the shrunk case

    (raw,) = done.records()
    record = ResultRecord.from_dict(raw)
    assert record.suite == "property" and record.verdict == "failed"
    assert record.relation == "random case matches float64 golden" and record.backend == "bf16-broken"
    assert record.shrunk is not None and record.shrunk["spec"]["dtype"] == "bf16"
    assert 'dtype = "bf16"' in record.shrunk["toml"] and record.case_id.startswith("bf16-")
    assert record.checks and record.worst_slack is not None and record.worst_slack > 1
