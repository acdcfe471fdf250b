"""mlaconf.judge.deviations: the seeded ATB entries, each selector, CANN version ordering, load errors."""

from __future__ import annotations

import functools
from pathlib import Path

import pytest

from mlaconf.facts.releases import compare_versions, in_range, parse_range
from mlaconf.golden.specs.spec import CaseSpec
from mlaconf.judge.deviations import DEFAULT_PATH, DeviationError, explaining, load_deviations, release_note


def _spec(q: tuple[int, ...], kv: tuple[int, ...] | None = None, **kw: object) -> CaseSpec:
    fields: dict[str, object] = dict(q_seqlen=q, kv_seqlen=kv or q, head_num=4, kv_head_num=4)
    fields.update(kw)
    return CaseSpec(**fields)  # type: ignore[arg-type]


#: The hicann/ascend-transformer-boost commit the shipped entries were reviewed against.
ATB_REVIEW_COMMIT = "ddcc8b6225b8b7d4703c69c319244bdea0f0c9a1"

CAUSAL_PREFIX_100 = _spec((28, 28), (128, 128), mask_type=3, kv_layout="padded")
SWA = _spec((16,), mask_type=4, expect_error="ERROR_INVALID_PARAM")
PADDED_RAGGED = _spec((16, 32), mask_type=0, kv_layout="padded")
PLAIN = _spec((16, 16), mask_type=0, kv_layout="packed")


def test_seeded_entries() -> None:
    devs = load_deviations()
    assert [d.id for d in devs.entries] == [
        "atb-c-causal-in-tensor-num",
        "atb-c-swa-norm-window-size",
        "atb-c-swa-norm-not-prefill",
        "atb-padded-kv-ragged",
        "atb-causal-prefix-not-128",
        "atb-nan-qk-scale-accepted",
        "atb-padded-kv-capacity",
        "atb-causal-kv-below-q-accepted",
        "atb-fp16-raw-scores-overflow",
        "zoo-fp16-score-path-raw-overflow",
        "atb-mask-free-fill-one-added",
        "atb-mask-free-fill-negative-multiplied",
    ]
    atb = [d for d in devs.entries if d.backend == "atb"]
    assert all(d.status == "unconfirmed" and d.reference for d in atb)
    # the zoo members on ATB's fp16 score path share its raw-score overflow, seen on the CPU
    (zoo,) = [d for d in devs.entries if d.backend != "atb"]
    assert zoo.backend == "zoo-*fp16*" and zoo.status == "confirmed" and not zoo.versions
    outcomes = [(d.outcome, d.error_status) for d in devs.entries]
    assert outcomes == [
        ("error", "ERROR_INVALID_IN_TENSOR_NUM"),
        ("error", "ERROR_INVALID_PARAM"),
        ("error", "ERROR_INVALID_PARAM"),
        *[("fail", None)] * 9,
    ]
    assert [d.stage for d in devs.entries[:3]] == ["setup", "create", "create"]
    # every entry was reviewed against ATB's source at one pinned commit
    assert {d.source_commit for d in devs.entries} == {ATB_REVIEW_COMMIT}
    assert f"@ {ATB_REVIEW_COMMIT[:12]}]" in devs.entries[0].describe()


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        (CAUSAL_PREFIX_100, "atb-c-causal-in-tensor-num"),
        (SWA, "atb-c-swa-norm-not-prefill"),  # 8.2.RC1: SWA_NORM is no prefill mask there
        (PADDED_RAGGED, "atb-padded-kv-ragged"),
        (_spec((32, 16), mask_type=0, kv_layout="padded"), None),  # only the last batch short: read right
        (_spec((16, 0, 8), mask_type=0, kv_layout="padded"), "atb-padded-kv-ragged"),
        (_spec((16, 32), mask_type=0, kv_layout="packed"), None),  # ragged, but packed
        (_spec((32, 32), mask_type=0, kv_layout="padded"), None),  # padded, not ragged
        (_spec((32, 32), mask_type=0, kv_layout="padded", kv_capacity=40), "atb-padded-kv-capacity"),
        (_spec((32,), mask_type=0, kv_layout="padded", kv_capacity=40), None),  # one batch: starts at row 0
        (_spec((32, 32), mask_type=0, kv_layout="padded", kv_capacity=32), None),  # S == max kv
        (PLAIN, None),
    ],
)
def test_seeded_matching(spec: CaseSpec, expected: str | None) -> None:
    found = load_deviations().match("atb", "8.2.RC1", spec)
    assert (found.id if found else None) == expected


def test_swa_norm_reason_follows_the_release() -> None:
    devs = load_deviations()
    assert [devs.match("atb", v, SWA).id for v in ("8.2.RC1", "8.3.RC1", "9.0.0")] == [  # type: ignore[union-attr]
        "atb-c-swa-norm-not-prefill",
        "atb-c-swa-norm-window-size",
        "atb-c-swa-norm-window-size",
    ]


