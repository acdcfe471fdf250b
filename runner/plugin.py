"""The MLA conformance pytest plugin (entry point ``pytest11: mla``): every option, marker,
fixture, parametrization, shard selection and output saving of the suites in ``cases/``.

Installed with the package, so ``pytest --pyargs mlaconf.cases`` and ``mlaconf run`` work from any
directory.  It stays inert in runs that use none of its fixtures: no backend is probed and no
report is written unless a test asks for one.
"""

from __future__ import annotations

import importlib.resources
import os
import signal
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from mlaconf.facts.operator import CACHE_NAMES, MASK_NAMES
from mlaconf.facts.processes import THREAD_ENV, kill_with_parent, usable_cpus
from mlaconf.facts.shard import in_shard, parse_shard
from mlaconf.golden.suites import SUITES_PACKAGE
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
    from mlaconf.golden.store import GoldenStore
    from mlaconf.harness.backend import Backend
    from mlaconf.judge.deviations import DeviationSet
    from mlaconf.judge.policy import PolicySet

MARKER = "mla_case"
BACKENDS = pytest.StashKey[list[str]]()
#: Selection name -> the backend's own name, for plug-ins selected by import path (test ids).
BACKEND_IDS = pytest.StashKey[dict[str, str]]()
#: Whether this session is an MLA run (:func:`mla_requested`).
ACTIVE = pytest.StashKey[bool]()
#: dest -> default of every option of the plugin, filled by pytest_addoption (for mla_requested).
OPTION_DEFAULTS: dict[str, Any] = {}
#: Default per-test timeout of the MLA suites, in seconds (``--mla-timeout``).
DEFAULT_TIMEOUT_S = 900.0
#: The real stderr, kept before pytest's capture redirects fd 2 (plugins load first): goldens that
#: take long to generate on demand announce themselves there, from xdist workers too.
_TERMINAL_FD = os.dup(2)


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("mla", "MLA prefill conformance")
    group.addoption(
        "--mla-backend",
        action="append",
        default=None,
        metavar="NAME",
        help="backend under test: a built-in name (" + ", ".join(registry.BUILTIN) + "), 'auto' "
        "(ATB, else CUDA, else CPU), or 'pkg.module:factory'; repeatable or comma-separated. "
        f"Default: ${registry.ENV_VAR} or auto.",
    )
    group.addoption(
        "--mla-suite",
        action="append",
        default=None,
        help="case suite(s) to run: a suite file's name in the suites folder (default smoke; 'all': every one)",
    )
    group.addoption(
        "--mla-cases",
        default=None,
        metavar="FILE",
        help="run the cases of this TOML suite file instead (its expect_error cases go to the error-contract suite)",
    )
    group.addoption(
        "--mla-seeds",
        default=None,
        metavar="S1,S2,...",
        help="run every case once per seed (replacing the suite's seed; new goldens)",
    )
    group.addoption(
        "--mla-golden-dir",
        default=None,
        metavar="DIR",
        help="golden store directory (default $MLA_GOLDEN_DIR, else .golden in the working directory)",
    )
    group.addoption("--mla-policy", default="default", help="tolerance policy from judge/tolerances.toml")
    group.addoption("--mla-tolerances", default=None, metavar="FILE", help="tolerance policy file")
    group.addoption("--mla-deviations", default=None, metavar="FILE", help="known-deviations file")
    group.addoption(
        "--mla-timing-repeats",
        type=int,
        default=1,
        metavar="N",
        help="timed backend calls per case (median reported; never part of the verdict)",
    )
    group.addoption(
        "--mla-likely-cause",
        action="store_true",
        default=False,
        help="judge every failing case against the likely-cause catalogue (default: only small cases, "
        "where it costs less than the case's golden)",
    )
    group.addoption("--mla-warmup", type=int, default=0, metavar="N", help="untimed backend calls before timing")
    group.addoption(
        "--mla-repeat",
        type=int,
        default=1,
        metavar="N",
        help="calls per conformance case whose outputs must agree bitwise (races); disagreeing runs are recorded",
    )
    group.addoption(
        "--mla-timeout",
        type=float,
        default=DEFAULT_TIMEOUT_S,
        metavar="SECONDS",
        help=f"per-test timeout of the MLA suites through pytest-timeout (default {DEFAULT_TIMEOUT_S:g}; "
        "0 = none); a test's own timeout marker, --timeout or the timeout ini value win. "
        "The test's record says 'timed out after N s in backend.run' (or where it hung)",
    )

    report = parser.getgroup("mla-report", "MLA conformance report")
    report.addoption(
        "--mla-report-dir",
        default=None,
        metavar="DIR",
        help="where results.jsonl, run.json and report.html go (default reports/out/<run-name>/ in "
        "the working directory); nothing is written when no test attached a record",
    )
    report.addoption(
        "--mla-resume",
        action="store_true",
        default=False,
        help="continue the interrupted run in --mla-report-dir: run only its selected tests without a "
        "record, with the same arguments, environment and goldens (else refused), into the same run",
    )
    report.addoption(
        "--mla-run-name", default=None, metavar="NAME", help="name of this run (default: timestamp + short host name)"
    )
    report.addoption(
        "--mla-shard",
        default=None,
        metavar="K/N",
        help="run only shard K of N: cases (mla_case marker) are split by their content hash, by "
        "the rule `mlaconf regen --shard` uses; tests without the marker run on shard 1 only",
    )
    report.addoption(
        "--mla-save-outputs",
        action="store_true",
        default=False,
        help="save each backend output (HDF5) under <report-dir>/outputs/",
    )
    for option in [*group.options, *report.options]:
        OPTION_DEFAULTS[option.dest] = option.attrs().get("default")


