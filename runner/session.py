"""The MLA suites' pytest plugin: every marker, fixture, parametrization, shard selection, front-door check
and output saving of the suites in ``cases/``.

Registered by the entry point (:mod:`mlaconf.runner.plugin`) only in an MLA run, so importing this module
(hypothesis, the collector, the reports) never happens in another project's session.  Even in an MLA run
no backend is probed and no report is written unless a test asks for one.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from mlaconf.facts.operator import CACHE_NAMES, MASK_NAMES
from mlaconf.facts.processes import THREAD_ENV, kill_with_parent, usable_cpus
from mlaconf.facts.shard import in_shard, parse_shard
from mlaconf.harness import registry
from mlaconf.reports import env
from mlaconf.reports.rundir import REPORTS_DIR, RUN_FILE, write_json
from mlaconf.reports.safeio import ReportFileError
from mlaconf.runner import hypothesis_profiles
from mlaconf.runner.collect import (
    STATE,
    Collector,
    MlaReport,
    ReportState,
    complete_report,
    has_record,
    is_mla_item,
    set_run_info,
)
from mlaconf.runner.identity import BACKEND_LABELS, policy_name
from mlaconf.runner.run_directory import deselect_recorded
from mlaconf.runner.selection import (
    ALL_SUITES,
    DEFAULT_SUITE,
    METAMORPHIC_SUITE,
    case_param,
    error_cases,
    load_cases,
    mark,
    marker_name,
    policy_problem,
    selected_cases,
    suite_choices,
    unmatched_deviations,
)

if TYPE_CHECKING:
    from mlaconf.golden.progress import CaseWork
    from mlaconf.golden.store import GoldenStore
    from mlaconf.harness.backend import Backend
    from mlaconf.judge.deviations import DeviationSet
    from mlaconf.judge.policy import PolicySet

MARKER = "mla_case"
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
    if not hasattr(config, "workerinput"):
        config.pluginmanager.register(Collector(config, config.stash[STATE]), "mla-report-collector")
    share_cpu_threads(config)
    if hasattr(config, "workerinput"):  # Ctrl-C is the controller's to handle: it stops the workers cleanly
        signal.signal(signal.SIGINT, LeaveToTheController())
        kill_with_parent()  # a SIGKILLed controller leaves no worker running on
    hypothesis_profiles.load_default()
    for line in marker_lines():
        config.addinivalue_line("markers", line)
    if not hasattr(config, "workerinput"):
        try:
            check_front_door(config)
        except pytest.UsageError as exc:
            end_with_usage_error(config, str(exc))
            raise


def pytest_unconfigure(config: pytest.Config) -> None:
    if TERMINAL_FD in config.stash:
        os.close(config.stash[TERMINAL_FD])


def real_stderr(config: pytest.Config) -> int:
    """The descriptor of the terminal's stderr: under pytest's fd capture (started before this plugin is
    registered) fd 2 is a temporary file and the capture keeps the original as ``targetfd_save``."""
    capture = getattr(config.pluginmanager.get_plugin("capturemanager"), "_global_capturing", None)
    saved = getattr(getattr(capture, "err", None), "targetfd_save", None)
    return saved if isinstance(saved, int) else 2


def end_with_usage_error(config: pytest.Config, message: str) -> None:
    """A named report directory ends ``usage_error`` (an earlier run there is moved aside): it never
    shows a previous run as this one.  A default (timestamped) directory is left unmade."""
    if not (config.getoption("mla_report_dir") or config.getoption("mla_run_name")) or config.getoption("mla_resume"):
        return  # a default directory is left unmade; a run being resumed is left as it was
    collector = config.pluginmanager.get_plugin("mla-report-collector")
    if not isinstance(collector, Collector):
        return
    collector.state.problems.append(f"usage error: {message.splitlines()[0]}")
    try:
        collector.claim()
        write_json(collector.state.report_dir / RUN_FILE, collector.run_document(time.time(), "usage_error"))
    except (pytest.UsageError, OSError, ReportFileError):  # another run owns it, or it cannot be written
        return


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
        f"{MARKER}(case_id, content_hash): a conformance case; --mla-shard splits by content_hash",
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


def _explicit_backends(config: pytest.Config) -> list[str] | None:
    """The backends the user named (--mla-backend or $MLA_BACKEND), None when none was named."""
    values = config.getoption("mla_backend") or [
        v for v in os.environ.get(registry.ENV_VAR, "").split(",") if v.strip()
    ]
    if not values:
        return None
    names = [part.strip() for value in values for part in value.split(",") if part.strip()]
    return list(dict.fromkeys(names))


def check_front_door(config: pytest.Config) -> None:
    """Usage errors before any test runs (controller only): backends that name nothing, an unusable
    golden store, an unknown policy.  Only what the user named is checked, so runs that use no
    MLA option (the framework's own tests) stay inert.  Also records the run facts in run.json."""
    state = config.stash[STATE]
    named = _explicit_backends(config)
    if named is not None:
        backends = []
        for name in named:
            if name == "auto":
                continue
            try:
                instance = registry.create(name)
            except registry.BackendSelectionError as exc:
                raise pytest.UsageError(f"{exc}\n{registry.choices_text()}") from exc
            except Exception as exc:  # a factory that raises: the user's to read, in one line
                raise pytest.UsageError(
                    f"backend {name!r}: its factory raised {type(exc).__name__}: {exc}\n{registry.choices_text()}"
                ) from exc
            try:
                availability = instance.available()
                ok, reason = bool(availability), getattr(availability, "reason", "")
            except Exception as exc:
                ok, reason = False, f"available() raised {type(exc).__name__}: {exc}"
            backends.append({"name": name, "label": instance.name, "available": ok, "reason": reason, "explicit": True})
            if not ok:
                state.problems.append(f"backend {name} was named explicitly but is unavailable here: {reason}")
        if "auto" in named:
            backends.append(
                {
                    "name": "auto",
                    "resolved": registry.resolve_auto(),
                    "available": True,
                    "reason": "",
                    "explicit": False,
                }
            )
        set_run_info(config, "backends", backends)
    golden = config.getoption("mla_golden_dir")
    if golden:
        problem = golden_dir_problem(Path(golden))
        if problem:
            raise pytest.UsageError(f"--mla-golden-dir {golden}: {problem}")
        set_run_info(config, "golden_store", str(Path(golden).resolve()))
    else:  # what the golden_store fixture will open (golden.store's rule)
        set_run_info(config, "golden_store", str(Path(os.environ.get("MLA_GOLDEN_DIR") or ".golden").resolve()))
    policy, tolerances = policy_name(config), config.getoption("mla_tolerances")
    if policy != "default" or tolerances:
        problem = policy_problem(policy, tolerances, "--mla-policy")
        if problem:
            raise pytest.UsageError(problem)
    set_run_info(config, "policy", policy)
    suites = config.getoption("mla_suite") or ([] if config.getoption("mla_cases") else [DEFAULT_SUITE])
    unknown = [name for name in suites if name not in suite_choices()]
    if unknown:
        raise pytest.UsageError(f"--mla-suite {unknown[0]!r}: no such suite; choose from {', '.join(suite_choices())}")
    set_run_info(config, "suites", suites)
    if suites and not config.getoption("mla_cases"):
        load_cases(config)  # a suite that does not parse: one usage line naming file and line, before any test
    if config.getoption("mla_cases"):
        cases = config.getoption("mla_cases")
        if not Path(cases).is_file():
            raise pytest.UsageError(f"--mla-cases {cases}: no such file")
        if not load_cases(config):
            raise pytest.UsageError(f"--mla-cases {cases}: the file holds no case; an empty selection is not a pass")
        set_run_info(config, "cases_file", str(Path(cases).resolve()))
    store = Path(golden or os.environ.get("MLA_GOLDEN_DIR") or ".golden")
    gap = unwritable_store_gap(store, [case.case_id for case in selected_cases(config)])
    if gap:
        raise pytest.UsageError(gap)


def unwritable_store_gap(store: Path, case_ids: list[str]) -> str | None:
    """Why a golden store this user cannot write cannot serve the selection (it lacks some of its
    goldens: every such test would fail making one), or None.  One line instead of a failure each."""
    if not store.is_dir() or os.access(store, os.W_OK | os.X_OK):
        return None
    missing = [case_id for case_id in case_ids if not (store / f"{case_id}.h5").exists()]
    if not missing:
        return None
    return (
        f"golden store {store.resolve()} is not writable and lacks {len(missing)} of the {len(case_ids)} "
        f"goldens this run selects (first: {missing[0]}); fill it with 'mlaconf regen --out {store}' "
        "where it is writable, or name a writable store with --golden-dir"
    )


def golden_dir_problem(path: Path) -> str | None:
    """Why a golden store directory cannot serve, or None."""
    if path.exists() and not path.is_dir():
        return "not a directory"
    if path.is_dir():
        empty = not any(path.iterdir())
        if empty and not os.access(path, os.W_OK | os.X_OK):
            return "an empty directory this user cannot write: no golden can be read or created there"
        return None
    parent = next((p for p in path.absolute().parents if p.exists()), None)
    if parent is None or not parent.is_dir() or not os.access(parent, os.W_OK | os.X_OK):
        return f"does not exist and cannot be created (no write access to {parent})"
    return None


def report_state(config: pytest.Config) -> ReportState:
    workerinput: dict[str, Any] | None = getattr(config, "workerinput", None)
    run_name = config.getoption("mla_run_name") or (time.strftime("%Y%m%d-%H%M%S") + "-" + env.short_host())
    if workerinput is not None and "mla_report_dir" in workerinput:
        report_dir = Path(workerinput["mla_report_dir"])
    elif config.getoption("mla_report_dir"):
        report_dir = Path(config.getoption("mla_report_dir")).resolve()
    else:
        report_dir = (REPORTS_DIR / run_name).resolve()
    shard_text = config.getoption("mla_shard")
    try:
        shard = parse_shard(shard_text) if shard_text else None
    except ValueError as exc:
        raise pytest.UsageError(f"--mla-shard: {exc}") from exc
    resume = bool(config.getoption("mla_resume"))
    if resume and not config.getoption("mla_report_dir") and workerinput is None:
        raise pytest.UsageError("--mla-resume needs --mla-report-dir: the run directory to continue")
    return ReportState(
        report_dir=report_dir,
        run_name=run_name,
        save_outputs=bool(config.getoption("mla_save_outputs")),
        shard=shard,
        resume=resume,
    )


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
    if "mla_backend_name" in metafunc.fixturenames:
        params = [
            pytest.param(name, id=backend_id(config, name), marks=mark(config, name, f"backend {name}"))
            for name in backend_names(config)
        ]
        metafunc.parametrize("mla_backend_name", params)


EMPTY_PARAMETER_SET = "got empty parameter set"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """MLA tests get the default timeout; a suite with no case is deselected (an empty selection
    is not a pass); ``--mla-shard K/N`` keeps the cases whose content hash falls in shard K (unmarked
    tests: shard 1)."""
    add_timeouts(config, items)
    empty = [
        item
        for item in items
        if is_mla_item(item)
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
        marker = item.get_closest_marker(MARKER)
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
        if is_mla_item(item) and item.get_closest_marker("timeout") is None:
            item.add_marker(pytest.mark.timeout(seconds))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
    """Every phase pytest counts of an MLA test leaves with exactly one record (see runner.collect)."""
    report = yield
    if is_mla_item(item) or has_record(item):
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
    from mlaconf.golden import progress
    from mlaconf.golden.store import GoldenStore

    root = pytestconfig.getoption("mla_golden_dir") or os.environ.get("MLA_GOLDEN_DIR")
    store = GoldenStore(Path(root) if root else None)
    write = progress.fd_writer(pytestconfig.stash[TERMINAL_FD])
    removers = [progress.add_listener(progress.Announcer(write)), progress.add_listener(on_demand_notice(write, store))]
    yield store
    for remove in removers:
        remove()


def on_demand_notice(write: Callable[[str], None], store: GoldenStore) -> Callable[[CaseWork], None]:
    """One line the first time this process builds a golden: a run that generates them says so (they may take
    minutes and hundreds of MB), and how to build them ahead."""
    told = False

    def listen(work: CaseWork) -> None:
        nonlocal told
        if not told and not work.finished:
            told = True
            write(
                f"golden: {work.case_id} is not in the store {store.root}: generating missing goldens on demand "
                f"('mlaconf regen SUITE --out {store.root}' builds them ahead)"
            )

    return listen


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
    """Attach result records and find the saved-outputs folder; see :class:`mlaconf.runner.collect.MlaReport`."""
    node = request.node
    assert isinstance(node, pytest.Item)
    return MlaReport(node, request.config.stash[STATE])


@pytest.hookimpl(trylast=True)  # after the collector's tables: the last word before pytest's counts
def pytest_terminal_summary(
    terminalreporter: pytest.TerminalReporter, exitstatus: int | pytest.ExitCode, config: pytest.Config
) -> None:
    """Known deviations for a selected backend that no selected case matched, then the run's verdict in one
    word and where its report is (controller only)."""
    if hasattr(config, "workerinput"):
        return
    stale_deviations(terminalreporter, config)
    html = config.stash[STATE].report_dir / "report.html"
    where = f"report: {html}" if html.is_file() else "no report written"
    final = config.stash[STATE].exit_status
    passed = int(exitstatus if final is None else final) == 0
    terminalreporter.write_sep("=", f"MLA run: {'PASS' if passed else 'FAIL'}; {where}", green=passed, red=not passed)


def stale_deviations(terminalreporter: pytest.TerminalReporter, config: pytest.Config) -> None:
    """Known deviations of a selected backend that no selected case matched, after a conformance run."""
    from mlaconf.judge.deviations import load_deviations

    ran_conformance = any(  # the suite's marker, which every report carries among its keywords
        "conformance" in getattr(report, "keywords", {})
        for reports in terminalreporter.stats.values()
        for report in reports
    )
    if not ran_conformance:
        return
    path = config.getoption("mla_deviations")
    stale = unmatched_deviations(config, load_deviations(Path(path) if path else None), backend_names(config))
    if stale:
        terminalreporter.section("known deviations matching no selected case", yellow=True)
        for line in stale:
            terminalreporter.line(f"  {line}")
