"""Discriminating power: the smoke suite plus the metamorphic tests fail every planted defect of
``harness/defects.py``, while the unmodified torch CPU backend passes them on five seeds.

Each backend runs in its own ``pytest`` subprocess (``--mla-suite smoke --mla-suite metamorphic``,
``-p no:cacheprovider``, JUnit XML parsed for the outcome), all sharing one golden directory: the
clean run, under xdist with two workers, generates every golden first; the defect runs then go two
at a time and only read goldens.  Set ``MLA_DEFECT_SUMMARY=<file>`` to keep a JSON summary of which tests caught each
defect (``docs/conformance.md`` is written from it).
"""

from __future__ import annotations

import json
import os
import re
import time
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from mlaconf.harness.defects import CATALOGUE, REAL_BUGS
from tests import pytest_runs

SUITES = ("cases/test_conformance.py", "cases/test_metamorphic.py")
CLEAN_SEEDS = "1,2,3,4,5"
PARALLEL = 2
TIMEOUT_S = 400
#: A defect that fails conformance must do so clearly somewhere: its largest slack over the smoke
#: suite at least this (a defect caught only near slack 1 is a near miss: add a case that exposes it).
NEAR_MISS = 2.0
#: One thread per process: the runs are parallel already (two workers or two subprocesses).
THREAD_ENV = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1"}


@dataclass
class Run:
    """One pytest subprocess: its outcome per test id and the failure messages."""

    backend: str
    returncode: int
    seconds: float
    outcomes: dict[str, str] = field(default_factory=dict)
    messages: dict[str, str] = field(default_factory=dict)
    output: str = ""
    report: Path | None = None

    def largest_slack(self) -> float:
        """The largest worst_slack among the run's conformance records (0 when none)."""
        if self.report is None or not (self.report / "results.jsonl").exists():
            return 0.0
        lines = (self.report / "results.jsonl").read_text().splitlines()
        slacks = [json.loads(line).get("worst_slack") for line in lines if line.strip()]
        return max((float(x) for x in slacks if x is not None), default=0.0)

    def with_outcome(self, outcome: str) -> list[str]:
        return [test for test, got in self.outcomes.items() if got == outcome]

    def describe(self) -> str:
        counts = {o: len(self.with_outcome(o)) for o in sorted(set(self.outcomes.values()))}
        return f"{self.backend}: rc {self.returncode}, {counts}, {self.seconds:.0f} s\n{self.output[-3000:]}"


def parse_junit(path: Path) -> tuple[dict[str, str], dict[str, str]]:
    """Test id -> passed/failed/error/skipped, and test id -> failure message."""
    outcomes: dict[str, str] = {}
    messages: dict[str, str] = {}
    for case in ET.parse(path).getroot().iter("testcase"):
        test = f"{case.get('classname')}::{case.get('name')}"
        outcome = "passed"
        for child in case:
            if child.tag in ("failure", "error", "skipped"):
                outcome = {"failure": "failed"}.get(child.tag, child.tag)
                messages[test] = child.get("message", "")
                break
        outcomes[test] = outcome
    return outcomes, messages


def run_pytest(backend: str, work: Path, golden_dir: Path, *extra: str, suites: tuple[str, ...] = SUITES) -> Run:
    label = re.sub(r"[^A-Za-z0-9_]+", "_", backend)
    junit = work / f"{label}.xml"
    start = time.perf_counter()
    done = pytest_runs.run_pytest(
        *suites,
        "--mla-backend",
        backend,
        "--mla-suite",
        "smoke",
        "--mla-suite",
        "metamorphic",
        "-q",
        f"--junitxml={junit}",
        *extra,
        golden=golden_dir,
        report=work / f"report-{label}",
        inherit=True,
        env=THREAD_ENV,
        timeout=TIMEOUT_S,
    )
    run = Run(
        backend,
        done.returncode,
        time.perf_counter() - start,
        output=done.stdout + done.stderr,
        report=work / f"report-{label}",
    )
    if junit.exists():
        run.outcomes, run.messages = parse_junit(junit)
    return run


