"""pytest wiring: options, markers, backend selection, golden store, xdist device pinning."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Iterator
from fnmatch import fnmatchcase
from pathlib import Path

import pytest

import cases.hypothesis_profiles  # noqa: F401  (profiles must exist before --hypothesis-profile is read)
from cases.deviations import DeviationSet, load_deviations
from cases.policy import PolicySet, load_policies
from golden.spec import CACHE_NAMES, MASK_NAMES, CaseSpec, SpecError, load_suite, load_suites
from golden.store import GoldenStore
from harness import registry
from harness.backend import Backend
from harness.devices import accelerator_count, auto_workers

pytest_plugins = ["reports.plugin"]

SUITES = ("smoke", "standard", "deepseek", "edge", "all")
ERROR_SUITE = "errors"


def marker_name(name: str) -> str:
    """Backend names as marker names (``torch-cpu`` -> ``torch_cpu``)."""
    return name.replace("-", "_").replace(".", "_").replace(":", "_")


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("mla", "MLA prefill conformance")
    group.addoption("--backend", action="append", default=None, metavar="NAME",
                    help="backend under test: a built-in name (" + ", ".join(registry.BUILTIN) + "), 'auto' "
                    "(ATB, else CUDA, else CPU), or 'pkg.module:factory'; repeatable or comma-separated. "
                    f"Default: ${registry.ENV_VAR} or auto.")
    group.addoption("--suite", action="append", default=None, choices=SUITES,
                    help="case suite(s) to run (default smoke; 'all' = every value suite)")
    group.addoption("--cases", default=None, metavar="FILE", help="run the cases of this TOML suite file instead")
    group.addoption("--seeds", default=None, metavar="S1,S2,...",
                    help="run every case once per seed (replacing the suite's seed; new goldens)")
    group.addoption("--golden-dir", default=None, metavar="DIR",
                    help="golden store directory (default $MLA_GOLDEN_DIR or <repo>/.golden)")
    group.addoption("--policy", default="default", help="tolerance policy from cases/tolerances.toml")
    group.addoption("--tolerances", default=None, metavar="FILE", help="tolerance policy file")
    group.addoption("--deviations", default=None, metavar="FILE", help="known-deviations file")
    group.addoption("--timing-repeats", type=int, default=1, metavar="N",
                    help="timed backend calls per case (median reported; never part of the verdict)")
    group.addoption("--warmup", type=int, default=0, metavar="N", help="untimed backend calls before timing")


def pytest_configure(config: pytest.Config) -> None:
    share_cpu_threads(config)
    markers = [
        "mla_case(case_id, content_hash): a conformance item's case (used for sharding)",
        "metamorphic: invariance tests (batch order, padding, heads, layouts, determinism)",
        "property: hypothesis-driven tests against an on-the-fly float64 golden",
        "error_contract: invalid inputs must be rejected with the documented status",
        "errors: the error-contract suite",
    ]
    markers += [f"{d}: dtype {d}" for d in ("fp16", "bf16")]
    markers += [f"{name}: maskType {code}" for code, name in MASK_NAMES.items()]
    markers += [f"{name}: cacheMode {code}" for code, name in CACHE_NAMES.items()]
    markers += [f"{s}: the {s} suite" for s in SUITES if s != "all"]
    names = set(registry.BUILTIN) | set(registry.selected_names(config.getoption("backend")))
    markers += [f"{marker_name(n)}: backend {n}" for n in sorted(names)]
    for line in markers:
        config.addinivalue_line("markers", line)


def share_cpu_threads(config: pytest.Config) -> None:
    """xdist workers split the cores between them instead of each using all of them."""
    workerinput = getattr(config, "workerinput", None)
    if workerinput is None:
        return
    import torch

    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    torch.set_num_threads(max(1, cores // int(workerinput.get("workercount", 1))))


def pytest_xdist_auto_num_workers(config: pytest.Config) -> int | None:
    """``-n auto``: one worker per NPU or GPU; xdist's default on a CPU-only host."""
    return auto_workers(accelerator_count())


# -- parametrization ----------------------------------------------------------------------------


