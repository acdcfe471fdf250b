"""Golden store: bit-exact HDF5 round trips, corruption/staleness detection and repair, atomic writes."""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import pickle
import re
import weakref
from collections.abc import Callable
from pathlib import Path

import h5py
import ml_dtypes
import numpy as np
import pytest

from mlaconf.golden.building import regen as rg
from mlaconf.golden.building.generate import build_golden
from mlaconf.golden.specs.spec import CaseSpec
from mlaconf.golden.specs.spec_build import build_case, spec_from_json
from mlaconf.golden.specs.types import GoldenCase
from mlaconf.golden.store import h5file
from mlaconf.golden.store.directory import GoldenStore
from mlaconf.golden.store.h5file import read_golden
from mlaconf.golden.store.integrity import (
    GENERATOR_VERSION,
    GoldenCorruptError,
    GoldenMissingError,
    GoldenStaleError,
    GoldenStoreError,
)
from mlaconf.golden.store.locations import ENV_DIR
from tests.goldens import consistent, reseal

FP16 = build_case({"q_seqlen": [3, 0, 5], "head_num": 2, "dtype": "fp16"}, source="test")
BF16 = build_case({"q_seqlen": [4, 6], "head_num": 2, "dtype": "bf16", "mask_type": 2, "q_layout": "2d"}, source="test")
CAUSAL = build_case(
    {
        "q_seqlen": [2, 3],
        "kv_seqlen": [5, 3],
        "head_num": 4,
        "kv_head_num": 2,
        "dtype": "bf16",
        "mask_type": 3,
        "kv_layout": "padded",
    },
    source="test",
)


