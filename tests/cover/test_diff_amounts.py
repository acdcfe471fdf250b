"""What the diff's words mean: "identical" says it means bit-identical outputs, "changed" says by
how much, and a fixed row labels each check by its role in its own run."""

from __future__ import annotations

from typing import Any

from mlaconf.reports import diff, diff_render
from tests.runs import record


def check(name: str, slack: float, decisive: bool = True) -> dict[str, Any]:
    rule, metric = name.split(":")
    return {"rule": rule, "metric": metric, "value": slack, "bound": 1.0, "slack": slack} | {
        "passed": slack <= 1.0,
        "decisive": decisive,
    }


#: A bf16 output whose largest |golden value| is 0.75: one ulp at that scale is 2^-8.
SCALE, SCALE_ULP = 0.75, 2.0**-8


def conformance(
    case: str, digest: str, model: float, ulp: float, verdict: str = "passed", element_ulps: float = 1.0, **extra: Any
) -> dict[str, Any]:
    """A conformance record whose largest error is ``ulp`` ulp of the output's scale (and ``element_ulps``
    representable values from its own golden element, as a sign flip next to zero makes thousands)."""
    metrics = {"max_abs_err": ulp * SCALE_ULP, "max_abs_expected": SCALE, "max_ulp_err": element_ulps}
    return record(
        case,
        dtype="bf16",
        verdict=verdict,
        output_sha256=digest * 64,
        worst_slack=model,
        checks=[check("model:max_err_over_bound", model), check("benchmark:rmse_ratio", 0.2)],
        metrics=metrics | {"rmse": 1e-5},
        **extra,
    )


def result(base: list[dict[str, Any]], cand: list[dict[str, Any]]) -> diff.DiffResult:
    cases, perf = diff.diff_records(base, cand)
    return diff.DiffResult("a", "b", cases, perf, [], [], baseline=len(base))


def test_identical_says_bit_identical() -> None:
    runs = [conformance(f"c{i}", "a", 0.2, 1.0) for i in range(3)]
    assert result(runs, runs).verdict() == (
        "GATE PASSES: 3 identical (bit-identical), 0 changed within tolerance, 3 of 3 baseline pairs compared"
    )
    # records without an output digest are identical by their evidence, and the verdict says so
    contract = record("e", suite="error_contract", output_sha256=None, error={"observed_status": "X"})
    assert result([*runs, contract], [*runs, contract]).identical_text() == (
        "4 identical (3 bit-identical, 1 same verdict and evidence, no output digest)"
    )


def test_changed_says_by_how_much() -> None:
    base = [conformance("moved", "a", 0.20, 1.0), conformance("still", "a", 0.2, 1.0)]
    cand = [conformance("moved", "b", 0.35, 3.0), conformance("still", "a", 0.2, 1.0)]
    res = result(base, cand)
    (moved,) = res.by_category("changed")
    assert moved.slack_change is not None and abs(moved.slack_change - 0.15) < 1e-12
    assert moved.slack_change_check == "model:max_err_over_bound"
    assert "largest slack change +0.15 (model:max_err_over_bound)" in moved.reasons
    assert "largest error vs golden 1 -> 3 ulp of the output's scale" in moved.reasons
    assert res.changed_text() == (
        "1 changed within tolerance (largest slack change +0.15 (model:max_err_over_bound, moved); "
        "largest error vs golden 1 -> 3 ulp of the output's scale)"
    )
    assert "1 identical (bit-identical), 1 changed within tolerance (largest slack change +0.15" in res.verdict()


def test_a_sign_flip_next_to_zero_is_not_thousands_of_ulp() -> None:
    """An element near zero whose sign flipped spans 29,887 representable values of its own, but its error
    is 2 ulp of the output's scale: the diff says the latter."""
    base = [conformance("flip", "a", 0.2, 1.5, element_ulps=152)]
    cand = [conformance("flip", "b", 0.3, 2.0, element_ulps=29887)]
    (moved,) = result(base, cand).by_category("changed")
    assert "largest error vs golden 1.5 -> 2 ulp of the output's scale" in moved.reasons
    assert not any("29887" in reason for reason in moved.reasons)


def test_a_passing_headline_names_its_fixes() -> None:
    failing = conformance("c", "a", 2.5, 9.0, verdict="failed")
    passing = [conformance("c", "b", 0.3, 1.0), conformance("d", "a", 0.2, 1.0)]
    verdict = result([failing, passing[1]], passing).verdict()
    assert verdict.startswith("GATE PASSES: 1 fixed, 1 identical (bit-identical)"), verdict


def test_a_fixed_row_labels_the_old_runs_deciding_check_by_its_own_role() -> None:
    """The candidate records the check as evidence only; in the base it decided and failed."""
    base = record(
        "c", verdict="failed", worst_slack=2.5, checks=[check("model:max_err_over_bound", 2.5)], output_sha256="a" * 64
    )
    cand = record(
        "c",
        worst_slack=0.3,
        checks=[check("model:max_err_over_bound", 0.4, decisive=False), check("benchmark:rmse_ratio", 0.3)],
        output_sha256="b" * 64,
    )
    res = result([base], [cand])
    (fixed,) = res.by_category("fixed")
    line = next(x for x in diff_render.terminal(res).splitlines() if x.startswith("FIXED"))
    assert "model:max_err_over_bound (evidence)" not in line, line
    assert (
        "model:max_err_over_bound (deciding in the base, evidence in the candidate) FAILED in the base "
        "slack 2.500->0.400" in line
    ), line
    assert fixed.evidence_checks == []
    # a check that is evidence only on both sides keeps its plain label
    both = record("c", checks=[check("atb:atb_max_scaled_err", 0.1, decisive=False)], output_sha256="c" * 64)
    moved = record("c", checks=[check("atb:atb_max_scaled_err", 0.2, decisive=False)], output_sha256="d" * 64)
    line = next(x for x in diff_render.terminal(result([both], [moved])).splitlines() if x.startswith("CHANGED"))
    assert "atb:atb_max_scaled_err (evidence) slack 0.100->0.200" in line, line