def selected_cases(config: pytest.Config) -> list[CaseSpec]:
    cases_file = config.getoption("cases")
    try:
        if cases_file:
            cases = [c for c in load_suite(cases_file) if c.expect_error is None]
        else:
            cases = load_suites(config.getoption("suite") or ["smoke"])
    except SpecError as exc:  # a bad suite file is the user's input: say what and where, no traceback
        raise pytest.UsageError(str(exc)) from exc
    seeds = config.getoption("seeds")
    if not seeds:
        return cases
    try:
        values = [int(s) for s in seeds.split(",") if s.strip()]
    except ValueError as exc:
        raise pytest.UsageError(f"--seeds: expected comma-separated integers, got {seeds!r}") from exc
    return [with_seed(c, seed) for c in cases for seed in values]


def with_seed(case: CaseSpec, seed: int) -> CaseSpec:
    """The same case with another seed (and so another id and golden)."""
    reseeded = dataclasses.replace(case, seed=seed, name="")
    return dataclasses.replace(reseeded, name=reseeded.case_id)


def error_cases() -> list[CaseSpec]:
    return load_suites([ERROR_SUITE])


def case_param(case: CaseSpec) -> object:
    marks = [
        getattr(pytest.mark, case.dtype),
        getattr(pytest.mark, case.mask_name),
        getattr(pytest.mark, case.cache_name),
        pytest.mark.mla_case(case_id=case.case_id, content_hash=case.content_hash),
    ]
    if case.suite:
        marks.append(getattr(pytest.mark, case.suite))
    return pytest.param(case, id=case.case_id, marks=marks)


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    config = metafunc.config
    if "conformance_case" in metafunc.fixturenames:
        metafunc.parametrize("conformance_case", [case_param(c) for c in selected_cases(config)])
    if "error_case" in metafunc.fixturenames:
        metafunc.parametrize("error_case", [case_param(c) for c in error_cases()])
    if "backend_name" in metafunc.fixturenames:
        names = registry.selected_names(config.getoption("backend"))
        metafunc.parametrize(
            "backend_name", [pytest.param(n, id=n, marks=getattr(pytest.mark, marker_name(n))) for n in names]
        )


# -- fixtures ------------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def backend_cache() -> Iterator[dict[str, Backend]]:
    yield {}


@pytest.fixture
def backend(backend_name: str, backend_cache: dict[str, Backend]) -> Backend:
    """The backend under test, created once per worker; skipped with its own reason if unavailable."""
    if backend_name not in backend_cache:
        try:
            backend_cache[backend_name] = registry.create(backend_name)
        except registry.BackendSelectionError as exc:
            raise pytest.UsageError(str(exc)) from exc
    instance = backend_cache[backend_name]
    availability = instance.available()
    if not availability:
        pytest.skip(f"backend {backend_name} unavailable: {availability.reason}")
    return instance


@pytest.fixture(scope="session")
def golden_store(pytestconfig: pytest.Config) -> GoldenStore:
    root = pytestconfig.getoption("golden_dir") or os.environ.get("MLA_GOLDEN_DIR")
    return GoldenStore(Path(root) if root else None)


@pytest.fixture(scope="session")
def policy_set(pytestconfig: pytest.Config) -> PolicySet:
    path = pytestconfig.getoption("tolerances")
    return load_policies(Path(path) if path else None)


@pytest.fixture(scope="session")
def deviation_set(pytestconfig: pytest.Config) -> DeviationSet:
    path = pytestconfig.getoption("deviations")
    return load_deviations(Path(path) if path else None)


# -- known deviations that match nothing ----------------------------------------------------------


def unmatched_deviations(config: pytest.Config) -> list[str]:
    """Entries for a selected backend that no selected case matches, whatever the version."""
    path = config.getoption("deviations")
    deviations = load_deviations(Path(path) if path else None)
    backends = registry.selected_names(config.getoption("backend"))
    cases = selected_cases(config)
    stale = []
    for entry in deviations.entries:
        if not any(fnmatchcase(b, entry.backend) for b in backends):
            continue  # about another backend: not this run's business
        unversioned = dataclasses.replace(entry, versions="")
        if not any(unversioned.selects(b, None, c) for b in backends for c in cases):
            stale.append(entry.describe())
    return stale


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter, config: pytest.Config) -> None:
    ran_conformance = any(
        "test_conformance" in getattr(report, "nodeid", "")
        for reports in terminalreporter.stats.values()
        for report in reports
    )
    if not ran_conformance or hasattr(config, "workerinput"):
        return
    stale = unmatched_deviations(config)
    if stale:
        terminalreporter.section("known deviations matching no selected case", yellow=True)
        for line in stale:
            terminalreporter.line(f"  {line}")
