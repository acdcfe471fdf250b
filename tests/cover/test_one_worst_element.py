"""A failure names one worst element: the one furthest beyond its own bound by the worst deciding check
that bounds single elements (the error model's error/bound ratio, ATB's scaled error within e), said in
one line (where, golden, got, error, bound) that the failure text, the record, the page and the repro
print alike; the metrics' own largest scaled error is named only when no deciding check bounds an
element, and then without a bound."""

from __future__ import annotations

import dataclasses

from mlaconf.judge.error_model import ModelResult
from mlaconf.judge.metrics import Element
from mlaconf.judge.policy import VerdictContext, load_policies
from mlaconf.reports.html import case_details
from tests.cover.test_policy import CTX16, _base_metrics

ELEMENT = Element(1, 5, 37, 3, 9, 0.5, 0.75, "model:max_err_over_bound", 0.25, 0.0625)
WHERE = (
    "batch 1 row 5 (token 37) head 3 col 9: golden 0.5, got 0.75, error 0.25, bound 0.0625 "
    "(by model:max_err_over_bound)"
)
#: The metrics' own largest scaled error: another element.
SCALED = Element(0, 2, 2, 1, 4, 2.0, 2.5, "metric:atb_max_scaled_err", 0.5)


def _model(ratio: float) -> ModelResult:
    return ModelResult(ratio, 100, 3, 7.0, dataclasses.replace(ELEMENT, bound=0.25 / ratio), {"pv_accum": 0.2})


def _ctx(ratio: float) -> VerdictContext:
    return dataclasses.replace(CTX16, model=_model(ratio))


def test_the_element_reads_the_same_in_every_form() -> None:
    assert ELEMENT.text() == WHERE
    record = ELEMENT.to_dict()
    assert record["text"] == WHERE and Element.from_dict(record) == ELEMENT


def test_a_failing_verdict_names_the_deciding_checks_element_once() -> None:
    policy = load_policies().resolve("default", "x", "fp16", "causal", "c")
    verdict = policy.evaluate(_base_metrics(worst=SCALED), None, _ctx(4.0))
    summary = verdict.summary()
    assert not verdict.passed and verdict.worst == ELEMENT
    assert summary.count("batch ") == 1 and summary.endswith(f"Worst element: {WHERE}."), summary


def test_atb_names_its_element_with_its_own_bound() -> None:
    """ATB's rule bounds each element by e max(1, |g|): the element's error over that bound is the rule's slack."""
    policy = load_policies().resolve("atb", "x", "fp16", "causal", "c")
    verdict = policy.evaluate(_base_metrics(worst=SCALED, atb_max_scaled_err=0.25), None, _ctx(4.0))
    check = next(c for c in verdict.checks if c.rule == "atb")
    assert not verdict.passed and verdict.worst is not None
    assert verdict.worst.located_by == "atb:atb_max_scaled_err"
    assert verdict.worst.bound == check.bound * 2.0  # e max(1, |golden 2.0|)
    assert verdict.worst.error / verdict.worst.bound == check.slack
    assert verdict.worst.text().endswith("error 0.5, bound " + f"{check.bound * 2:.6g} (by atb:atb_max_scaled_err)")


def test_without_an_elementwise_rule_the_metrics_name_the_element_without_a_bound() -> None:
    policy = load_policies().resolve("benchmark", "x", "fp16", "causal", "c")
    verdict = policy.evaluate(_base_metrics(worst=SCALED, max_rel_err=1.0), None, _ctx(4.0))
    assert verdict.worst == SCALED
    assert verdict.worst_element.endswith("error 0.5, no elementwise bound (by metric:atb_max_scaled_err)")


def test_the_page_names_the_records_element_and_no_other() -> None:
    """The failing case's details print the record's line; an older record's ``worst_*`` metrics (the
    metrics' own element) are left out of its metric table."""
    record = {
        "case_id": "c",
        "backend": "b",
        "verdict": "failed",
        "worst_element": ELEMENT.to_dict(),
        "metrics": {"rmse": 0.1, "worst_token": 2, "worst_expected": 2.0},
    }
    page = case_details(record)
    assert f"<b>worst element:</b> {WHERE}</p>" in page
    assert "worst_token" not in page and "worst_expected" not in page and "rmse" in page
