"""mlaconf.judge.metrics: every metric against a hand-computed example, ULP counting, NaN/Inf, chunking."""

from __future__ import annotations

import json
import math

import ml_dtypes
import numpy as np
import pytest

from mlaconf.golden.building import chunks
from mlaconf.judge import metrics as gm
from mlaconf.judge.metrics import Metrics, compute_metrics, locate, round_to_dtype, ulp_distance

BF16 = ml_dtypes.bfloat16


def _worst(m: Metrics) -> tuple[int, int, int, int, int]:
    """(batch, row in batch, token, head, column) of the worst element."""
    assert m.worst is not None
    return m.worst.batch, m.worst.row_in_batch, m.worst.token, m.worst.head, m.worst.column


def _hand_case() -> tuple[np.ndarray, np.ndarray, np.ndarray, list[int]]:
    """T=4 (batches of 1, 2, 1 rows; row 3 is 'don't care' and holds NaN), H=1, D=2."""
    expected = np.array([[[1.0, 3.0]], [[0.5, -1.0]], [[0.0, 1.5]], [[7.0, 7.0]]])
    actual = np.array(
        [[[1 + 2**-10, 3.0]], [[0.5, -1.0]], [[2**-12, 1.5 - 2**-9]], [[np.nan, np.inf]]], dtype=np.float16
    )
    row_valid = np.array([True, True, True, False])
    return actual, expected, row_valid, [1, 2, 1]


def test_hand_computed_example_fp16() -> None:
    actual, expected, row_valid, q_seqlen = _hand_case()
    m = compute_metrics(actual, expected, row_valid, "fp16", q_seqlen)
    # errors a - g on the six valid elements: +2^-10 (g=1), +2^-12 (g=0), -2^-9 (g=1.5)
    rel = [2**-10, 2**-12 / 2**-11, 2**-9 / 1.5]  # g = 0 uses the fp16 floor 2^-11
    assert m.n_elements == 6 and m.n_rows == 3
    assert m.max_abs_err == 2**-9
    assert m.max_rel_err == 0.5
    assert m.mean_rel_err == pytest.approx(sum(rel) / 6, rel=1e-15)
    assert m.rmse == pytest.approx(math.sqrt((2**-20 + 2**-24 + 2**-18) / 6), rel=1e-15)
    assert m.eb_rel == pytest.approx(-3 * 2**-12 / 7.0, rel=1e-15)  # Σ(a-g) / Σ|g|
    assert m.mean_signed_err == pytest.approx(-3 * 2**-12 / 6, rel=1e-15)
    a = [1 + 2**-10, 3.0, 0.5, -1.0, 2**-12, 1.5 - 2**-9]
    g = [1.0, 3.0, 0.5, -1.0, 0.0, 1.5]
    dot = sum(x * y for x, y in zip(a, g, strict=True))
    cosine = dot / math.sqrt(sum(x * x for x in a) * sum(y * y for y in g))
    assert m.cosine == pytest.approx(cosine, rel=1e-15)
    assert m.cosine < 1.0
    assert m.max_ulp_err == 3072  # 2^-12 vs 0: 1023 subnormals + 2 binades of 1024, fp16 bits 0x0C00
    assert m.frac_beyond_thousandth == pytest.approx(2 / 6)  # 0.5 and 2^-9/1.5 exceed 0.001
    assert m.atb_max_scaled_err == 2**-9 / 1.5
    assert m.max_abs_expected == 3.0
    assert m.rms_expected == pytest.approx(math.sqrt((1 + 9 + 0.25 + 1 + 0 + 2.25) / 6), rel=1e-15)
    # the invalid row's NaN/Inf is not looked at
    assert (m.nan_count, m.inf_count, m.expected_nan_count, m.expected_inf_count) == (0, 0, 0, 0)
    assert m.nan_positions_match and m.inf_positions_match and m.finite
    # worst ATB-scaled element: token 2 = batch 1, row 1; head 0, column 1
    assert _worst(m) == (1, 1, 2, 0, 1)
    assert m.worst is not None and (m.worst.expected, m.worst.actual, m.worst.error) == (1.5, 1.5 - 2**-9, 2**-9)
    assert m.worst.text().startswith("batch 1 row 1 (token 2) head 0 col 1: golden 1.5, got 1.49805, error 0.00195312")
    assert "worst" not in m.to_dict()  # a record names one element: the verdict's, not the metrics' own


def test_bf16_floor_and_thousandth_threshold() -> None:
    expected = np.array([[[0.0, 1.0, 1 + 2**-9]]])
    actual = np.array([[[2**-10, 1 + 2**-7, 1.0]]]).astype(BF16)
    m = compute_metrics(actual, expected, np.array([True]), "bf16", [1])
    assert m.max_rel_err == 2**-10 / 2**-8  # g = 0 uses the bf16 floor 2^-8
    # rel errs 0.25, 2^-7 = 0.0078 and 2^-9/(1+2^-9) = 0.00195: only the first two exceed 0.004
    assert m.frac_beyond_thousandth == pytest.approx(2 / 3)
    assert m.max_ulp_err == (127 - 10) * 128  # 2^-10 vs 0: bf16 bits 0x3A80 (exponent field 117)


