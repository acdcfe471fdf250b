"""mlaconf.golden.building.magnitudes and judge.error_model: the stored magnitudes and the per-element bound."""

from __future__ import annotations

import gc
import math
from typing import Any

import ml_dtypes
import numpy as np
import pytest

from mlaconf.facts.operator import scores_in_fp16
from mlaconf.golden.building import chunks
from mlaconf.golden.building.generate import build_golden
from mlaconf.golden.building.inputs import generate_inputs
from mlaconf.golden.building.magnitudes import (
    CANCELLING_MAGNITUDES,
    cancellation_noise,
    reference_and_magnitudes,
    round_up_bf16,
    torch_magnitudes,
)
from mlaconf.golden.building.reference import effective_scale, reference_attention
from mlaconf.golden.building.stats import ErrorStats
from mlaconf.golden.specs.layout import causal_offset, kv_views, offsets, q_views, visible_keys
from mlaconf.golden.specs.spec import CaseSpec
from mlaconf.golden.specs.spec_build import build_case
from mlaconf.golden.specs.types import ELEMENT_MAGNITUDES, ROW_MAGNITUDES, GoldenCase, magnitude_names
from mlaconf.golden.store.directory import GoldenStore
from mlaconf.golden.store.integrity import SCHEMA_VERSION
from mlaconf.judge.error_model import ModelBound, scale_cast_error
from mlaconf.judge.policy import load_policies
from mlaconf.judge.verdict import PerGolden, verdict_context
from tests.goldens import baseline_metrics, reseal


def _spec(**fields: Any) -> CaseSpec:
    return build_case(dict(fields), source="test_error_model")


CAUSAL = _spec(
    dtype="bf16",
    mask_type="causal",
    q_seqlen=[5, 0, 9],
    kv_seqlen=[21, 4, 9],
    head_num=4,
    kv_head_num=2,
    kv_layout="padded",
    q_layout="2d",
)
FP16 = _spec(dtype="fp16", mask_type="undefined", q_seqlen=[33, 7], head_num=2, distribution="large_logits")
FP16_MASK_FREE = _spec(dtype="fp16", mask_type="mask_free", q_seqlen=[6, 19], head_num=3)


def _brute(spec: CaseSpec, golden: GoldenCase) -> dict[str, np.ndarray]:
    """Every magnitude from its definition, one row at a time in float64."""
    t, h = spec.total_q, spec.head_num
    out = {n: np.zeros((t, h, 128)) for n in ("pv_abs", "pv_rss", "pvs_rss", "pv_scale", "pv_sub")}
    out.update({n: np.zeros((t, h)) for n in ("score_absmax", "score_dot", "p_rss")})
    qn, qr = q_views(golden.inputs, spec)
    scale = effective_scale(spec)
    starts = offsets(spec.q_seqlen)
    for b in range(spec.batch):
        if not spec.q_seqlen[b] or not spec.kv_seqlen[b]:
            continue
        kn, kr, vv = kv_views(golden.inputs, spec, b)
        offset = causal_offset(spec, b)
        for head in range(h):
            g = head // (h // spec.kv_head_num)
            k = np.concatenate([kn[:, g], kr[:, g]], 1).astype(np.float64)
            v = vv[:, g].astype(np.float64)
            for i in range(spec.q_seqlen[b]):
                tok = int(starts[b]) + i
                q = np.concatenate([qn[tok, head], qr[tok, head]]).astype(np.float64)
                n = k.shape[0] if offset is None else i + offset + 1
                s = scale * (k[:n] @ q)
                m = s.max()
                p = np.exp(s - m) / np.exp(s - m).sum()
                gv = p @ v[:n]
                w = p * (2 * np.abs(s) + np.abs(s - m))
                out["pv_abs"][tok, head] = p @ np.abs(v[:n])
                out["pv_rss"][tok, head] = np.sqrt((p**2) @ v[:n] ** 2)
                out["pvs_rss"][tok, head] = np.sqrt((w**2) @ (v[:n] - gv) ** 2)
                out["pv_scale"][tok, head] = (p * s) @ (v[:n] - gv)
                sub = np.clip((2.0**-12 - np.exp(s - m)) / 2.0**-13, 0.0, 1.0)  # 1 below 2^-13, 0 from 2^-12
                out["pv_sub"][tok, head] = (p * sub) @ (np.abs(v[:n]) + np.abs(gv)) / (1 - (p * sub).sum())
                out["score_absmax"][tok, head] = np.abs(s).max()
                out["score_dot"][tok, head] = scale * np.linalg.norm(q) * np.linalg.norm(k[:n], axis=1).max()
                out["p_rss"][tok, head] = np.sqrt((p**2).sum())
    return out


