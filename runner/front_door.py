"""The MLA run's front door: every usage error a run's options can make, said in one line before any test
runs, and the run facts they give run.json.

Checked on the controller only, and only what the user named, so a session that uses no MLA option (the
framework's own tests) stays inert: a backend that names nothing or whose factory raises, a golden store
that cannot serve (not a directory, empty and unwritable, or unwritable and lacking goldens the selection
needs), an unknown policy, a misspelt suite, a suite or ``--mla-cases`` file that does not parse or holds
no case (an empty selection is not a pass), a malformed ``--mla-shard``, ``--mla-resume`` without the run
directory to continue.  The session (:mod:`mlaconf.runner.suites_plugin`) turns a refusal into pytest's usage
error, and a named report directory then ends ``usage_error``
(:meth:`mlaconf.runner.run_directory.Run.end_with_usage_error`).
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import pytest

from mlaconf.facts.near_miss import did_you_mean
from mlaconf.facts.shard import parse_shard
from mlaconf.golden.store.locations import chosen_root, golden_dir_problem
from mlaconf.harness import registry
from mlaconf.reports import env
from mlaconf.reports.rundir import REPORTS_DIR
from mlaconf.runner.identity import policy_name
from mlaconf.runner.run_directory import STATE, ReportState, set_run_info
from mlaconf.runner.selection import DEFAULT_SUITE, load_cases, policy_problem, selected_cases, suite_choices


def report_state(config: pytest.Config) -> ReportState:
    """The session's state from its options (every process, xdist workers too): where the run goes, its
    name, shard and whether it resumes; a malformed ``--mla-shard`` or a resume without its directory
    is a usage error."""
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
    else:  # what the golden_store fixture will open
        set_run_info(config, "golden_store", str(chosen_root().resolve()))
    policy, tolerances = policy_name(config), config.getoption("mla_tolerances")
    if policy != "default" or tolerances:
        problem = policy_problem(policy, tolerances, "--mla-policy")
        if problem:
            raise pytest.UsageError(problem)
    set_run_info(config, "policy", policy)
    suites = config.getoption("mla_suite") or ([] if config.getoption("mla_cases") else [DEFAULT_SUITE])
    unknown = [name for name in suites if name not in suite_choices()]
    if unknown:
        choices = suite_choices()
        hint = did_you_mean(unknown[0], choices)
        raise pytest.UsageError(f"--mla-suite {unknown[0]!r}: no such suite{hint}; choose from {', '.join(choices)}")
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
