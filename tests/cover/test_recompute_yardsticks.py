"""``verify --recompute``'s yardsticks (golden/building/drift.py): the float64 reference within 1e-12 of |g| + A per
element, the baseline and its statistics within the baseline's own rounding bound; which library
computed each array; the dependency floors that install."""

from __future__ import annotations

import dataclasses
import re
import sys
from pathlib import Path

import numpy as np
import pytest

from mlaconf.golden.building import baseline, drift
from mlaconf.golden.building import regen as rg
from mlaconf.golden.building.generate import build_golden
from mlaconf.golden.building.reference import gemm_library
from mlaconf.golden.specs.spec import CaseSpec
from mlaconf.golden.specs.spec_build import build_case
from mlaconf.golden.specs.types import GoldenCase
from mlaconf.golden.store.directory import GoldenStore
from mlaconf.golden.store.h5file import read_golden
from tests.goldens import consistent, split_sum_gemm

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - python 3.10
    import tomli as tomllib

#: The fp16 score path (scores stored in fp16) and the fp32 one (bf16, causal after a 960-key prefix).
FP16 = build_case({"q_seqlen": [200], "head_num": 2, "dtype": "fp16", "mask_type": 0}, source="test")
BF16_CAUSAL = build_case(
    {"q_seqlen": [64], "kv_seqlen": [1024], "head_num": 2, "dtype": "bf16", "mask_type": 3, "kv_layout": "padded"},
    source="test",
)
X = Path("x.h5")


def _stored_and_other_path(spec: CaseSpec, monkeypatch: pytest.MonkeyPatch) -> tuple[GoldenCase, GoldenCase]:
    stored = build_golden(spec)
    with monkeypatch.context() as patch:
        patch.setattr(baseline, "gemm", split_sum_gemm)  # the baseline's GEMMs only, not the reference's
        fresh = build_golden(spec)
    return stored, fresh


@pytest.mark.parametrize("spec", [FP16, BF16_CAUSAL], ids=["fp16-score-path", "bf16-causal"])
def test_another_summation_order_moves_the_baseline_within_its_bound(
    spec: CaseSpec, monkeypatch: pytest.MonkeyPatch
) -> None:
    stored, fresh = _stored_and_other_path(spec, monkeypatch)
    assert np.array_equal(stored.out, fresh.out), "the reference's GEMMs are not the baseline's"
    moved_bits = np.count_nonzero(stored.baseline_out.view(np.uint16) != fresh.baseline_out.view(np.uint16))
    assert moved_bits > 0, "the other order must move some baseline element, or this test shows nothing"
    old, new = stored.baseline_stats, fresh.baseline_stats
    largest = max(abs(float(new[k]) - float(old[k])) / float(old[k]) for k in ("mean_rel_err", "rmse"))
    assert largest > 1e-6, "the statistics move by more than the old fixed 1e-6 limit allowed"
    result = rg.compare_recomputed(X, stored, fresh)
    assert result.problems == []
    [(what, size)] = result.moved
    assert what == "baseline moved within its bound"
    assert f"{moved_bits} of {stored.baseline_out.size} elements moved" in size and "statistics moved" in size


def test_a_baseline_beyond_its_bound_is_bad(monkeypatch: pytest.MonkeyPatch) -> None:
    stored, fresh = _stored_and_other_path(BF16_CAUSAL, monkeypatch)
    scaled = (stored.baseline_out.astype(np.float64) * 1.25).astype(stored.baseline_out.dtype)
    problems = rg.compare_recomputed(X, consistent(stored, baseline_out=scaled), fresh).problems
    assert [p.dataset for p in problems] == ["baseline/out"]
    assert re.search(
        r"beyond its rounding bound: [0-9]+ of [0-9]+ elements moved, largest .* \(([0-9.e+]+) of its",
        problems[0].message,
    )


def test_one_element_past_its_bound_is_bad() -> None:
    golden = build_golden(BF16_CAUSAL)
    bounds = [drift.baseline_bound(golden, rows) for rows in drift.all_rows(golden)]
    bound = np.concatenate(bounds).reshape(-1)
    at = int(np.argmax(bound))
    for factor, bad in ((0.5, False), (2.0, True)):
        moved = golden.baseline_out.astype(np.float64)
        moved.flat[at] += factor * bound[at]
        fresh = consistent(golden, baseline_out=moved.astype(golden.baseline_out.dtype))
        result = rg.compare_recomputed(X, golden, fresh)
        assert [p.dataset for p in result.problems] == (["baseline/out"] if bad else [])
        assert [what for what, _ in result.moved] == ([] if bad else ["baseline moved within its bound"])


def test_statistics_must_be_their_own_baselines(monkeypatch: pytest.MonkeyPatch) -> None:
    """A move of the baseline allows its statistics to move with it, never to differ from what it gives."""
    stored, fresh = _stored_and_other_path(FP16, monkeypatch)
    assert rg.compare_recomputed(X, stored, fresh).problems == []
    for side in ("stored", "recomputed"):
        golden = stored if side == "stored" else fresh
        wrong = dict(golden.baseline_stats, rmse=float(golden.baseline_stats["rmse"]) * 1.0001)  # inside the move
        pair = (dataclasses.replace(stored, baseline_stats=wrong), fresh)
        if side == "recomputed":
            pair = (stored, dataclasses.replace(fresh, baseline_stats=wrong))
        problems = rg.compare_recomputed(X, *pair).problems
        assert [p.dataset for p in problems] == ["baseline (attributes)"]
        assert problems[0].message.startswith(f"{side} baseline statistics are not their baseline's: rmse ")


