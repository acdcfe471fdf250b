"""A quiet gate: identical runs diff to 0 changed and 0 perf in all four suites; a latency change
needs enough timed calls and a significant one-sided Mann-Whitney U test; rows lead with the
deciding check; no row lacks a reason; runs of differently named backends get a hint."""

from __future__ import annotations

import argparse
import random
from pathlib import Path
from typing import Any

import pytest

from mlaconf import verb_function
from mlaconf.reports import diff, diff_render, latency, verbs
from mlaconf.reports.records import ResultRecord, evidence_sha256
from tests.runs import write_run_dir


def record(suite: str, case: str = "c1", **values: Any) -> dict[str, Any]:
    relation = {"metamorphic": "determinism", "property": "random case matches float64 golden"}.get(suite, "")
    return ResultRecord.from_dict(
        {
            "schema_version": 2,
            "suite": suite,
            "test": f"cases/t.py::t[{case}]",
            "backend": "torch-cpu",
            "verdict": "passed",
            "case_id": case,
            "relation": relation,
            **values,
        }
    ).to_dict()


def metamorphic(digest: str | None, max_abs_diff: float = 0.0) -> dict[str, Any]:
    return record(
        "metamorphic",
        message="metamorphic determinism (exact) on c1 [backend torch-cpu ...]",
        difference={"kind": "exact", "max_abs_diff": max_abs_diff, "differing": 0, "problems": []},
        output_sha256=digest,
    )


def categories(base: list[dict[str, Any]], cand: list[dict[str, Any]]) -> dict[str, int]:
    cases, perf = diff.diff_records(base, cand)
    assert perf == []
    return {k: v for k, v in diff.DiffResult("a", "b", cases, perf, [], []).counts().items() if v}


def test_identical_runs_of_all_four_suites_are_identical() -> None:
    """Today's diff said "changed" for every metamorphic and property record (no output digest)."""
    run = [
        record("conformance", output_sha256="ab" * 32, worst_slack=0.3, timing={"latency_ms_median": 2.0}),
        metamorphic("cd" * 32),
        dict(metamorphic(None), case_id="c9"),  # from before relations carried a digest: the evidence decides
        record("property"),  # passed, no evidence: made from pytest's outcome
        dict(
            record("property", "c2", output_sha256="ef" * 32, examples={"count": 25, "derandomized": True}),
            relation="another property",
        ),
        record(
            "error_contract", error={"expected_status": "ERROR_INVALID_PARAM", "observed_status": "ERROR_INVALID_PARAM"}
        ),
    ]
    rerun = [dict(r, message=r.get("message", "") + " (gw1)") for r in run]  # messages name workers
    rerun[0]["timing"] = {"latency_ms_median": 18.4}  # 9.2x slower from one call: not compared
    assert categories(run, rerun) == {"identical": 6}


def test_a_relation_whose_outputs_changed_is_changed_with_a_reason() -> None:
    cases, _ = diff.diff_records([metamorphic("cd" * 32)], [metamorphic("ee" * 32)])
    (d,) = cases
    assert d.category == "changed" and "output differs (sha256 cdcdcdcd -> eeeeeeee)" in d.reasons
    cases, _ = diff.diff_records([metamorphic(None)], [metamorphic(None, max_abs_diff=0.5)])
    (d,) = cases
    assert d.category == "changed" and any("evidence differs: difference" in r for r in d.reasons)


def test_a_property_over_random_examples_that_held_twice_is_identical() -> None:
    random_a = record("property", output_sha256="aa" * 32, examples={"count": 60, "derandomized": False})
    random_b = record("property", output_sha256="bb" * 32, examples={"count": 60, "derandomized": False})
    assert categories([random_a], [random_b]) == {"identical": 1}
    fixed_a = record("property", output_sha256="aa" * 32, examples={"count": 25, "derandomized": True})
    fixed_b = record("property", output_sha256="bb" * 32, examples={"count": 25, "derandomized": True})
    cases, _ = diff.diff_records([fixed_a], [fixed_b])
    assert [(c.category, c.reasons) for c in cases] == [("changed", ["output differs (sha256 aaaaaaaa -> bbbbbbbb)"])]


def test_evidence_digest_ignores_timing_messages_and_node_ids() -> None:
    a = record("error_contract", message="on gw0", error={"observed_status": "ERROR_INVALID_PARAM"})
    b = dict(a, message="on gw3", test="other", timing={"latency_ms_median": 1.0})
    assert evidence_sha256(a) == evidence_sha256(b)
    assert evidence_sha256(a) != evidence_sha256(dict(a, error={"observed_status": "NO_ERROR"}))