@pytest.mark.parametrize(
    "spec", [CAUSAL, FP16, FP16_MASK_FREE], ids=["bf16-causal-gqa-ragged", "fp16-large-logits", "fp16-mask_free-packed"]
)
def test_magnitudes_match_their_definitions_rounded_up(spec: CaseSpec) -> None:
    golden = build_golden(spec)
    expected = _brute(spec, golden)
    assert tuple(golden.magnitudes) == magnitude_names(spec)
    for name in magnitude_names(spec):
        stored = golden.magnitudes[name]
        assert stored.dtype == (np.float32 if name in ROW_MAGNITUDES else ml_dtypes.bfloat16), name
        got = stored.reshape(expected[name].shape).astype(np.float64)
        want = expected[name]
        # float64 rounding of two summation orders; S and T are expanded sums that cancel (S of a
        # 1-key row is 0 up to sqrt(eps) of the column's scale), so their noise is ~1e-8 of the largest
        slack = (1e-6 if name in CANCELLING_MAGNITUDES else 1e-9) * np.abs(want).max()
        assert np.all(np.abs(got) >= np.abs(want) - slack), f"{name} understated"
        assert np.all(np.abs(got) <= np.abs(want) * (1 + 2.0**-7) + slack), f"{name} above one bf16 ulp"
        assert np.all((np.sign(got) == np.sign(want)) | (np.abs(want) <= slack)), f"{name} sign"


def test_score_path_magnitudes_only_where_scores_are_fp16() -> None:
    assert magnitude_names(CAUSAL) == ("pv_abs", "pv_rss", "pv_scale", *ROW_MAGNITUDES)
    assert set(ELEMENT_MAGNITUDES + ROW_MAGNITUDES) == set(magnitude_names(FP16))
    fp16_causal = _spec(dtype="fp16", mask_type="causal", q_seqlen=[4], head_num=1, kv_layout="padded")
    assert "pvs_rss" not in magnitude_names(fp16_causal)


def test_round_up_bf16_never_understates_and_stays_within_one_ulp() -> None:
    rng = np.random.default_rng(7)
    values = rng.standard_normal(200_000) * np.exp2(rng.integers(-60, 60, 200_000))
    exact = rng.standard_normal(1000).astype(ml_dtypes.bfloat16).astype(np.float64)
    values = np.concatenate([values, exact, [0.0, -0.0, 1.0, -3.0, 2.0**-130]])
    rounded = round_up_bf16(values).astype(np.float64)
    assert np.all(np.abs(rounded) >= np.abs(values))
    assert np.all(np.abs(rounded) <= np.abs(values) * (1 + 2.0**-7) + 2.0**-133)
    assert np.all((np.sign(rounded) == np.sign(values)) | (values == 0))
    assert np.array_equal(rounded[200_000:201_000], exact)  # representable values are kept
    nudged = np.nextafter(exact, np.inf * np.sign(exact))
    assert np.all(np.abs(round_up_bf16(nudged).astype(np.float64)) > np.abs(exact))


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("spec", [CAUSAL, FP16], ids=["bf16-causal-gqa-ragged", "fp16-large-logits"])
def test_the_shared_pass_leaves_the_golden_bit_for_bit(spec: CaseSpec, threads: int) -> None:
    inputs = generate_inputs(spec)
    golden, _ = reference_and_magnitudes(inputs, spec, threads=threads, tile=4)
    expected, _ = reference_attention(inputs, spec, tile=4)
    assert golden.shape == expected.shape and golden.tobytes() == expected.tobytes()


