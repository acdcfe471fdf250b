"""A sampled case's inputs drawn by blocks: any rows alone equal the same rows of the whole tensors, the store keeps
their record (seed, generator, digests) instead of them, and a golden whose recorded digest this host does not
draw again is refused, naming the file and the tensor."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import h5py
import numpy as np
import pytest

from mlaconf import main
from mlaconf.golden.building.blocks import (
    BlockInputs,
    input_digests,
    inputs_record,
    regenerate_inputs,
    with_inputs,
)
from mlaconf.golden.building.generate import build_golden
from mlaconf.golden.building.inputs import generate_inputs
from mlaconf.golden.specs.layout import kv_views, q_views
from mlaconf.golden.specs.spec import CaseSpec, SpecError
from mlaconf.golden.specs.spec_build import build_case
from mlaconf.golden.specs.suites import load_suite
from mlaconf.golden.specs.types import TENSOR_NAMES
from mlaconf.golden.store.directory import GoldenStore, write_golden
from mlaconf.golden.store.h5file import INPUTS_RECORD, read_golden
from mlaconf.golden.store.integrity import BLOCK_GENERATOR, GoldenStaleError

#: Every distribution and structure the generator shapes, each kv layout, GQA, NaN padding, zero-length batches.
CASES = {
    "padded-raw-scores": dict(
        q_seqlen=[0, 37, 0, 600, 0], head_num=4, kv_layout="padded", distribution="large_raw_scores"
    ),
    "strided-outliers": dict(
        q_seqlen=[129, 0, 300],
        head_num=2,
        mask_type="mask_free",
        kv_layout="strided",
        dtype="bf16",
        distribution="v_outliers",
    ),
    "packed-near-tie": dict(q_seqlen=[1100, 0, 300], kv_capacity=1700, head_num=2, distribution="near_tie"),
    "gqa-structure": dict(
        q_seqlen=[129, 0, 700],
        head_num=4,
        kv_head_num=2,
        mask_type="causal",
        kv_layout="padded",
        padding="nan",
        structure={
            "logits": "recency",
            "rise": 4.0,
            "v_mean": 0.5,
            "v_scale": [1.0, 4.0],
            "head_temperature": [0.5, 2.0],
        },
    ),
    "wide-normal": dict(
        q_seqlen=[70],
        kv_seqlen=[200],
        head_num=16,
        dtype="bf16",
        distribution="normal",
        mask_type="causal",
        kv_layout="padded",
    ),
}


def spec_of(name: str) -> CaseSpec:
    return build_case({**CASES[name], "rows": 8}, source="test_block_inputs", index=0)


def bits(a: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(a).view(np.uint16)


@pytest.mark.parametrize("name", CASES)
def test_rows_drawn_alone_equal_the_same_rows_of_the_whole_tensors(name: str) -> None:
    """Query row ranges across block edges, gathered rows in any order and each (batch, kv head)'s keys, drawn by a
    fresh generator, equal the whole tensors' rows bit for bit; the whole tensors hash to the recorded digests."""
    spec = spec_of(name)
    whole = regenerate_inputs(spec, inputs_record(spec))
    qn, qr = q_views(whole, spec)
    source = BlockInputs(spec)
    size = source.block_rows("q")
    for r0, r1 in ((0, 1), (size - 1, size + 1), (1, 2 * size + 3), (spec.total_q - 3, spec.total_q)):
        if 0 <= r0 < r1 <= spec.total_q:
            assert np.array_equal(bits(BlockInputs(spec).query_rows("q", r0, r1)), bits(qn[r0:r1])), (r0, r1)
    rows = np.array([spec.total_q - 1, 0, size, size - 1, 2])
    assert np.array_equal(bits(source.gather_queries("q_rope", rows)), bits(qr[rows]))
    for b in range(spec.batch):
        if spec.kv_seqlen[b]:
            kn, kr, vv = kv_views(whole, spec, b)
            for head in range(spec.kv_head_num):
                k, v = BlockInputs(spec).keys(b, head)
                assert np.array_equal(bits(k), bits(np.concatenate([kn[:, head], kr[:, head]], axis=1))), (b, head)
                assert np.array_equal(bits(v), bits(vv[:, head])), (b, head)
    assert input_digests(spec, threads=2) == inputs_record(spec).digests
    legacy = generate_inputs(dataclasses.replace(spec, rows=None)).arrays()  # the whole-tensor generator's layouts
    assert {n: (a.shape, a.dtype) for n, a in whole.arrays().items()} == {
        n: (a.shape, a.dtype) for n, a in legacy.items()
    }


