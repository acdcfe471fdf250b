"""Sampled goldens: the rows a spec's ``rows`` chooses, and a golden built for them alone.

A sampled golden's rows equal, bit for bit, the same rows of the golden of every row built by the same row
kernels (a row's float64 values never depend on the rows built with it), and agree with the tile path's full
golden from the same inputs to float64 rounding; its inputs are drawn by blocks; its file holds the rows and why
each was chosen; its cost is its sample's."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest

from mlaconf.golden.building import cost
from mlaconf.golden.building.blocks import with_inputs
from mlaconf.golden.building.generate import build_golden, build_sampled
from mlaconf.golden.building.magnitudes import reference_and_magnitudes
from mlaconf.golden.specs.layout import row_valid, visible_keys
from mlaconf.golden.specs.sample import QUERY_TILE, choose_rows
from mlaconf.golden.specs.spec import DEFAULT_RANDOM_ROWS, CaseSpec, SpecError
from mlaconf.golden.specs.spec_build import build_case
from mlaconf.golden.specs.suites import load_suite
from mlaconf.golden.specs.types import REASONS, RowSample, reason_bit
from mlaconf.golden.store.directory import GoldenStore
from mlaconf.golden.store.h5file import SAMPLE_ROWS, read_golden
from mlaconf.golden.store.integrity import GoldenCorruptError

#: Small cases on every path of the row kernels: fp32 scores with a causal prefix and GQA (and fp16's flushed P),
#: bf16 in the 2-D layout, the fp16 score path (S stored), zero-length batches with large logits, the strided kv form.
CASES = {
    "causal-gqa": dict(
        q_seqlen=[300, 140], kv_seqlen=[500, 140], head_num=4, kv_head_num=2, mask_type="causal", kv_layout="padded"
    ),
    "bf16-2d": dict(q_seqlen=[200, 77], head_num=3, dtype="bf16", q_layout="2d"),
    "fp16-scores": dict(q_seqlen=[600], head_num=4, mask_type="mask_free"),
    "empty-batches": dict(q_seqlen=[0, 37, 0, 128, 0], head_num=4, kv_layout="padded", distribution="large_logits"),
    "strided": dict(q_seqlen=[129, 0, 300], head_num=2, mask_type="mask_free", kv_layout="strided", dtype="bf16"),
}


def spec_of(name: str, rows: object = 16) -> CaseSpec:
    return build_case({**CASES[name], "rows": rows}, source="test_sampled_goldens", index=0)


def every_row(spec: CaseSpec) -> RowSample:
    rows = np.flatnonzero(row_valid(spec))
    return RowSample(rows, np.zeros(rows.size, dtype=np.uint8))


@pytest.mark.parametrize("name", CASES)
def test_sampled_rows_equal_the_golden_of_every_row_bit_for_bit(name: str) -> None:
    spec = spec_of(name)
    sampled, everything = build_golden(spec), build_sampled(spec, every_row(spec))
    at = np.searchsorted(everything.sample.rows, sampled.sample.rows)
    assert np.array_equal(sampled.out, everything.out[at])
    assert sampled.magnitudes.keys() == everything.magnitudes.keys()
    for name_, values in sampled.magnitudes.items():
        assert np.array_equal(values.view(np.uint8), everything.magnitudes[name_][at].view(np.uint8)), name_


@pytest.mark.parametrize("name", CASES)
def test_a_sampled_golden_agrees_with_the_tile_paths_full_golden(name: str) -> None:
    """The tile path's golden of every row, from the sampled golden's inputs drawn whole again: the same float64
    values to rounding (BLAS sums in another order); the element bounds A and R within a bf16 step of the tile
    path's float32-lifted ones, never above them."""
    spec = spec_of(name)
    sampled = build_golden(spec)
    out, magnitudes = reference_and_magnitudes(with_inputs(sampled).inputs, cost.full_case(spec))
    full = dataclasses.replace(sampled, out=out, magnitudes=magnitudes)
    rows = sampled.sample.rows
    want = full.out.reshape(spec.total_q, -1)[rows]
    got = sampled.out.reshape(rows.size, -1)
    assert np.abs(got - want).max() <= 1e-13 * np.abs(want).max()
    for name_ in ("pv_abs", "pv_rss"):
        mine = sampled.magnitudes[name_].astype(np.float64).reshape(rows.size, -1)
        tiles = full.magnitudes[name_].astype(np.float64).reshape(spec.total_q, -1)[rows]
        assert (mine <= tiles).all() and (mine >= tiles * (1 - 2.0**-6)).all(), name_
    for name_ in ("score_absmax", "score_dot", "p_rss"):
        assert np.array_equal(sampled.magnitudes[name_], full.magnitudes[name_][rows]), name_