def test_zero_golden_uses_floor_per_dtype() -> None:
    expected = np.zeros((1, 1, 1))
    m16 = compute_metrics(np.array([[[2**-12]]], dtype=np.float16), expected, np.array([True]), "fp16", [1])
    mbf = compute_metrics(np.array([[[2**-12]]]).astype(BF16), expected, np.array([True]), "bf16", [1])
    assert m16.max_rel_err == 2**-12 / 2**-11
    assert mbf.max_rel_err == 2**-12 / 2**-8
    assert m16.frac_beyond_thousandth == 1.0 and mbf.frac_beyond_thousandth == 1.0


@pytest.mark.parametrize(
    ("dtype", "a", "e", "ulps"),
    [
        ("fp16", np.nextafter(np.float16(1), np.float16(2)), 1.0, 1),
        ("fp16", np.float16(2) - np.float16(2**-10), 2.0, 1),  # across a binade boundary
        ("fp16", np.float16(2**-24), -(2.0**-24), 2),  # sign crossing: -min, 0, +min
        ("fp16", np.float16(-0.0), 0.0, 0),  # +0 and -0 are the same value
        ("fp16", np.float16(1), 1 + 0.4 * 2**-10, 0),  # expected rounds to 1 first
        ("fp16", np.float16(65504), 1e6, math.inf),  # golden beyond range: inf, never a small count
        ("bf16", BF16(1 + 2**-7), 1.0, 1),
        ("bf16", BF16(-(2.0**-133)), 2.0**-133, 2),  # smallest bf16 subnormals, either sign
        ("bf16", BF16(1 + 2**-7), 1 + 2**-8 + 2**-30, 0),  # correct (single) rounding of the golden
        ("bf16", BF16(-1.0), 1.0, 2 * 0x3F80),
    ],
)
def test_ulp_distance(dtype: str, a: object, e: float, ulps: float) -> None:
    got = ulp_distance(np.array([a]), np.array([e]), dtype)
    assert got.tolist() == [ulps]


def test_round_to_dtype_bf16_is_single_rounding() -> None:
    x = np.array([1 + 2**-8 + 2**-30, -(1 + 2**-8 + 2**-30), 1 + 2**-8, 1 + 3 * 2**-8, 1e-50, 1e40])
    got = round_to_dtype(x, "bf16").astype(np.float64)
    assert got.tolist() == [1 + 2**-7, -(1 + 2**-7), 1.0, 1 + 2**-6, 0.0, math.inf]
    assert round_to_dtype(np.array([1 + 2**-11 + 2**-40]), "fp16").astype(np.float64).tolist() == [1 + 2**-10]


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
def test_nonfinite_actual_never_looks_passing(bad: float, dtype: str) -> None:
    rng = np.random.default_rng(1)
    expected = rng.normal(size=(5, 2, 4))
    actual = round_to_dtype(expected, dtype)
    actual[3, 1, 2] = bad
    m = compute_metrics(actual, expected, np.ones(5, bool), dtype, [2, 3])
    for value in (m.max_abs_err, m.max_rel_err, m.mean_rel_err, m.rmse, m.max_ulp_err, m.atb_max_scaled_err):
        assert value == math.inf
    assert math.isnan(m.cosine)
    assert not m.finite
    assert (m.nan_count, m.inf_count) == ((1, 0) if math.isnan(bad) else (0, 1))
    assert m.nan_positions_match == (not math.isnan(bad))
    assert m.inf_positions_match == math.isnan(bad)
    assert _worst(m) == (1, 1, 3, 1, 2)


def test_nonfinite_expected_is_counted() -> None:
    expected = np.array([[[np.inf, np.nan]]])
    actual = np.array([[[np.inf, np.nan]]], dtype=np.float16)
    m = compute_metrics(actual, expected, np.array([True]), "fp16", [1])
    assert (m.expected_inf_count, m.expected_nan_count) == (1, 1)
    assert m.nan_positions_match and m.inf_positions_match
    assert m.max_abs_err == math.inf  # matching non-finite values are still not "small errors"


def test_chunked_equals_unchunked(monkeypatch: pytest.MonkeyPatch) -> None:
    rng = np.random.default_rng(2)
    expected = rng.normal(size=(37, 3, 8))
    actual = (expected * (1 + rng.normal(scale=1e-3, size=expected.shape))).astype(np.float16)
    actual[30, 2, 5] += 0.25  # the worst element sits in a late chunk
    row_valid = rng.random(37) > 0.2
    row_valid[30] = True
    q_seqlen = [10, 0, 27]
    whole = compute_metrics(actual, expected, row_valid, "fp16", q_seqlen)
    monkeypatch.setattr(chunks, "CHUNK_ELEMENTS", 7)  # below one row: one row per chunk
    chunked = compute_metrics(actual, expected, row_valid, "fp16", q_seqlen)
    for key, value in whole.to_dict().items():
        other = chunked.to_dict()[key]
        if isinstance(value, float):
            assert other == pytest.approx(value, rel=1e-12), key
        else:
            assert other == value, key
    assert _worst(chunked) == (2, 20, 30, 2, 5)


