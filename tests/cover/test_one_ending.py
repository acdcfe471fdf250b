"""One way to end a test: the suites' machinery returns an Ending, one place names it and makes the record,
and a numeric verdict's evidence is written by one builder (runner/ending.py)."""

from __future__ import annotations

import ast
from pathlib import Path

import mlaconf
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


def test_every_record_is_made_by_the_one_builder() -> None:
    """``make_record`` is called only by ``Ending.record``: pytest's outcomes, crashes and never-ran tests
    (the controller's and a lost Ray shard's) are endings too."""
    callers = []
    rooms = [ROOT / room for room in (*mlaconf.ROOMS, "mlaconf")]  # the product's files (never build/'s copies)
    for path in sorted(p for room in rooms for p in room.rglob("*.py")):
        if path.name.startswith("."):
            continue
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Call)
                and getattr(node.func, "id", getattr(node.func, "attr", None)) == "make_record"
            ):
                callers.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert callers == ["runner/ending.py:" + str(_line_of_make_record())], callers


def _line_of_make_record() -> int:
    source = (ROOT / "runner/ending.py").read_text().splitlines()
    return next(n for n, line in enumerate(source, 1) if "make_record(" in line and "import" not in line)


def test_a_never_ran_record_is_one_record_for_the_controller_and_a_lost_shard() -> None:
    from mlaconf.runner.ending import never_ran_record
    from mlaconf.tools.ray_run import not_run_records

    nodeid = "cases/test_conformance.py::test_conformance[bf16-causal-x-torch-cpu]"
    from_ray = not_run_records([nodeid], "1/2", "node died")[0]
    ident = {k: from_ray[k] for k in ("suite", "test", "backend", "case_id") if k in from_ray}
    direct = never_ran_record(ident, "shard 1/2 was lost on the Ray cluster (node died)").to_dict()
    assert from_ray["failure"] == direct["failure"] == {**direct["failure"], "kind": "not_run"}
    assert (from_ray["verdict"], from_ray["message"]) == (
        "error",
        "never ran: shard 1/2 was lost on the Ray cluster (node died)",
    )
