"""The compiled tile kernel (golden/building/src/tile_kernel.cpp): its exp, its row passes, its rounding up,
and the fused golden's agreement with the unfused float64 formula on small shipped cases."""

from __future__ import annotations

import mpmath
import numpy as np
import pytest

from mlaconf.golden.building import _tile_kernel as kernel
from mlaconf.golden.building.inputs import bf16_bits, round_to
from mlaconf.golden.building.reference import ROUNDED_UP_FLOOR
from mlaconf.golden.specs.suites import load_suites
from tests.agreement import AGREEMENT, worst_disagreement

FLOOR32 = np.float32(ROUNDED_UP_FLOOR)


def test_exp_is_within_one_ulp_of_the_correctly_rounded_value() -> None:
    rng = np.random.default_rng(3)
    x = np.concatenate(
        [-rng.random(20_000) * 40, -rng.random(2_000) * 746, [0.0, -0.0, -1e-300, -708.39, -709.5, -744.4, -745.1]]
    )
    got = kernel.exp_nonpositive(x)
    mpmath.mp.dps = 40
    for xi, gi in zip(x[::17].tolist() + x[-7:].tolist(), np.concatenate([got[::17], got[-7:]]).tolist(), strict=True):
        exact = mpmath.exp(mpmath.mpf(xi))
        ulp = float(np.spacing(np.float64(float(exact)))) if exact > 0 else 5e-324
        assert abs(mpmath.mpf(gi) - exact) <= ulp, (xi, gi)
    assert kernel.exp_nonpositive(np.array([-np.inf, -746.0, -1e4])).tolist() == [0.0, 0.0, 0.0]
    with pytest.raises(ValueError, match="<= 0"):
        kernel.exp_nonpositive(np.array([0.5]))
    with pytest.raises(ValueError, match="<= 0"):
        kernel.exp_nonpositive(np.array([np.nan]))


@pytest.mark.parametrize("causal_first", [None, 5, -1, 100])
def test_softmax_tile_masks_and_reports_row_statistics(causal_first: int | None) -> None:
    rng = np.random.default_rng(1)
    scores = rng.standard_normal((9, 37)) * 30
    scores[2, :] = -700.0 - rng.random(37) * 60  # tiny differences to the max still fine; P^2 underflows
    work = scores.copy()
    stats = np.empty((4, 9))
    p32, p2 = np.empty((9, 37), np.float32), np.empty((9, 37), np.float32)
    raw = np.full_like(scores, np.nan)
    kernel.softmax_tile(work, stats, causal_first, p32, p2, ROUNDED_UP_FLOOR, raw)
    for r in range(9):
        allowed = 37 if causal_first is None else max(0, min(37, causal_first + r + 1))
        row = scores[r, :allowed]
        assert np.array_equal(raw[r, :allowed], row) and not raw[r, allowed:].any()  # the scores before, masked 0
        if allowed == 0:
            assert not work[r].any() and not p32[r].any()
            continue
        e = np.exp(row - row.max())
        np.testing.assert_allclose(work[r, :allowed], e, rtol=4e-16, atol=0)
        assert not work[r, allowed:].any() and not p32[r, allowed:].any() and not p2[r, allowed:].any()
        np.testing.assert_allclose(stats[:, r], [row.max(), row.min(), e.sum(), (e * e).sum()], rtol=1e-14)
        p = work[r, :allowed]
        # rounded up: never below, at most one float32 step above (or the floor)
        assert (p32[r, :allowed] >= p).all() and (p2[r, :allowed] >= p * p).all()
        assert (p32[r, :allowed] >= FLOOR32).all() and (p2[r, :allowed] >= FLOOR32).all()
        assert (p32[r, :allowed] <= np.maximum(np.nextafter(p.astype(np.float32), np.float32(1)), FLOOR32)).all()


def test_softmax_tile_rejects_bad_buffers() -> None:
    stats = np.empty((4, 3))
    with pytest.raises(ValueError, match="C-contiguous"):
        kernel.softmax_tile(np.zeros((5, 3)).T, stats, None, None, None, ROUNDED_UP_FLOOR)
    with pytest.raises(ValueError, match="stats"):
        kernel.softmax_tile(np.zeros((3, 5)), np.empty((4, 2)), None, None, None, ROUNDED_UP_FLOOR)
    with pytest.raises(ValueError, match="p32"):
        kernel.softmax_tile(
            np.zeros((3, 5)), stats, None, np.empty((3, 4), np.float32), np.empty((3, 4), np.float32), ROUNDED_UP_FLOOR
        )
    with pytest.raises(ValueError, match="floor"):
        kernel.softmax_tile(np.zeros((3, 5)), stats, None, None, None, 0.0)


SMALL = [s for s in load_suites(["smoke", "edge"]) if s.useful_flops <= 2e7]


