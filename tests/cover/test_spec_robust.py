"""The spec loader under hostile input: any TOML content gives a valid suite or a SpecError, never
another exception, a huge allocation or a path-unsafe case id; ``mlaconf list`` reports it in one line."""

from __future__ import annotations

import datetime
import json
import math
import os
import re
import time
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from mlaconf.facts.operator import MAX_BATCH
from mlaconf.golden import maintain
from mlaconf.golden.specs.spec import SpecError
from mlaconf.golden.specs.spec_build import build_case, spec_from_json, validate_case
from mlaconf.golden.specs.suites import load_suite

FIELDS = [
    "q_seqlen",
    "kv_seqlen",
    "head_num",
    "kv_head_num",
    "dtype",
    "mask_type",
    "cache_mode",
    "qk_scale",
    "q_layout",
    "kv_layout",
    "kv_capacity",
    "distribution",
    "seed",
    "expect_error",
    "expect_stage",
    "perturb",
    "name",
    "suite",
    "source",
]
SAFE_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+-]*")


def toml_value(value: Any) -> str:
    """A TOML literal for a Python value (inline tables and arrays)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf") if math.isinf(value) else repr(value)
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)
    if isinstance(value, (datetime.date, datetime.time)):
        return value.isoformat()
    if isinstance(value, list):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    return "{ " + ", ".join(f"{json.dumps(k)} = {toml_value(v)}" for k, v in value.items()) + " }"


def toml_document(top: dict[str, Any], tables: list[tuple[str, dict[str, Any]]]) -> str:
    lines = [f"{json.dumps(k)} = {toml_value(v)}" for k, v in top.items()]
    for header, table in tables:
        lines.append(header)
        lines += [f"{json.dumps(k)} = {toml_value(v)}" for k, v in table.items()]
    return "\n".join(lines) + "\n"


def write(tmp_path: Path, body: str, name: str = "suite.toml") -> Path:
    path = tmp_path / name
    path.write_text(body)
    return path


# -- named hostile inputs (each seen raising something else before) ---------------------------------


@pytest.mark.parametrize(
    ("body", "case", "field_name", "fragment"),
    [
        ("[[case]]\nhead_num = 1\nq_seqlen = [1]\ndtype = 1", "#0", "dtype", "must be one of"),
        ("[suite]\nname = 5\n", "<file>", "suite.name", "must match"),
        ("suite = 5\n", "<file>", "suite", "must be a table"),
        ("defaults = [1]\n", "<file>", "defaults", "must be a table"),
        ("case = 5\n", "<file>", "case", "array of tables"),
        ("matrix = [1]\n", "<file>", "matrix", "array of tables"),
        ("[[case]]\nhead_num = 1\nq_seqlen = [1]\nexpect_error = 1979-05-27", "#0", "expect_error", "ATB status"),
        ("[[case]]\nhead_num = 1\nq_seqlen = { pattern = 5, times = 2 }", "#0", "q_seqlen", "'pattern'"),
        ("[[case]]\nhead_num = 1\nq_seqlen = { pattern = [1], times = 50000000 }", "#0", "q_seqlen", "8192"),
        ("[[case]]\nhead_num = 1\nq_seqlen = [1]\nseed = -1", "#0", "seed", "[0, 9223372036854775807]"),
        ("[[case]]\nhead_num = 1\nq_seqlen = [1]\nseed = 9223372036854775808", "#0", "seed", "integer in"),
        ("[[case]]\nhead_num = 1\nq_seqlen = [2147483648]", "#0", "q_seqlen", "int32"),
        ("[[case]]\nhead_num = 1\nq_seqlen = [1]\nkv_seqlen = [-2147483649]", "#0", "kv_seqlen", "int32"),
        ("[[case]]\nhead_num = 99999999999999999999\nq_seqlen = [1]", "#0", "head_num", "integer in"),
        ('[[case]]\nname = "s"\nhead_num = 1\nq_seqlen = [1]\nqk_scale = 1e400', "s", "qk_scale", "must be in (0, 1]"),
        (
            "[[case]]\nhead_num = 1\nq_seqlen = [1]\nqk_scale = 99999999999999999999999999999999999999999999999"
            "9999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999"
            "9999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999"
            "9999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999999",
            "#0",
            "qk_scale",
            "must be a number",
        ),
        (
            '[[case]]\nhead_num = 1\nq_seqlen = [4]\nexpect_error = "ERROR_X"\nperturb = "../../etc/x"',
            "#0",
            "perturb",
            "no path separators",
        ),
        ('[[case]]\nhead_num = 1\nq_seqlen = [4]\nname = "a/b"', "#0", "name", "no path separators"),
        ('[[case]]\nhead_num = 1\nq_seqlen = [4]\nname = ".hidden"', "#0", "name", "no path separators"),
        ("[[case]]\nhead_num = 1\nq_seqlen = [4]\nsuite = 5", "#0", "suite", "must be a string matching"),
        (
            '[[case]]\nhead_num = 1\nq_seqlen = [4]\nexpect_stage = 3\nexpect_error = "ERROR_X"',
            "#0",
            "expect_stage",
            "must be one of",
        ),
        ("[[case]]\nhead_num = 1\nq_seqlen = [4]\nmask_type = 4294967296", "#0", "mask_type", "int32"),
        ('[[case]]\nhead_num = 1\nq_seqlen = [4]\nkv_capacity = "x"', "#0", "kv_capacity", "integer in"),
        ("[[matrix]]\nhead_num = 1\nq_seqlen = [[1]]\ndtype = []", "matrix #0", "dtype", "at least one value"),
        (
            "[[matrix]]\nq_seqlen = [[1]]\n" + "\n".join(f"k{i} = [{{seed = 1}}, {{seed = 2}}]" for i in range(30)),
            "matrix #0",
            "<matrix>",
            "at most 10000",
        ),
        ("[[case]]\n" * 10_001, "<file>", "case", "at most 10000"),
    ],
)
def test_hostile_content_is_a_spec_error_naming_file_case_and_field(
    tmp_path: Path, body: str, case: str, field_name: str, fragment: str
) -> None:
    path = write(tmp_path, body)
    start = time.monotonic()
    with pytest.raises(SpecError) as info:
        load_suite(path)
    assert time.monotonic() - start < 2.0, "rejected only after expanding"
    assert (info.value.source, info.value.case, info.value.field_name) == (str(path), case, field_name)
    assert fragment in str(info.value) and "\n" not in str(info.value)


def test_error_cases_may_exceed_the_batch_limit_to_test_it_but_not_without_bound(tmp_path: Path) -> None:
    base = '[[case]]\nhead_num = 1\nexpect_error = "ERROR_INVALID_TENSOR_DIM"\nq_seqlen = { pattern = [1], times = '
    (spec,) = load_suite(write(tmp_path, base + f"{MAX_BATCH + 1} }}"))
    assert spec.batch == MAX_BATCH + 1
    with pytest.raises(SpecError, match="at most 16384 entries"):
        load_suite(write(tmp_path, base + "50000000 }"))


@pytest.mark.parametrize("data", [b"\xff\xfe[[case]]\n", b"a = " + b"[" * 5000 + b"]" * 5000 + b"\n"])
def test_undecodable_or_deeply_nested_files_are_spec_errors(tmp_path: Path, data: bytes) -> None:
    path = tmp_path / "bad.toml"
    path.write_bytes(data)
    with pytest.raises(SpecError) as info:
        load_suite(path)
    assert info.value.case == "<file>" and info.value.field_name in ("<file>", "<toml>")


def test_stored_spec_json_is_checked_like_a_suite() -> None:
    spec = build_case({"q_seqlen": [3], "head_num": 2}, source="test")
    assert spec_from_json(spec.to_json()) == spec
    for text in ("[1]", "{", json.dumps({**json.loads(spec.to_json()), "perturb": "../x"})):
        with pytest.raises(SpecError):
            spec_from_json(text)


def test_unknown_suite_names_cannot_escape_the_cases_directory() -> None:
    from mlaconf.golden.specs.suites import load_suites

    with pytest.raises(SpecError, match=re.escape("no suite named '../cases/smoke'")):
        load_suites(["../cases/smoke"])


@pytest.mark.parametrize(
    "body",
    [
        "case = 5\n",
        "[[case]]\nhead_num = 1\nq_seqlen = [1]\nseed = -1\n",
        "x = [\n",
        "[[case]]\nhead_num = 1\nq_seqlen = { pattern = [1], times = 50000000 }\n",
    ],
)
def test_mlaconf_list_reports_a_bad_file_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], body: str
) -> None:
    path = write(tmp_path, body)
    assert maintain.main(["list", "--cases", str(path), "--out", str(tmp_path / "store")]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: {path}: ") and err.count("\n") == 1, err


# -- fuzz ---------------------------------------------------------------------------------------------

SCALARS = st.one_of(
    st.integers(-(2**66), 2**66),
    st.sampled_from([0, 1, 2, 3, 4, 16, 128, 129, 8192, 8193, -1, 2**31 - 1, 2**31, 2**63, 50_000_000]),
    st.floats(allow_nan=True, allow_infinity=True),
    st.booleans(),
    st.text(max_size=12),
    st.sampled_from(
        [
            "fp16",
            "bf16",
            "causal",
            "mask_free",
            "undefined",
            "padded",
            "packed",
            "2d",
            "3d",
            "normal",
            "krope_ctkv",
            "ERROR_INVALID_PARAM",
            "setup",
            "drop_mask",
            "../x",
            "a/b",
            "",
            "x" * 200,
        ]
    ),
    st.dates(),
    st.datetimes(),
    st.times(),
)
LENGTHS = st.one_of(
    st.lists(st.integers(-3, 300), max_size=5),
    st.fixed_dictionaries(
        {
            "pattern": st.one_of(st.lists(st.integers(0, 9), max_size=3), SCALARS),
            "times": st.one_of(st.integers(-2, 9), st.just(50_000_000), SCALARS),
        }
    ),
)
VALUES = st.one_of(
    SCALARS, LENGTHS, st.lists(SCALARS, max_size=3), st.dictionaries(st.sampled_from(FIELDS), SCALARS, max_size=2)
)
KEYS = st.sampled_from([*FIELDS, "heads", "pattern", "batch", "x"])
TABLES = st.dictionaries(KEYS, VALUES, max_size=6)


@st.composite
def plausible_case(draw: st.DrawFn) -> dict[str, Any]:
    """Mostly valid fields, sometimes one random replacement: reaches deep into validation."""
    small = st.lists(st.integers(0, 64), min_size=1, max_size=3)
    case: dict[str, Any] = {
        "head_num": draw(st.sampled_from([1, 2, 4])),
        "q_seqlen": draw(st.one_of(small, small, LENGTHS)),
    }
    case.update(
        draw(
            st.fixed_dictionaries(
                {},
                optional={
                    "dtype": st.sampled_from(["fp16", "bf16"]),
                    "mask_type": st.sampled_from([0, 2, 3, "causal", 1]),
                    "kv_layout": st.sampled_from(["padded", "packed"]),
                    "seed": st.integers(0, 2**64),
                    "q_layout": st.sampled_from(["2d", "3d"]),
                    "kv_capacity": st.integers(0, 70),
                    "kv_seqlen": st.one_of(small, LENGTHS),
                    "kv_head_num": st.sampled_from([1, 2, 3]),
                    "qk_scale": st.floats(0, 2),
                    "expect_error": st.sampled_from(["ERROR_INVALID_PARAM", "bad"]),
                    "perturb": st.sampled_from(["drop_mask", "../x", ""]),
                    "name": st.one_of(st.sampled_from(["n1", "case.2", "a/b", ".x"]), st.text(max_size=6)),
                },
            )
        )
    )
    if draw(st.integers(0, 2)) == 0:
        case.update(draw(st.dictionaries(KEYS, VALUES, max_size=1)))
    return case


@st.composite
def suite_documents(draw: st.DrawFn) -> str | bytes:
    kind = draw(st.sampled_from(["structured"] * 6 + ["top", "text", "bytes"]))
    if kind == "top":  # a top-level table given as something else
        return toml_document({draw(st.sampled_from(["suite", "defaults", "case", "matrix"])): draw(VALUES)}, [])
    if kind == "text":
        return draw(st.text(max_size=200))
    if kind == "bytes":
        return draw(st.binary(max_size=200))
    top = {}
    if draw(st.integers(0, 3)) == 0:
        top = draw(st.dictionaries(st.sampled_from(["suite", "defaults", "case", "matrix", "x"]), VALUES, max_size=1))
    tables: list[tuple[str, dict[str, Any]]] = []
    if draw(st.booleans()):
        suite = st.fixed_dictionaries(
            {},
            optional={
                "name": st.one_of(st.just("mine"), st.just("mine"), SCALARS),
                "description": st.one_of(st.text(max_size=9), SCALARS),
            },
        )
        tables.append(("[suite]", draw(suite)))
    if draw(st.booleans()):
        tables.append(("[defaults]", draw(st.one_of(st.just({"head_num": 2}), st.just({"seed": 3}), TABLES))))
    tables += [
        ("[[case]]", c) for c in draw(st.lists(st.one_of(plausible_case(), plausible_case(), TABLES), max_size=3))
    ]
    matrix = st.dictionaries(KEYS, st.one_of(VALUES, st.lists(VALUES, max_size=3)), max_size=4)
    tables += [("[[matrix]]", m) for m in draw(st.lists(st.one_of(matrix, plausible_case()), max_size=2))]
    return toml_document(
        top if not any(h == f"[{k}]" or h == f"[[{k}]]" for k in top for h, _ in tables) else {}, tables
    )


@pytest.fixture(scope="module")
def fuzz_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("spec-fuzz")


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(document=suite_documents())
def test_any_suite_file_gives_a_valid_suite_or_a_spec_error(fuzz_dir: Path, document: str | bytes) -> None:
    path = fuzz_dir / "fuzz.toml"
    if isinstance(document, bytes):
        path.write_bytes(document)
    else:
        path.write_text(document, encoding="utf-8")
    start = time.monotonic()
    try:
        cases = load_suite(path)
    except SpecError as exc:
        assert exc.source == str(path) and "\n" not in str(exc)
        event(f"SpecError: field {exc.field_name}")
        return
    finally:
        assert time.monotonic() - start < 5.0
    event(f"valid suite ({'no' if not cases else 'some'} cases)")
    for spec in cases:  # a valid suite: contract-valid, path-safe ids, round trips through JSON
        if spec.expect_error is None:
            validate_case(spec)
        assert SAFE_ID.fullmatch(spec.case_id) and len(spec.case_id) < 255, spec.case_id
        assert spec_from_json(spec.to_json()) == spec


@pytest.mark.timeout(60)
def test_a_fifo_given_as_a_suite_file_is_refused_without_reading_it(tmp_path: Path) -> None:
    """A FIFO (or a device) would block the read for ever: ``list``, ``coverage`` and ``run`` get one error."""
    fifo = tmp_path / "cases.toml"
    os.mkfifo(fifo)
    with pytest.raises(SpecError, match="not a regular file"):
        load_suite(fifo)
