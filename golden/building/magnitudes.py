"""Float64 magnitudes of the attention sums: what the error-model tolerance rule scales with.

A correct low-precision kernel's error at an output element does not scale with the element's
value |g| (which cancels) but with the magnitudes of the terms summed into it.  For every batch,
query head h, query row i and value column c (P the float64 softmax over the allowed keys A(i),
s the scaled scores, g = P.V the golden; docs/conformance.md derives the rule that uses them):

per element, attenOut's layout (stored as ``golden/<name>``):

* ``pv_abs``   A = sum_j P_ij |V_jc|                      (fp32 accumulation of P.V)
* ``pv_rss``   R = sqrt(sum_j P_ij^2 V_jc^2)              (P rounded to the input dtype)
* ``pvs_rss``  S = sqrt(sum_j (P_ij w_ij)^2 (V_jc - g_ic)^2),  w_ij = 2|s_ij| + |s_ij - m_i|
                                                           (score roundings, each ~ |score|)
* ``pv_scale`` T = sum_j P_ij s_ij (V_jc - g_ic)          (d g / d log(qkScale): a rounded scale)
* ``pv_sub``   D = sum_j P_ij f_ij (|V_jc| + |g_ic|) / (1 - sum_j P_ij f_ij),  f_ij = f(exp(s_ij - m_i)),
               f = 1 below 2^-13 falling linearly to 0 at 2^-12   (fp16 P flushed to zero: every key
                                                           whose fp16 P is subnormal has f = 1; fp16 only)

per row and head, ``[T, H]``:

* ``score_absmax``  M = max_{j in A(i)} |s_ij|
* ``score_dot``     C = qkScale * ||q_i|| * max_{j in A(i)} ||k_j||   (bounds every |q_i|.|k_j| sum)
* ``p_rss``         rho = sqrt(sum_j P_ij^2)

(m_i is the row maximum of s.)  S is stored only where the kernel keeps scores in fp16
(:func:`mlaconf.facts.operator.scores_in_fp16`): elsewhere scores are fp32 and the rule's score term uses its
cap 4 M (A + |g|) u32 instead of S (looser, and still ~2^-16 of the output-rounding term).  T is stored
on every case: the bound's scale term uses it on the fp16 score path only, and the judge's temperature
check (judge/systematic.py) projects every output's error on it.  S and T are expanded sums that
cancel where V is nearly constant, so each is moved away from zero by a bound on its float64 error
before rounding.

Element magnitudes are stored as bf16 rounded away from zero, row magnitudes as float32 rounded up:
a stored magnitude never understates its float64 value and overstates it by at most 2^-7 relative
(inside the rule's safety factor, in the safe direction), so they cost 6 bytes per output element on
most cases (8 where scores are fp16) instead of 32 in float64.  Computed in float64 tile by tile like
the reference (memory O(tile x S) per thread); on the CPU they come out of the golden's own pass
(:func:`reference_and_magnitudes`: the same exponentials, and two more GEMMs per tile, in float32
on operands rounded up, lifted by a rigorous factor (:func:`lift_float32_sum`), so never below the
float64 value), on the golden device out of a float64 torch pass (:func:`torch_magnitudes`).
Rows of zero-length batches are 0.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import ml_dtypes
import numpy as np

from mlaconf.facts.operator import U32, V_DIM, scores_in_fp16
from mlaconf.golden.building import progress
from mlaconf.golden.building.reference import (
    DEFAULT_GPU_TILE,
    FUSED_TILE,
    ROUNDED_UP_FLOOR,
    HeadTask,
    Workspace,
    effective_scale,
    for_each_tile,
    fused_scores,
    gemm,
    iter_head_tasks,
    tile_bounds,
    tile_flops,
    tile_kernel,
    value_gemm,
)
from mlaconf.golden.specs.layout import out_shape, visible_keys
from mlaconf.golden.specs.spec import CaseSpec
from mlaconf.golden.specs.types import (
    ELEMENT_MAGNITUDES,
    ROW_MAGNITUDES,
    OpInputs,
    element_magnitudes,
)

#: Expanded sums that cancel: two correct float64 evaluations differ by :func:`cancellation_noise`.
CANCELLING_MAGNITUDES = ("pvs_rss", "pv_scale")
#: e = exp(s - m) at or below SUBNORMAL_WEIGHT_FULL counts fully in ``pv_sub``, above SUBNORMAL_WEIGHT_ZERO
#: not at all, linearly in between: twice fp16's smallest normal, so a key whose kernel-side e (its
#: scores off by rounding, its max a running one <= the row's) is subnormal always counts fully, and
#: continuous, so two correct float64 evaluations agree within rounding.
SUBNORMAL_WEIGHT_FULL = 2.0**-13
SUBNORMAL_WEIGHT_ZERO = 2.0**-12
EPS64 = float(np.finfo(np.float64).eps)
#: Floor of the float32 GEMM operands (P, P^2, |V'|, V'^2): float32's smallest normal.  A subnormal
#: operand makes a float32 GEMM ~100x slower on this hardware; the floor only raises the bound, by at
#: most n 2^-126 in the column's scale (sqrt of that for pv_rss, ~2^-56 of it at 16 K keys).
OPERAND_FLOOR = ROUNDED_UP_FLOOR
#: Largest absolute error of one float32 operation whose result is subnormal (half float32's smallest step).
UNDERFLOW32 = 2.0**-150


def subnormal_weight(e: np.ndarray) -> np.ndarray:
    """f(e) of ``pv_sub``: 1 at or below 2^-13, 0 from 2^-12, linear in between (masked keys: e = 0)."""
    weight: np.ndarray = np.clip(
        (SUBNORMAL_WEIGHT_ZERO - e) / (SUBNORMAL_WEIGHT_ZERO - SUBNORMAL_WEIGHT_FULL), 0.0, 1.0
    )
    return weight


def round_up_bf16(values: np.ndarray) -> np.ndarray:
    """float64 -> bf16 rounded away from zero: |result| >= |value|, at most one bf16 ulp above."""
    mag = np.abs(values)
    nearest = mag.astype(np.float32)
    bits = nearest.view(np.uint32)
    bump = ((bits & 0xFFFF) != 0) | (nearest.astype(np.float64) < mag)
    upper = (bits >> 16) + bump.astype(np.uint32)
    upper |= np.signbit(values).astype(np.uint32) << 15
    rounded: np.ndarray = upper.astype(np.uint16).view(ml_dtypes.bfloat16)
    return rounded


def round_up_float32(values: np.ndarray) -> np.ndarray:
    """Non-negative float64 -> float32, never below the value."""
    nearest = values.astype(np.float32)
    below = nearest.astype(np.float64) < values
    result: np.ndarray = np.where(below, np.nextafter(nearest, np.float32(np.inf)), nearest)
    return result


def cancellation_noise(
    spec: CaseSpec,
    magnitudes: dict[str, np.ndarray],
    golden: np.ndarray,
    tokens: slice,
    token_rows: np.ndarray | None = None,
) -> dict[str, np.ndarray]:
    """How far two correct float64 evaluations of S and T may lie apart at the elements of rows
    ``tokens`` of the arrays (their expanded sums cancel), bounded from stored magnitudes that do not cancel;
    ``token_rows``: the token of each array row when the golden holds a sample of rows.

    With gamma = (n_i + 4) eps64: S's float64 error is at most sqrt(gamma) (sqrt(sum w^2 V^2) +
    |g| sqrt(sum w^2)) <= sqrt(gamma) 4 M (R + rho |g|), since w <= 4 M P; T's at most
    gamma (sum |P s V| + |g sum P s|) <= gamma M (A + |g|).  Each evaluation adds its guard of the
    same size, hence the factor 2 (S) and 2 x 2 (T)."""
    keys = visible_keys(spec) if token_rows is None else visible_keys(spec)[token_rows]
    t, h = keys.size, spec.head_num
    shape = (t, h, V_DIM)
    gamma = ((keys[tokens] + 4) * EPS64)[:, None, None]
    score = magnitudes["score_absmax"].reshape(t, h)[tokens].astype(np.float64)[:, :, None]
    rho = magnitudes["p_rss"].reshape(t, h)[tokens].astype(np.float64)[:, :, None]
    g = np.abs(golden.reshape(shape)[tokens])
    r = magnitudes["pv_rss"].reshape(shape)[tokens].astype(np.float64)
    a = magnitudes["pv_abs"].reshape(shape)[tokens].astype(np.float64)
    return {"pvs_rss": 2.0 * np.sqrt(gamma) * 4.0 * score * (r + rho * g), "pv_scale": 4.0 * gamma * score * (a + g)}


def _largest_key_norm(key_peak: np.ndarray, rows: int, k_end: int, diag: tuple[int, int] | None) -> np.ndarray:
    """Per query row of a tile seeing at most keys ``[0, k_end)``: the largest ||k_j|| over the keys the row
    may see, from the running maximum ``key_peak`` of the kv head's key norms."""
    if diag is None:
        return np.full(rows, key_peak[k_end - 1])
    last = np.minimum(np.arange(diag[0], diag[0] + rows) + diag[1], k_end - 1)
    largest: np.ndarray = key_peak[last]
    return largest


