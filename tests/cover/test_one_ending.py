"""One way to end a test: the suites' machinery returns an Ending, one place names it and makes the record,
and a numeric verdict's evidence is written by one builder (runner/ending.py)."""

from __future__ import annotations

import ast
from pathlib import Path

from mlaconf.golden.specs.spec_build import build_case
from mlaconf.runner.ending import Ending
from mlaconf.runner.identity import conformance_identity

ROOT = Path(__file__).resolve().parents[2]
#: The suites and their machinery, which end through runner/ending.py.
ENDING_THROUGH_ONE_PLACE = (
    "cases/test_conformance.py",
    "cases/test_error_contract.py",
    "cases/test_metamorphic.py",
    "cases/test_properties.py",
    "runner/conformance.py",
    "runner/metamorphic.py",
    "runner/perturb.py",
)
#: What only the one place does: name a test, make its record, hand pytest the outcome.
ONE_PLACE_NAMES = {"make_record", "make_identity", "identity", "conclude", "attach"}
#: The keys of a numeric verdict's evidence, written by ``verdict_evidence`` alone.
VERDICT_EVIDENCE = {"checks", "worst_slack", "metrics", "overrides", "error_map", "worst_element", "likely_cause"}


def _offences(path: str) -> list[str]:
    found = []
    for node in ast.walk(ast.parse((ROOT / path).read_text())):
        name = node.id if isinstance(node, ast.Name) else node.attr if isinstance(node, ast.Attribute) else None
        if name in ONE_PLACE_NAMES:
            found.append(f"{path}:{node.lineno} uses {name}")
        keys = [k.value for k in node.keys if isinstance(k, ast.Constant)] if isinstance(node, ast.Dict) else []
        keys += [k.arg for k in node.keywords] if isinstance(node, ast.Call) else []
        found += [f"{path}:{node.lineno} writes {key}" for key in keys if key in VERDICT_EVIDENCE]
    return found


def test_the_suites_name_no_test_and_write_no_verdict_evidence() -> None:
    offences = [line for path in ENDING_THROUGH_ONE_PLACE for line in _offences(path)]
    assert not offences, "\n".join(offences)


def test_an_ending_becomes_the_record_of_the_test_it_names() -> None:
    spec = build_case({"head_num": 1, "q_seqlen": [3]}, source="test", suite="mine")
    ending = Ending("xfailed", "known deviation: it", {"failing": ("x over its bound",), "deviation": "d-1"})
    record = ending.record(conformance_identity(spec, "some-backend", "strict"))
    assert (record.suite, record.case_id, record.backend, record.policy) == (
        "conformance",
        spec.case_id,
        "some-backend",
        "strict",
    )
    assert record.test == f"test_conformance[{spec.case_id}-some-backend]" and record.case_suite == "mine"
    assert (record.verdict, record.message, record.failing, record.deviation) == (
        "xfailed",
        "known deviation: it",
        ("x over its bound",),
        "d-1",
    )