@pytest.mark.parametrize("spec", SMALL, ids=lambda s: s.case_id)
def test_fused_golden_agrees_with_the_unfused_formula(spec: object) -> None:
    assert worst_disagreement(spec) <= AGREEMENT  # type: ignore[arg-type]


@pytest.mark.parametrize("causal_first", [None, 150])
def test_softmax_tile_products_round_as_numpys_separate_steps_and_sum_the_rows(causal_first: int | None) -> None:
    """T's products (P / sum P) s come out of the softmax pass bit for bit as numpy's separate divide and
    multiply, with or without the raw scores asked for too, and their row sums within T's guard."""
    rng = np.random.default_rng(5)
    scores = rng.normal(0.0, 30.0, (37, 211))
    raw = np.full_like(scores, np.nan)
    results = []
    for keep_raw in (True, False):
        p, stats = scores.copy(), np.empty((4, scores.shape[0]))
        ps, sums = np.full_like(p, np.nan), np.full((2, p.shape[0]), np.nan)
        kernel.softmax_tile(p, stats, causal_first, None, None, ROUNDED_UP_FLOOR, raw if keep_raw else None, ps, sums)
        results.append((ps, sums))
    expected = (p / stats[2][:, None]) * raw
    if causal_first is not None:
        assert (raw[0, causal_first + 1 :] == 0).all() and (ps[0, causal_first + 1 :] == 0).all()  # masked keys
    for ps, sums in results:
        assert np.array_equal(ps.view(np.uint64), expected.view(np.uint64))  # bit for bit, signed zeros too
        # T's guard bounds the sums' error by (keys + 4) eps64 times the sum of |ps|, whatever the order
        bound = (p.shape[1] + 4) * np.finfo(np.float64).eps * np.abs(expected).sum(axis=1)
        assert np.all(np.abs(sums[0] - np.abs(expected).sum(axis=1)) <= bound)
        assert np.all(np.abs(sums[1] - expected.sum(axis=1)) <= bound)
    assert np.array_equal(results[0][1], results[1][1])


def test_softmax_tile_products_refuse_mismatched_buffers() -> None:
    scores, stats = np.zeros((4, 8)), np.empty((4, 4))
    with pytest.raises(ValueError, match="ps must be"):
        kernel.softmax_tile(scores, stats, None, None, None, ROUNDED_UP_FLOOR, None, np.zeros((4, 7)), np.zeros((2, 4)))
    with pytest.raises(ValueError, match="ps_sums must be"):
        kernel.softmax_tile(scores, stats, None, None, None, ROUNDED_UP_FLOOR, None, np.zeros((4, 8)), np.zeros((4, 2)))
    with pytest.raises(ValueError, match="together"):
        kernel.softmax_tile(scores, stats, None, None, None, ROUNDED_UP_FLOOR, None, np.zeros((4, 8)), None)


def baseline_scores(rng: np.random.Generator, scale: float) -> np.ndarray:
    """float32 scores whose e^(s scale - max) cover [0, 1] densely, fp16's flush boundary 2^-14 (with the
    midpoint 2^-14 - 2^-25 that ties up to it) and float32's subnormals."""
    near_flush = np.log(2.0**-14) + np.linspace(-3e-4, 3e-4, 4001)
    spread = -rng.exponential(8.0, 20_000)
    tiny = -rng.uniform(87.0, 104.0, 3_000)  # e below float32's normal range
    return (np.concatenate([[0.0], near_flush, spread, tiny]) / scale).astype(np.float32)


@pytest.mark.parametrize("name", ["bf16", "fp16"])
@pytest.mark.parametrize("causal_first", [None, 3, -1])
def test_baseline_softmax_tile_rounds_p_as_ml_dtypes_and_masks(name: str, causal_first: int | None) -> None:
    """P = e^(s scale - max) through the kernel's exp to float32, then one rounding to the input dtype
    (ml_dtypes / numpy, bit for bit; fp16 below 2^-14 flushed to 0); masked keys 0; the sum of the
    float32 e rounded once."""
    import ml_dtypes

    scale = np.float32(0.75)
    row = baseline_scores(np.random.default_rng(6), float(scale))
    scores = np.stack([row, row[::-1].copy(), np.roll(row, 7)])
    got, denom = scores.copy(), np.full(scores.shape[0], np.nan, dtype=np.float32)
    kernel.baseline_softmax_tile(got, denom, float(scale), causal_first, name)
    scaled = scores * scale
    cols = np.arange(scores.shape[1])
    for r in range(scores.shape[0]):
        allowed = scores.shape[1] if causal_first is None else max(0, min(scores.shape[1], causal_first + r + 1))
        x = scaled[r, :allowed]
        e = kernel.exp_nonpositive((x - x.max()).astype(np.float64)).astype(np.float32) if allowed else x
        want = e.astype(ml_dtypes.bfloat16 if name == "bf16" else np.float16).astype(np.float32)
        if name == "fp16":
            want[want < 2.0**-14] = 0.0
        assert np.array_equal(got[r, :allowed].view(np.uint32), want.view(np.uint32))
        assert np.all(got[r, cols >= allowed] == 0.0)
        assert denom[r] == np.float32(e.astype(np.float64).sum())  # one rounding of the float64 sum
    if name == "fp16" and causal_first is None:  # the boundary cases occur: kept at 2^-14, flushed below it
        assert np.any(got == np.float32(2.0**-14)) and np.any((got == 0.0) & (scaled > scaled.max() - 10.0))


