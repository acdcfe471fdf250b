"""Which test a record is about: its suite, test, case or relation and backend, built in one place.

A test's own process (an xdist worker or not) reads its markers and parameters (:func:`identity`);
the xdist controller, which collects nothing and knows a test that never reported its setup by its id
alone, reads the markers that test's function and module declare (:func:`declared_markers`) and the
rest from the id (:func:`identity_from_nodeid`).  Both read the suite from markers by one rule
(:func:`suite_of`) and end in :func:`make_identity`, so a record's identity fields have one author.
"""

from __future__ import annotations

import importlib
import warnings
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from mlaconf.golden.specs.suites import SUITES_PACKAGE, suites_dir
from mlaconf.reports.records import SUITES

if TYPE_CHECKING:
    from mlaconf.golden.specs.spec import CaseSpec
#: The parameter every MLA test runs under: the backend's selection name (:func:`is_mla_test`).
MLA_PARAMETER = "mla_backend_name"
#: Parameters that carry a test's case spec.
CASE_PARAMS = ("mla_conformance_case", "mla_error_case", "mla_relation_case")
#: Backend selection name -> the instance's ``name`` (filled when a backend is created).
BACKEND_LABELS: dict[str, str] = {}
#: Suites whose tests are named after the relation they check.
RELATION_SUITES = ("metamorphic", "property")
#: Suites judged under the run's tolerance policy.
POLICY_SUITES = ("conformance", "property")


def is_mla_test(item: pytest.Item) -> bool:
    """The one answer to "is this an MLA test?": a test that runs on a selected backend, under the plugin's
    :data:`MLA_PARAMETER` (never a generic fixture name a foreign project may also use).  Such a test ends
    with exactly one record, gets the suites' timeout and is accounted for if it never runs."""
    return MLA_PARAMETER in getattr(item, "fixturenames", ())


def is_mla_test_id(nodeid: str, rootdir: Path) -> bool:
    """:func:`is_mla_test` for a test known by its id only (the xdist controller collects nothing): every
    test of the suites package runs under :data:`MLA_PARAMETER` (tests/cover/test_plugin_entry.py holds
    the suites to it), so it is a parametrized test in a module there, never a foreign module that shares
    a name."""
    in_suites = (rootdir / nodeid.partition("::")[0]).resolve().parent == suites_dir().resolve()
    return in_suites and nodeid.endswith("]")


def policy_name(config: pytest.Config) -> str:
    """The run's tolerance policy (``--mla-policy``): the one place its name is read."""
    return str(config.getoption("mla_policy", None) or "default")


def declared_markers(nodeid: str) -> list[str]:
    """The marker names a shipped suite's test declares on its function and module (``pytestmark``),
    read from the code as pytest reads them for the item; none for a test outside the suites package."""
    path, _, rest = nodeid.partition("::")
    module_name, function = path.rsplit("/", 1)[-1].removesuffix(".py"), rest.partition("[")[0]
    if not module_name.isidentifier():
        return []
    try:
        with warnings.catch_warnings():  # read, not run: a session that registered no MLA marker may read them
            warnings.simplefilter("ignore", pytest.PytestUnknownMarkWarning)
            module = importlib.import_module(f"{SUITES_PACKAGE}.{module_name}")
    except ImportError:
        return []
    marks: list[Any] = []
    for owner in (module, getattr(module, function, None)):
        declared = getattr(owner, "pytestmark", [])
        marks += declared if isinstance(declared, list) else [declared]
    return [str(getattr(mark, "name", "")) for mark in marks]


def suite_of(markers: Iterable[str]) -> str:
    """A test's suite from its marker names (the first suite marker; conformance without one)."""
    names = set(markers)
    return next((suite for suite in SUITES if suite in names), SUITES[0])


def spec_fields(spec: CaseSpec) -> dict[str, Any]:
    """A case's identity fields in a record."""
    return {
        "case_id": spec.case_id,
        "case_suite": spec.suite or "",
        "spec": spec.content(),
        "dtype": spec.dtype,
        "mask": spec.mask_name,
        "cache": spec.cache_name,
    }


def relation_name(function: str) -> str:
    """A relation's name, for its record and its failure text alike: its test function's, without ``test_``."""
    return function.removeprefix("test_").replace("_", " ")


def make_identity(
    *,
    suite: str,
    test: str,
    function: str,
    backend: str,
    spec: CaseSpec | None = None,
    case_id: str = "",
    policy: str | None = None,
) -> dict[str, Any]:
    """A record's identity fields: the one function that writes them (see the module docstring)."""
    ident: dict[str, Any] = {"suite": suite, "test": test, "backend": backend}
    if spec is not None:
        ident.update(spec_fields(spec))
    if suite in RELATION_SUITES:
        ident["relation"] = relation_name(function)
    if suite in POLICY_SUITES and policy is not None:
        ident["policy"] = policy
    if case_id and not ident.get("case_id") and not ident.get("relation"):
        ident["case_id"] = case_id
    return ident


def conformance_identity(spec: CaseSpec, backend: str, policy: str) -> dict[str, Any]:
    """A conformance test's identity outside pytest (``mlaconf repro``, ``mlaconf power``): the test its id names."""
    return make_identity(
        suite="conformance",
        test=f"test_conformance[{spec.case_id}-{backend}]",
        function="test_conformance",
        backend=backend,
        spec=spec,
        policy=policy,
    )


def identity(item: pytest.Item) -> dict[str, Any]:
    """Which suite, test, case or relation and backend an item is, from its markers and parameters."""
    params: Mapping[str, Any] = getattr(getattr(item, "callspec", None), "params", {})
    name = str(params.get(MLA_PARAMETER, "?"))
    spec = next((params[p] for p in CASE_PARAMS if hasattr(params.get(p), "case_id")), None)
    return make_identity(
        suite=suite_of(marker.name for marker in item.iter_markers()),
        test=item.nodeid,
        function=getattr(item, "originalname", item.name),
        backend=BACKEND_LABELS.get(name, name),
        spec=spec,
        case_id=getattr(getattr(item, "callspec", None), "id", "") or item.name,
        policy=policy_name(item.config),
    )


def identity_from_nodeid(nodeid: str, backends: Mapping[str, str] | None = None) -> dict[str, Any]:
    """A test whose worker died before its setup was reported: the suite from the markers its code
    declares, the backend from the end of the parameter id (``backends``: selection name -> label),
    the case from the rest (a best guess)."""
    rest = nodeid.partition("::")[2]
    function, _, params = rest.partition("[")
    params = params.removesuffix("]")
    backend, case = "?", params
    by_id = {**{label: label for label in (backends or {}).values()}, **(backends or {})}  # a plug-in's id is its label
    for name in sorted(by_id, key=len, reverse=True):
        if params == name or params.endswith(f"-{name}"):
            backend, case = by_id[name], params[: -len(name)].rstrip("-")
            break
    ident = make_identity(suite=suite_of(declared_markers(nodeid)), test=nodeid, function=function, backend=backend)
    ident.setdefault("case_id", case or rest)  # the id's case part, beside a relation too: a guess needs both
    return ident