def test_locate_with_empty_batches() -> None:
    assert locate(2, 5, 7, [2, 0, 3]) == gm.Location(batch=2, row_in_batch=0, token=2, head=5, column=7)
    assert locate(1, 0, 0, [2, 0, 3]).batch == 0
    with pytest.raises(IndexError):
        locate(5, 0, 0, [2, 0, 3])


def test_to_dict_is_plain_and_round_trips() -> None:
    actual, expected, row_valid, q_seqlen = _hand_case()
    m = compute_metrics(actual, expected, row_valid, "fp16", q_seqlen)
    data = m.to_dict()
    assert all(type(v) in (int, float, bool, str) for v in data.values()), data
    json.dumps(data)
    as_numpy = {k: (np.float64(v) if isinstance(v, float) else v) for k, v in data.items()}
    assert Metrics.from_dict(as_numpy) == m


def test_nothing_valid_gives_empty_metrics() -> None:
    m = compute_metrics(np.zeros((2, 1, 1), np.float16), np.zeros((2, 1, 1)), np.zeros(2, bool), "fp16", [2])
    assert m.n_elements == 0 and m.worst is None


@pytest.mark.parametrize(
    ("shape", "row_valid", "dtype", "q_seqlen", "message"),
    [
        ((2, 1, 1), [True, True], "fp32", [2], "dtype"),
        ((2, 1), [True, True], "fp16", [2], "T, H, D"),
        ((2, 1, 1), [True], "fp16", [2], "row_valid"),
        ((2, 1, 1), [True, True], "fp16", [3], "q_seqlen"),
    ],
)
def test_bad_arguments(
    shape: tuple[int, ...], row_valid: list[bool], dtype: str, q_seqlen: list[int], message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        compute_metrics(np.zeros(shape, np.float16), np.zeros(shape), np.array(row_valid), dtype, q_seqlen)


def test_worst_is_first_of_equal_violations_across_chunks(monkeypatch: pytest.MonkeyPatch) -> None:
    expected = np.ones((4, 1, 2))
    actual = expected.astype(np.float16)
    actual[1, 0, 1] = actual[3, 0, 0] = np.nan
    monkeypatch.setattr(chunks, "CHUNK_ELEMENTS", 2)  # one row per chunk
    m = compute_metrics(actual, expected, np.ones(4, bool), "fp16", [2, 2])
    assert _worst(m) == (0, 1, 1, 0, 1)


@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
def test_fast_finite_rounding_matches_round_to_dtype(dtype: str) -> None:
    """The finite fast path's integer rounding gives round_to_dtype's bits, ties and overflow included."""
    from mlaconf.judge.metrics import bits16_finite, round_to_dtype

    rng = np.random.default_rng(7)
    x = np.concatenate(
        [
            rng.normal(0, 1, 20000),
            rng.uniform(-1, 1, 2000) * 2.0 ** rng.integers(-140, 130, 2000),
            [0.0, -0.0, 1e-300, -1e-300, 65519.9, 65520.0, 3.3e38, 3.4e38, -3.39e38],
        ]
    )
    with np.errstate(all="ignore"):
        exact = round_to_dtype(x, dtype).astype(np.float64)
        x = np.concatenate([x, exact, np.nextafter(exact, np.inf), (exact + np.nextafter(exact, np.inf)) / 2])
        x = x[np.isfinite(x)]
        assert np.array_equal(bits16_finite(x, dtype), round_to_dtype(x, dtype).view(np.uint16))


def test_baseline_statistics_are_the_metrics_own_numbers() -> None:
    """golden.stats.error_stats (what the golden stores for its baseline) and the judge's metrics are
    one computation: the benchmark and relative rules divide like by like."""
    from mlaconf.golden.building.stats import ErrorStats, error_stats

    rng = np.random.default_rng(3)
    expected = rng.standard_normal((40, 3, 8))
    actual = (expected * (1 + 1e-3 * rng.standard_normal(expected.shape))).astype(np.float16)
    valid = np.ones(40, bool)
    valid[7] = False
    m = compute_metrics(actual, expected, valid, "fp16", [40])
    stats = error_stats(actual, expected, valid, "fp16")
    assert stats == ErrorStats(m.n_elements, m.max_abs_err, m.max_rel_err, m.mean_rel_err, m.rmse)
    assert ErrorStats.from_dict({k: np.float64(v) for k, v in stats.to_dict().items()}) == stats
    broken = actual.copy()
    broken[3, 1, 2] = np.nan
    bad = error_stats(broken, expected, valid, "fp16")
    assert bad.max_abs_err == bad.rmse == bad.mean_rel_err == math.inf
    with pytest.raises(KeyError, match="rmse"):
        ErrorStats.from_dict({k: v for k, v in stats.to_dict().items() if k != "rmse"})