def test_baseline_softmax_tile_refuses_bad_arguments() -> None:
    scores = np.zeros((3, 5), dtype=np.float32)
    with pytest.raises(ValueError, match="dtype must be"):
        kernel.baseline_softmax_tile(scores, np.empty(3, dtype=np.float32), 1.0, None, "fp32")
    with pytest.raises(ValueError, match="denom must be"):
        kernel.baseline_softmax_tile(scores, np.empty(2, dtype=np.float32), 1.0, None, "bf16")
    with pytest.raises(ValueError, match="scores must be"):
        kernel.baseline_softmax_tile(scores.T, np.empty(5, dtype=np.float32), 1.0, None, "bf16")


def test_the_kernel_and_the_fallback_round_to_bf16_alike_and_once() -> None:
    """One rounding from float64 (not through float32) in both the compiled kernel and numpy's fallback
    (inputs.bf16_bits): ties, near-ties, binade carries, signed zeros."""
    import ml_dtypes

    ties = np.arange(-2000, 2000) * 2.0**-7 + 2.0**-8
    values = np.concatenate(
        [ties, ties + 2.0**-40, ties - 2.0**-40, np.nextafter(ties, 9.0), [0.0, -0.0, 255.99, -3.9999999]]
    )
    values = np.concatenate([values * 2.0**e for e in (-110, -20, 0, 20, 110)])
    values = np.concatenate([values, np.random.default_rng(2).standard_normal(100_000)])
    bits = np.empty(values.shape, dtype=np.uint16)
    assert kernel.round_to_bf16(values, bits)
    assert np.array_equal(bits, bf16_bits(values))
    twice = values.astype(np.float32).astype(ml_dtypes.bfloat16).view(np.uint16)  # float32 -> bf16: one rounding
    assert (bits != twice).sum() > 1000  # the values hold the near-ties a second rounding gets wrong


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (2.0**-133, 0x0001),  # bf16's smallest subnormal
        (2.0**-134, 0x0000),  # half of it: a tie, to even (zero)
        (2.0**-134 * 1.0001, 0x0001),
        (-(2.0**-128) * 1.3, 0x802A),  # a negative subnormal, 41.6 steps of 2^-133 -> 42
        (1e-300, 0x0000),
        (-0.0, 0x8000),
        (3.3895313892515355e38, 0x7F7F),  # bf16's largest
        (3.4e38, 0x7F80),  # past it by more than half a step: inf
        (-np.inf, 0xFF80),
        (np.nan, 0x7FC0),
    ],
)
def test_the_fallback_rounds_every_bf16_range(value: float, expected: int) -> None:
    assert int(bf16_bits(np.array([value]))[0]) == expected


def test_inputs_round_to_falls_back_for_subnormal_bf16() -> None:
    values = np.array([1.5, 2.0**-130, -(2.0**-128) * 1.3])
    assert not kernel.round_to_bf16(values, np.empty(3, dtype=np.uint16))
    assert np.array_equal(round_to(values, "bf16").view(np.uint16), bf16_bits(values))


def _finish_operands(rng: np.random.Generator, rows: int) -> dict[str, object]:
    """One tile's inputs to finish_magnitudes, with the edges: zero and huge sums, T of either sign and 0,
    magnitudes past bf16's largest value (capped) and below its smallest, strided (Fortran) psv and golden."""
    abs_sum = (rng.random((rows, 128)) * 10.0 ** rng.integers(-40, 3, (rows, 128))).astype(np.float32)
    abs_sum[0, :8] = [0.0, 3e38, 1e-45, 1.0, 0.5, 2.0**-126, 7.0, 0.0]
    sq_sum = np.minimum(np.square(abs_sum.astype(np.float64)), 3e38).astype(np.float32)
    golden = np.asfortranarray(rng.standard_normal((rows, 128)) * 10.0 ** rng.integers(-30, 30, (rows, 1)))
    psv = np.asfortranarray(golden * rng.uniform(-2, 2, (rows, 1)) + rng.standard_normal((rows, 128)) * 1e-9)
    psv[1] = 0.0
    golden[1] = 0.0
    sums = np.abs(rng.standard_normal((2, rows))) * 10.0 ** rng.integers(-5, 5, (2, rows))
    sums[1] *= rng.choice([-1.0, 1.0], rows)
    scale = np.ldexp(1.0, rng.integers(-140, 128, 128)).astype(np.float64)
    cap = np.abs(rng.standard_normal(128)) * 10.0 ** rng.integers(-30, 39, 128)
    cap[:3] = [3.3895313892515355e38, 0.0, 1e-40]
    denom = 1.0 + rng.random(rows) * 100
    vmax = np.abs(rng.standard_normal(128)) * 100
    return {
        "abs_sum": abs_sum,
        "sq_sum": sq_sum,
        "psv": psv,
        "golden": golden,
        "denom": denom,
        "sums": sums,
        "scale": scale,
        "cap": cap,
        "vmax": vmax,
    }