def timed(ms: list[float], case: str = "c1") -> dict[str, Any]:
    return record("conformance", case, output_sha256="ab" * 32, timing={"latencies_ms": ms, "repeats": len(ms)})


def noise(median: float, n: int, seed: int) -> list[float]:
    rng = random.Random(seed)
    return [median * rng.uniform(0.9, 1.15) for _ in range(n)]


def test_latency_needs_enough_timed_calls() -> None:
    cases, perf = diff.diff_records([timed([1.0])], [timed([9.2])])
    assert perf == [] and cases[0].latency.startswith("not compared (1 vs 1 timed calls; needs 10 each)")
    few = latency.MIN_REPEATS - 1
    cases, perf = diff.diff_records([timed(noise(1.0, few, 1))], [timed(noise(5.0, few, 2))])
    assert perf == [] and cases[0].latency.startswith("not compared")


def test_latency_noise_is_no_regression_across_many_cases() -> None:
    base = [timed(noise(1.0 + k, 12, k), f"c{k}") for k in range(60)]
    cand = [timed(noise(1.0 + k, 12, 1000 + k), f"c{k}") for k in range(60)]
    cases, perf = diff.diff_records(base, cand)
    assert perf == [] and all(c.latency.startswith("unchanged") for c in cases)


def test_a_real_slowdown_is_reported_with_its_test() -> None:
    base = [timed(noise(1.0 + k, 12, k), f"c{k}") for k in range(60)]
    cand = [timed(noise(1.0 + k, 12, 1000 + k), f"c{k}") for k in range(60)]
    cand[7] = timed(noise(8.0 * 1.5, 12, 7), "c7")  # 1.5x slower on every call
    cases, perf = diff.diff_records(base, cand)
    assert [(p.case_id, p.repeats) for p in perf] == [("c7", (12, 12))]
    assert perf[0].p_value is not None and perf[0].p_value < latency.ALPHA / 60  # survives the Holm correction
    assert perf[0].ratio == pytest.approx(1.5, rel=0.15)
    text = diff_render.terminal(diff.DiffResult("a", "b", cases, perf, [], []))
    assert "PERF      c7 [torch-cpu]" in text and "Mann-Whitney U p = " in text and "12 / 12 timed calls" in text


def test_a_few_slow_calls_from_load_are_no_regression() -> None:
    """Load on a shared host inflates some calls (two in three, or one in three, 6x); a slower kernel is slower
    on its fastest call."""
    base = timed(noise(1.0, 12, 1))
    cand = timed([v * (6.0 if k % 3 else 1.0) for k, v in enumerate(noise(1.0, 12, 2))])
    cases, perf = diff.diff_records([base], [cand])
    assert perf == [] and cases[0].latency.startswith("unchanged"), cases[0].latency
    cand = timed([v * (6.0 if k % 3 == 0 else 1.0) for k, v in enumerate(noise(1.0, 12, 2))])
    cases, perf = diff.diff_records([base], [cand])
    assert perf == [] and cases[0].latency.startswith("unchanged"), cases[0].latency


def test_holm_correction() -> None:
    assert latency.holm_significant([0.001, 0.02, 0.004], alpha=0.01) == [True, False, True]
    assert latency.holm_significant([0.006, 0.006], alpha=0.01) == [False, False]


def checks(model: float, atb: float) -> list[dict[str, Any]]:
    return [
        {
            "rule": "model",
            "metric": "max_err_over_bound",
            "value": model,
            "bound": 1.0,
            "slack": model,
            "passed": model <= 1,
            "decisive": True,
        },
        {
            "rule": "benchmark",
            "metric": "rmse_ratio",
            "value": 0.4,
            "bound": 2.0,
            "slack": 0.2,
            "passed": True,
            "decisive": True,
        },
        {
            "rule": "atb",
            "metric": "atb_max_scaled_err",
            "value": atb,
            "bound": 0.0039,
            "slack": atb / 0.0039,
            "passed": atb <= 0.0039,
            "decisive": False,
        },
    ]


def conformance(verdict: str, model: float, atb: float, digest: str) -> dict[str, Any]:
    metrics = {"atb_max_scaled_err": atb, "max_rel_err": atb, "rmse": 1e-5}
    return record(
        "conformance",
        verdict=verdict,
        checks=checks(model, atb),
        worst_slack=model,
        metrics=metrics,
        output_sha256=digest * 64,
    )


