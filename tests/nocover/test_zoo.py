"""The default policy never fails a correct kernel: every member of ``harness/zoo.py`` passes every suite.

* conformance: smoke, standard and edge on seeds 1-5, all members in one pytest subprocess (two
  xdist workers; goldens shared), every record passed;
* metamorphic: the relations on seeds 1-5, all members;
* property: the property suite's own case strategy, ``ZOO_EXAMPLES`` derandomized examples (2,000
  by default), one golden per example judged for every member under the default policy.

``MLA_ZOO_SUMMARY=<file>`` keeps the largest slack per member, dtype and mask (docs/conformance.md
reports it).  Commands to run the same checks by hand are in docs/conformance.md.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings

from mlaconf.cases.test_properties import case_specs
from mlaconf.golden.building.generate import build_golden
from mlaconf.golden.specs.spec import CaseSpec
from mlaconf.golden.specs.suites import load_suites
from mlaconf.harness import zoo
from mlaconf.judge.policy import load_policies
from mlaconf.judge.verdict import judge_output, mode_text
from mlaconf.runner.execution import execute, make_call
from tests.pytest_runs import PytestRun, run_pytest
from tests.slack_table import groups, table

# About an hour on 2 cores, so deselected by default: `pytest -m soak tests/nocover/test_zoo.py`.
pytestmark = pytest.mark.soak

SEEDS = "1,2,3,4,5"
BACKENDS = ",".join(f"mlaconf.harness.zoo:{name}" for name in zoo.ZOO)
ZOO_EXAMPLES = int(os.environ.get("ZOO_EXAMPLES", "2000"))
THREAD_ENV = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1"}


def _pytest(work: Path, label: str, *args: str) -> tuple[PytestRun, Path]:
    report = work / f"report-{label}"
    done = run_pytest(
        *args,
        "--mla-backend",
        BACKENDS,
        "--mla-seeds",
        SEEDS,
        "-q",
        "-n",
        "2",
        golden=work / "golden",
        report=report,
        inherit=True,
        env=THREAD_ENV,
        timeout=7200,
    )
    return done, report


@pytest.fixture(scope="module")
def work(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("zoo")


def test_zoo_passes_conformance_on_five_seeds(work: Path) -> None:
    done, report = _pytest(
        work,
        "conformance",
        "cases/test_conformance.py",
        "--mla-suite",
        "smoke",
        "--mla-suite",
        "standard",
        "--mla-suite",
        "edge",
    )
    found = groups([report])
    summary = os.environ.get("MLA_ZOO_SUMMARY")
    if summary:
        Path(summary).write_text(table(found) + "\n")
    failed = {key: g.failed for key, g in found.items() if g.failed}
    assert done.returncode == 0 and not failed, f"{failed}\n{done.stdout[-4000:]}{done.stderr[-2000:]}"
    assert {backend for backend, _, _ in found} == {f"zoo-{name}" for name in zoo.ZOO}
    cases = len(load_suites(["smoke", "standard", "edge"]))
    assert sum(g.cases for g in found.values()) == len(zoo.ZOO) * 5 * cases


def test_zoo_passes_metamorphic_on_five_seeds(work: Path) -> None:
    done, _ = _pytest(work, "metamorphic", "cases/test_metamorphic.py")
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    assert " failed" not in done.stdout.splitlines()[-1], done.stdout[-4000:]


MEMBERS = {name: getattr(zoo, name)() for name in zoo.ZOO}
POLICIES = load_policies()
WORST: dict[str, float] = {}


@settings(
    max_examples=ZOO_EXAMPLES,
    derandomize=True,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow],
)
@given(spec=case_specs())
def test_zoo_passes_property_cases(spec: CaseSpec) -> None:
    golden = build_golden(spec)
    for name, member in MEMBERS.items():
        out = execute(member, make_call(golden.inputs, spec), spec).out
        _, verdict = judge_output(golden, out, POLICIES, "default", member.name)
        key = f"{name} {spec.dtype} {spec.mask_name}"
        WORST[key] = max(WORST.get(key, 0.0), verdict.worst_slack)
        assert verdict.passed, f"{mode_text(spec, member.name)}: {verdict.summary()}\n{spec.to_toml()}"
    WORST["examples passed"] = WORST.get("examples passed", 0) + 1
    summary = os.environ.get("MLA_ZOO_PROPERTY_SUMMARY")
    if summary:
        Path(summary).write_text(json.dumps(WORST, indent=1, sort_keys=True))