@dataclass(frozen=True)
class ValueOperands:
    """One kv head's V for the magnitudes' float32 GEMMs: each column c scaled by 2^-e_c so that its
    largest |V| lies in [1/2, 1) (V^2 cannot overflow or underflow to nothing), then |V'| and V'^2
    rounded up to float32 and floored at :data:`OPERAND_FLOOR`: each operand >= its exact value.
    With them the running maxima over keys that every tile of the kv head reads a prefix of (computed once
    per kv head, not per tile): of |V| per column and of the key norms ||k_j||."""

    abs32: np.ndarray  # [kv_len, 128] float32
    sq32: np.ndarray  # [kv_len, 128] float32
    scale: np.ndarray  # [128] float64, 2^e_c
    largest: np.ndarray  # [128] float64, max_j |V_jc|: pv_abs and pv_rss never exceed it
    abs_peak: np.ndarray  # [kv_len, 128] float32, max_{j' <= j} |V_j'c| (exact: V holds dtype values)
    key_peak: np.ndarray  # [kv_len] float64, max_{j' <= j} ||k_j'||

    @classmethod
    def of(cls, v: np.ndarray, k: np.ndarray) -> ValueOperands:
        largest = np.abs(v).max(axis=0) if v.shape[0] else np.zeros(v.shape[1])
        exponent = np.where(largest > 0, np.frexp(largest)[1], 0)
        scale = np.ldexp(1.0, exponent)
        scaled = np.abs(v) / scale  # exact: a power of two, and every |V'| <= 1 stays a normal float64
        abs32 = np.maximum(round_up_float32(scaled), np.float32(OPERAND_FLOOR))
        sq32 = np.maximum(round_up_float32(scaled * scaled), np.float32(OPERAND_FLOOR))
        abs_peak = np.maximum.accumulate(np.abs(v).astype(np.float32), axis=0)
        key_peak = np.maximum.accumulate(np.linalg.norm(k, axis=1))
        return cls(np.ascontiguousarray(abs32), np.ascontiguousarray(sq32), scale, largest, abs_peak, key_peak)


