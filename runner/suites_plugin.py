"""The MLA suites' pytest plugin: every marker, fixture, parametrization, shard selection and output saving
of the suites in ``cases/``; the front-door checks it runs first are :mod:`mlaconf.runner.front_door`'s,
the records' gathering :mod:`mlaconf.runner.recording`'s and the run directory
:mod:`mlaconf.runner.run_directory`'s.

Registered by the entry point (:mod:`mlaconf.runner.plugin`) only in an MLA run, so importing this module
(hypothesis, the record gatherer, the reports) never happens in another project's session.  Even in an MLA run
no backend is probed and no report is written unless a test asks for one.
"""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from mlaconf.facts.operator import CACHE_NAMES, MASK_NAMES
from mlaconf.facts.processes import THREAD_ENV, kill_with_parent, usable_cpus
from mlaconf.facts.shard import in_shard
from mlaconf.harness import registry
from mlaconf.runner import hypothesis_profiles
from mlaconf.runner.front_door import check_front_door, report_state
from mlaconf.runner.identity import BACKEND_LABELS, MLA_PARAMETER, is_mla_test
from mlaconf.runner.recording import REBUILT, MlaReport, RecordGatherer, complete_report, has_record
from mlaconf.runner.run_directory import STATE, deselect_recorded
from mlaconf.runner.selection import (
    ALL_SUITES,
    CASE_MARKER,
    METAMORPHIC_SUITE,
    case_param,
    error_cases,
    mark,
    marker_name,
    relation_cases,
    selected_cases,
    suite_choices,
    unmatched_deviations,
)

if TYPE_CHECKING:
    from mlaconf.golden.specs.spec import CaseSpec
    from mlaconf.golden.specs.types import GoldenCase
    from mlaconf.golden.store.directory import Builder, GoldenStore
    from mlaconf.harness.backend import Backend
    from mlaconf.judge.deviations import DeviationSet
    from mlaconf.judge.policy import PolicySet

BACKENDS = pytest.StashKey[list[str]]()
#: A copy of the real stderr: goldens that take long to generate on demand announce themselves there
#: (from xdist workers too), past pytest's capture.
TERMINAL_FD = pytest.StashKey[int]()
#: Selection name -> the backend's own name, for plug-ins selected by import path (test ids).
BACKEND_IDS = pytest.StashKey[dict[str, str]]()


def pytest_configure(config: pytest.Config) -> None:
    """Called when the entry point registers this plugin, in an MLA run only."""
    config.stash[STATE] = report_state(config)
    config.stash[TERMINAL_FD] = os.dup(real_stderr(config))
    gatherer = None if hasattr(config, "workerinput") else RecordGatherer(config, config.stash[STATE])
    if gatherer is not None:
        config.pluginmanager.register(gatherer, "mla-record-gatherer")
    share_cpu_threads(config)
    if hasattr(config, "workerinput"):  # Ctrl-C is the controller's to handle: it stops the workers cleanly
        signal.signal(signal.SIGINT, LeaveToTheController())
        kill_with_parent()  # a SIGKILLed controller leaves no worker running on
    hypothesis_profiles.load_default()
    for line in marker_lines():
        config.addinivalue_line("markers", line)
    if gatherer is not None:
        try:
            check_front_door(config)
        except pytest.UsageError as exc:
            written = gatherer.run.end_with_usage_error(str(exc))
            if written is None:
                raise
            raise pytest.UsageError(f"{exc} (run.json in {written} records this usage error)") from None


def pytest_unconfigure(config: pytest.Config) -> None:
    if TERMINAL_FD in config.stash:
        os.close(config.stash[TERMINAL_FD])


def real_stderr(config: pytest.Config) -> int:
    """The descriptor of the terminal's stderr: under pytest's fd capture (started before this plugin is
    registered) fd 2 is a temporary file and the capture keeps the original as ``targetfd_save``."""
    capture = getattr(config.pluginmanager.get_plugin("capturemanager"), "_global_capturing", None)
    saved = getattr(getattr(capture, "err", None), "targetfd_save", None)
    return saved if isinstance(saved, int) else 2


class LeaveToTheController:
    """A worker's SIGINT handler: no exception (the controller stops the workers), but no test starts
    here after the running one: the controller records nothing after a stop, so a test run then would
    be lost work.  A handler, not SIG_IGN, so that processes a test starts get the default Ctrl-C back
    (exec resets handlers, not ignores)."""

    def __init__(self) -> None:
        self.session: pytest.Session | None = None

    def __call__(self, signum: int, frame: object) -> None:
        if self.session is not None:
            self.session.shouldstop = "interrupted: the controller stops the run"


def pytest_sessionstart(session: pytest.Session) -> None:
    """An xdist worker's Ctrl-C handler learns the session it stops."""
    handler = signal.getsignal(signal.SIGINT)
    if isinstance(handler, LeaveToTheController):
        handler.session = session


