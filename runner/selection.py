"""Which cases and backends a run selects, and how each becomes a pytest parameter."""

from __future__ import annotations

import dataclasses
import functools
import re
from fnmatch import fnmatchcase
from pathlib import Path

import pytest

from mlaconf.golden.specs.spec import CaseSpec, SpecError
from mlaconf.golden.specs.suites import (
    RelationTable,
    available_suites,
    load_relations,
    load_suite,
    load_suites,
    suite_path,
    suite_paths,
)
from mlaconf.judge.deviations import DeviationSet

ERROR_SUITE = "errors"
#: The marker of a test that runs one case: its id and content hash (``--mla-shard`` splits by the hash).
CASE_MARKER = "mla_case"
#: The metamorphic relations (``cases/test_metamorphic.py``; their cases and ``[relations.NAME]`` tables:
#: ``metamorphic.toml``, whose cases run under the relations only, never as conformance cases).
METAMORPHIC_SUITE = "metamorphic"
ALL_SUITES = "all"
DEFAULT_SUITE = "smoke"


def suite_choices() -> list[str]:
    """What ``--mla-suite`` and ``mlaconf run --suite`` accept: the value suites in the suites folder,
    the metamorphic suite, and all."""
    value_suites = [name for name in available_suites() if name not in (ERROR_SUITE, METAMORPHIC_SUITE)]
    return [*value_suites, METAMORPHIC_SUITE, ALL_SUITES]


def runs_metamorphic(config: pytest.Config) -> bool:
    """Whether the run selects the metamorphic relations: named, within ``all``, or no suite filter at
    all (no ``--mla-suite``, no ``--mla-cases``).  A suite of one's own (``--mla-suite mine``) runs alone."""
    suites = config.getoption("mla_suite") or []
    if config.getoption("mla_cases"):
        return METAMORPHIC_SUITE in suites
    return not suites or bool({METAMORPHIC_SUITE, ALL_SUITES} & set(suites))


def policy_problem(policy: str, tolerances: str | None, option: str) -> str | None:
    """Why ``policy`` is no policy of the tolerance file, as one line naming ``option``, the spelling
    the user typed (``--mla-policy`` in pytest, ``--policy`` in ``mlaconf run``); None when it is one."""
    from mlaconf.judge.policy import load_policies

    try:
        names = set(load_policies(Path(tolerances) if tolerances else None).policies)
    except Exception as exc:
        return f"--mla-tolerances {tolerances or '(built-in)'}: {exc}"
    if policy in names:
        return None
    return f"{option} {policy!r}: no such policy; choose from {', '.join(sorted(names))}"


_NOT_IDENTIFIER = re.compile(r"[^0-9A-Za-z_]")


def marker_name(name: str) -> str:
    """Any name as a marker name (``torch-cpu`` -> ``torch_cpu``, ``my.mod:f`` -> ``my_mod_f``)."""
    cleaned = _NOT_IDENTIFIER.sub("_", name)
    return cleaned if cleaned[:1].isalpha() or cleaned[:1] == "_" else f"_{cleaned}"


def mark(config: pytest.Config, name: str, description: str) -> pytest.MarkDecorator:
    """A marker registered on first use, so ``--strict-markers`` accepts names only a run knows."""
    marker = marker_name(name)
    if not any(line.split(":")[0].split("(")[0].strip() == marker for line in config.getini("markers")):
        config.addinivalue_line("markers", f"{marker}: {description}")
    decorator: pytest.MarkDecorator = getattr(pytest.mark, marker)
    return decorator


def load_cases(config: pytest.Config) -> list[CaseSpec]:
    """Every case the run's suite options name (a bad suite file is a usage error)."""
    return _load(config)


def _load(config: pytest.Config) -> list[CaseSpec]:
    """Every case the run's suite options name, error cases included."""
    cases_file = config.getoption("mla_cases")
    try:
        if cases_file:
            return load_suite(cases_file)
        paths = suite_paths(config.getoption("mla_suite") or [DEFAULT_SUITE])
        relations = suite_path(METAMORPHIC_SUITE)  # its cases run under the relations only
        return [case for path in paths if path != relations for case in load_suite(path)]
    except SpecError as exc:  # a bad suite file is the user's input: say what and where, no traceback
        raise pytest.UsageError(str(exc)) from exc


