"""The record schema: one constructor, validated, round-trips, reads schema-1 records."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from mlaconf.reports.aggregate import failing_summary
from mlaconf.reports.records import (
    SCHEMA_VERSION,
    ErrorEvidence,
    Failure,
    RecordError,
    RelationEvidence,
    ResultRecord,
    record_key,
)
from mlaconf.reports.rundir import read_results, write_results


def test_round_trip_keeps_every_field_and_unknown_keys() -> None:
    record = ResultRecord(
        suite="metamorphic",
        test="cases/test_metamorphic.py::test_determinism[x-torch-cpu]",
        backend="torch-cpu",
        verdict="failed",
        case_id="x",
        relation="determinism",
        message="run 2 vs run 1: 3 differ",
        difference=RelationEvidence("exact", 0.5, 3, ("run 2 vs run 1: 3 differ",)),
        failure=Failure("timeout", "Timeout", "Timeout (>5.0s)", "backend.run", 5.0),
        extra={"outcome": "failed", "custom": [1, 2]},
    )
    data = json.loads(json.dumps(record.to_dict()))
    assert data["schema_version"] == SCHEMA_VERSION and data["custom"] == [1, 2]
    assert data["difference"] == {
        "kind": "exact",
        "max_abs_diff": 0.5,
        "differing": 3,
        "problems": ["run 2 vs run 1: 3 differ"],
    }
    assert ResultRecord.from_dict(data) == record
    assert record.failure is not None and record.failure.text() == "timed out after 5 s in backend.run"
    assert failing_summary(data) == "timed out after 5 s in backend.run"


def test_keys_tell_suites_apart() -> None:
    def key(**values: str) -> tuple[str, str]:
        return record_key(ResultRecord(test="t", backend="b", verdict="passed", **values).to_dict())

    assert key(suite="conformance", case_id="c") == ("c", "b")
    assert key(suite="error_contract", case_id="c") == ("error_contract:c", "b")
    assert key(suite="metamorphic", case_id="c", relation="batch order") == ("metamorphic:batch order:c", "b")
    assert key(suite="property", relation="random case") == ("property:random case", "b")
    assert key(suite="property", relation="random case", case_id="shrunk") == ("property:random case", "b")


@pytest.mark.parametrize(
    ("values", "fragment"),
    [
        ({"suite": "nope"}, "'suite': 'nope' is not one of"),
        ({"verdict": "great"}, "'verdict': 'great' is not one of"),
        ({"backend": ""}, "'backend' is empty"),
        ({"case_id": ""}, "needs a 'case_id' or a 'relation'"),
        ({"failure": {"kind": "meltdown"}}, "'failure.kind': 'meltdown'"),
        ({"error": "ERROR_X"}, "'error': expected an object"),
        ({"worst_element": [3, 0, 17]}, "'worst_element': expected an object"),
    ],
)
def test_invalid_records_name_the_field(values: dict[str, object], fragment: str) -> None:
    data = {
        "schema_version": 2,
        "suite": "conformance",
        "test": "t",
        "backend": "b",
        "verdict": "passed",
        "case_id": "c",
        **values,
    }
    with pytest.raises(RecordError, match=fragment.replace("(", r"\(")):
        ResultRecord.from_dict(data)


def test_schema_1_records_are_read_as_conformance(tmp_path: Path) -> None:
    old = {
        "case_id": "c",
        "backend": "atb",
        "suite": "smoke",
        "nodeid": "cases/test_conformance.py::t[c-atb]",
        "verdict": "failed",
        "error": {"status": 8, "name": "ERROR_INVALID_TENSOR_DIM", "stage": "setup"},
        "worst_slack": None,
        "metrics": {},
        "checks": [],
    }
    path = tmp_path / "results.jsonl"
    path.write_text(json.dumps(old) + "\n")
    (record,) = read_results(path)
    assert record["suite"] == "conformance" and record["case_suite"] == "smoke"
    assert record["test"] == old["nodeid"] and "nodeid" not in record
    parsed = ResultRecord.from_dict(record)
    assert parsed.error == ErrorEvidence(observed_status="ERROR_INVALID_TENSOR_DIM", observed_stage="setup")
    write_results(path, [record])
    assert read_results(path) == [record]
    assert record_key(record) == record_key(old) == ("c", "atb")  # old and new runs still pair up


def test_a_test_that_crashed_before_its_setup_report_is_still_named() -> None:
    from mlaconf.runner.identity import identity_from_nodeid

    nodeid = (
        "cases/test_metamorphic.py::test_batch_order[fp16-undefined-krope_ctkv-b3-s64-h4-q3d-packed-33abb953-my.mod:f]"
    )
    ident = identity_from_nodeid(nodeid, {"my.mod:f": "my-kernel", "f": "other"})
    assert ident == {
        "suite": "metamorphic",
        "test": nodeid,
        "backend": "my-kernel",
        "relation": "batch order",
        "case_id": "fp16-undefined-krope_ctkv-b3-s64-h4-q3d-packed-33abb953",
    }
    assert identity_from_nodeid("cases/test_conformance.py::test_conformance[c1-x]")["backend"] == "?"


def test_one_builder_validates_every_record_it_makes() -> None:
    from mlaconf.reports.records import make_record

    ident = {"suite": "error_contract", "test": "t", "backend": "atb", "case_id": "c"}
    failure = Failure("not_run", "", "never ran", "")
    record = make_record(ident, verdict="error", message=failure.text(), failure=failure)
    assert record.suite == "error_contract" and record.failure == failure
    assert "outcome" not in record.to_dict()  # one outcome key in results.jsonl: verdict
    assert make_record(ident, verdict="failed", case_id="d").case_id == "d"  # values win over the identity
    with pytest.raises(RecordError, match="'suite'"):
        make_record(dict(ident, suite="errors"), verdict="error")  # a case suite is no record suite
    with pytest.raises(RecordError, match="'verdict'"):
        make_record(ident, verdict="outcome")


def test_the_suite_comes_from_the_markers_by_one_rule() -> None:
    from mlaconf.runner.identity import declared_markers, make_identity, suite_of

    assert suite_of(["smoke", "fp16", "error_contract", "errors"]) == "error_contract"
    assert suite_of(["property", "metamorphic"]) == "metamorphic"  # the first in records.SUITES order
    assert suite_of([]) == "conformance"
    modules = {"conformance": "test_conformance", "error_contract": "test_error_contract"}
    modules.update(metamorphic="test_metamorphic", property="test_properties")
    for suite, module in modules.items():  # what the controller reads of a test it knows by id alone
        assert suite_of(declared_markers(f"cases/{module}.py::test_x[a-b]")) == suite
    assert declared_markers("tests/test_conformance_like.py::test[a]") == declared_markers("../x.py::t") == []
    ident = make_identity(suite="property", test="t", function="test_tolerance_any_case", backend="b", policy="p")
    assert ident == {"suite": "property", "test": "t", "backend": "b", "relation": "tolerance any case", "policy": "p"}
    plain = make_identity(suite="error_contract", test="t", function="f", backend="b", case_id="c", policy="p")
    assert plain == {"suite": "error_contract", "test": "t", "backend": "b", "case_id": "c"}  # not judged by a policy


def test_the_worst_element_is_optional_and_round_trips() -> None:
    """A record from before ``worst_element`` reads with none; one that names it keeps it."""
    older = {
        "schema_version": 2,
        "suite": "conformance",
        "test": "t",
        "backend": "b",
        "verdict": "failed",
        "case_id": "c",
    }
    assert ResultRecord.from_dict(older).worst_element is None
    named = {
        "token": 3,
        "head": 0,
        "column": 17,
        "expected": 0.5,
        "actual": 0.75,
        "located_by": "model:max_err_over_bound",
    }
    data = json.loads(json.dumps(ResultRecord.from_dict({**older, "worst_element": named}).to_dict()))
    assert data["worst_element"] == named and ResultRecord.from_dict(data).worst_element == named
