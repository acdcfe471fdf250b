"""The pytest entry point ``pytest11: mla``, loaded into every pytest session of every project where this
package is installed: so it imports almost nothing and does nothing at import.

It adds the ``--mla-*`` options (they belong in ``pytest --help``) and decides whether the session is an MLA
run (:func:`mla_requested`); only then does it register :mod:`mlaconf.runner.suites_plugin`, the suites' markers,
fixtures, parametrization, shard selection and reports.  Elsewhere pytest runs as if we were not installed
(tests/nocover/test_guest.py).
"""

from __future__ import annotations

import importlib
from typing import Any

import pytest

#: Whether this session is an MLA run (:func:`mla_requested`).
ACTIVE = pytest.StashKey[bool]()
#: dest -> default of every option of the plugin, filled by pytest_addoption (for mla_requested).
OPTION_DEFAULTS: dict[str, Any] = {}
#: Default per-test timeout of the MLA suites, in seconds (``--mla-timeout``).
DEFAULT_TIMEOUT_S = 900.0
#: Our hypothesis profiles' prefix (runner/hypothesis_profiles.py).
PROFILE_PREFIX = "mla-"


def pytest_addoption(parser: pytest.Parser) -> None:
    """The ``--mla-*`` options, in every session's ``pytest --help`` (the backend registry names the built-ins)."""
    from mlaconf.harness import registry

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


@pytest.hookimpl(tryfirst=True)  # before hypothesis reads --hypothesis-profile, which must name a registered one
def pytest_configure(config: pytest.Config) -> None:
    """An MLA run registers the suites' plugin (whose own ``pytest_configure`` runs at once); any other
    session is left alone.  ``--hypothesis-profile mla-...`` registers our profiles, so hypothesis finds them."""
    profile = config.getoption("hypothesis_profile", None)
    config.stash[ACTIVE] = mla_requested(config)
    # import_module, not ``from mlaconf.runner import ...``: that would reuse the module an earlier in-process
    # session (pytester) imported even after it left sys.modules, with hypothesis classes no longer current
    if config.stash[ACTIVE] or (isinstance(profile, str) and profile.startswith(PROFILE_PREFIX)):
        importlib.import_module("mlaconf.runner.hypothesis_profiles").register()
    if config.stash[ACTIVE]:
        config.pluginmanager.register(importlib.import_module("mlaconf.runner.suites_plugin"), "mla-suites")


def mla_requested(config: pytest.Config) -> bool:
    """An MLA run: an ``--mla-*`` option was given, or the run's paths reach the shipped suites.

    This is the plugin's one switch: outside such a run :mod:`mlaconf.runner.suites_plugin` is never imported,
    so no marker is registered, no hypothesis profile loaded, no thread variable set, no ``-n auto``
    overridden and no torch imported."""
    if any(getattr(config.option, dest, default) != default for dest, default in OPTION_DEFAULTS.items()):
        return True
    from mlaconf.golden.specs.suites import suites_dir

    suites = suites_dir().resolve()
    root = config.invocation_params.dir
    for arg in config.args:
        target = arg.split("::", 1)[0]
        if config.option.pyargs and target.split(".")[0] == "mlaconf":
            return True
        path = (root / target).resolve()
        if path == suites or suites in path.parents or path in suites.parents:
            return True
    return False


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_auto_num_workers(config: pytest.Config) -> int | None:
    """``-n auto`` in an MLA run: one worker per NPU or GPU; xdist's default on a CPU-only host."""
    if not config.stash.get(ACTIVE, False):
        return None
    from mlaconf.harness.devices import accelerator_count, auto_workers

    return auto_workers(accelerator_count())