def test_the_sample_holds_each_chosen_row_with_its_reasons() -> None:
    """causal-gqa: batch 0 has 300 rows over 500 keys (offset 200), batch 1 140 rows over 140 keys."""
    spec = spec_of("causal-gqa", rows=5)
    sample = choose_rows(spec)
    rows, reasons = sample.rows, sample.reasons
    assert (np.diff(rows) > 0).all() and row_valid(spec)[rows].all()

    def why(row: int) -> set[str]:
        at = int(np.searchsorted(rows, row))
        return {r for r in REASONS if reasons[at] & reason_bit(r)} if at < rows.size and rows[at] == row else set()

    assert all("batch_edge" in why(row) for row in (0, 299, 300, 439))
    assert all("tile_edge" in why(row) for row in (QUERY_TILE - 1, QUERY_TILE, 255, 256, 427, 428))
    # q and attenOut are [T, 4 * 128]: element 2^16 starts row 128, 2^17 row 256; byte 2^16 (element 2^15) row 64
    assert all("q_offset" in why(row) for row in (63, 64, 127, 128, 255, 256))
    # batch 0's row i sees i + 201 keys: they end a 128-key block at rows 55 and 183; batch 1's at its row 127
    assert all("diagonal" in why(row) for row in (55, 56, 183, 184, 427, 428))
    assert sample.counts()["random"] == 5 and len(rows) == len(set(rows.tolist()))
    assert np.array_equal(choose_rows(spec).rows, rows) and np.array_equal(choose_rows(spec).reasons, reasons)


def test_key_crossings_choose_the_first_row_that_sees_the_key() -> None:
    """k of 2 kv heads is [B, S, 256] padded: element 2^16 is key 256 of batch 0, which causal row i sees from
    i = 256 - 200 on (offset 200); the row before it does not see it."""
    spec = spec_of("causal-gqa")
    reasons = dict(zip(*(a.tolist() for a in (choose_rows(spec).rows, choose_rows(spec).reasons)), strict=True))
    assert reasons[56] & reason_bit("kv_offset") and reasons[55] & reason_bit("kv_offset")
    assert visible_keys(spec)[56] == 257 and visible_keys(spec)[55] == 256


def test_a_case_without_rows_keeps_its_hash_and_inputs_and_its_twin_shares_them() -> None:
    full = build_case(CASES["bf16-2d"], source="test")
    assert "rows" not in full.content() and full.inputs_key == full.content_hash
    twin = dataclasses.replace(full, rows=DEFAULT_RANDOM_ROWS)
    assert twin.content_hash != full.content_hash and twin.inputs_key == full.inputs_key
    assert twin.case_id.endswith(f"sampled-{twin.short_hash}")
    assert build_case({**CASES["bf16-2d"], "rows": "sample"}, source="t").rows == DEFAULT_RANDOM_ROWS
    assert build_case({**CASES["bf16-2d"], "rows": "all"}, source="t").rows is None
    assert build_case(twin.content(), source="t") == twin  # a golden file's spec_json reads back


@pytest.mark.parametrize("value", ["some", -1, 1.5, True, [1]])
def test_a_bad_rows_value_names_the_field(value: object) -> None:
    with pytest.raises(SpecError, match=r"case 'x': field 'rows': must be 'all', 'sample' or a number"):
        build_case({**CASES["bf16-2d"], "rows": value, "name": "x"}, source="f.toml")


def test_a_suite_samples_the_cases_above_its_cost(tmp_path: Path) -> None:
    suite = tmp_path / "s.toml"
    suite.write_text(
        '[suite]\nname = "s"\nsample_above = 1e9\n\n'
        "[[case]]\nq_seqlen = [64]\nhead_num = 1\n\n"
        "[[case]]\nq_seqlen = [4096]\nhead_num = 8\n\n"
        '[[case]]\nq_seqlen = [4096]\nhead_num = 8\nseed = 1\nrows = "all"\n'
    )
    small, large, kept = load_suite(suite)
    assert (small.rows, large.rows, kept.rows) == (None, DEFAULT_RANDOM_ROWS, None)
    suite.write_text('[suite]\nsample_above = "big"\n[[case]]\nq_seqlen = [64]\nhead_num = 1\n')
    with pytest.raises(SpecError, match=r"suite\.sample_above"):
        load_suite(suite)