def lift_float32_sum(computed: np.ndarray, keys: int) -> np.ndarray:
    """A float32 GEMM of non-negative rounded-up operands over ``keys`` terms, lifted (in float64) above
    the float64 value of the same sum; the caller divides by the float64 row sum afterwards.

    Any summation order (blocked, SIMD, FMA) of ``n`` non-negative float32 products is within
    gamma32 = n u32 / (1 - n u32) of the exact sum (Higham, Thm 3.1) plus, where products or partial
    sums fall below float32's normal range, at most 2 n x 2^-150 absolute: exact <= (computed +
    n 2^-149) / (1 - gamma32).  The float64 value being bounded (sums of n terms, a division, exp's ulp) lies within
    (1 + 4 (n + 8) eps64) of its exact value and so does ours (different summation orders, exp within
    an ulp or two, a few final roundings), hence 8 (n + 8) eps64; for ``pv_rss`` the factor goes under
    the square root, which halves it, still above what the two float64 values can differ by."""
    add, factor = lift_terms(keys)
    lifted: np.ndarray = (computed.astype(np.float64) + add) * factor
    return lifted


def lift_terms(keys: int) -> tuple[float, float]:
    """:func:`lift_float32_sum`'s ``(add, factor)``: the lifted sum is ``(computed + add) * factor``."""
    n = max(keys, 1)
    if n * U32 >= 0.5:  # pragma: no cover - far beyond the operator's sequence limits
        raise ValueError(f"{keys} keys: too many for the float32 magnitude bound")
    gamma32 = n * U32 / (1 - n * U32)
    return 2 * n * UNDERFLOW32, (1 + 8 * (n + 8) * EPS64) / (1 - gamma32)