@pytest.mark.parametrize("spec", [CAUSAL, FP16], ids=["bf16-causal-gqa-ragged", "fp16-large-logits"])
def test_torch_magnitudes_agree_with_numpy(spec: CaseSpec) -> None:
    inputs = generate_inputs(spec)
    out, numpy_path = reference_and_magnitudes(inputs, spec, threads=2)
    torch_path = torch_magnitudes(inputs, spec, device="cpu", tile=8)
    assert tuple(torch_path) == tuple(numpy_path)
    noise = cancellation_noise(spec, numpy_path, out, slice(None))  # S and T of 1-key rows are 0 +- noise
    for name, got in torch_path.items():
        a, b = got.astype(np.float64), numpy_path[name].astype(np.float64)
        step = 2.0**-7 if name in ELEMENT_MAGNITUDES else 2.0**-23  # one rounding step apart at most
        allowed = step * np.maximum(np.abs(a), np.abs(b)) + 1e-300
        if name in CANCELLING_MAGNITUDES:  # + float64 noise of g itself (numpy: S V / sum, torch: P V)
            allowed = allowed + noise[name].reshape(a.shape) + 1e-12 * np.abs(b).max()
        np.testing.assert_array_less(np.abs(a - b), allowed, err_msg=name)


def test_visible_keys_per_mask() -> None:
    assert visible_keys(CAUSAL).tolist() == [17, 18, 19, 20, 21, *range(1, 10)]
    spec = _spec(dtype="fp16", mask_type="mask_free", q_seqlen=[3, 2], head_num=1)
    assert visible_keys(spec).tolist() == [1, 2, 3, 1, 2]
    assert visible_keys(FP16).tolist() == [33] * 33 + [7] * 7


def test_scale_cast_only_on_the_fp16_score_path() -> None:
    assert scores_in_fp16(FP16.dtype, FP16.mask_type) and not scores_in_fp16(CAUSAL.dtype, CAUSAL.mask_type)
    assert scale_cast_error(CAUSAL) == 0.0
    eps = scale_cast_error(FP16)
    assert eps != 0.0 and abs(eps) <= 2.0**-11