class CountingBuilder:
    """The real builder, counting calls (the store must build only when it has to)."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    def __call__(self, spec: CaseSpec) -> GoldenCase:
        self.calls.append(spec.case_id)
        return build_golden(spec)


def bits(arr: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(arr).view(np.uint8)


def flip_byte(path: Path, dataset: str) -> None:
    """Invert one byte in the middle of a dataset's raw data (contiguous layout: offset is known)."""
    with h5py.File(path, "r", locking=False) as f:
        offset, size = f[dataset].id.get_offset(), f[dataset].id.get_storage_size()
    assert offset is not None and size > 0
    with open(path, "r+b") as fh:
        fh.seek(offset + size // 2)
        byte = fh.read(1)[0]
        fh.seek(offset + size // 2)
        fh.write(bytes([byte ^ 0xFF]))


def rewrite_dataset(path: Path, name: str, stored: np.ndarray) -> None:
    """Replace a dataset's values and fix every checksum (and the seal), keeping its device_dtype tag."""
    import xxhash

    sha = xxhash.xxh3_128_hexdigest(np.ascontiguousarray(stored).tobytes())
    with h5py.File(path, "r+", locking=False) as f:
        tag = f[name].attrs["device_dtype"]
        del f[name]
        ds = f.create_dataset(name, data=stored)
        ds.attrs.update({"device_dtype": tag, "xxh3_128": sha})
        sums = json.loads(f.attrs["checksums_json"])
        sums[name] = sha
        f.attrs["checksums_json"] = json.dumps(sums, sort_keys=True)
    reseal(path)


@pytest.fixture
def store(tmp_path: Path) -> GoldenStore:
    return GoldenStore(tmp_path / "store")


@pytest.mark.parametrize("spec", [FP16, BF16, CAUSAL], ids=lambda s: s.case_id)
def test_round_trip_is_bit_exact(store: GoldenStore, spec: CaseSpec) -> None:
    golden = build_golden(spec)
    path = store.save(golden)
    assert path == store.root / f"{spec.case_id}.h5"
    loaded = store.load(spec)
    assert set(loaded.inputs.arrays()) == set(golden.inputs.arrays())
    for name, arr in golden.inputs.arrays().items():
        got = getattr(loaded.inputs, name)
        assert got.dtype == arr.dtype and got.shape == arr.shape, name
        if arr.dtype.itemsize == 2:
            assert np.array_equal(got.view(np.uint16), arr.view(np.uint16)), name
        assert np.array_equal(bits(got), bits(arr)), name
    assert loaded.baseline_out.dtype == golden.baseline_out.dtype
    assert np.array_equal(loaded.baseline_out.view(np.uint16), golden.baseline_out.view(np.uint16))
    assert loaded.out.dtype == np.float64 and np.array_equal(bits(loaded.out), bits(golden.out))
    assert loaded.row_valid.dtype == np.bool_ and np.array_equal(loaded.row_valid, golden.row_valid)
    assert loaded.baseline_stats == golden.baseline_stats
    assert {k: type(v) for k, v in loaded.baseline_stats.items()} == {
        k: type(v) for k, v in golden.baseline_stats.items()
    }
    assert loaded.provenance == golden.provenance
    assert loaded.spec is spec


def test_file_schema_and_attributes(store: GoldenStore) -> None:
    golden = build_golden(BF16)
    path = store.save(golden)
    with h5py.File(path, "r", locking=False) as f:
        assert f["inputs/q"].dtype == np.uint16 and f["inputs/q"].attrs["device_dtype"] == "bf16"
        bits = f["inputs/q"][()].astype(np.uint32) << 16  # the documented decoding, without ml_dtypes
        assert np.array_equal(bits.view(np.float32), golden.inputs.q.astype(np.float32))
        assert f["inputs/mask"].attrs["device_dtype"] == "bf16"
        assert f["inputs/q_seqlen"].dtype == np.int32
        assert f["golden/out"].dtype == np.float64 and f["golden/row_valid"].dtype == np.bool_
        assert f["baseline/out"].attrs["device_dtype"] == "bf16"
        assert "max_abs_err" in f["baseline"].attrs
        attrs = dict(f.attrs)
        sums = json.loads(attrs["checksums_json"])
        datasets: list[str] = []
        f.visititems(lambda name, obj: datasets.append(name) if isinstance(obj, h5py.Dataset) else None)
        assert sorted(sums) == sorted(datasets)
        assert all(f[name].attrs["xxh3_128"] == sha for name, sha in sums.items())
    assert spec_from_json(attrs["spec_json"]).content_hash == BF16.content_hash
    assert attrs["content_hash"] == BF16.content_hash and attrs["case_id"] == BF16.case_id
    assert attrs["generator_version"] == GENERATOR_VERSION and attrs["seed"] == BF16.seed
    versions = json.loads(attrs["provenance_json"])  # the one list of library versions in the file
    assert versions["numpy"] == np.__version__ and versions["h5py"] == h5py.__version__
    assert versions["ml_dtypes"] == ml_dtypes.__version__ and versions["python"] and versions["hdf5"]
    assert not any(key.endswith("_version") and key != "generator_version" for key in attrs if key != "schema_version")
    assert isinstance(json.loads(attrs["blas"]), dict) and attrs["created_utc"].endswith("Z")
    assert not list(store.root.glob("*.tmp")) and not list(store.root.glob(".*.tmp"))


@pytest.mark.parametrize("dataset", ["inputs/q", "inputs/kv_seqlen", "golden/out", "golden/row_valid", "baseline/out"])
def test_flipped_byte_is_detected_and_ensure_rebuilds(
    store: GoldenStore, dataset: str, caplog: pytest.LogCaptureFixture
) -> None:
    path = store.save(build_golden(FP16))
    flip_byte(path, dataset)
    with pytest.raises(GoldenCorruptError) as info:
        store.load(FP16)
    assert info.value.dataset == dataset and str(path) in str(info.value) and dataset in str(info.value)
    assert "raw data changed" in str(info.value)
    builder = CountingBuilder()
    with caplog.at_level(logging.WARNING, logger="mlaconf.golden.store.directory"):
        repaired = store.ensure(FP16, builder)
    assert builder.calls == [FP16.case_id]
    assert str(path) in caplog.text and "GoldenCorruptError" in caplog.text
    assert np.array_equal(store.load(FP16).out, repaired.out)


def test_truncated_file_is_detected_and_rebuilt(store: GoldenStore) -> None:
    path = store.save(build_golden(BF16))
    os.truncate(path, path.stat().st_size // 2)
    with pytest.raises(GoldenCorruptError, match=re.escape(str(path))):
        store.load(BF16)
    builder = CountingBuilder()
    store.ensure(BF16, builder)
    assert builder.calls == [BF16.case_id]
    store.load(BF16)


def test_bf16_dataset_must_be_stored_as_16_bit_patterns(store: GoldenStore) -> None:
    golden = build_golden(BF16)
    path = store.save(golden)
    rewrite_dataset(path, "inputs/q", golden.inputs.q.view(np.uint16).copy())
    store.load(BF16)  # a rewrite with the same bits and fixed checksums is accepted
    rewrite_dataset(path, "inputs/q", golden.inputs.q.astype(np.float32))  # the old (schema 2) encoding
    with pytest.raises(GoldenCorruptError, match="stored as float32, device_dtype 'bf16' needs uint16") as info:
        store.load(BF16)
    assert info.value.dataset == "inputs/q"


def test_a_missing_dataset_is_corrupt(store: GoldenStore) -> None:
    path = store.save(build_golden(FP16))
    with h5py.File(path, "r+", locking=False) as f:
        del f["golden/row_valid"]
    with pytest.raises(GoldenCorruptError, match="whole-file digest mismatch"):
        store.load(FP16)
    reseal(path)  # behind the header, the per-dataset bookkeeping catches it too
    with pytest.raises(GoldenCorruptError, match="golden/row_valid"):
        store.load(FP16)


def test_tampered_baseline_statistics_are_corrupt_and_drift_is_reported(store: GoldenStore) -> None:
    golden = build_golden(FP16)
    path = store.save(golden)
    with h5py.File(path, "r+", locking=False) as f:
        f["baseline"].attrs["rmse"] = float(f["baseline"].attrs["rmse"]) * 1000  # loosens the benchmark rule
    with pytest.raises(GoldenCorruptError, match="whole-file digest mismatch"):
        store.load(FP16)
    reseal(path)
    with pytest.raises(GoldenCorruptError) as info:
        store.load(FP16)
    assert info.value.dataset == "baseline (attributes)" and str(path) in str(info.value)
    stats = dict(golden.baseline_stats, rmse=float(golden.baseline_stats["rmse"]) * 1.001)
    problems = rg.compare_recomputed(path, dataclasses.replace(golden, baseline_stats=stats), golden).problems
    assert [p.dataset for p in problems] == ["baseline (attributes)"] and "rmse" in problems[0].message
    assert rg.compare_recomputed(path, golden, build_golden(FP16)) == rg.Recomputed([], [])


def test_other_generator_version_is_stale_and_ensure_rebuilds(tmp_path: Path) -> None:
    old = GoldenStore(tmp_path, generator_version="0.9-old")
    old.save(build_golden(FP16))
    old.load(FP16)
    new = GoldenStore(tmp_path, generator_version="1.0-new")
    with pytest.raises(GoldenStaleError, match=re.escape("generator_version '0.9-old'")):
        new.load(FP16)
    builder = CountingBuilder()
    result = new.ensure_result(FP16, builder)
    assert result.action == "generated" and "GoldenStaleError" in result.why
    assert builder.calls == [FP16.case_id]
    new.load(FP16)
    with h5py.File(new.path_for(FP16), "r", locking=False) as f:
        assert f.attrs["generator_version"] == "1.0-new"


def test_file_of_another_spec_is_stale(store: GoldenStore) -> None:
    other = dataclasses.replace(FP16, seed=FP16.seed + 1)
    store.save(build_golden(FP16))
    store.path_for(FP16).rename(store.path_for(other))
    with pytest.raises(GoldenStaleError, match="content_hash"):
        store.load(other)


def test_ensure_builds_once_then_loads(store: GoldenStore) -> None:
    builder = CountingBuilder()
    with pytest.raises(GoldenMissingError):
        store.load(FP16)
    first = store.ensure_result(FP16, builder)
    second = store.ensure_result(FP16, builder)
    assert builder.calls == [FP16.case_id]
    assert (first.action, second.action) == ("generated", "up-to-date")
    assert first.bytes_written == store.path_for(FP16).stat().st_size
    forced = store.ensure_result(FP16, builder, force=True)
    assert forced.action == "generated" and builder.calls == [FP16.case_id] * 2


def test_failed_write_leaves_nothing(store: GoldenStore) -> None:
    golden = build_golden(FP16)
    bad = dataclasses.replace(golden, out=golden.out.astype(np.float32))
    with pytest.raises(TypeError, match="float64"):
        store.save(bad)
    assert not store.path_for(FP16).exists()
    assert [p.name for p in store.root.iterdir() if p.is_file()] == []


def test_leftover_temp_file_of_a_dead_writer_is_removed(store: GoldenStore) -> None:
    store.root.mkdir(parents=True)
    leftover = store.root / f".{FP16.case_id}.h5.999999.tmp"
    leftover.write_bytes(b"partial")
    store.ensure(FP16, CountingBuilder())
    assert not leftover.exists()
    store.load(FP16)


def test_root_selection(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ENV_DIR, str(tmp_path / "env"))
    assert GoldenStore().root == tmp_path / "env"
    assert GoldenStore(tmp_path / "explicit").root == tmp_path / "explicit"
    monkeypatch.delenv(ENV_DIR)
    assert GoldenStore().root.name == ".golden"


def test_read_golden_without_spec_uses_the_stored_spec(store: GoldenStore) -> None:
    path = store.save(build_golden(CAUSAL))
    golden, meta = read_golden(path)
    assert golden.spec == CAUSAL and meta.content_hash == CAUSAL.content_hash
    with pytest.raises(GoldenMissingError):
        read_golden(store.root / "absent.h5")
    assert issubclass(GoldenCorruptError, GoldenStoreError) and issubclass(GoldenStaleError, GoldenStoreError)


def _golden_bytes(golden: GoldenCase) -> dict[str, bytes]:
    named = {f"inputs/{n}": a for n, a in golden.inputs.arrays().items()} | {
        f"golden/{n}": a for n, a in golden.magnitudes.items()
    }
    named |= {"golden/out": golden.out, "golden/row_valid": golden.row_valid, "baseline/out": golden.baseline_out}
    return {name: bits(array).tobytes() for name, array in named.items()}


def test_a_load_reuses_memory_only_once_the_last_golden_is_dropped(
    store: GoldenStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A golden still alive keeps its memory: the next load reads elsewhere, and reuses it once dropped."""
    monkeypatch.setattr(h5file, "BLOCK_MIN_BYTES", 0)  # this golden is small
    built = _golden_bytes(build_golden(CAUSAL))
    store.save(build_golden(CAUSAL))
    first = store.load(CAUSAL)
    second = store.load(CAUSAL)
    assert not np.shares_memory(first.out, second.out) and not np.shares_memory(first.inputs.k, second.out)
    assert _golden_bytes(first) == _golden_bytes(second) == built
    assert second.out.base is not None and second.inputs.q.base is second.out.base  # one block holds them all
    block = weakref.ref(second.out.base)  # a reference of the test's own would keep it in use
    del second
    third = store.load(CAUSAL)
    assert third.out.base is block()  # reused
    assert _golden_bytes(third) == _golden_bytes(first) == built
    assert pickle.loads(pickle.dumps(store)).load(CAUSAL).out.base is not block()  # a copy has its own
    monkeypatch.setattr(h5file, "BLOCK_MIN_BYTES", 1 << 40)
    del third
    assert store.load(CAUSAL).out.base is not block()  # below the minimum: arrays of its own


# -- recompute comparison and sharding (golden/building/regen.py) ------------------------------------------


def _perturbed(golden: GoldenCase, rel: float) -> GoldenCase:
    return consistent(golden, out=golden.out * (1.0 + rel))


@pytest.mark.parametrize(("rel", "flagged"), [(1e-9, True), (1e-11, True), (1e-14, False), (0.0, False)])
def test_recompute_comparison_threshold(rel: float, flagged: bool) -> None:
    golden = build_golden(FP16)
    problems = rg.compare_recomputed(Path("x.h5"), _perturbed(golden, rel), golden).problems
    assert [p.dataset for p in problems] == (["golden/out"] if flagged else [])


def test_recompute_comparison_needs_bit_exact_inputs() -> None:
    golden = build_golden(BF16)
    q = golden.inputs.q.copy()
    q.view(np.uint16).flat[7] ^= 1  # one ulp
    changed = dataclasses.replace(golden, inputs=dataclasses.replace(golden.inputs, q=q))
    problems = rg.compare_recomputed(Path("x.h5"), changed, golden).problems
    assert [p.dataset for p in problems] == ["inputs/q"]


@pytest.mark.parametrize(("steps", "flagged"), [(0, False), (1, False), (3, True)])
def test_recomputed_magnitudes_may_differ_by_one_rounding_step(steps: int, flagged: bool) -> None:
    golden = build_golden(BF16)
    stored = golden.magnitudes["pv_abs"]
    bits = stored.view(np.uint16).copy()
    largest = int(np.argmax(stored.astype(np.float64)))
    bits.flat[largest] += steps  # the array's largest element: the floor cannot hide a step there
    moved = dict(golden.magnitudes, pv_abs=bits.view(stored.dtype))
    problems = rg.compare_recomputed(Path("x.h5"), golden, dataclasses.replace(golden, magnitudes=moved)).problems
    assert [p.dataset for p in problems] == (["golden/pv_abs"] if flagged else [])


def test_relative_difference_treats_nan_positions() -> None:
    a = np.array([1.0, np.nan, 2.0])
    assert rg.relative_difference(a, a.copy()) == 0.0
    assert rg.relative_difference(a, np.array([1.0, 0.0, 2.0])) == float("inf")


def test_resolve_builder_binds_threads() -> None:
    calls: list[int] = []

    def with_threads(spec: CaseSpec, *, threads: int = 1) -> GoldenCase:
        calls.append(threads)
        return build_golden(spec)

    rg.resolve_builder(with_threads, 3)(FP16)
    assert calls == [3]
    builder: Callable[[CaseSpec], GoldenCase] = rg.resolve_builder("mlaconf.golden.building.generate:build_golden", 2)
    assert builder(FP16).out.shape == build_golden(FP16).out.shape
    with pytest.raises(ValueError, match=re.escape("pkg.mod:func")):
        rg.resolve_builder("mlaconf.golden.building.generate", 1)


def test_magnitudes_of_the_wrong_dtype_are_refused_on_write(store: GoldenStore) -> None:
    golden = build_golden(BF16)
    as_float32 = dict(golden.magnitudes, pv_abs=golden.magnitudes["pv_abs"].astype(np.float32))
    with pytest.raises(TypeError, match=r"magnitude pv_abs is float32.*must be bfloat16"):
        store.save(dataclasses.replace(golden, magnitudes=as_float32))
    assert not store.path_for(BF16).exists()


@pytest.mark.parametrize(
    "fields",
    [
        {"q_seqlen": [1], "head_num": 2, "dtype": "fp16", "mask_type": 0},
        {"q_seqlen": [97, 1, 5], "head_num": 2, "dtype": "fp16", "mask_type": 2},
    ],
    ids=["fp16-one-token", "fp16-mask_free-short-rows"],
)
def test_the_device_path_recomputes_within_tolerance(
    fields: dict[str, object], monkeypatch: pytest.MonkeyPatch
) -> None:
    """What `MLA_GOLDEN_DEVICE=cuda mlaconf verify --recompute` checks, with torch on the CPU ("cpu:0"):
    S and T of rows with one or a few keys are float64 cancellation noise, different in each path."""
    spec = build_case(fields, source="test")
    stored = build_golden(spec)
    monkeypatch.setenv("MLA_GOLDEN_DEVICE", "cpu:0")
    fresh = build_golden(spec)
    assert fresh.provenance["reference_device"] == "cpu:0"
    assert rg.compare_recomputed(Path("x.h5"), stored, fresh).problems == []
    if spec.total_q > 1:  # rows with many keys carry real S values: doubling them is drift
        doubled = dict(
            fresh.magnitudes,
            pvs_rss=(fresh.magnitudes["pvs_rss"].astype(np.float64) * 2).astype(fresh.magnitudes["pvs_rss"].dtype),
        )
        moved = rg.compare_recomputed(Path("x.h5"), stored, dataclasses.replace(fresh, magnitudes=doubled)).problems
        assert [p.dataset for p in moved] == ["golden/pvs_rss"]