#: Element magnitudes that :func:`fused_tile` can finish in the compiled kernel, straight into their stored
#: bf16 bits (``finish_magnitudes``: the same roundings as the numpy formulas and :func:`round_up_bf16`).
KERNEL_FINISHED = ("pv_abs", "pv_rss", "pv_scale")


def fused_tile(
    q: np.ndarray,
    k: np.ndarray,
    v: np.ndarray,
    operands: ValueOperands,
    scale: float,
    diag: tuple[int, int] | None,
    score_terms: bool,
    work: Workspace,
    subnormal_terms: bool,
    vt: np.ndarray,
    finished: dict[str, np.ndarray] | None = None,
) -> dict[str, np.ndarray]:
    """The golden ``out`` exactly as :func:`mlaconf.golden.building.reference.fused_tile` computes it, and the
    magnitudes from the same exponentials: ``pv_abs`` and ``pv_rss`` from float32 GEMMs of the
    rounded-up operands lifted by :func:`lift_float32_sum` (never below their float64 values), the
    row magnitudes from the kernel's float64 row statistics.  ``vt`` is ``v`` transposed (the task's,
    so that it is not copied per tile).  With ``finished`` (uint16 ``[rows, 128]`` views of the stored
    bf16 arrays, one per :data:`KERNEL_FINISHED` name) those magnitudes go there already rounded up, in one
    compiled pass instead of ~40 numpy ones, and are left out of the result."""
    qs = q * scale
    shape = (q.shape[0], k.shape[0])  # tile-sized temporaries live in the thread's workspace: no fresh pages
    # T's products (P / sum P) s come out of the softmax pass; S also needs the raw scores (masked keys 0)
    raw = work.take("raw", shape, np.float64) if score_terms else None
    ps, sums = work.take("ps", shape, np.float64), np.empty((2, q.shape[0]))
    p, stats, rounded = fused_scores(qs, k, diag, work, rounded_up=True, raw=raw, products=(ps, sums))
    assert rounded is not None
    p32, p2_32 = rounded
    denom = stats[2][:, None]
    golden = value_gemm(p, vt)
    golden /= denom
    # The exact A and R never exceed max |V| (A is a mean of |V|, R <= max |V| sqrt(sum P^2) <= max |V|): capped
    # there, the bound stays inside bf16's range (rounded up to bf16 it can never become inf)
    cap = operands.largest
    abs_sum = gemm(p32, operands.abs32[: k.shape[0]], np.empty((q.shape[0], v.shape[1]), dtype=np.float32))
    sq_sum = gemm(p2_32, operands.sq32[: k.shape[0]], np.empty((q.shape[0], v.shape[1]), dtype=np.float32))
    out = {
        "out": golden,
        "p_rss": np.sqrt(stats[3]) / stats[2],
        "score_absmax": np.maximum(np.abs(stats[0]), np.abs(stats[1])),
        "score_dot": np.linalg.norm(qs, axis=1) * _largest_key_norm(operands.key_peak, q.shape[0], k.shape[0], diag),
    }
    if finished is None:
        out["pv_abs"] = np.minimum(lift_float32_sum(abs_sum, k.shape[0]) * operands.scale / denom, cap)
        out["pv_rss"] = np.minimum(np.sqrt(lift_float32_sum(sq_sum, k.shape[0])) * operands.scale / denom, cap)
    m = stats[0][:, None]
    if subnormal_terms:  # fp16: the keys whose e may be flushed to zero, and the renormalisation they cause
        sub = p * subnormal_weight(p)
        dropped = sub.sum(axis=1, keepdims=True)  # over the kept sum: a flushed row renormalises by it
        sub_abs = gemm(sub, np.abs(v), np.empty((q.shape[0], v.shape[1])))
        out["pv_sub"] = (sub_abs + dropped * np.abs(golden)) / (denom - dropped)
    ps_sums = (sums[0][:, None], sums[1][:, None])
    psv = value_gemm(ps, vt)
    vmax = operands.abs_peak[k.shape[0] - 1].astype(np.float64)  # max |V| over the tile's keys
    if finished is None:
        out["pv_scale"] = scale_derivative(psv, *ps_sums, golden, vmax, k.shape[0])
    else:
        add, factor = lift_terms(k.shape[0])
        gamma = (k.shape[0] + 4) * EPS64  # scale_derivative's
        tile_kernel().finish_magnitudes(
            abs_sum,
            sq_sum,
            psv,
            golden,
            stats[2],
            sums,
            operands.scale,
            cap,
            vmax,
            add,
            factor,
            gamma,
            *(finished[name] for name in KERNEL_FINISHED),
        )
    if score_terms:
        assert raw is not None
        probs = np.divide(p, denom, out=work.take("probs", shape, np.float64))
        weight = probs * (2.0 * np.abs(raw) + np.abs(raw - m))
        w2 = weight * weight
        out["pvs_rss"] = score_rss(golden, w2 @ (v * v), w2 @ v, w2.sum(axis=1, keepdims=True), keys=k.shape[0])
    return out