def test_backend_and_version_gate() -> None:
    devs = load_deviations()
    assert devs.match("torch-cpu", "8.2.RC1", PADDED_RAGGED) is None
    assert devs.match("atb", "8.1.RC1", PADDED_RAGGED) is None  # before the C interface shipped
    assert devs.match("atb", "8.3.RC1.alpha002", PADDED_RAGGED) is not None
    assert devs.match("atb", None, PADDED_RAGGED) is None  # unknown version: never excused
    assert devs.match("atb", "not-a-version", PADDED_RAGGED) is None


def test_an_unknown_release_is_judged_against_every_release_an_entry_names() -> None:
    """A source build of ATB has no release: the entries of every range are candidates, the one whose
    prediction was seen explains it (never a regression, never a pass), and the note says so with the fix."""
    devs = load_deviations()
    swa = devs.candidates("atb", None, SWA)
    assert [d.id for d in swa] == ["atb-c-swa-norm-window-size", "atb-c-swa-norm-not-prefill"]
    assert [d.id for d in devs.candidates("atb", "8.2.RC1", SWA)] == ["atb-c-swa-norm-not-prefill"]
    assert devs.candidates("atb", None, PLAIN) == [] and devs.candidates("torch-cpu", None, PADDED_RAGGED) == []
    ragged = devs.candidates("atb", None, PADDED_RAGGED)
    chosen = explaining(ragged, False, None)
    assert chosen is not None and chosen.classify(False, None) == "expected"  # the misread seen: xfailed
    assert chosen.classify(True, None) == "unexpected_pass"  # conforming: xpassed, never a plain pass
    note = release_note(None, chosen)
    assert note.startswith("; ATB release unknown (") and "MLA_ATB_VERSION=<release>" in note
    assert f"{chosen.id} (>=8.2.RC1) is the one that explains it" in note
    assert release_note("8.2.RC1", chosen) == "" and explaining([], True, None) is None


SELECTOR_FILE = """
[[deviation]]
id = "{id}"
backend = "{backend}"
outcome = "fail"
status = "confirmed"
reason = "r"
reference = "spec"
[deviation.select]
{select}
"""


def _one(tmp_path: Path, select: str, backend: str = "*") -> Path:
    path = tmp_path / "devs.toml"
    path.write_text(SELECTOR_FILE.format(id="d", backend=backend, select=select))
    return path


@pytest.mark.parametrize(
    ("select", "hit", "miss"),
    [
        ('dtype = "bf16"', _spec((4,), dtype="bf16"), _spec((4,), dtype="fp16")),
        ('mask = "mask_*"', _spec((4,), mask_type=2), _spec((4,), mask_type=0)),
        ('kv_layout = "padded"', _spec((4,), kv_layout="padded"), _spec((4,), kv_layout="packed")),
        ("ragged = true", _spec((4, 5)), _spec((4, 4))),
        ("ragged = false", _spec((4, 4)), _spec((4, 5))),
        ("padded_kv_misread = true", _spec((4, 5), kv_layout="padded"), _spec((5, 4), kv_layout="padded")),
        ("padded_kv_misread = true", _spec((2, 2), kv_layout="padded", kv_capacity=3), _spec((4, 5))),
        ("causal_prefix_mod128 = true", _spec((4,), (104,), mask_type=3), _spec((4,), (132,), mask_type=3)),
        ("causal_prefix_mod128 = false", _spec((4, 0), (260, 7)), _spec((4,), (5,))),  # q=0 batch ignored
        ('case = "*-h8-*"', _spec((4,), head_num=8, kv_head_num=8), _spec((4,))),
        ('mask_fill = "neg*"', _spec((4,), mask_type=2, mask_fill="neg_inf"), _spec((4,), mask_type=2, dtype="bf16")),
        ('mask_fill = "neg10000"', _spec((4,), mask_type=2), _spec((4,))),  # fp16's documented fill; no mask
        (
            "fp16_raw_overflow = true",
            _spec((4,), distribution="large_raw_scores", qk_scale=1e-4),
            _spec((4,), distribution="large_raw_scores", qk_scale=1e-4, mask_type=3),  # fp32 scores under CAUSAL
        ),
        (
            "fp16_raw_overflow = true",
            _spec((4,), distribution="large_raw_scores", qk_scale=1e-4),
            _spec((4,), distribution="large_raw_scores", qk_scale=5e-4),  # raw products near 14,000
        ),
    ],
)
def test_each_selector(tmp_path: Path, select: str, hit: CaseSpec, miss: CaseSpec) -> None:
    devs = load_deviations(_one(tmp_path, select))
    assert devs.match("anything", "1.0", hit) is not None
    assert devs.match("anything", "1.0", miss) is None


def test_backend_glob_and_no_version_range(tmp_path: Path) -> None:
    devs = load_deviations(_one(tmp_path, "", backend="torch-*"))
    assert devs.match("torch-cuda", None, PLAIN) is not None  # no range: version not needed
    assert devs.match("atb", None, PLAIN) is None