def marker_lines() -> list[str]:
    markers = [
        f"{CASE_MARKER}(case_id, content_hash): a test's case; --mla-shard splits by content_hash",
        "conformance: the numerical conformance suite (every case against its float64 golden)",
        "metamorphic: invariance tests (batch order, padding, heads, layouts, determinism)",
        "property: hypothesis-driven tests against an on-the-fly float64 golden",
        "error_contract: invalid inputs must be rejected with the documented status",
    ]
    markers += [f"{d}: dtype {d}" for d in ("fp16", "bf16")]
    markers += [f"{name}: maskType {code}" for code, name in MASK_NAMES.items()]
    markers += [f"{name}: cacheMode {code}" for code, name in CACHE_NAMES.items()]
    markers += [f"{s}: the {s} suite" for s in suite_choices() if s not in (ALL_SUITES, METAMORPHIC_SUITE)]
    markers += [f"{marker_name(n)}: backend {n}" for n in registry.BUILTIN]
    return markers


def share_cpu_threads(config: pytest.Config) -> None:
    """xdist workers split the cores between them instead of each using all of them."""
    workerinput = getattr(config, "workerinput", None)
    if workerinput is None:
        return
    threads = max(1, usable_cpus() // int(workerinput.get("workercount", 1)))
    for name in THREAD_ENV:  # read by BLAS and torch when they load
        os.environ.setdefault(name, str(threads))
    if "torch" in sys.modules:  # already loaded: tell it directly
        sys.modules["torch"].set_num_threads(threads)


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node: Any) -> None:
    """xdist controller: give every worker the controller's report directory."""
    node.workerinput["mla_report_dir"] = str(node.config.stash[STATE].report_dir)


# -- parametrization and selection --------------------------------------------------------------


def backend_names(config: pytest.Config) -> list[str]:
    """The run's backends, ``auto`` resolved once per process."""
    if BACKENDS not in config.stash:
        try:
            config.stash[BACKENDS] = registry.selected_names(config.getoption("mla_backend"))
        except registry.BackendSelectionError as exc:
            raise pytest.UsageError(str(exc)) from exc
    return config.stash[BACKENDS]


def backend_id(config: pytest.Config, name: str) -> str:
    """A test id's backend part: a built-in's name, or a plug-in's own ``name`` rather than its
    import path ``pkg.mod:factory`` (a plug-in that cannot be created keeps the path; its fixture
    reports why)."""
    if ":" not in name:
        return name
    ids = config.stash.setdefault(BACKEND_IDS, {})
    if name not in ids:
        try:
            ids[name] = str(registry.create(name).name) or name
        except registry.BackendSelectionError:
            ids[name] = name
    return ids[name]


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """Parametrizes the plugin's own ``mla_``-named parameters, and only in an MLA run."""
    config = metafunc.config
    if "mla_conformance_case" in metafunc.fixturenames:
        metafunc.parametrize("mla_conformance_case", [case_param(config, c) for c in selected_cases(config)])
    if "mla_error_case" in metafunc.fixturenames:
        metafunc.parametrize("mla_error_case", [case_param(config, c) for c in error_cases(config)])
    if "mla_relation_case" in metafunc.fixturenames:
        cases = relation_cases(config, metafunc.function.__name__)
        metafunc.parametrize("mla_relation_case", [case_param(config, c) for c in cases])
    if MLA_PARAMETER in metafunc.fixturenames:
        params = [
            pytest.param(name, id=backend_id(config, name), marks=mark(config, name, f"backend {name}"))
            for name in backend_names(config)
        ]
        metafunc.parametrize(MLA_PARAMETER, params)


EMPTY_PARAMETER_SET = "got empty parameter set"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """MLA tests get the default timeout; a suite with no case is deselected (an empty selection
    is not a pass); ``--mla-shard K/N`` keeps the cases whose content hash falls in shard K (unmarked
    tests: shard 1)."""
    add_timeouts(config, items)
    empty = [
        item
        for item in items
        if is_mla_test(item)
        and any(str(m.kwargs.get("reason", "")).startswith(EMPTY_PARAMETER_SET) for m in item.iter_markers("skip"))
    ]
    if empty:
        config.hook.pytest_deselected(items=empty)
        items[:] = [item for item in items if item not in empty]
    if config.stash[STATE].resume:
        deselect_recorded(config, items, config.stash[STATE].report_dir)
    shard = config.stash[STATE].shard
    if shard is None:
        return
    keep: list[pytest.Item] = []
    drop: list[pytest.Item] = []
    for item in items:
        marker = item.get_closest_marker(CASE_MARKER)
        if marker is None:
            selected = shard[0] == 1
        else:
            key = str(marker.kwargs.get("content_hash") or marker.kwargs.get("case_id") or item.nodeid)
            selected = in_shard(key, shard)
        (keep if selected else drop).append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep


def add_timeouts(config: pytest.Config, items: list[pytest.Item]) -> None:
    """A pytest-timeout marker on every MLA test without one, unless --timeout or the ini set one."""
    seconds = config.getoption("mla_timeout")
    if not seconds or not config.pluginmanager.hasplugin("timeout"):
        return
    if config.getoption("timeout", None) is not None or config.getini("timeout"):
        return
    for item in items:
        if is_mla_test(item) and item.get_closest_marker("timeout") is None:
            item.add_marker(pytest.mark.timeout(seconds))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
    """Every phase pytest counts of an MLA test leaves with exactly one record (see runner.recording)."""
    report = yield
    if is_mla_test(item) or has_record(item):
        complete_report(item, call, report)
    return report


# -- fixtures -------------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def mla_backend_cache() -> Iterator[dict[str, Backend]]:
    yield {}


@pytest.fixture
def mla_backend(mla_backend_name: str, mla_backend_cache: dict[str, Backend]) -> Backend:
    """The backend under test, created once per worker; skipped with its own reason if unavailable."""
    if mla_backend_name not in mla_backend_cache:
        try:
            mla_backend_cache[mla_backend_name] = registry.create(mla_backend_name)
        except registry.BackendSelectionError as exc:
            raise pytest.UsageError(str(exc)) from exc
    instance = mla_backend_cache[mla_backend_name]
    BACKEND_LABELS[mla_backend_name] = instance.name
    availability = instance.available()
    if not availability:
        pytest.skip(f"backend {mla_backend_name} unavailable: {availability.reason}")
    return instance


@pytest.fixture(scope="session")
def mla_golden_store(pytestconfig: pytest.Config) -> Iterator[GoldenStore]:
    """The run's store (:class:`mlaconf.runner.run_store.RunStore`): what it rebuilds goes into the records."""
    from mlaconf.golden.building import progress
    from mlaconf.golden.building.generate import build_golden
    from mlaconf.runner.run_store import RunStore

    store = RunStore(pytestconfig.getoption("mla_golden_dir") or None, pytestconfig.stash.setdefault(REBUILT, {}))
    write = progress.fd_writer(pytestconfig.stash[TERMINAL_FD])
    store.builder = on_demand_builder(write, store, build_golden)
    remove = progress.add_listener(progress.Announcer(write))
    yield store
    remove()


def on_demand_builder(write: Callable[[str], None], store: GoldenStore, build: Builder) -> Builder:
    """The store's builder, with one line the first time this process's store builds a missing golden: a run
    that generates them says so (they may take minutes and hundreds of MB), and how to build them ahead.  Only
    the store's builds of missing goldens: a damaged or stale one it rebuilds is said in the run's summary, and
    a golden made outside the store on purpose (the property suite's) says nothing."""
    told = False

    def build_missing(spec: CaseSpec) -> GoldenCase:
        nonlocal told
        if not told and not store.path_for(spec).exists():
            told = True
            write(
                f"golden: {spec.case_id} is not in the store {store.root}: generating missing goldens on demand "
                f"('mlaconf regen SUITE --out {store.root}' builds them ahead)"
            )
        return build(spec)

    return build_missing


@pytest.fixture(scope="session")
def mla_policy_set(pytestconfig: pytest.Config) -> PolicySet:
    from mlaconf.judge.policy import load_policies

    path = pytestconfig.getoption("mla_tolerances")
    return load_policies(Path(path) if path else None)


@pytest.fixture(scope="session")
def mla_deviation_set(pytestconfig: pytest.Config) -> DeviationSet:
    from mlaconf.judge.deviations import load_deviations

    path = pytestconfig.getoption("mla_deviations")
    return load_deviations(Path(path) if path else None)


@pytest.fixture
def mla_report(request: pytest.FixtureRequest) -> MlaReport:
    """Attach result records and find the saved-outputs folder; see :class:`mlaconf.runner.recording.MlaReport`."""
    node = request.node
    assert isinstance(node, pytest.Item)
    return MlaReport(node, request.config.stash[STATE])


@pytest.hookimpl(trylast=True)  # after the gatherer's tables: the last word before pytest's counts
def pytest_terminal_summary(
    terminalreporter: pytest.TerminalReporter, exitstatus: int | pytest.ExitCode, config: pytest.Config
) -> None:
    """Known deviations for a selected backend that no selected case matched, then the run's verdict in one
    word and where its report is (controller only)."""
    if hasattr(config, "workerinput"):
        return
    stale_deviations(terminalreporter, config)
    from mlaconf.reports.summary import run_verdict

    final = config.stash[STATE].exit_status
    passed = int(exitstatus if final is None else final) == 0
    line = run_verdict(passed, config.stash[STATE].report_dir)
    terminalreporter.write_sep("=", line, green=passed, red=not passed)


def stale_deviations(terminalreporter: pytest.TerminalReporter, config: pytest.Config) -> None:
    """Known deviations of a selected backend that no selected case matched, after a conformance run."""
    from mlaconf.judge.deviations import load_deviations

    if not any(record.get("suite") == "conformance" for record in config.stash[STATE].records):
        return
    path = config.getoption("mla_deviations")
    stale = unmatched_deviations(config, load_deviations(Path(path) if path else None), backend_names(config))
    if stale:
        terminalreporter.section("known deviations matching no selected case", yellow=True)
        for line in stale:
            terminalreporter.line(f"  {line}")