def score_rss(
    g: np.ndarray, w2v2: np.ndarray, w2v: np.ndarray, w2sum: np.ndarray, *, keys: int | np.ndarray
) -> np.ndarray:
    """S from its expanded sum, moved away from zero by a bound on its float64 error.

    S^2 = sum w^2 V^2 - 2 g sum w^2 V + g^2 sum w^2 cancels where V is nearly constant; without the
    guard the computed value could fall below the exact one by the cancellation noise.  Guard
    (gamma = (keys + 4) eps64, Cauchy-Schwarz for sum w^2 |V|): gamma (sqrt(sum w^2 V^2) + |g| sqrt(sum w^2))^2."""
    gamma = (keys + 4) * EPS64
    sq = w2v2 - 2.0 * g * w2v + g * g * w2sum
    sq_guard = gamma * (np.sqrt(w2v2) + np.abs(g) * np.sqrt(w2sum)) ** 2
    rss: np.ndarray = np.sqrt(np.maximum(sq, 0.0) + sq_guard)
    return rss


def scale_derivative(
    psv: np.ndarray, ps_abs: np.ndarray, ps_sum: np.ndarray, g: np.ndarray, vmax: np.ndarray, keys: int | np.ndarray
) -> np.ndarray:
    """T = sum (P s) V - g sum P s, moved away from zero by gamma (sum |P s| max|V| + |g sum P s|),
        a bound on the float64 error of the cancelling expanded sum (gamma = (keys + 4) eps64; ``keys`` per row
    as a column where the rows see different keys)."""
    gamma = (keys + 4) * EPS64
    t = psv - ps_sum * g
    guarded: np.ndarray = t + np.copysign(gamma * (ps_abs * vmax + np.abs(g * ps_sum)), t)
    return guarded


