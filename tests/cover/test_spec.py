"""Case specs: shipped suites cover what they promise; bad specs name file, case and field."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest

from mlaconf.facts.operator import DEFAULT_QK_SCALE
from mlaconf.golden.specs.spec import SpecError
from mlaconf.golden.specs.spec_build import build_case
from mlaconf.golden.specs.suites import load_suite, load_suites


def write_suite(tmp_path: Path, body: str) -> Path:
    path = tmp_path / "suite.toml"
    path.write_text('[suite]\nname = "t"\n' + body)
    return path


def test_smoke_covers_every_dtype_mask_and_layout() -> None:
    cases = load_suites(["smoke"])
    seen = {(c.dtype, c.mask_type, c.q_layout, c.kv_layout) for c in cases}
    for dtype, mask, q_layout, kv_layout in itertools.product(
        ("fp16", "bf16"), (0, 2, 3), ("2d", "3d"), ("padded", "packed")
    ):
        if mask == 3 and kv_layout == "packed":
            continue  # CAUSAL accepts only the padded layout (docs/operator.md §2)
        assert (dtype, mask, q_layout, kv_layout) in seen, f"smoke lacks {dtype}/{mask}/{q_layout}/{kv_layout}"
    assert any(len(set(c.q_seqlen)) > 1 for c in cases), "no ragged batch"
    assert any(c.mask_type == 3 and c.kv_head_num < c.head_num for c in cases), "no GQA causal case"
    assert any(c.mask_type == 3 and c.max_kv > c.max_q for c in cases), "no prefix causal case"
    # smoke must stay small: its largest case is the one the pair (group 128, q_len gt512) of the factor
    # model needs (128 heads over a 513-row batch; golden/coverage/covering.py)
    assert max(c.total_q * c.head_num for c in cases) <= 128 * 1024, "smoke must stay small"


def test_standard_covers_tails_heads_prefixes_and_batch_limit() -> None:
    cases = load_suites(["standard"])
    lengths = {n for c in cases for n in c.q_seqlen}
    assert {1, 15, 16, 127, 128, 129, 513, 4097} <= lengths
    assert {1, 128} <= {c.head_num for c in cases}
    prefixes = {kv - q for c in cases if c.mask_type == 3 for q, kv in zip(c.q_seqlen, c.kv_seqlen, strict=True)}
    assert {128, 256} <= prefixes and any(p % 128 for p in prefixes)
    assert max(c.batch for c in cases) == 8192
    ragged = [c for c in cases if len(set(c.kv_seqlen)) > 1]
    assert {c.kv_layout for c in ragged} == {"padded", "packed", "strided"}  # every kv addressing ATB reads ragged


def test_deepseek_and_edge_shapes() -> None:
    deepseek = load_suites(["deepseek"])
    assert {c.head_num for c in deepseek} == {128, 64, 32, 16, 8}
    assert all(4096 <= c.max_q <= 16384 and 1 <= c.batch <= 8 for c in deepseek)
    edge = load_suites(["edge"])
    assert any(0 in c.q_seqlen for c in edge)
    assert {"large_logits", "near_tie", "v_outliers"} <= {c.distribution for c in edge}


def test_matrix_expands_products_and_zipped_axes(tmp_path: Path) -> None:
    path = write_suite(
        tmp_path,
        """