def test_statistics_beyond_what_the_move_allows_are_bad(monkeypatch: pytest.MonkeyPatch) -> None:
    """Statistics that are their baseline's but moved further than the element-wise move allows: the
    bookkeeping of the allowance itself (a mean over fewer elements, say) would be wrong."""
    stored, fresh = _stored_and_other_path(FP16, monkeypatch)
    found = drift.baseline_drift(stored, fresh)
    assert found.stat_problems() == [] and found.moved > 0
    old, new, allowed = found.stats["mean_rel_err"]
    assert 0 < abs(float(new) - float(old)) <= allowed  # type: ignore[arg-type]
    tight = dataclasses.replace(found, stats=dict(found.stats, mean_rel_err=(old, new, allowed * 1e-3)))
    assert [p.split()[0] for p in tight.stat_problems()] == ["mean_rel_err"]


def test_statistics_allowance_bounds_any_move_of_the_errors() -> None:
    """The triangle inequality per statistic: random errors moved by at most d stay within the allowance."""
    rng = np.random.default_rng(5)
    g = rng.normal(size=4000)
    b_old = g + rng.normal(scale=1e-3, size=g.size)
    for _ in range(20):
        d = np.abs(rng.normal(scale=10.0 ** rng.uniform(-6, -3), size=g.size)) * (rng.random(g.size) < 0.3)
        b_new = b_old + d * rng.choice([-1.0, 1.0], size=g.size)
        floor = drift.REL_FLOOR["bf16"]
        den = np.maximum(np.abs(g), floor)
        rel_old, rel_new = np.abs(b_old - g) / den, np.abs(b_new - g) / den
        allowance = drift.stats_allowance(g.size, d.max(), (d / den).max(), (d / den).sum(), np.square(d).sum())
        rms = (np.sqrt(np.mean(np.square(b_new - g))), np.sqrt(np.mean(np.square(b_old - g))))
        assert abs(rms[0] - rms[1]) <= allowance["rmse"] * (1 + 1e-12)
        assert abs(rel_new.mean() - rel_old.mean()) <= allowance["mean_rel_err"] * (1 + 1e-12)
        assert abs(rel_new.max() - rel_old.max()) <= allowance["max_rel_err"] * (1 + 1e-12)


def test_the_reference_is_judged_per_element_against_g_plus_a() -> None:
    golden = build_golden(BF16_CAUSAL)
    scale = np.abs(golden.out) + golden.magnitudes["pv_abs"].astype(np.float64).reshape(golden.out.shape)
    within = consistent(golden, out=golden.out + 0.5e-12 * scale)  # beyond 1e-12 of max |g| somewhere
    assert np.abs(within.out - golden.out).max() > 1e-12 * np.abs(golden.out).max()
    result = rg.compare_recomputed(X, golden, within)
    assert result.problems == [] and result.moved[0][0] == "reference moved within its agreement"
    assert "of |g|+A (limit 1e-12)" in result.moved[0][1]
    one = golden.out.copy()
    one.flat[int(np.argmin(scale))] += 3e-12 * scale.flat[int(np.argmin(scale))]  # the smallest scale
    problems = rg.compare_recomputed(X, golden, consistent(golden, out=one)).problems
    assert [p.dataset for p in problems] == ["golden/out"]
    assert problems[0].message.startswith("reference drift: 1 elements moved")


@pytest.mark.parametrize("where", [0, -1])
def test_a_nan_ratio_in_any_chunk_is_infinitely_far(where: int) -> None:
    """A NaN ratio (an infinity that changed sign) fails the yardstick wherever it lies among the chunks."""
    ratio = np.zeros(8)
    ratio[where] = np.nan
    assert drift.worst_ratio(ratio) == np.inf
    assert drift.worst_ratio(np.array([0.25, 0.5])) == 0.5


def test_provenance_names_the_library_that_computed_each_array(tmp_path: Path) -> None:
    golden = build_golden(FP16)
    library = gemm_library()
    assert golden.provenance["reference_computed_by"] == f"float64 GEMMs in {library}"
    assert golden.provenance["baseline_computed_by"] == f"float32 GEMMs in {library}"
    assert "numpy" in golden.provenance["inputs_computed_by"]
    assert "torch" in library and "MKL_CBWR" in library and "CPU capability" in library
    store = GoldenStore(tmp_path)
    older = {k: v for k, v in golden.provenance.items() if not k.endswith("_computed_by")}  # a golden from before
    path = store.save(dataclasses.replace(golden, provenance=older))
    assert read_golden(path)[0].provenance == older


def test_the_declared_dependency_floors_install_together() -> None:
    """numpy 1.26 resolves only with ml_dtypes 0.5.4 (0.6 and later require numpy 2): the floors declared
    are that measured pair, not a numpy floor no ml_dtypes in range accepts by default."""
    project = tomllib.loads((Path(__file__).parents[2] / "pyproject.toml").read_text())
    floors = {}
    for requirement in project["project"]["dependencies"]:
        match = re.fullmatch(r"([A-Za-z0-9_.-]+)>=([0-9.]+)", requirement)
        if match:
            floors[match[1]] = tuple(int(x) for x in match[2].split("."))
    assert floors["numpy"] >= (1, 26) and floors["ml_dtypes"] >= (0, 5, 4)
    assert floors["ml_dtypes"] < (0, 6), "above 0.5 ml_dtypes needs numpy 2: the numpy floor would be untrue"