@pytest.mark.parametrize("spec", [CAUSAL, FP16, FP16_MASK_FREE], ids=["bf16-causal", "fp16-logits", "fp16-mask-free"])
def test_a_bound_made_once_judges_each_output_as_one_made_for_it(
    spec: CaseSpec, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Power judges every subject against one kept bound: each verdict is the one a fresh bound gives, and
    the terms reported at the worst element are that element's (they add up to its bound).  Rows in chunks
    of three, so that each chunk keeps its own."""
    golden = build_golden(spec)
    monkeypatch.setattr(chunks, "CHUNK_ELEMENTS", 3 * spec.head_num * 128)
    args = (golden.out, golden.row_valid, golden.magnitudes, spec)
    kept = ModelBound(*args, false_alarm=1e-6, safety=2.0, keep=True)
    assert len(kept.chunks) > 2
    base = golden.baseline_out.astype(np.float64).reshape(golden.out.shape)
    noisy = base + np.random.default_rng(0).normal(0.0, 1e-2, base.shape) * np.abs(base)
    for out in (base, noisy, base):
        fresh = ModelBound(*args, false_alarm=1e-6, safety=2.0).ratio(out)
        assert kept.ratio(out) == fresh
        assert fresh.element is not None and fresh.element.bound is not None
        assert sum(fresh.terms.values()) == pytest.approx(fresh.element.bound, rel=1e-12)
    assert kept.ratio(noisy).max_ratio > 1.0  # the two outputs differ


def test_a_value_kept_per_golden_goes_with_its_golden() -> None:
    class Owner:
        pass

    kept, made = PerGolden[int](4), []
    owner = Owner()
    assert kept.get(owner, (1,), lambda: len(made)) == 0
    made.append(owner)
    assert kept.get(owner, (1,), lambda: len(made)) == 0 and len(kept) == 1  # the kept value
    assert kept.get(owner, (2,), lambda: len(made)) == 1 and len(kept) == 2  # other parameters
    del owner, made[:]
    gc.collect()
    assert len(kept) == 0


@pytest.mark.parametrize("spec", [CAUSAL, FP16], ids=["bf16-causal-gqa-ragged", "fp16-large-logits"])
def test_emulated_atb_path_is_inside_and_one_planted_error_is_not(spec: CaseSpec) -> None:
    golden = build_golden(spec)
    base = golden.baseline_out
    model = ModelBound(golden.out, golden.row_valid, golden.magnitudes, spec, false_alarm=1e-6, safety=2.0)
    result = model.ratio(base)
    assert 0.0 < result.max_ratio < 0.5, result.where
    # lam: 2 exp(-lam^2 / 2) * 4 random terms * N elements = false_alarm
    assert result.lam == pytest.approx(math.sqrt(2 * math.log(8 * result.n_elements / 1e-6)))
    assert result.n_elements == int(golden.row_valid.sum()) * spec.head_num * 128
    # one element pushed to 1.5x its own bound, in a valid row of the last batch
    shape = (spec.total_q, spec.head_num, 128)
    bad = base.astype(np.float64).reshape(shape).copy()
    tok, head, col = spec.total_q - 2, spec.head_num - 1, 77
    clean = model.ratio(bad)
    bound_probe = golden.out.reshape(shape)[tok, head, col]
    bad[tok, head, col] = bound_probe + 1.0  # far beyond any bound: the probe is the worst element
    probe = model.ratio(bad)
    bound = 1.0 / probe.max_ratio
    assert probe.element is not None and probe.element.bound == pytest.approx(bound)
    bad[tok, head, col] = bound_probe + 1.5 * bound
    result = model.ratio(bad)
    assert result.max_ratio == pytest.approx(1.5, rel=1e-6) and result.n_over == 1 + clean.n_over
    assert f"(token {tok}) head {head} col {col}" in result.where
    bad[tok, head, col] = np.nan
    assert model.ratio(bad).max_ratio == math.inf


def test_default_policy_on_a_real_golden_and_baseline() -> None:
    golden = build_golden(CAUSAL)
    baseline = ErrorStats.from_dict(golden.baseline_stats)
    metrics = baseline_metrics(golden)
    policy = load_policies().resolve("default", "emulated-baseline", "bf16", "causal", CAUSAL.case_id)
    context = verdict_context(golden, golden.baseline_out, policy)
    verdict = policy.evaluate(metrics, baseline, context)
    assert verdict.passed, verdict.summary()
    model = next(c for c in verdict.checks if c.rule == "model")
    assert model.decisive and 0 < model.slack < 0.5
    assert all(not c.decisive for c in verdict.checks if c.rule in ("atb", "benchmark"))  # 2048 elements
    # the context measured what the policy's rules read, with the policy's parameters
    assert context.model is not None and context.systematic is not None and context.msprobe is not None
    n = context.model.n_elements
    assert context.model.lam == pytest.approx(
        math.sqrt(2 * math.log(8 * n / policy.param("model", "false_alarm", "bf16")))
    )
    atb = load_policies().resolve("atb", "emulated-baseline", "bf16", "causal", CAUSAL.case_id)
    bare = verdict_context(golden, golden.baseline_out, atb)  # a rule the policy lacks is not measured
    assert bare.model is None and bare.systematic is not None and bare.msprobe is not None


def test_magnitudes_survive_the_store(tmp_path: Any) -> None:
    store = GoldenStore(tmp_path, builder=build_golden)
    golden = store.ensure(CAUSAL)
    loaded = store.load(CAUSAL)
    assert tuple(loaded.magnitudes) == magnitude_names(CAUSAL)
    for name in magnitude_names(CAUSAL):
        assert loaded.magnitudes[name].dtype == golden.magnitudes[name].dtype, name
        assert np.array_equal(loaded.magnitudes[name].view(np.uint8), golden.magnitudes[name].view(np.uint8)), name


def test_schema_2_files_are_stale_and_rebuilt_with_magnitudes(tmp_path: Any) -> None:
    import h5py

    from mlaconf.golden.store.integrity import GoldenCorruptError, GoldenStaleError

    store = GoldenStore(tmp_path, builder=build_golden)
    path = store.save(build_golden(CAUSAL))
    with h5py.File(path, "a", locking=False) as f:  # what a schema-2 file looks like: no magnitudes
        for name in magnitude_names(CAUSAL):
            del f[f"golden/{name}"]
        f.attrs["schema_version"] = 2
    reseal(path)  # past the whole-file integrity header: the schema check itself must say stale
    with pytest.raises(GoldenStaleError, match=rf"schema_version .*2.*, store reads {SCHEMA_VERSION}"):
        store.load(CAUSAL)
    result = store.ensure_result(CAUSAL)
    assert result.action == "generated" and "GoldenStaleError" in result.why
    assert set(store.load(CAUSAL).magnitudes) == set(magnitude_names(CAUSAL))
    with h5py.File(path, "a", locking=False) as f:  # magnitudes are checksummed like the rest
        data = f["golden/pv_abs"]
        data[0, 0] = data[0, 0] ^ 0x5A5A
    with pytest.raises(GoldenCorruptError, match="golden/pv_abs"):  # the whole-file digest names it
        store.load(CAUSAL)
    reseal(path)
    with pytest.raises(GoldenCorruptError, match="golden/pv_abs"):  # and so does its own checksum
        store.load(CAUSAL)


def _bf16_values(values: np.ndarray) -> np.ndarray:
    return values.astype(ml_dtypes.bfloat16).astype(np.float64)


@pytest.mark.parametrize("diag", [None, (0, 40)], ids=["bidirectional", "causal"])
def test_float32_magnitudes_never_fall_below_float64_at_the_edges_of_bf16_range(diag: tuple[int, int] | None) -> None:
    """pv_abs and pv_rss come from float32 GEMMs (the fused tile kernel); at V near bf16's largest and smallest values,
    P down to e^-700 (below float32's range) and all-zero columns, they stay >= their float64 values."""
    from mlaconf.golden.building.magnitudes import ValueOperands, fused_tile
    from mlaconf.golden.building.reference import Workspace, float64_tile

    rng = np.random.default_rng(23)
    rows, keys = 24, 300
    q = _bf16_values(rng.standard_normal((rows, 192)) * 4)
    k = _bf16_values(rng.standard_normal((keys, 192)) * 4)  # scores of +-hundreds: P spans 1 .. e^-700
    biggest = float(ml_dtypes.finfo(ml_dtypes.bfloat16).max)
    smallest = float(ml_dtypes.finfo(ml_dtypes.bfloat16).smallest_subnormal)
    v = _bf16_values(rng.standard_normal((keys, 128)))
    v[:, 0] = _bf16_values(biggest * rng.uniform(0.5, 1.0, keys) * rng.choice([-1, 1], keys))
    v[:, 1] = smallest * rng.integers(1, 100, keys) * rng.choice([-1, 1], keys)
    v[:, 2] = np.where(rng.random(keys) < 0.5, biggest, smallest)
    v[:, 3] = 0.0
    v[:, 4] = _bf16_values(np.exp2(rng.uniform(-130, 127, keys)))
    scale = 0.7
    got = fused_tile(q, k, v, ValueOperands.of(v, k), scale, diag, False, Workspace(), False, np.ascontiguousarray(v.T))
    want_abs = float64_tile(q, k, np.abs(v), scale, diag)
    # sqrt(sum P^2 V^2) in float64 without overflow: scale V by its column maximum first
    colmax = np.where(np.abs(v).max(axis=0) > 0, np.abs(v).max(axis=0), 1.0)
    s = (q * scale) @ k.T
    if diag is not None:
        s[np.arange(s.shape[1])[None, :] > np.arange(rows)[:, None] + diag[0] + diag[1]] = -np.inf
    p = np.exp(s - s.max(axis=1, keepdims=True))
    p /= p.sum(axis=1, keepdims=True)
    want_rss = np.sqrt((p * p) @ (v / colmax) ** 2) * colmax
    for name, want in (("pv_abs", want_abs), ("pv_rss", want_rss)):
        value = got[name]
        assert np.isfinite(value).all(), name
        # never below the float64 value, except that no bound exceeds max |V| (the exact value's own cap;
        # the float64 value may pass it by its rounding, and bf16 cannot hold more than its largest value)
        floor = np.minimum(want, np.abs(v).max(axis=0))
        assert (value >= floor).all(), f"{name} below its float64 value at {np.argwhere(value < floor)[:3].tolist()}"
        # and not loose beyond the float32 factor and the operand floor (2^-126 of the column's scale per key)
        assert (value <= want * 1.01 + np.sqrt(keys * 2.0**-124) * colmax).all(), name
    assert not got["pv_abs"][:, 3].any() and got["pv_abs"][:, 2].max() <= biggest
    assert np.isfinite(round_up_bf16(got["pv_abs"]).astype(np.float64)).all()