hypothesis_profiles.register()


@pytest.hookimpl(trylast=True)  # after hypothesis has loaded a --hypothesis-profile
def pytest_configure(config: pytest.Config) -> None:
    """Inert unless the run is an MLA run (:func:`mla_requested`): a guest in other projects' sessions."""
    config.stash[STATE] = report_state(config)
    config.stash[ACTIVE] = mla_requested(config)
    if not config.stash[ACTIVE]:
        return
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


def mla_requested(config: pytest.Config) -> bool:
    """An MLA run: an ``--mla-*`` option was given, or the run's paths reach the shipped suites.

    This is the plugin's one switch: outside such a run it registers no marker, loads no hypothesis
    profile, sets no thread variable, overrides no ``-n auto`` and imports no torch."""
    if any(getattr(config.option, dest, default) != default for dest, default in OPTION_DEFAULTS.items()):
        return True
    suites = Path(str(importlib.resources.files(SUITES_PACKAGE))).resolve()
    root = config.invocation_params.dir
    for arg in config.args:
        target = arg.split("::", 1)[0]
        if config.option.pyargs and target.split(".")[0] == "mlaconf":
            return True
        path = (root / target).resolve()
        if path == suites or suites in path.parents or path in suites.parents:
            return True
    return False


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
def pytest_xdist_auto_num_workers(config: pytest.Config) -> int | None:
    """``-n auto`` in an MLA run: one worker per NPU or GPU; xdist's default on a CPU-only host."""
    if not config.stash.get(ACTIVE, False):
        return None
    from mlaconf.harness.devices import accelerator_count, auto_workers

    return auto_workers(accelerator_count())


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
    if not config.stash.get(ACTIVE, False):
        return
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
    if not config.stash.get(ACTIVE, False):
        return
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
    if item.config.stash.get(ACTIVE, False) and (is_mla_item(item) or has_record(item)):
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

    remove = progress.add_listener(progress.Announcer(progress.fd_writer(_TERMINAL_FD)))
    root = pytestconfig.getoption("mla_golden_dir") or os.environ.get("MLA_GOLDEN_DIR")
    yield GoldenStore(Path(root) if root else None)
    remove()


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


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter, config: pytest.Config) -> None:
    """Known deviations for a selected backend that no selected case matched (controller only)."""
    from mlaconf.judge.deviations import load_deviations

    if not config.stash.get(ACTIVE, False) or hasattr(config, "workerinput"):
        return
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
