"""golden.magnitudes and golden.error_model: the stored magnitudes and the per-element bound."""

from __future__ import annotations

import io
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from golden.error_model import fp16_score_path, model_ratio, scale_cast_error, tail_factor
from golden.generate import build_golden
from golden.layout import causal_offset, kv_views, offsets, q_views
from golden.magnitudes import MAGNITUDES, allowed_keys
from golden.metrics import Metrics
from golden.reference import effective_scale
from golden.spec import CaseSpec, build_case
from golden.store import SCHEMA_VERSION, GoldenStore, seal
from golden.types import GoldenCase
from judge.policy import load_policies
from judge.verdict import verdict_context


def _spec(**fields: Any) -> CaseSpec:
    return build_case(dict(fields), source="test_error_model")


CAUSAL = _spec(dtype="bf16", mask_type="causal", q_seqlen=[5, 0, 9], kv_seqlen=[21, 4, 9], head_num=4,
               kv_head_num=2, kv_layout="padded", q_layout="2d")
FP16 = _spec(dtype="fp16", mask_type="undefined", q_seqlen=[33, 7], head_num=2, distribution="large_logits")


def _brute(spec: CaseSpec, golden: GoldenCase) -> dict[str, np.ndarray]:
    """Every magnitude from its definition, one row at a time in float64."""
    t, h = spec.total_q, spec.head_num
    out = {n: np.zeros((t, h, 128)) for n in ("pv_abs", "pv_rss", "pvs_rss", "pv_scale")}
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
                out["score_absmax"][tok, head] = np.abs(s).max()
                out["score_dot"][tok, head] = scale * np.linalg.norm(q) * np.linalg.norm(k[:n], axis=1).max()
                out["p_rss"][tok, head] = np.sqrt((p**2).sum())
    return out


@pytest.mark.parametrize("spec", [CAUSAL, FP16], ids=["bf16-causal-gqa-ragged", "fp16-large-logits"])
def test_magnitudes_match_their_definitions(spec: CaseSpec) -> None:
    golden = build_golden(spec)
    expected = _brute(spec, golden)
    for name in MAGNITUDES:
        got = golden.magnitudes[name].reshape(expected[name].shape).astype(np.float64)
        assert got.dtype == np.float64 and golden.magnitudes[name].dtype == np.float32
        scale = np.abs(expected[name]).max()
        np.testing.assert_allclose(got, expected[name], rtol=1e-5, atol=1e-6 * scale, err_msg=name)


def test_allowed_keys_per_mask() -> None:
    assert allowed_keys(CAUSAL).tolist() == [17, 18, 19, 20, 21, *range(1, 10)]
    spec = _spec(dtype="fp16", mask_type="mask_free", q_seqlen=[3, 2], head_num=1)
    assert allowed_keys(spec).tolist() == [1, 2, 3, 1, 2]
    assert allowed_keys(FP16).tolist() == [33] * 33 + [7] * 7


def test_scale_cast_only_on_the_fp16_score_path() -> None:
    assert fp16_score_path(FP16) and not fp16_score_path(CAUSAL)
    assert scale_cast_error(CAUSAL) == 0.0
    eps = scale_cast_error(FP16)
    assert eps != 0.0 and abs(eps) <= 2.0**-11
    assert tail_factor(10_000, 1e-6) == pytest.approx(math.sqrt(2 * math.log(8e10)))


