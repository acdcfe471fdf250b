"""A failing property test reads as the verdict and the shrunk case, not as pages of fixture reprs."""

from __future__ import annotations

import pytest

from tests.pytest_runs import run_pytest

pytestmark = pytest.mark.slow


def test_property_failure_ends_with_verdict_and_shrunk_spec() -> None:
    done = run_pytest(
        "cases/test_properties.py",
        "-q",
        "-n",
        "0",
        "-x",
        "--mla-backend",
        "mlaconf.harness.defects:scale_twice",
        "--hypothesis-profile",
        "mla-ci",
        "-W",
        "ignore",
        timeout=600,
        inherit=True,
    )
    assert done.returncode == 1, done.stdout[-3000:] + done.stderr[-2000:]
    lines = done.stdout.splitlines()
    start = next(i for i, line in enumerate(lines) if "test_random_case_matches_float64_golden" in line)
    # the failure ends at the next section: the MLA summary (the property record), else pytest's own
    end = next(i for i, line in enumerate(lines) if i > start and line.startswith("=") and line.endswith("="))
    assert "MLA conformance" in lines[end] or "short test summary info" in lines[end]
    failure = lines[start + 1 : end]
    assert "FAIL under policy 'default'" in failure[0] and "torch-cpu-defect-scale_twice" in failure[0]
    assert failure[1] == "Paste into a suite to keep it:" and failure[2] == "[[case]]"
    assert all(" = " in line for line in failure[3:] if line)  # the TOML snippet, and nothing after it
    assert len(failure) < 30 and "policies={" not in done.stdout  # no fixture dumped field by field