VERSIONS_IN_ORDER = [
    "8.0.RC3",
    "8.0.0",
    "8.1.RC1",
    "8.2.RC1",
    "8.2.RC2",
    "8.2.0",
    "8.2.1",
    "8.3.RC1.alpha001",
    "8.3.RC1.alpha002",
    "8.3.RC1",
    "8.3.RC2",
    "8.3.0",
    "9",
]


def test_version_ordering() -> None:
    shuffled = list(reversed(VERSIONS_IN_ORDER))
    assert sorted(shuffled, key=functools.cmp_to_key(compare_versions)) == VERSIONS_IN_ORDER
    assert compare_versions("8.2", "8.2.0") == 0 and compare_versions("8.2.0", "8.2.0.0") == 0
    assert compare_versions("8.2.rc1", "8.2.RC1") == 0
    assert compare_versions("8.2.RC10", "8.2.RC9") == 1
    assert compare_versions("v8.2.RC1", "CANN 8.2.RC1") == 0
    with pytest.raises(ValueError):
        compare_versions("unknown", "8.2.0")


def test_ranges() -> None:
    clauses = parse_range(">=8.2.RC1, <9")
    assert clauses == [(">=", "8.2.RC1"), ("<", "9")]
    got = [in_range(v, clauses) for v in ("8.1.0", "8.2.RC1", "8.5.0", "9.0.0")]
    assert got == [False, True, True, False]
    assert in_range("8.2.0", parse_range("8.2.0")) and not in_range("8.2.1", parse_range("8.2.0"))
    assert in_range("8.2.1", parse_range("!=8.2.0,>8.2.RC2,<=8.2.1"))
    for bad in (">=", "~8.2", ">=RC1"):
        with pytest.raises(ValueError):
            parse_range(bad)


def test_classify() -> None:
    devs = load_deviations()
    error_dev, numeric_dev = devs.entries[0], devs.entries[3]
    assert error_dev.classify(False, "ERROR_INVALID_IN_TENSOR_NUM") == "expected"
    assert error_dev.classify(False, "ERROR_INVALID_PARAM") == "different"
    assert error_dev.classify(True, None) == "unexpected_pass"
    assert error_dev.classify(True, "ERROR_INVALID_PARAM") == "unexpected_pass"  # the documented rejection
    assert error_dev.classify(False, None) == "different"
    assert numeric_dev.classify(False, None) == "expected"
    assert numeric_dev.classify(True, None) == "unexpected_pass"
    assert numeric_dev.classify(False, "ERROR_RT_FAIL") == "different"
    assert "ERROR_INVALID_IN_TENSOR_NUM" in error_dev.describe() and "unconfirmed" in error_dev.describe()


BASE_ENTRY = 'id = "x"\nbackend = "atb"\noutcome = "fail"\nstatus = "unconfirmed"\nreason = "r"\nreference = "s"\n'


@pytest.mark.parametrize(
    ("body", "field"),
    [
        (BASE_ENTRY.replace('reason = "r"\n', ""), "reason"),
        (BASE_ENTRY.replace('"fail"', '"error"'), "error_status"),
        (BASE_ENTRY.replace('"fail"', '"error"') + 'error_status = "ERROR_NOPE"\n', "error_status"),
        (BASE_ENTRY + 'error_status = "ERROR_INVALID_PARAM"\n', "error_status"),
        (BASE_ENTRY.replace('"fail"', '"crash"'), "outcome"),
        (BASE_ENTRY.replace('"unconfirmed"', '"maybe"'), "status"),
        (BASE_ENTRY + 'versions = ">=eight"\n', "versions"),
        (BASE_ENTRY + "colour = 1\n", "colour"),
        (BASE_ENTRY + "[deviation.select]\nheads = 4\n", "select.heads"),
        (BASE_ENTRY + "[deviation.select]\nragged = 1\n", "select.ragged"),
        (BASE_ENTRY + "[deviation.select]\ndtype = 16\n", "select.dtype"),
        (BASE_ENTRY + 'source_commit = "ddcc8b622"\n', "source_commit"),
        (BASE_ENTRY + f'source_commit = "{ATB_REVIEW_COMMIT.upper()}"\n', "source_commit"),
    ],
)
def test_load_errors_name_file_entry_and_field(tmp_path: Path, body: str, field: str) -> None:
    path = tmp_path / "devs.toml"
    path.write_text("[[deviation]]\n" + body)
    with pytest.raises(DeviationError) as info:
        load_deviations(path)
    assert info.value.field_name == field
    assert str(path) in str(info.value) and "'x'" in str(info.value)


def test_duplicate_ids_and_bad_toml(tmp_path: Path) -> None:
    path = tmp_path / "devs.toml"
    path.write_text(("[[deviation]]\n" + BASE_ENTRY) * 2)
    with pytest.raises(DeviationError, match="duplicate id"):
        load_deviations(path)
    path.write_text("[[deviation]\n")
    with pytest.raises(DeviationError, match="not valid TOML"):
        load_deviations(path)


def test_default_path_is_shipped_file() -> None:
    assert load_deviations().source == str(DEFAULT_PATH) and DEFAULT_PATH.name == "known_deviations.toml"