def test_a_regressed_row_leads_with_the_deciding_check_not_the_evidence() -> None:
    """Today's rows cited "atb_max_scaled_err FAILING" (evidence, not deciding) instead of the model check."""
    base = conformance("passed", 0.8, 0.003, "a")
    cand = conformance("failed", 6.4, 0.005, "b")
    cases, _ = diff.diff_records([base], [cand])
    (d,) = cases
    assert d.category == "regressed" and d.deciding == ["model:max_err_over_bound"]
    line = next(
        x
        for x in diff_render.terminal(diff.DiffResult("a", "b", cases, [], [], [])).splitlines()
        if x.startswith("REGRESSED")
    )
    deltas = line.split(" | ", 1)[1]
    assert deltas.startswith("model:max_err_over_bound FAILING slack 0.800->6.400")
    assert "atb:atb_max_scaled_err (evidence) slack" in deltas and "atb_max_scaled_err FAILING" not in deltas
    assert "benchmark:rmse_ratio" not in deltas  # unchanged: nothing to say
    assert d.failing_metrics == ["max_err_over_bound"]
    md = diff_render.markdown(diff.DiffResult("a", "b", cases, [], [], []))
    assert "| model:max_err_over_bound FAILING slack 0.800->6.400" in md


def test_every_listed_row_has_a_reason() -> None:
    """Today's "changed" metamorphic and property rows had no reason and no delta."""
    base = [conformance("passed", 0.3, 0.001, "a"), metamorphic("cd" * 32), record("property", "p", verdict="failed")]
    base += [record("conformance", "gone", output_sha256="1" * 64)]
    cand = [
        conformance("passed", 0.31, 0.001, "b"),
        metamorphic("ee" * 32),
        record("property", "p", verdict="failed", shrunk={"toml": "[[case]]"}),
    ]
    cand += [record("conformance", "new", output_sha256="2" * 64)]
    cases, _ = diff.diff_records(base, cand)
    listed = [c for c in cases if c.category != "identical"]
    assert len(listed) == 5 and all(any(r for r in c.reasons) for c in listed), [(c.case_id, c.reasons) for c in listed]


def test_differently_named_backends_that_pair_nothing_get_a_hint(tmp_path: Path) -> None:
    base = write_run_dir(tmp_path / "a", [dict(record("conformance", f"c{k}"), backend="atb") for k in range(3)])
    cand = write_run_dir(tmp_path / "b", [dict(record("conformance", f"c{k}"), backend="torch-npu") for k in range(3)])
    result = diff.diff_dirs(base, cand)
    assert result.counts()["added"] == 3 and result.counts()["missing"] == 3
    assert any("--base-backend atb --cand-backend torch-npu" in n for n in result.notes), result.notes
    paired = diff.diff_dirs(base, cand, base_backend="atb", cand_backend="torch-npu")
    assert paired.counts()["identical"] == 3 and not any("--base-backend atb --cand" in n for n in paired.notes)


def test_the_diff_says_the_gates_verdict_first(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    base = write_run_dir(tmp_path / "a", [conformance("passed", 0.8, 0.003, "a"), record("conformance", "gone")])
    cand = write_run_dir(tmp_path / "b", [conformance("failed", 6.4, 0.005, "b")])
    result = diff.diff_dirs(base, cand)
    assert result.verdict() == "GATE FAILS: 1 regressed; 1 missing"
    assert result.verdict(allow_missing=True) == "GATE FAILS: 1 regressed"
    page = diff_render.render_html(result)
    body = page.split("<body>", 1)[1]
    assert body.index('class="banner fail"') < body.index("<table")
    assert "**GATE FAILS: 1 regressed; 1 missing**" in diff_render.markdown(result)
    again = write_run_dir(tmp_path / "c", [conformance("passed", 0.8, 0.003, "a"), record("conformance", "gone")])
    same = diff.diff_dirs(base, again)
    assert same.verdict() == (
        "GATE PASSES: 2 identical (1 bit-identical, 1 same verdict and evidence, no output digest), "
        "0 changed within tolerance, 2 of 2 baseline pairs compared"
    )
    assert 'class="banner pass"' in diff_render.render_html(same)
    # the verb prints the verdict right after the counts
    parser = argparse.ArgumentParser()
    verbs.register(parser.add_subparsers(dest="verb", required=True))
    args = parser.parse_args(["report", "diff", str(base), str(cand), "--allow-missing"])
    assert verb_function(args.func)(args) == 1
    assert capsys.readouterr().out.splitlines()[2] == "  GATE FAILS: 1 regressed"
