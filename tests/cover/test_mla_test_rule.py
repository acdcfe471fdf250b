"""One answer to "is this an MLA test?" (runner/identity.py: ``is_mla_test`` on an item, ``is_mla_test_id`` on
the id the xdist controller sees), and the run's other questions answered from it: the two forms agree on every
shipped suite's test and on a foreign module that shares a suite's name; the stale known-deviations note
follows the run's conformance records."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

from mlaconf.runner.identity import is_mla_test_id
from tests.machine import HANG_S

REPO = Path(__file__).resolve().parents[2]

PROBE = """
import json, os
from mlaconf.runner.identity import is_mla_test, is_mla_test_id

def pytest_collection_finish(session):
    rows = {i.nodeid: [is_mla_test(i), is_mla_test_id(i.nodeid, session.config.rootpath)] for i in session.items}
    with open(os.environ["RULE_OUT"], "w") as out:
        json.dump(rows, out)
"""

FOREIGN = """
import pytest

@pytest.mark.parametrize("case", ["c1"])
def test_case(case):
    pass
"""

#: A tiny case of one's own, and a known deviation for torch-cpu that no case of it matches.
CASES = textwrap.dedent("""
    [suite]
    name = "tiny"

    [defaults]
    head_num = 2

    [[case]]
    dtype = "fp16"
    mask_type = "mask_free"
    q_seqlen = [4]

    [[case]]
    name = "mask-seven"
    q_seqlen = [8]
    mask_type = 7
    expect_error = "ERROR_INVALID_PARAM"
    expect_stage = "create"
""")
DEVIATIONS = textwrap.dedent("""
    [[deviation]]
    id = "never-matches"
    backend = "torch-cpu"
    outcome = "fail"
    status = "unconfirmed"
    reason = "a stale entry"
    reference = "docs/operator.md"
    [deviation.select]
    case = "no-such-case"
""")
STALE = "known deviations matching no selected case"


def pytest_in_repo(tmp_path: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", "0", *args],
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), str(tmp_path)]), "MLA_GOLDEN_DIR": "", **env},
        capture_output=True,
        text=True,
        timeout=HANG_S,
    )


def test_the_item_and_the_id_forms_agree_on_every_suite_and_on_a_foreign_namesake(tmp_path: Path) -> None:
    (tmp_path / "mla_rule_probe.py").write_text(PROBE)
    (tmp_path / "foreign").mkdir()
    (tmp_path / "foreign" / "test_conformance.py").write_text(FOREIGN)
    out = tmp_path / "rows.json"
    ran = pytest_in_repo(
        tmp_path,
        "--collect-only",
        "-p",
        "mla_rule_probe",
        "cases",
        str(tmp_path / "foreign" / "test_conformance.py"),
        "--mla-backend",
        "torch-cpu",
        "--mla-report-dir",
        str(tmp_path / "report"),
        RULE_OUT=str(out),
    )
    assert ran.returncode == 0, ran.stdout[-2000:] + ran.stderr[-2000:]
    rows = json.loads(out.read_text())
    suites = {nodeid.partition("::")[0] for nodeid, (item, _) in rows.items() if item}
    assert suites == {f"cases/{path.name}" for path in (REPO / "cases").glob("test_*.py")}
    assert all(item == by_id for item, by_id in rows.values()), rows
    assert [forms for nodeid, forms in rows.items() if nodeid.endswith("::test_case[c1]")] == [[False, False]]


def test_the_id_form_knows_a_suite_module_from_a_namesake() -> None:
    name = "test_conformance.py::test_conformance[c1-torch-cpu]"
    assert is_mla_test_id(f"cases/{name}", REPO)
    assert not is_mla_test_id(f"mine/{name}", REPO)
    assert not is_mla_test_id("cases/test_conformance.py::test_conformance", REPO)  # not parametrized


def test_the_stale_deviations_note_follows_the_conformance_records(tmp_path: Path) -> None:
    (tmp_path / "tiny.toml").write_text(CASES)
    (tmp_path / "deviations.toml").write_text(DEVIATIONS)
    common = ("--mla-backend", "torch-cpu", "--mla-cases", str(tmp_path / "tiny.toml"))
    common += ("--mla-deviations", str(tmp_path / "deviations.toml"), "--mla-golden-dir", str(tmp_path / "store"))
    conformance = pytest_in_repo(
        tmp_path, "cases/test_conformance.py", *common, "--mla-report-dir", str(tmp_path / "a")
    )
    assert conformance.returncode == 0, conformance.stdout[-2000:] + conformance.stderr[-2000:]
    assert STALE in conformance.stdout and "never-matches" in conformance.stdout
    errors_only = pytest_in_repo(
        tmp_path, "cases/test_error_contract.py", *common, "--mla-report-dir", str(tmp_path / "b")
    )
    assert "MLA run: PASS" in errors_only.stdout, errors_only.stdout[-2000:]
    assert STALE not in errors_only.stdout
