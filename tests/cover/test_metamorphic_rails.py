"""The metamorphic suite's name and failure class, on real runs of four relations (one small spec each)
on torch-cpu and two planted defects:

* a relation's name has one source (the test function, its ``metamorphic.toml`` table): the
  record's ``relation`` and the failure message's say the same (they once differed for two);
* an accuracy defect fails a tolerance relation as the conformance failure of its sides (message,
  ``conformance_failures``, the diff's "regressed"), not as a broken relation, while a defect that
  reads padding breaks the exact relation (the diff's relation_broken)."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from mlaconf.reports.diff import classify
from mlaconf.reports.rundir import read_results
from mlaconf.runner.selection import relation_tables
from tests.machine import HANG_S

REPO = Path(__file__).resolve().parents[2]
SUITE = REPO / "cases" / "test_metamorphic.py"
ACCURACY = "mlaconf.harness.defects:scale_twice"
READS_PADDING = "mlaconf.harness.defects:padding_rows_read"
#: The two relations whose names once differed, and one exact and one tolerance relation beside them.
RELATIONS = ("q_layout", "padded_vs_packed", "batch_order", "padding_contents")


@pytest.fixture(scope="module")
def records(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    report, store = tmp_path_factory.mktemp("meta") / "report", tmp_path_factory.mktemp("goldens")
    command = [sys.executable, "-m", "pytest", str(SUITE), "-p", "no:cacheprovider", "-q", "-n", "0"]
    command += ["--mla-report-dir", str(report), "-k", f"fp16-undefined and ({' or '.join(RELATIONS)})"]
    command += ["--mla-golden-dir", str(store)]  # the sides' goldens, built on demand, not in the checkout
    command += [arg for backend in ("torch-cpu", ACCURACY, READS_PADDING) for arg in ("--mla-backend", backend)]
    done = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=HANG_S)
    assert done.returncode == 1, done.stdout[-3000:] + done.stderr[-2000:]  # the defects fail
    return read_results(report / "results.jsonl")


def by(records: list[dict[str, Any]], relation: str, backend: str) -> dict[str, Any]:
    """The record of ``relation`` on ``backend`` (a defect by its catalogue name)."""
    (found,) = [
        r for r in records if r["relation"] == relation and r["backend"] in (backend, f"torch-cpu-defect-{backend}")
    ]
    return found


def test_every_relation_test_has_one_table_and_the_record_and_message_share_its_name(
    records: list[dict[str, Any]],
) -> None:
    functions = {
        node.name.removeprefix("test_")
        for node in ast.parse(SUITE.read_text()).body
        if isinstance(node, ast.FunctionDef) and node.name.startswith("test_")
    }
    assert functions == set(relation_tables())
    assert {r["relation"] for r in records} == {name.replace("_", " ") for name in RELATIONS}
    assert len(records) == 3 * len(RELATIONS)
    for r in records:
        kind = relation_tables()[r["relation"].replace(" ", "_")].kind
        assert r["message"].startswith(f"metamorphic {r['relation']} ({kind}) on "), r["message"]
        assert r["difference"]["kind"] == kind, r


def test_an_accuracy_defect_is_a_conformance_failure_and_reading_padding_breaks_the_relation(
    records: list[dict[str, Any]],
) -> None:
    for relation in ("batch order", "padded vs packed"):  # tolerance: each side against its golden
        base, cand = by(records, relation, "torch-cpu"), by(records, relation, "scale_twice")
        assert base["verdict"] == "passed" and cand["verdict"] == "failed", (base, cand)
        sides = cand["conformance_failures"]
        assert len(sides) == 2 and all(s["worst_slack"] > 1 for s in sides), sides
        assert cand["difference"]["problems"] == [], cand
        assert "conformance: side " in cand["message"] and "broken" not in cand["message"], cand["message"]
        pair = classify(base, cand, 1.5)
        assert pair.category == "regressed", pair
        assert any("fails its golden" in reason for reason in pair.reasons), pair.reasons
    base, cand = by(records, "padding contents", "torch-cpu"), by(records, "padding contents", "padding_rows_read")
    assert base["verdict"] == "passed" and cand["verdict"] == "failed", (base, cand)
    assert "conformance_failures" not in cand and cand["difference"]["problems"], cand
    assert "broken: garbage padding: " in cand["message"], cand["message"]
    assert classify(base, cand, 1.5).category == "relation_broken"
    # a record of a run before the field: its failure is read as a broken relation, as it was
    old = {k: v for k, v in by(records, "batch order", "scale_twice").items() if k != "conformance_failures"}
    old["difference"] = {**old["difference"], "problems": ["original: FAIL under policy 'default'"]}
    assert classify(by(records, "batch order", "torch-cpu"), old, 1.5).category == "relation_broken"