@pytest.mark.parametrize("keys", [1, 300, 16384])
def test_finish_magnitudes_stores_the_numpy_formulas_bits(keys: int) -> None:
    """The compiled finish of pv_abs, pv_rss and pv_scale stores exactly round_up_bf16 of the numpy formulas
    (lift_float32_sum, scale_derivative): a golden's bits must not depend on which path computed them."""
    from mlaconf.golden.building.magnitudes import (
        EPS64,
        lift_float32_sum,
        lift_terms,
        round_up_bf16,
        scale_derivative,
    )

    rows = 61
    o = _finish_operands(np.random.default_rng(keys), rows)
    denom = o["denom"][:, None]
    want = {
        "pv_abs": np.minimum(lift_float32_sum(o["abs_sum"], keys) * o["scale"] / denom, o["cap"]),
        "pv_rss": np.minimum(np.sqrt(lift_float32_sum(o["sq_sum"], keys)) * o["scale"] / denom, o["cap"]),
        "pv_scale": scale_derivative(
            o["psv"], o["sums"][0][:, None], o["sums"][1][:, None], o["golden"], o["vmax"], keys
        ),
    }
    stored = np.zeros((3, rows + 5, 4, 128), dtype=np.uint16)  # written through strided [rows, 128] views
    views = [stored[i, 2 : rows + 2, 1] for i in range(3)]
    add, factor = lift_terms(keys)
    operands = [o[k] for k in ("abs_sum", "sq_sum", "psv", "golden", "denom", "sums", "scale", "cap", "vmax")]
    kernel.finish_magnitudes(*operands, add, factor, (keys + 4) * EPS64, *views)
    for view, (name, value) in zip(views, want.items(), strict=True):
        expected = round_up_bf16(value).view(np.uint16)
        assert np.array_equal(view, expected), f"{name}: {np.argwhere(view != expected)[:3].tolist()}"
    untouched = stored.copy()
    untouched[:, 2 : rows + 2, 1] = 0
    assert not untouched.any()  # nothing outside the views
    with pytest.raises(ValueError, match="uint16"):  # a copy made by conversion would drop the writes
        kernel.finish_magnitudes(*operands, add, factor, 1e-12, views[0].astype(np.int32), views[1], views[2])


def test_finish_magnitudes_rounds_up_at_every_bf16_boundary() -> None:
    """With the lift, scale and row sum neutral, pv_abs is the float32 sum itself rounded up to bf16: on a bf16
    value it stays, one float32 ulp above it goes up one bf16 ulp (and T's sign stays with the guard's)."""
    from mlaconf.golden.building.magnitudes import round_up_bf16

    rng = np.random.default_rng(9)
    on = (rng.integers(0x0080, 0x7F7F, (16, 128)).astype(np.uint32) << 16).view(np.float32)  # normal bf16 values
    above = np.nextafter(on, np.float32(np.inf))
    abs_sum = np.concatenate([on, above])
    rows = abs_sum.shape[0]
    golden = np.zeros((rows, 128))
    psv = np.concatenate([-on, above]).astype(np.float64)  # T = psv exactly (golden 0), guard 0
    views = [np.zeros((rows, 128), dtype=np.uint16) for _ in range(3)]
    ones = np.ones(128)
    kernel.finish_magnitudes(
        abs_sum,
        abs_sum,
        psv,
        golden,
        np.ones(rows),
        np.zeros((2, rows)),
        ones,
        ones * np.inf,
        ones,
        0.0,
        1.0,
        0.0,
        *views,
    )
    expected = round_up_bf16(abs_sum.astype(np.float64)).view(np.uint16)
    assert np.array_equal(views[0], expected)
    assert np.array_equal(views[0][:16], on.view(np.uint32) >> 16)  # on a boundary: kept
    assert np.array_equal(views[0][16:], (on.view(np.uint32) >> 16) + 1)  # just above: one bf16 ulp up
    assert np.array_equal(views[2], round_up_bf16(psv).view(np.uint16)) and (views[2][:16] >> 15 == 1).all()
