"""Issue 32 item 4: a failure names one worst element.  The error model's check located its worst
element by error/bound ratio and the verdict named another (the largest scaled error of the
metrics); now the verdict names the one the worst deciding check located, and that check's note
no longer repeats it."""

from __future__ import annotations

import dataclasses

from mlaconf.judge.error_model import ModelResult
from mlaconf.judge.metrics import Element
from mlaconf.judge.policy import VerdictContext, load_policies
from tests.cover.test_policy import CTX16, _base_metrics

ELEMENT = Element(1, 5, 37, 3, 9, 0.5, 0.75, "model:max_err_over_bound")
WHERE = "batch 1 row 5 (token 37) head 3 col 9: expected 0.5, actual 0.75"


def _model(ratio: float) -> ModelResult:
    return ModelResult(ratio, 100, 3, 7.0, ELEMENT, 0.25, 0.25 / ratio, {"pv_accum": 0.2})


def _ctx(ratio: float) -> VerdictContext:
    return dataclasses.replace(CTX16, model=_model(ratio))


def test_a_failing_verdict_names_the_deciding_checks_element_once() -> None:
    policy = load_policies().resolve("default", "x", "fp16", "causal", "c")
    metrics = _base_metrics()
    assert WHERE.split(":")[0] not in metrics.worst_text()  # the metrics' own worst element differs
    verdict = policy.evaluate(metrics, None, _ctx(4.0))
    summary = verdict.summary()
    assert not verdict.passed
    assert verdict.worst_element == WHERE and verdict.worst == ELEMENT
    assert summary.count("batch ") == 1 and summary.endswith(f"Worst element: {WHERE}."), summary


def test_without_a_located_check_the_metrics_name_the_element() -> None:
    policy = load_policies().resolve("atb", "x", "fp16", "causal", "c")
    metrics = _base_metrics(atb_max_scaled_err=1.0)
    verdict = policy.evaluate(metrics, None, _ctx(4.0))
    assert not verdict.passed and verdict.worst_element == metrics.worst_text()
