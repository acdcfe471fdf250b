"""Structured inputs: the spec's ``structure`` table, what golden/building/inputs.py makes of it, and
that unstructured cases kept their hashes and their bits."""

from __future__ import annotations

import hashlib
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from mlaconf.golden.building.generate import build_golden
from mlaconf.golden.building.inputs import generate_inputs, round_to, trend_amplitude
from mlaconf.golden.specs.layout import kv_views, q_views
from mlaconf.golden.specs.spec import CaseSpec, SpecError
from mlaconf.golden.specs.spec_build import build_case, spec_from_json
from mlaconf.golden.specs.suites import load_suite

LATE = {"logits": "late_max", "rise": 16.0, "late_from": 512}


def spec_of(**fields: Any) -> CaseSpec:
    base: dict[str, Any] = {"head_num": 2, "q_seqlen": [640], "mask_type": "mask_free", "seed": 5}
    base.update(fields)
    return build_case(base, source="test")


def scores(spec: CaseSpec, batch: int = 0) -> np.ndarray:
    """float64 scaled scores ``[H, q, kv]`` of one batch from the generated (rounded) inputs."""
    inputs = generate_inputs(spec)
    qn, qr = q_views(inputs, spec)
    kn, kr, _ = kv_views(inputs, spec, batch)
    start = sum(spec.q_seqlen[:batch])
    rows = slice(start, start + spec.q_seqlen[batch])
    q = np.concatenate([qn[rows], qr[rows]], -1).astype(np.float64)
    k = np.concatenate([kn, kr], -1).astype(np.float64)
    group = spec.head_num // spec.kv_head_num
    k = np.repeat(k, group, axis=1)
    return spec.qk_scale * np.einsum("ihd,jhd->hij", q, k)


def test_unstructured_cases_keep_their_hash_and_their_inputs() -> None:
    """Pinned from the generator before ``structure`` and the ``v_mean`` stream existed."""
    spec = build_case(
        dict(
            dtype="bf16",
            mask_type="causal",
            kv_layout="padded",
            q_seqlen=[5, 0, 9],
            kv_seqlen=[21, 4, 9],
            head_num=4,
            kv_head_num=2,
            distribution="v_outliers",
            seed=3,
        ),
        source="pin",
    )
    assert spec.content_hash == "a3dba244630aa0456769f11730b411ed64d912325d5538f839ef9cdb01b95a10"
    digest = hashlib.sha256()
    for name, array in sorted(generate_inputs(spec).arrays().items()):
        digest.update(name.encode())
        digest.update(array.tobytes())
    assert digest.hexdigest() == "e2d57133d0893ad692e6eb01c1d3a6338f0d0e10b4561d5268210d099c53ca0e"


@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
def test_late_max_rises_after_its_key_by_rise(dtype: str) -> None:
    spec = spec_of(dtype=dtype, structure=LATE)
    s = scores(spec)
    last = s[:, -1]  # the last row sees every key
    early, late = last[:, :512].max(axis=1), last[:, 512:].min(axis=1)
    assert np.all(late - early > 16.0 - 2 * 0.34 * 4)  # uniform logits: |noise| < ~4 std of 0.34
    jump = np.median(last[:, 512:], axis=1) - np.median(last[:, :512], axis=1)
    assert np.allclose(jump, 16.0, atol=0.3)
    assert "late_max" in spec.case_id


def test_sinks_and_recency_follow_the_key_position() -> None:
    sinks = scores(spec_of(structure={"logits": "sinks", "rise": 8.0, "sink_keys": 3}))[:, -1]
    assert np.allclose(sinks[:, :3].mean(axis=1) - sinks[:, 3:].mean(axis=1), 8.0, atol=0.4)
    ramp = scores(spec_of(mask_type="undefined", structure={"logits": "recency", "rise": 12.0}))[:, 0]
    slope = np.polyfit(np.arange(640) / 639, ramp.T, 1)[0]
    assert np.allclose(slope, 12.0, atol=0.5)


def test_causal_positions_restart_in_every_batch_of_a_padded_cache() -> None:
    spec = spec_of(
        mask_type="causal",
        kv_layout="padded",
        q_seqlen=[4, 0, 3],
        kv_seqlen=[600, 9, 530],
        head_num=2,
        kv_head_num=1,
        structure=LATE,
    )
    for batch, kv in ((0, 600), (2, 530)):
        last = scores(spec, batch)[:, -1]
        assert last.shape[1] == kv
        assert np.all(last[:, 512:].min(axis=1) - last[:, :512].max(axis=1) > 10.0)


def test_the_trend_is_rounded_once_to_the_dtype() -> None:
    spec = spec_of(dtype="bf16", structure={"logits": "late_max", "rise": 96.0, "late_from": 512})
    inputs = generate_inputs(spec)
    a = trend_amplitude(spec)
    assert math.isclose(a * a * spec.qk_scale, 96.0)
    q_rope = inputs.q_rope.reshape(640, 2, 64).astype(np.float64)
    k_rope = inputs.k_rope.reshape(640, 2, 64).astype(np.float64)
    want = round_to(np.array([a]), "bf16").astype(np.float64)[0]
    assert np.all(q_rope[:, :, 0] == want) and np.all(k_rope[512:, :, 0] == want) and np.all(k_rope[:512, :, 0] == 0)