def torch_tile(
    q: Any,
    k: Any,
    v: Any,
    knorm: Any,
    i0: int,
    diag: tuple[int, int] | None,
    score_terms: bool,
    torch: Any,
    subnormal_terms: bool = False,
) -> dict[str, np.ndarray]:
    """:func:`fused_tile`'s magnitudes in torch float64 on the golden device (``q`` already scaled)."""
    s = q @ k.T
    allowed = None
    if diag is not None:
        i = torch.arange(i0, i0 + q.shape[0], device=q.device)[:, None]
        j = torch.arange(k.shape[0], device=q.device)[None, :]
        allowed = j <= i + diag[1]
        s0 = torch.where(allowed, s, torch.zeros_like(s))
        s = torch.where(allowed, s, torch.full_like(s, float("-inf")))
    else:
        s0 = s
    m = s.amax(dim=1, keepdim=True)
    p = torch.exp(s - m)
    weight = None
    if subnormal_terms:
        ramp = SUBNORMAL_WEIGHT_ZERO - SUBNORMAL_WEIGHT_FULL
        weight = torch.clamp((SUBNORMAL_WEIGHT_ZERO - p) / ramp, 0.0, 1.0)
    p /= p.sum(dim=1, keepdim=True)  # masked keys: exp(-inf) = 0
    out: dict[str, Any] = {"pv_abs": p @ v.abs()}
    if weight is not None:
        sub = p * weight
        dropped = sub.sum(dim=1, keepdim=True)
        out["pv_sub"] = (sub @ v.abs() + dropped * (p @ v).abs()) / (1.0 - dropped)
    g = p @ v
    ps = p * s0
    psv, ps_abs, ps_sum, g64, vmax = (
        x.cpu().numpy()
        for x in (ps @ v, ps.abs().sum(dim=1, keepdim=True), ps.sum(dim=1, keepdim=True), g, v.abs().amax(dim=0))
    )
    extra = {"pv_scale": scale_derivative(psv, ps_abs, ps_sum, g64, vmax, k.shape[0])}
    if score_terms:
        weight = p * (2.0 * s0.abs() + (s0 - m).abs())
        w2 = weight * weight
        w2v2, w2v, w2sum = (x.cpu().numpy() for x in (w2 @ (v * v), w2 @ v, w2.sum(dim=1, keepdim=True)))
        extra["pvs_rss"] = score_rss(g64, w2v2, w2v, w2sum, keys=k.shape[0])
    p2 = p * p
    out["pv_rss"] = (p2 @ (v * v)).sqrt()
    out["p_rss"] = p2.sum(dim=1).sqrt()
    out["score_absmax"] = s0.abs().amax(dim=1)
    if diag is None:
        kmax = knorm.amax().expand(q.shape[0])
    else:
        last = torch.clamp(torch.arange(i0, i0 + q.shape[0], device=q.device) + diag[1], max=k.shape[0] - 1)
        kmax = torch.cummax(knorm, dim=0).values[last]
    out["score_dot"] = q.norm(dim=1) * kmax
    return {**{name: value.cpu().numpy() for name, value in out.items()}, **extra}


#: Rounds one tile's float64 magnitudes into the stored arrays, all but the names given (stored already).
Sink = Callable[[HeadTask, int, int, "dict[str, np.ndarray]", "tuple[str, ...]"], None]


def _sink(spec: CaseSpec) -> tuple[dict[str, np.ndarray], Sink]:
    """Result arrays for ``spec`` and the function that rounds one tile's float64 values into them."""
    t, h = spec.total_q, spec.head_num
    stored: dict[str, np.ndarray] = {
        name: np.zeros((t, h, V_DIM), dtype=ml_dtypes.bfloat16) for name in element_magnitudes(spec)
    }
    stored.update({name: np.zeros((t, h), dtype=np.float32) for name in ROW_MAGNITUDES})

    def put(task: HeadTask, i0: int, i1: int, part: dict[str, np.ndarray], skip: tuple[str, ...]) -> None:
        rows = slice(task.q_start + i0, task.q_start + i1)
        for name, target in stored.items():
            if name in skip:  # already stored by the kernel (fused_tile's ``finished``)
                continue
            rounded = round_up_bf16 if target.dtype == ml_dtypes.bfloat16 else round_up_float32
            target[rows, task.head] = rounded(part[name])

    return stored, put


