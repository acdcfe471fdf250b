"""``mlaconf coverage``: how much of the factor model the selected cases cover (what of it is said:
:mod:`mlaconf.golden.coverage.report`), and with ``--backend NAME`` how much the cases that backend runs to a
numeric verdict cover: a case counts unless a known deviation for that backend (judge/known_deviations.toml, at
any release the entry names) predicts a refusal or a numeric failure, so the ATB C route's real coverage is
visible without an NPU.  ``--complete`` then has the covering generator (golden/coverage/covering.py) write the
cheapest cases that backend answers which hold the tuples its cases leave open, and name the tuples none can.

The verb's work (its command line: :mod:`mlaconf.tools.verbs`); it lives here, above the judge, because the
deviations decide what a backend answers."""

from __future__ import annotations

import argparse
import collections
import json
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from mlaconf.golden.specs.spec import CaseSpec
    from mlaconf.judge.deviations import DeviationSet


def backend_name(name: str) -> str:
    """The name a backend's records carry (what the deviations match): a built-in's own, else its factory's."""
    from mlaconf.harness.registry import BUILTIN, BackendSelectionError, create, name_problem

    if name == "auto":
        raise BackendSelectionError("--backend auto: name the backend whose coverage to count")
    problem = name_problem(name)
    if problem:
        raise BackendSelectionError(problem)
    return name if name in BUILTIN else create(name).name


def answered(cases: Sequence[CaseSpec], backend: str, deviations: DeviationSet) -> tuple[list[CaseSpec], Any]:
    """The valid cases ``backend`` runs to a numeric verdict, and how many each deviation takes away."""
    kept, dropped = [], collections.Counter[str]()
    for spec in cases:
        if spec.expect_error is not None:
            continue  # error cases hold no level
        entry = deviations.unanswered(backend, spec)
        if entry is None:
            kept.append(spec)
        else:
            dropped[entry.id] += 1
    return kept, dropped


def completion(cases: Sequence[CaseSpec], name: str, t: int, accept: Any) -> tuple[list[CaseSpec], list[str]]:
    """The cheapest accepted cases holding the valid pairs (and, at t = 3, the structure triples) of the settled
    model that ``cases`` leave open, and the open tuples no accepted case the generator builds holds."""
    from mlaconf.facts.factors import load_model
    from mlaconf.golden.coverage.covering import Generator, targets
    from mlaconf.golden.coverage.levels import describe

    model = load_model().settled()
    generator = Generator(model, targets(model, t >= 3), cases, name, accept=accept)
    made = generator.run()
    return made, [describe(items) for items in generator.unreachable]


def cmd_coverage(args: argparse.Namespace) -> int:
    from mlaconf.facts.factors import FactorModelError
    from mlaconf.golden.coverage.covering import case_toml
    from mlaconf.golden.coverage.levels import coverage
    from mlaconf.golden.coverage.report import backlog_lines, selection_document, selection_lines, selections
    from mlaconf.golden.specs.spec import SpecError
    from mlaconf.harness.registry import BackendSelectionError
    from mlaconf.judge.deviations import DeviationError, load_deviations

    if args.show < 0:
        print("error: --show must be >= 0", file=sys.stderr)
        return 2
    if args.complete and not args.backend:
        print("error: --complete needs --backend NAME (the backend whose answered cases to complete)", file=sys.stderr)
        return 2
    try:
        chosen = selections(args)
        backend = backend_name(args.backend) if args.backend else None
        deviations = load_deviations() if backend else None
    except (SpecError, FactorModelError, BackendSelectionError, DeviationError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    documents, lines = [], []
    for name, cases in chosen:
        kept, dropped = (cases, None) if deviations is None else answered(cases, str(backend), deviations)
        found = coverage(kept, range(1, args.t + 1))
        document = selection_document(name if backend is None else f"{name} on {backend}", kept, found, args.show)
        lines += selection_lines(str(document["selection"]), kept, found, args.show)
        if backend is not None and dropped is not None:
            valid = sum(spec.expect_error is None for spec in cases)
            why = ", ".join(f"{entry} ({n})" for entry, n in dropped.most_common()) or "none"
            lines.append(f"  {backend} runs {len(kept)} of {valid} valid cases to a numeric verdict; the rest: {why}")
            document.update(backend=backend, valid_cases=valid, not_answered=dict(dropped))
        if args.complete:
            assert deviations is not None and backend is not None
            made, unreachable = completion(
                kept, name, args.t, lambda spec: deviations.unanswered(str(backend), spec) is None
            )
            lines.append(f"  {len(made)} case(s) {backend} answers complete it; {len(unreachable)} tuple(s) none can:")
            lines += [f"    {text}" for text in unreachable]
            lines += ["", *(case_toml(spec) for spec in made)]
            document.update(completion=[case_toml(spec) for spec in made], unreachable=unreachable)
        documents.append(document)
    if args.json:
        json.dump(documents, sys.stdout, indent=2)
        print()
        return 0
    print("\n".join([*lines, *backlog_lines(args.show)]))
    return 0