def reseeded(config: pytest.Config, cases: list[CaseSpec]) -> list[CaseSpec]:
    """Every case once per seed of ``--mla-seeds`` (the one reader of that option), else as it is."""
    seeds = config.getoption("mla_seeds")
    if not seeds:
        return cases
    try:
        values = [int(s) for s in seeds.split(",") if s.strip()]
    except ValueError as exc:
        raise pytest.UsageError(f"--mla-seeds: expected comma-separated integers, got {seeds!r}") from exc
    return [with_seed(c, seed) for c in cases for seed in values]


def selected_cases(config: pytest.Config) -> list[CaseSpec]:
    """The value cases (no ``expect_error``) of the selected suites or ``--cases`` file."""
    return reseeded(config, [c for c in _load(config) if c.expect_error is None])


def error_cases(config: pytest.Config) -> list[CaseSpec]:
    """The error-contract cases: a ``--cases`` file's ``expect_error`` cases, else the shipped suite."""
    if config.getoption("mla_cases"):
        return [c for c in _load(config) if c.expect_error is not None]
    return load_suites([ERROR_SUITE])


@functools.cache
def relation_tables() -> dict[str, RelationTable]:
    """The metamorphic suite's relations, read and checked once per process."""
    return load_relations(suite_path(METAMORPHIC_SUITE))


def relation_table(function: str) -> RelationTable:
    """The table of the relation a test function checks (its name less ``test_``)."""
    name = function.removeprefix("test_")
    table = relation_tables().get(name)
    if table is None:
        path = suite_path(METAMORPHIC_SUITE)
        raise SpecError(str(path), "<file>", f"relations.{name}", f"no table for the relation test {function}")
    return table


def relation_cases(config: pytest.Config, function: str) -> list[CaseSpec]:
    """The cases a relation runs on, reseeded by ``--mla-seeds`` as every suite is; none unless the run
    selects the metamorphic suite (an empty parameter set deselects the test)."""
    if not runs_metamorphic(config):
        return []
    try:
        return reseeded(config, list(relation_table(function).cases))
    except SpecError as exc:  # the shipped file edited badly: say what and where, no traceback
        raise pytest.UsageError(str(exc)) from exc


def with_seed(case: CaseSpec, seed: int) -> CaseSpec:
    """The same case with another seed (and so another id and golden)."""
    fresh = dataclasses.replace(case, seed=seed, name="")
    return dataclasses.replace(fresh, name=fresh.case_id)


def case_param(config: pytest.Config, case: CaseSpec) -> object:
    """A case as a parameter: its id, and markers for dtype, mask, cache, suite and shard."""
    marks = [
        mark(config, case.dtype, f"dtype {case.dtype}"),
        mark(config, case.mask_name, f"maskType {case.mask_type}"),
        mark(config, case.cache_name, f"cacheMode {case.cache_mode}"),
        getattr(pytest.mark, CASE_MARKER)(case_id=case.case_id, content_hash=case.content_hash),
    ]
    if case.suite:
        marks.append(mark(config, case.suite, f"the {case.suite} suite"))
    return pytest.param(case, id=case.case_id, marks=marks)


def unmatched_deviations(config: pytest.Config, deviations: DeviationSet, backends: list[str]) -> list[str]:
    """Known-deviation entries for a selected backend that no selected case matches, whatever the version."""
    cases = selected_cases(config)
    stale = []
    for entry in deviations.entries:
        if not any(fnmatchcase(b, entry.backend) for b in backends):
            continue  # about another backend: not this run's business
        unversioned = dataclasses.replace(entry, versions="")
        if not any(unversioned.selects(b, None, c) for b in backends for c in cases):
            stale.append(entry.describe())
    return stale