def _shaped(spec: CaseSpec, stored: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    shape = out_shape(spec)
    return {name: a.reshape(shape) if name in ELEMENT_MAGNITUDES else a for name, a in stored.items()}


def reference_and_magnitudes(
    inputs: OpInputs, spec: CaseSpec, *, tile: int | None = None, threads: int = 1
) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """The float64 golden (bit for bit :func:`mlaconf.golden.building.reference.reference_attention`'s, attenOut's
    layout) and :func:`magnitude_names` of ``spec`` in one pass over the tiles on ``threads`` CPU
    workers: the magnitudes reuse the golden's scores and exponentials."""
    golden = np.zeros((spec.total_q, spec.head_num, V_DIM), dtype=np.float64)
    stored, put = _sink(spec)
    scale = effective_scale(spec)
    score_terms = scores_in_fp16(spec.dtype, spec.mask_type)
    work = Workspace()
    operands: dict[int, tuple[np.ndarray, ValueOperands]] = {}  # id(task.v) -> (task.v, its operands)
    lock = threading.Lock()

    def value_operands(v: np.ndarray, k: np.ndarray) -> ValueOperands:
        """Built once per (batch, kv head): the query heads of a group share their V and K arrays."""
        with lock:
            known = operands.get(id(v))
            if known is None or known[0] is not v:
                while len(operands) >= 4:  # tasks arrive in (batch, kv head) order: the oldest are done
                    operands.pop(next(iter(operands)))
                known = operands[id(v)] = (v, ValueOperands.of(v, k))
            return known[1]

    subnormal_terms = spec.dtype == "fp16"

    def visit(task: HeadTask, i0: int, i1: int, k_end: int, diag: tuple[int, int] | None) -> None:
        ops = value_operands(task.v, task.k)
        part = fused_tile(
            task.q[i0:i1],
            task.k[:k_end],
            task.v[:k_end],
            ops,
            scale,
            diag,
            score_terms,
            work,
            subnormal_terms,
            task.vt[:, :k_end],
            {
                name: stored[name][task.q_start + i0 : task.q_start + i1, task.head].view(np.uint16)
                for name in KERNEL_FINISHED
            },
        )
        golden[task.q_start + i0 : task.q_start + i1, task.head] = part["out"]
        put(task, i0, i1, part, KERNEL_FINISHED)

    for_each_tile(inputs, spec, visit, np.float64, tile=tile or FUSED_TILE, threads=threads)
    return golden.reshape(out_shape(spec)), _shaped(spec, stored)


def torch_magnitudes(
    inputs: OpInputs, spec: CaseSpec, *, device: str = "cuda", tile: int | None = None
) -> dict[str, np.ndarray]:
    """The same magnitudes computed in torch float64 on ``device`` (tested against numpy on the CPU)."""
    import torch  # deferred like the reference's torch path

    dev = torch.device(device)
    tile = tile or DEFAULT_GPU_TILE
    scale = effective_scale(spec)
    score_terms = scores_in_fp16(spec.dtype, spec.mask_type)
    stored, put = _sink(spec)
    cache: tuple[Any, Any, Any, Any] | None = None
    for task in iter_head_tasks(inputs, spec, np.float64):
        if cache is None or cache[0] is not task.k:
            k = torch.from_numpy(task.k).to(dev)
            cache = (task.k, k, torch.from_numpy(task.v).to(dev), k.norm(dim=1))
        _, k, v, knorm = cache
        q = torch.from_numpy(task.q).to(dev) * scale
        for i0, i1, k_end, diag in tile_bounds(task, tile):
            part = torch_tile(
                q[i0:i1], k[:k_end], v[:k_end], knorm[:k_end], i0, diag, score_terms, torch, spec.dtype == "fp16"
            )
            put(task, i0, i1, part, ())
            progress.add_work(tile_flops(i1 - i0, k_end, diag))
    return _shaped(spec, stored)