def test_padding_and_structure_sit_at_their_key_positions() -> None:
    """gqa-structure: padded kv [3, 700, ...]: NaN beyond each kvSeqLen, kRope's reserved column the recency trend
    (0 at a sequence's first key, its largest at the last), and keys drawn in [-1, 1] elsewhere (rounded)."""
    spec = spec_of("gqa-structure")
    whole = regenerate_inputs(spec, inputs_record(spec))
    k_rope = whole.k_rope.astype(np.float64).reshape(spec.batch, spec.padded_rows, spec.kv_head_num, -1)
    for b, length in enumerate(spec.kv_seqlen):
        assert np.isnan(k_rope[b, length:]).all() and not np.isnan(k_rope[b, :length]).any()
        if length > 1:
            trend = k_rope[b, :length, :, 0]
            assert (trend[0] == 0).all() and (np.diff(trend, axis=0) >= 0).all() and (trend[-1] > 1).all()
            assert (np.abs(k_rope[b, :length, :, 1:]) <= 1).all()


def test_the_generators_values_are_pinned() -> None:
    """The digests of one small case: a change to the values drawn (streams, block addresses, shapes) must bump
    BLOCK_GENERATOR, which makes every sampled golden stale instead of wrong."""
    assert BLOCK_GENERATOR == "blocks-1"
    assert inputs_record(spec_of("packed-near-tie")).digests == PINNED


PINNED = {
    "q": "8cce08b15f1e869e4c9bfd88534a7dac",
    "q_rope": "b6e944ec89d4f94edf7a1929d8495c80",
    "k": "01acb40a1c3533c0674489bdb653330f",
    "k_rope": "9e6dedae34cf05a8fca910325bbdd51f",
    "v": "7a65a8db873f160a3403246e66e8c79d",
}


def test_a_sampled_case_with_explicit_inputs_is_refused_naming_the_field(tmp_path: Path) -> None:
    """Explicit inputs cannot be drawn again: ``rows`` beside them is refused; a suite's ``sample_above`` leaves
    such a case whole."""
    dumped = {"q_seqlen": [64], "head_num": 1, "inputs": "ab" * 32, "name": "dumped"}
    with pytest.raises(SpecError, match=r"f\.toml: case 'dumped': field 'inputs': a sampled case \(rows\) draws"):
        build_case({**dumped, "rows": 8}, source="f.toml")
    suite = tmp_path / "s.toml"
    suite.write_text(f'[suite]\nsample_above = 0\n\n[[case]]\nq_seqlen = [64]\nhead_num = 1\ninputs = "{"ab" * 32}"\n')
    assert load_suite(suite, validate=True)[0].rows is None


def test_the_store_keeps_the_record_not_the_tensors_and_draws_them_again(tmp_path: Path) -> None:
    """The file holds no q, qRope, k, kRope or v, only the record; read back, the golden holds none of them until
    drawn again, then the tensors of a whole build; ``mlaconf verify`` accepts the file."""
    spec = spec_of("gqa-structure")
    store = GoldenStore(tmp_path, builder=build_golden)
    built = store.ensure(spec)
    path = store.path_for(spec)
    with h5py.File(path, "r") as f:
        assert sorted(f["inputs"]) == ["kv_seqlen", "q_seqlen"] and INPUTS_RECORD in f.attrs
    golden, _ = read_golden(path)
    assert not golden.holds_inputs and golden.inputs_record is not None
    assert golden.inputs_record.digests == built.inputs_record.digests and golden.inputs_record.origin == str(path)
    assert golden.provenance["inputs_generator"] == BLOCK_GENERATOR
    whole = with_inputs(golden).inputs
    again = regenerate_inputs(spec, inputs_record(spec))
    for name in TENSOR_NAMES:
        assert np.array_equal(bits(getattr(whole, name)), bits(getattr(again, name))), name
    assert main(["verify", "--out", str(tmp_path)]) == 0


def test_a_recorded_digest_this_host_does_not_draw_is_refused_naming_file_and_tensor(tmp_path: Path) -> None:
    spec = spec_of("strided-outliers")
    golden = build_golden(spec)
    record = golden.inputs_record
    assert record is not None
    wrong = dataclasses.replace(record, digests={**record.digests, "k_rope": "0" * 32})
    write_golden(dataclasses.replace(golden, inputs_record=wrong), tmp_path / "g.h5", "test")
    stored, _ = read_golden(tmp_path / "g.h5")
    with pytest.raises(GoldenStaleError, match=r"g\.h5: dataset 'inputs/k_rope': regenerated k_rope has digest"):
        with_inputs(stored)