def test_head_temperatures_and_value_profiles() -> None:
    structure = {"head_temperature": [0.5, 4.0], "v_scale": [0.25, 4.0], "v_mean": 3.0}
    spec = spec_of(head_num=4, mask_type="undefined", distribution="normal", q_seqlen=[1000], structure=structure)
    spread = scores(spec)[:, :200].std(axis=(1, 2))  # the logit spread grows 0.5 -> 4 over heads
    assert np.allclose(spread / spread[0], [1.0, 2.0, 4.0, 8.0], rtol=0.15)
    _, _, v = kv_views(generate_inputs(spec), spec, 0)
    v = v.astype(np.float64)  # [kv, H, 128]
    means = v.mean(axis=0)
    assert np.allclose(np.abs(means), 3.0, atol=0.4)  # +-v_mean per kv head and column
    noise = np.abs(v - means)
    # |V| x 0.25 at the first key, x 4 at the last: the mean positions of the two 100-key ends are 900 keys apart
    assert np.isclose(noise[-100:].mean() / noise[:100].mean(), 16.0 ** (900 / 999), rtol=0.15)


def test_structured_goldens_are_finite_on_the_fp16_score_path() -> None:
    spec = spec_of(
        dtype="fp16", structure=LATE, distribution="normal", mask_type="undefined", q_seqlen=[600], head_num=1
    )
    golden = build_golden(spec)
    assert np.isfinite(golden.out).all() and all(
        np.isfinite(m.astype(np.float64)).all() for m in golden.magnitudes.values()
    )


@pytest.mark.parametrize(
    ("structure", "fields", "field_name", "fragment"),
    [
        ({"logits": "sinks", "rise": 4.0}, {}, "structure.sink_keys", "required"),
        (
            {"logits": "late_max", "rise": 4.0, "late_from": 9, "sink_keys": 1},
            {},
            "structure.sink_keys",
            "only allowed",
        ),
        ({"rise": 4.0}, {}, "structure.rise", "only allowed"),
        ({"logits": "spiral", "rise": 4.0}, {}, "structure.logits", "one of"),
        ({"logits": "recency", "rise": -1.0}, {}, "structure.rise", "(0, 128]"),
        ({"head_temperature": [0.5]}, {}, "structure.head_temperature", "two numbers"),
        ({"v_scale": [0.5, 100.0]}, {}, "structure.v_scale", "two numbers"),
        ({"v_mean": True}, {}, "structure.v_mean", "number"),
        ({"colour": 1}, {}, "structure.colour", "unknown key"),
        ({}, {}, "structure", "empty"),
        ({"logits": "late_max", "rise": 4.0, "late_from": 640}, {}, "structure.late_from", "below the longest"),
        ({"logits": "recency", "rise": 100.0}, {"qk_scale": 0.01}, "structure.rise", "fp16"),
        ({"logits": "recency", "rise": 4.0}, {"distribution": "near_tie"}, "structure", "near_tie"),
    ],
)
def test_bad_structures_name_the_key(
    tmp_path: Path, structure: dict[str, Any], fields: dict[str, Any], field_name: str, fragment: str
) -> None:
    def toml(value: Any) -> str:
        if isinstance(value, dict):
            return "{ " + ", ".join(f"{k} = {toml(v)}" for k, v in value.items()) + " }"
        if isinstance(value, str):
            return f'"{value}"'
        if isinstance(value, list):
            return "[" + ", ".join(toml(v) for v in value) + "]"
        return str(value).lower() if isinstance(value, bool) else str(value)

    table = {"name": "bad", "head_num": 1, "q_seqlen": [640], "dtype": "fp16", **fields, "structure": structure}
    path = tmp_path / "suite.toml"
    path.write_text("[[case]]\n" + "\n".join(f"{k} = {toml(v)}" for k, v in table.items()) + "\n")
    with pytest.raises(SpecError) as info:
        load_suite(path)
    assert (info.value.case, info.value.field_name) == ("bad", field_name)
    assert fragment in str(info.value) and str(path) in str(info.value)


def test_structure_round_trips_through_toml_and_json(tmp_path: Path) -> None:
    spec = spec_of(structure={**LATE, "head_temperature": [0.5, 2], "v_mean": 1})
    path = tmp_path / "suite.toml"
    path.write_text(spec.to_toml())
    (loaded,) = load_suite(path)
    assert loaded.content_hash == spec.content_hash and loaded.structure == spec.structure
    assert spec_from_json(spec.to_json()).content_hash == spec.content_hash
    assert spec.content_hash != spec_of(structure=LATE).content_hash


def test_matrix_axis_of_structures(tmp_path: Path) -> None:
    path = tmp_path / "suite.toml"
    path.write_text(
        '[[matrix]]\nhead_num = 1\nq_seqlen = [[640]]\ndtype = ["fp16", "bf16"]\n'
        'structure = [{ logits = "recency", rise = 9.0 }, { v_mean = 2.0 }]\n'
    )
    cases = load_suite(path)
    assert len(cases) == 4 and {c.structure.label for c in cases if c.structure} == {"recency", "vmean"}