@pytest.fixture(scope="module")
def work(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("defects")


@pytest.fixture(scope="module")
def clean(work: Path) -> Run:
    """torch-cpu on five seeds, two xdist workers; writes every golden the defect runs read."""
    return run_pytest("torch-cpu", work, work / "golden", "--mla-seeds", CLEAN_SEEDS, "-n", str(PARALLEL))


@pytest.fixture(scope="module")
def defect_runs(work: Path, clean: Run) -> Iterator[dict[str, Run]]:
    names = ["control_math", *CATALOGUE]
    with ThreadPoolExecutor(PARALLEL) as pool:
        runs = dict(
            zip(
                names,
                pool.map(lambda n: run_pytest(f"mlaconf.harness.defects:{n}", work, work / "golden"), names),
                strict=True,
            )
        )
    yield runs
    summary = os.environ.get("MLA_DEFECT_SUMMARY")
    if summary:
        Path(summary).write_text(json.dumps(_summary(work, clean, runs), indent=1))


def _summary(work: Path, clean: Run, runs: dict[str, Run]) -> dict[str, object]:
    return {
        "clean": {
            "seconds": round(clean.seconds, 1),
            "outcomes": clean.outcomes,
            "results": str(work / "report-torch_cpu" / "results.jsonl"),
        },
        "defects": {
            name: {
                "description": CATALOGUE[name].description if name in CATALOGUE else "control",
                "seconds": round(run.seconds, 1),
                "failed": {t: run.messages[t] for t in run.with_outcome("failed")},
                "largest_slack": run.largest_slack(),
                "counts": {o: len(run.with_outcome(o)) for o in ("passed", "failed", "error", "skipped")},
            }
            for name, run in runs.items()
        },
    }


def test_clean_backend_passes_on_five_seeds(clean: Run) -> None:
    assert clean.returncode == 0, clean.describe()
    passed = clean.with_outcome("passed")
    assert len(passed) == len(clean.outcomes), clean.describe()
    seeds = CLEAN_SEEDS.split(",")
    for suite in ("test_conformance", "test_metamorphic"):
        assert sum(suite in test for test in passed) >= 25 * len(seeds), clean.describe()


def test_control_math_path_passes(defect_runs: dict[str, Run]) -> None:
    run = defect_runs["control_math"]
    assert run.returncode == 0 and run.outcomes and not run.with_outcome("failed"), run.describe()


@pytest.mark.parametrize("name", list(CATALOGUE))
def test_defect_is_caught(name: str, defect_runs: dict[str, Run]) -> None:
    run = defect_runs[name]
    assert run.returncode == 1, run.describe()  # 1 = tests failed (not a usage or internal error)
    assert run.with_outcome("failed"), f"defect {name} ({CATALOGUE[name].description}) was not caught\n{run.describe()}"
    assert not run.with_outcome("error"), run.describe()
    if any("test_conformance" in test for test in run.with_outcome("failed")):
        largest = run.largest_slack()
        assert largest >= NEAR_MISS, (
            f"defect {name}: conformance fails only near its bound (largest slack "
            f"{largest:.3g} < {NEAR_MISS}): a near miss\n{run.describe()}"
        )


def test_forgetful_contract_model_fails_the_error_suite(work: Path) -> None:
    run = run_pytest(
        "mlaconf.harness.defects:strict_forgets_seqlen_values",
        work,
        work / "golden-errors",
        suites=("cases/test_error_contract.py",),
    )
    failed = run.with_outcome("failed")
    assert run.returncode == 1 and failed, run.describe()
    # exactly the cases about seqlen values: unequal lengths without CAUSAL, kv_b < q_b under CAUSAL
    seqlen_cases = ("kv-longer-without-causal", "kv-longer-mask-free", "causal-kv-shorter-than-q", "causal-kv-zero")
    named = sorted(next((c for c in seqlen_cases if f"{c} (" in run.messages[t]), t) for t in failed)
    assert named == sorted(seqlen_cases), run.describe()
    assert all("ERROR_INVALID_PARAM at setup, the call was accepted" in run.messages[t] for t in failed)


def _failed_slack_by_dtype_mask(run: Run) -> dict[tuple[str, str], float]:
    """(dtype, mask) -> the largest worst_slack among the run's failed conformance records."""
    assert run.report is not None
    largest: dict[tuple[str, str], float] = {}
    for line in (run.report / "results.jsonl").read_text().splitlines():
        record = json.loads(line) if line.strip() else {}
        if record.get("verdict") == "failed" and record.get("worst_slack") is not None:
            key = (record["dtype"], record["mask"])
            largest[key] = max(largest.get(key, 0.0), float(record["worst_slack"]))
    return largest


@pytest.mark.parametrize("name", list(REAL_BUGS))
def test_real_bug_is_killed_in_every_dtype_and_mask(name: str, defect_runs: dict[str, Run]) -> None:
    """docs/real-bugs.md: smoke kills each reproduced upstream bug at slack >= NEAR_MISS in every
    dtype and mask its conditions reach."""
    largest = _failed_slack_by_dtype_mask(defect_runs[name])
    for dtype in ("fp16", "bf16"):
        for mask in REAL_BUGS[name]:
            slack = largest.get((dtype, mask), 0.0)
            assert slack >= NEAR_MISS, f"real bug {name}: {dtype} {mask} largest failing slack {slack:.3g}"