[[matrix]]
dtype = ["fp16", "bf16"]
mask_type = [0, 2]
head_num = 2
q_seqlen = [[4], [5, 6]]
[[matrix]]
mask_type = "causal"
kv_layout = "padded"
pair = [{ head_num = 4, kv_head_num = 2, q_seqlen = [3], kv_seqlen = [9] }, { head_num = 2, q_seqlen = [1] }]
[[case]]
head_num = 1
q_seqlen = { pattern = [1, 2], times = 3 }
""",
    )
    cases = load_suite(path)
    assert len(cases) == 2 * 2 * 2 + 2 + 1
    assert cases[0].q_seqlen == (1, 2, 1, 2, 1, 2)  # [[case]] tables come first
    gqa = [c for c in cases if c.kv_head_num == 2 and c.head_num == 4]
    assert len(gqa) == 1 and gqa[0].kv_seqlen == (9,)
    assert all(c.suite == "t" for c in cases)


@pytest.mark.parametrize(
    ("fields", "field_name", "fragment"),
    [
        ({"head_num": 0}, "head_num", "[1, 128]"),
        ({"head_num": 129}, "head_num", "[1, 128]"),
        ({"head_num": 4, "kv_head_num": 2}, "kv_head_num", "must equal headNum"),
        ({"mask_type": 1}, "mask_type", "must be one of"),
        ({"cache_mode": 0}, "cache_mode", "KROPE_CTKV"),
        ({"qk_scale": 1.5}, "qk_scale", "(0, 1]"),
        ({"qk_scale": 0.0}, "qk_scale", "(0, 1]"),
        ({"q_seqlen": [4, 5], "kv_seqlen": [4, 6]}, "kv_seqlen", "element-wise"),
        ({"q_seqlen": [4], "kv_seqlen": [4, 4]}, "kv_seqlen", "differs"),
        ({"mask_type": 3, "q_seqlen": [8], "kv_seqlen": [4], "kv_layout": "padded"}, "kv_seqlen", ">= q_seqlen"),
        ({"mask_type": 3, "kv_layout": "packed"}, "kv_layout", "padded"),
        ({"mask_type": 3, "head_num": 6, "kv_head_num": 4, "kv_layout": "padded"}, "kv_head_num", "multiple"),
        ({"dtype": "fp32"}, "dtype", "one of"),
        ({"q_layout": "4d"}, "q_layout", "one of"),
        ({"distribution": "cauchy"}, "distribution", "one of"),
        ({"q_seqlen": {"pattern": [1], "times": 8193}}, "q_seqlen", "8192"),
        ({"q_seqlen": [-1, 3]}, "q_seqlen", ">= 0"),
        ({"q_seqlen": [0, 0]}, "q_seqlen", "at least one"),
        ({"heads": 4}, "heads", "unknown field"),
        ({"perturb": "no_mask"}, "perturb", "only allowed with expect_error"),
        ({"kv_capacity": 3}, "kv_capacity", "the sum of kv_seqlen (4)"),  # packed: k's rows, spare ones allowed
        ({"kv_layout": "strided", "q_seqlen": [4, 8], "kv_capacity": 9}, "kv_capacity", "no capacity"),
        ({"kv_layout": "strided"}, "kv_layout", "needs ragged kv_seqlen"),
        ({"kv_capacity": 3, "kv_layout": "padded"}, "kv_capacity", ">= max kv_seqlen"),
        ({"mask_fill": "neg_inf"}, "mask_fill", "only with mask_type 2"),
        ({"mask_type": 2, "mask_fill": "zero"}, "mask_fill", "one of"),
        ({"padding": "nan"}, "padding", "leaves no row unread"),  # packed without spare rows
        ({"padding": "nan", "kv_layout": "padded", "q_seqlen": [4, 4]}, "padding", "leaves no row unread"),
        ({"padding": "inf", "kv_capacity": 9}, "padding", "one of"),
        ({"structure": {"logit_shift": 0.0}}, "structure.logit_shift", "nonzero number"),
        ({"structure": {"logit_shift": -200.0}}, "structure.logit_shift", "[-128, 128]"),
        (
            {"structure": {"logit_shift": 5.0, "logits": "sinks", "rise": 2.0, "sink_keys": 1}},
            "structure.logit_shift",
            "not with a logits trend",
        ),
        ({"qk_scale": 0.01, "structure": {"logit_shift": -100.0}}, "structure.logit_shift", "store raw Q.K"),
        ({"distribution": "large_raw_scores", "qk_scale": 1.07e-4}, "qk_scale", "within 5%"),
        ({"distribution": "large_raw_scores", "structure": {"logit_shift": 2.0}}, "structure", "no trend or shift"),
    ],
)
def test_validation_names_file_case_and_field(
    tmp_path: Path, fields: dict[str, object], field_name: str, fragment: str
) -> None:
    table = {"name": "bad-one", "head_num": 4, "q_seqlen": [4], **fields}
    body = "[[case]]\n" + "\n".join(f"{k} = {_toml(v)}" for k, v in table.items())
    path = write_suite(tmp_path, body)
    with pytest.raises(SpecError) as info:
        load_suite(path)
    err = info.value
    assert (err.source, err.case, err.field_name) == (str(path), "bad-one", field_name)
    assert str(path) in str(err) and "'bad-one'" in str(err) and fragment in str(err)


def _toml(value: object) -> str:
    if isinstance(value, dict):
        return "{ " + ", ".join(f"{k} = {_toml(v)}" for k, v in value.items()) + " }"
    if isinstance(value, str):
        return f'"{value}"'
    return str(value).lower() if isinstance(value, bool) else str(value)


def test_invalid_toml_and_unknown_tables_are_named(tmp_path: Path) -> None:
    path = write_suite(tmp_path, "[[case]\n")
    with pytest.raises(SpecError, match="not valid TOML"):
        load_suite(path)
    path.write_text("[cases]\nx = 1\n")
    with pytest.raises(SpecError, match="'cases'"):
        load_suite(path)


def test_duplicate_cases_are_rejected(tmp_path: Path) -> None:
    path = write_suite(tmp_path, "[[case]]\nhead_num = 1\nq_seqlen = [3]\n[[case]]\nhead_num = 1\nq_seqlen = [3]\n")
    with pytest.raises(SpecError, match="duplicates"):
        load_suite(path)


def test_expect_error_skips_value_validation() -> None:
    spec = build_case(
        {
            "head_num": 0,
            "q_seqlen": [4],
            "cache_mode": 3,
            "expect_error": "ERROR_INVALID_PARAM",
            "expect_stage": "create",
        },
        source="x",
    )
    assert spec.head_num == 0 and spec.cache_mode == 3
    with pytest.raises(SpecError, match="expect_error"):
        build_case({"head_num": 1, "q_seqlen": [4], "expect_error": "oops"}, source="x")


def test_case_id_is_readable_and_content_addressed() -> None:
    spec = build_case(
        {
            "head_num": 16,
            "q_seqlen": [1024] * 4,
            "kv_seqlen": [1024] * 4,
            "dtype": "bf16",
            "mask_type": "causal",
            "kv_layout": "padded",
        },
        source="x",
    )
    assert spec.case_id.startswith("bf16-causal-krope_ctkv-b4-s1024-h16-")
    assert spec.case_id.endswith(spec.short_hash) and len(spec.short_hash) == 8
    renamed = build_case(
        {
            "name": "other",
            "head_num": 16,
            "q_seqlen": [1024] * 4,
            "dtype": "bf16",
            "mask_type": 3,
            "kv_layout": "padded",
        },
        source="y",
    )
    assert renamed.content_hash == spec.content_hash  # names and sources do not change content
    reseeded = build_case(
        {"head_num": 16, "q_seqlen": [1024] * 4, "dtype": "bf16", "mask_type": 3, "kv_layout": "padded", "seed": 9},
        source="x",
    )
    assert reseeded.content_hash != spec.content_hash
    assert spec.qk_scale == DEFAULT_QK_SCALE


def test_toml_snippet_round_trips(tmp_path: Path) -> None:
    spec = build_case(
        {
            "head_num": 4,
            "kv_head_num": 2,
            "q_seqlen": [3, 0],
            "kv_seqlen": [7, 5],
            "mask_type": 3,
            "kv_layout": "padded",
            "distribution": "near_tie",
            "qk_scale": 0.5,
            "seed": 11,
        },
        source="x",
    )
    path = write_suite(tmp_path, spec.to_toml())
    (loaded,) = load_suite(path)
    assert loaded.content_hash == spec.content_hash
    # printed as a suite file writes it: the mask and cache by name, not the C enum's codes
    assert 'mask_type = "causal"' in spec.to_toml() and 'cache_mode = "krope_ctkv"' in spec.to_toml()


def test_fields_of_the_branch_levels_keep_old_hashes_and_name_the_case(tmp_path: Path) -> None:
    """mask_fill, padding and a logit shift count in the content hash only when given (every older case keeps its
    hash and golden), show in the case id, and round-trip through a printed snippet."""
    base = {"head_num": 2, "q_seqlen": [4, 8], "mask_type": 2, "kv_layout": "strided", "dtype": "bf16"}
    plain = build_case(base, source="x")
    assert not {"mask_fill", "padding"} & set(plain.content())
    shaped = build_case(
        {**base, "mask_fill": "neg_inf", "padding": "nan", "structure": {"logit_shift": -110.0}}, source="x"
    )
    assert shaped.content_hash != plain.content_hash
    assert "-shift-110-fill_neg_inf-pad_nan-" in shaped.case_id
    (loaded,) = load_suite(write_suite(tmp_path, shaped.to_toml()))
    assert loaded.content_hash == shaped.content_hash and loaded.structure == shaped.structure
    assert build_case({**base, "mask_fill": "one"}, source="x").mask_fill_name == "one"
    assert plain.mask_fill_name == "one" and build_case({**base, "dtype": "fp16"}, source="x").mask_fill_name == (
        "neg10000"
    )


def test_qk_scale_is_held_as_the_fp32_the_operator_receives() -> None:
    import numpy as np

    spec = build_case({"head_num": 1, "q_seqlen": [3], "qk_scale": 0.01}, source="x")
    assert spec.qk_scale == float(np.float32(0.01)) and spec.qk_scale != 0.01
    assert float(np.float32(192**-0.5)) == DEFAULT_QK_SCALE


@pytest.mark.parametrize(
    ("body", "field_name"),
    [
        ("case = 5\n", "suite.case"),  # still inside write_suite's [suite] table
        ("[defaults]\nheads = 4\n", "defaults.heads"),
        ("[[matrix]]\nhead_num = 1\nq_seqlen = [[3]]\nheads = 4\n", "heads"),
        ("[[case]]\nhead_num = 1\nq_seqlen = { pattern = [3], times = 2, every = 1 }\n", "q_seqlen"),
        ("[[case]]\nhead_num = 1\nq_seqlen = [640]\nstructure = { v_mean = 1.0, hue = 2 }\n", "structure.hue"),
    ],
)
def test_unknown_keys_are_rejected_in_every_table(tmp_path: Path, body: str, field_name: str) -> None:
    """A key no table knows (``[suite]`` holding ``case = 5``) fails, naming file, table and key."""
    path = write_suite(tmp_path, body)
    with pytest.raises(SpecError) as info:
        load_suite(path)
    assert info.value.field_name == field_name and str(path) in str(info.value)
    assert "unknown" in str(info.value) or "needs 'pattern'" in str(info.value)