@pytest.mark.parametrize("spec", [CAUSAL, FP16], ids=["bf16-causal-gqa-ragged", "fp16-large-logits"])
def test_emulated_atb_path_is_inside_and_one_planted_error_is_not(spec: CaseSpec) -> None:
    golden = build_golden(spec)
    base = golden.baseline_out
    result = model_ratio(base, golden.out, golden.row_valid, golden.magnitudes, spec, false_alarm=1e-6, safety=2.0)
    assert 0.0 < result.max_ratio < 0.5, result.text()
    # one element pushed to 1.5x its own bound, in a valid row of the last batch
    shape = (spec.total_q, spec.head_num, 128)
    bad = base.astype(np.float64).reshape(shape).copy()
    tok, head, col = spec.total_q - 2, spec.head_num - 1, 77
    clean = model_ratio(bad, golden.out, golden.row_valid, golden.magnitudes, spec, false_alarm=1e-6, safety=2.0)
    bound_probe = golden.out.reshape(shape)[tok, head, col]
    bad[tok, head, col] = bound_probe + 1.0  # far beyond any bound: the probe is the worst element
    probe = model_ratio(bad, golden.out, golden.row_valid, golden.magnitudes, spec, false_alarm=1e-6, safety=2.0)
    bound = 1.0 / probe.max_ratio
    assert probe.bound == pytest.approx(bound)
    bad[tok, head, col] = bound_probe + 1.5 * bound
    result = model_ratio(bad, golden.out, golden.row_valid, golden.magnitudes, spec, false_alarm=1e-6, safety=2.0)
    assert result.max_ratio == pytest.approx(1.5, rel=1e-6) and result.n_over == 1 + clean.n_over
    assert f"(token {tok}) head {head} col {col}" in result.text()
    bad[tok, head, col] = np.nan
    assert model_ratio(bad, golden.out, golden.row_valid, golden.magnitudes, spec, false_alarm=1e-6,
                       safety=2.0).max_ratio == math.inf


def test_default_policy_on_a_real_golden_and_baseline() -> None:
    golden = build_golden(CAUSAL)
    baseline = Metrics.from_dict(golden.baseline_stats)
    policy = load_policies().resolve("default", "emulated-baseline", "bf16", "causal", CAUSAL.case_id)
    verdict = policy.evaluate(baseline, baseline, verdict_context(golden, golden.baseline_out))
    assert verdict.passed, verdict.summary()
    model = next(c for c in verdict.checks if c.rule == "model")
    assert model.decisive and 0 < model.slack < 0.5
    assert all(not c.decisive for c in verdict.checks if c.rule in ("atb", "benchmark"))  # 2048 elements


def test_magnitudes_survive_the_store(tmp_path: Any) -> None:
    store = GoldenStore(tmp_path)
    golden = store.ensure(CAUSAL)
    loaded = store.load(CAUSAL)
    for name in MAGNITUDES:
        assert np.array_equal(loaded.magnitudes[name], golden.magnitudes[name]), name


def reseal(path: Path) -> None:
    """Rewrite the integrity header after a deliberate edit, to reach the checks behind it."""
    path.write_bytes(seal(io.BytesIO(path.read_bytes())))


def test_schema_2_files_are_stale_and_rebuilt_with_magnitudes(tmp_path: Any) -> None:
    import h5py

    from golden.store import GoldenCorruptError, GoldenStaleError

    store = GoldenStore(tmp_path)
    path = store.save(build_golden(CAUSAL))
    with h5py.File(path, "a", locking=False) as f:  # what a schema-2 file looks like: no magnitudes
        for name in MAGNITUDES:
            del f[f"golden/{name}"]
        f.attrs["schema_version"] = 2
    reseal(path)  # past the whole-file integrity header: the schema check itself must say stale
    with pytest.raises(GoldenStaleError, match=rf"schema_version .*2.*, store reads {SCHEMA_VERSION}"):
        store.load(CAUSAL)
    result = store.ensure_result(CAUSAL)
    assert result.action == "generated" and "GoldenStaleError" in result.why
    assert set(store.load(CAUSAL).magnitudes) == set(MAGNITUDES)
    with h5py.File(path, "a", locking=False) as f:  # magnitudes are checksummed like the rest
        data = f["golden/pv_abs"]
        data[0, 0] = data[0, 0] * 2 + 1
    with pytest.raises(GoldenCorruptError, match="golden/pv_abs"):  # the whole-file digest names it
        store.load(CAUSAL)
    reseal(path)
    with pytest.raises(GoldenCorruptError, match="golden/pv_abs"):  # and so does its own checksum
        store.load(CAUSAL)