def test_no_shipped_case_is_sampled_but_the_long_suites() -> None:
    from mlaconf.golden.specs.suites import available_suites, suite_path

    for name in available_suites():
        if name != "long":
            assert not any(spec.sampled for spec in load_suite(suite_path(name))), name


def test_a_sampled_golden_is_stored_with_its_rows_and_read_back(tmp_path: Path) -> None:
    spec = spec_of("causal-gqa")
    store = GoldenStore(tmp_path, builder=build_golden)
    built = store.ensure(spec)
    golden, _ = read_golden(store.path_for(spec))
    assert golden.sample is not None and np.array_equal(golden.sample.rows, built.sample.rows)
    assert np.array_equal(golden.sample.reasons, built.sample.reasons) and np.array_equal(golden.out, built.out)
    assert golden.out.shape == (golden.sample.rows.size, spec.head_num, 128)
    assert golden.provenance["reference_computed_by"].startswith("float64 row kernels")
    assert cost.stored_bytes(spec) == pytest.approx(store.path_for(spec).stat().st_size, rel=0.05)


def test_a_golden_whose_rows_disagree_with_its_spec_is_refused(tmp_path: Path) -> None:
    from mlaconf.golden.store.directory import write_golden

    spec = spec_of("bf16-2d")
    golden = build_golden(spec)
    shuffled = dataclasses.replace(golden, sample=RowSample(golden.sample.rows[::-1].copy(), golden.sample.reasons))
    write_golden(shuffled, tmp_path / "g.h5", "test")
    with pytest.raises(GoldenCorruptError, match=SAMPLE_ROWS):
        read_golden(tmp_path / "g.h5")
    with pytest.raises(TypeError, match="needs a row sample"):
        write_golden(dataclasses.replace(golden, sample=None), tmp_path / "h.h5", "test")


def test_a_sampled_case_costs_its_sample() -> None:
    spec = spec_of("fp16-scores")
    full = cost.full_case(spec)
    rows = cost.golden_rows(spec)
    assert rows < spec.total_q and cost.golden_flops(full) == full.useful_flops
    pairs = int(visible_keys(spec)[choose_rows(spec).rows].sum())
    assert cost.golden_flops(spec) == 2 * (192 + 128) * spec.head_num * pairs
    assert cost.stored_bytes(spec) < cost.stored_bytes(full)


def test_verify_recompute_accepts_a_sampled_golden_and_names_a_changed_sample(tmp_path: Path) -> None:
    from mlaconf.golden.building.regen import compare_recomputed

    spec = spec_of("fp16-scores")
    stored, fresh = build_golden(spec), build_golden(spec)
    assert compare_recomputed(tmp_path / "g.h5", stored, fresh).problems == []
    other = RowSample(fresh.sample.rows, fresh.sample.reasons ^ np.uint8(1))
    problems = compare_recomputed(tmp_path / "g.h5", stored, dataclasses.replace(fresh, sample=other)).problems
    assert [p.dataset for p in problems] == [SAMPLE_ROWS]


def test_list_prints_a_sampled_cases_cost_beside_its_full_cost(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from mlaconf import main

    suite = tmp_path / "s.toml"
    suite.write_text('[suite]\nname = "s"\nsample_above = 0\n[[case]]\nq_seqlen = [600]\nhead_num = 4\n')
    main(["list", "--cases", str(suite), "--out", str(tmp_path / "store")])
    out = capsys.readouterr().out
    spec = load_suite(suite)[0]
    rows = choose_rows(spec).rows.size
    assert f"sampled {rows} of 600 rows (every row: " in out and "(1 sampled; every row of every case: " in out


def test_the_long_suite_samples_every_case_and_reaches_32_bit_offsets() -> None:
    from mlaconf.golden.specs.suites import suite_path, suites_in_all

    cases = {spec.name: spec for spec in load_suite(suite_path("long"))}
    assert "long" not in suites_in_all() and all(spec.sampled for spec in cases.values())
    assert {spec.max_kv for spec in cases.values()} >= {32768, 65536, 131072}
    for name, power in (("offsets-2e31-one-sequence", 31), ("offsets-2e32-batches", 32), ("offsets-2e31-h16", 31)):
        spec = cases[name]
        width = spec.head_num * 128  # attenOut's elements per token row
        assert spec.total_q * width > 2**power
        sample = choose_rows(spec)
        row = 2**power // width  # the row holding element 2^power (it starts the row here)
        for token in (row - 1, row):
            at = int(np.searchsorted(sample.rows, token))
            assert sample.rows[at] == token and sample.reasons[at] & reason_bit("q_offset"), (name, token)
