"""Deterministic operator inputs from (spec, seed), rounded to the case dtype.

Values are drawn in float64 with numpy's Generator and rounded once to fp16 or bf16 (one
round-to-nearest-even), so every backend and the reference see exactly the same numbers.  The
padded kv layout fills rows beyond each kvSeqLen with large finite garbage: an implementation that
reads them gets visibly wrong answers instead of accidentally right ones (zeros would hide it).
"""

from __future__ import annotations

import copy
import functools
import math
from collections.abc import Callable
from types import ModuleType
from typing import Any

import ml_dtypes
import numpy as np

from mlaconf.facts.operator import MASK_FILLS, MASK_SIZE, NOPE_DIM, ROPE_DIM, SCORE_DIM, V_DIM
from mlaconf.facts.processes import shared_pool
from mlaconf.golden.specs.spec import RAW_SCORE_LOGIT, CaseSpec, Structure
from mlaconf.golden.specs.types import OpInputs

_tile_kernel: ModuleType | None
try:  # the compiled kernel rounds to bf16 fast; without it (a source tree not built) bf16_bits does
    from mlaconf.golden.building import _tile_kernel
except ImportError:  # pragma: no cover - the package builds it
    _tile_kernel = None

#: Target standard deviation of the scaled logits for the ``large_logits`` distribution, per dtype.
#: fp16 kernels store raw scores in fp16, so the spread is chosen where a kernel with ATB's
#: precision still meets ATB's own rule while exp() without max subtraction overflows fp16
#: (logits above ~11); bf16 keeps scores in fp32 and is pushed harder.
LARGE_LOGIT_STD = {"fp16": 2.5, "bf16": 8.0}
V_OUTLIER_FRACTION = 0.002
V_OUTLIER_MAGNITUDE = 64.0
NEAR_TIE_NOISE = 0.01
#: ``large_raw_scores``: every element of q, qRope, k and kRope is +-a (1 + RAW_NOISE u), u in [-1, 1); each key
#: row is scaled by its own c in [-1, 1) (the first key of a sequence by 1: its raw product, the largest, reaches
#: every row under every mask), so the scaled logits spread over +-RAW_SCORE_LOGIT.
RAW_NOISE = 0.05


def numpy_dtype(dtype: str) -> np.dtype[Any]:
    """The numpy dtype holding a case dtype's values exactly."""
    if dtype == "fp16":
        return np.dtype(np.float16)
    if dtype == "bf16":
        bf16: np.dtype[Any] = np.dtype(ml_dtypes.bfloat16)
        return bf16
    raise ValueError(f"unknown dtype {dtype!r}")


def round_to(values: np.ndarray, dtype: str) -> np.ndarray:
    """Round float64 values to the case dtype (round-to-nearest-even, one rounding).

    bf16 goes through the compiled kernel where every value stays in bf16's normal range, else through
    :func:`bf16_bits`: the same bits, whichever ml_dtypes is installed. fp16 and other inputs take numpy's
    cast."""
    contiguous = np.ascontiguousarray(values)
    if dtype == "bf16" and contiguous.dtype == np.float64:
        bits = np.empty(contiguous.shape, dtype=np.uint16)
        if _tile_kernel is None or not _tile_kernel.round_to_bf16(contiguous, bits):
            bits = bf16_bits(contiguous)
        as_bf16: np.ndarray = bits.view(numpy_dtype(dtype))
        return as_bf16
    rounded: np.ndarray = contiguous.astype(numpy_dtype(dtype))
    return rounded


def bf16_bits(values: np.ndarray) -> np.ndarray:
    """float64 values as bf16 bit patterns, rounded once to nearest-even: subnormals, overflow to inf, zeros'
    signs, inf and NaN included. ml_dtypes before 0.7 casts float64 through float32, two roundings that differ
    on values near a bf16 tie (1,921 of the 180,020 values tests/cover/test_fused_kernel.py checks)."""
    x = np.asarray(values, dtype=np.float64)
    _, exponent = np.frexp(x)  # x = m 2^exponent, 0.5 <= |m| < 1 (exponent 0 for 0, inf, NaN)
    spacing = np.ldexp(1.0, np.maximum(exponent - 1, -126) - 7)  # 8 significant bits; subnormals 2^-133 apart
    with np.errstate(over="ignore", invalid="ignore"):
        rounded = (np.round(x / spacing) * spacing).astype(np.float32)  # exact: at most 8 significant bits
    bits: np.ndarray = (rounded.view(np.uint32) >> 16).astype(np.uint16)
    return bits


def case_rng(spec: CaseSpec) -> np.random.Generator:
    """A generator seeded by the spec's seed and content, so equal specs give equal data."""
    return np.random.default_rng(np.random.SeedSequence([spec.seed, int(spec.inputs_key[:16], 16)]))


def build_mask(spec: CaseSpec) -> np.ndarray:
    """The 512x512 MASK_FREE mask: 0 on and below the diagonal, the case's fill above it (the dtype's documented
    encoding, docs/operator.md §4, unless ``mask_fill`` names another)."""
    upper = np.triu(np.ones((MASK_SIZE, MASK_SIZE), dtype=bool), k=1)
    fill = spec.mask_fill_name
    assert fill is not None, "a mask only for MASK_FREE"
    return round_to(np.where(upper, MASK_FILLS[fill], 0.0), spec.dtype)


def _uniform_amplitude_for_logit_std(target_std: float, qk_scale: float) -> float:
    """Amplitude a of U(-a, a) for q and k such that scaled logits have ``target_std``."""
    # var(q*k) = a^4 / 9 per term, SCORE_DIM terms, then scaled by qk_scale.
    return math.sqrt(target_std * 3.0 / (qk_scale * math.sqrt(SCORE_DIM)))


#: float64 values drawn at a time (8 MB).  Every stream is consumed in row order, so the values do
#: not depend on this number (tests draw with other chunk sizes and compare).
CHUNK_ELEMENTS = 1 << 20

#: One independent random stream per role, spawned from the case's seed sequence, so each tensor
#: can be drawn chunk by chunk without interleaving another tensor's draws.
#: New roles go at the end: a stream is the spawned child at its index, so earlier streams keep their values.
STREAMS = (
    *("q", "q_rope", "k", "k_rope", "v", "v_hits", "v_signs", "tie_base", "pad_k", "pad_k_rope", "pad_v", "v_mean"),
    "raw_keys",
)


def case_streams(spec: CaseSpec) -> dict[str, np.random.Generator]:
    """The case's random streams by role, deterministic in (spec content, seed)."""
    children = np.random.SeedSequence([spec.seed, int(spec.inputs_key[:16], 16)]).spawn(len(STREAMS))
    return {name: np.random.default_rng(child) for name, child in zip(STREAMS, children, strict=True)}


def trend_amplitude(spec: CaseSpec) -> float:
    """The value a of the reserved score dimension: q carries a, k carries f(position) * a, so the
    scaled logit gains qkScale * a^2 * f = rise * f (a^2 = rise / qkScale splits the product evenly)."""
    assert spec.structure is not None and spec.structure.rise is not None
    return math.sqrt(spec.structure.rise / spec.qk_scale)


def shift_amplitude(spec: CaseSpec) -> float:
    """The value a of the reserved score dimension for a logit shift: q carries a, k carries +-a, so every scaled
    logit gains qkScale * a^2 = |logit_shift| with the shift's sign."""
    assert spec.structure is not None and spec.structure.logit_shift is not None
    return math.sqrt(abs(spec.structure.logit_shift) / spec.qk_scale)


def key_trend(structure: Structure, positions: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """f in [0, 1] at each key position of a sequence of the given length (:class:`Structure`)."""
    if structure.logits == "recency":
        trend: np.ndarray = positions / np.maximum(lengths - 1, 1)
        return trend
    if structure.logits == "sinks":
        return (positions < (structure.sink_keys or 0)).astype(np.float64)
    return (positions >= (structure.late_from or 0)).astype(np.float64)


def head_temperatures(structure: Structure, heads: int) -> np.ndarray:
    """Multiplier of q's random part per query head: geometric from the first value to the second."""
    if structure.head_temperature is None:
        return np.ones(heads)
    first, last = structure.head_temperature
    return first * (last / first) ** (np.arange(heads) / max(heads - 1, 1))


def value_scales(structure: Structure, positions: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """|V| multiplier at each key position: geometric from the first key's value to the last key's."""
    if structure.v_scale is None:
        return np.ones(positions.shape)
    first, last = structure.v_scale
    scales: np.ndarray = first * (last / first) ** (positions / np.maximum(lengths - 1, 1))
    return scales


class _Source:
    """Draws one logical tensor ``[rows, heads, dim]`` chunk by chunk, in row order.

    With a :class:`Structure` the float64 draws are shaped before the one rounding: kv rows are drawn
    in batch order (packed and padded alike), so the i-th drawn row's sequence position follows from
    the cumulative kvSeqLen."""

    def __init__(
        self, spec: CaseSpec, streams: dict[str, np.random.Generator], role: str, heads: int, dim: int
    ) -> None:
        self.spec, self.streams, self.role, self.heads, self.dim = spec, streams, role, heads, dim
        self.row = 0
        self.starts = np.cumsum([0, *spec.kv_seqlen])
        structure = spec.structure
        self.key_scales = None  # k and kRope each draw the same per-key scales from a copy of one stream
        if spec.distribution == "large_raw_scores" and role in ("k", "k_rope"):
            self.key_scales = copy.deepcopy(streams["raw_keys"])
        self.offsets = None
        if structure is not None and structure.v_mean is not None and role == "v":
            signs = np.where(streams["v_mean"].random((heads, dim)) < 0.5, -1.0, 1.0)
            self.offsets = (structure.v_mean * signs).reshape(-1)

    def draw(self, rows: int) -> np.ndarray:
        """The next ``rows`` rows as float64 ``[rows, heads * dim]``."""
        values = self._random(rows)
        if self.key_scales is not None:
            scales = self.key_scales.uniform(-1.0, 1.0, rows)
            scales[self._positions(rows)[0] == 0] = 1.0
            values *= scales[:, None]
        if self.spec.structure is not None:
            self._shape(values)
        self.row += rows
        return values

    def _positions(self, rows: int) -> tuple[np.ndarray, np.ndarray]:
        """The next ``rows`` kv rows' positions in their sequences, and those sequences' lengths."""
        index = np.arange(self.row, self.row + rows)
        batch = np.searchsorted(self.starts, index, side="right") - 1
        return (index - self.starts[batch]).astype(np.float64), np.asarray(self.spec.kv_seqlen, np.float64)[batch]

    def _shape(self, values: np.ndarray) -> None:
        """Apply the structure to drawn rows in place (``values`` is ``[rows, heads * dim]``)."""
        structure, spec = self.spec.structure, self.spec
        assert structure is not None
        per_head = values.reshape(values.shape[0], self.heads, self.dim)
        if self.role in ("q", "q_rope"):
            per_head *= head_temperatures(structure, self.heads)[None, :, None]
            if self.role == "q_rope" and structure.logits is not None:
                per_head[:, :, 0] = trend_amplitude(spec)
            if self.role == "q_rope" and structure.logit_shift is not None:
                per_head[:, :, 0] = shift_amplitude(spec)
            return
        positions, lengths = self._positions(values.shape[0])
        if self.role == "k_rope" and structure.logit_shift is not None:
            per_head[:, :, 0] = math.copysign(shift_amplitude(spec), structure.logit_shift)
        if self.role == "k_rope" and structure.logits is not None:
            per_head[:, :, 0] = (key_trend(structure, positions, lengths) * trend_amplitude(spec))[:, None]
        if self.role == "v":
            values *= value_scales(structure, positions, lengths)[:, None]
            if self.offsets is not None:
                values += self.offsets[None, :]

    def _random(self, rows: int) -> np.ndarray:
        shape = (rows, self.heads * self.dim)
        rng, dist, kind = self.streams[self.role], self.spec.distribution, self.role.split("_")[0]
        if dist == "normal":
            return rng.standard_normal(shape)
        if dist == "large_logits" and kind in ("q", "k"):
            amp = _uniform_amplitude_for_logit_std(LARGE_LOGIT_STD[self.spec.dtype], self.spec.qk_scale)
            return rng.uniform(-amp, amp, shape)
        if dist == "large_raw_scores" and kind in ("q", "k"):
            amp = math.sqrt(RAW_SCORE_LOGIT / (self.spec.qk_scale * SCORE_DIM))
            return amp * (1.0 + RAW_NOISE * rng.uniform(-1.0, 1.0, shape))
        values = rng.uniform(-1.0, 1.0, shape)
        if dist == "v_outliers" and self.role == "v":
            hits = self.streams["v_hits"].random(shape) < V_OUTLIER_FRACTION
            signs = self.streams["v_signs"].random(int(hits.sum())) < 0.5
            values[hits] = np.where(signs, -V_OUTLIER_MAGNITUDE, V_OUTLIER_MAGNITUDE)
        return values


class _NearTieKeys:
    """Keys that are tiny perturbations of one row per kv head: all logits of a row nearly tie.

    k and kRope are drawn together (one 192-wide key) and split; ``draw`` returns both.
    """

    def __init__(self, streams: dict[str, np.random.Generator], heads: int) -> None:
        self.rng, self.heads = streams["k"], heads
        self.base = streams["tie_base"].uniform(-1.0, 1.0, (1, heads, SCORE_DIM))

    def draw(self, rows: int) -> tuple[np.ndarray, np.ndarray]:
        full = self.base + NEAR_TIE_NOISE * self.rng.uniform(-1.0, 1.0, (rows, self.heads, SCORE_DIM))
        return (full[..., :NOPE_DIM].reshape(rows, -1), full[..., NOPE_DIM:].reshape(rows, -1))


def _chunks(rows: int, width: int) -> list[tuple[int, int]]:
    step = max(1, CHUNK_ELEMENTS // max(width, 1))
    return [(r0, min(r0 + step, rows)) for r0 in range(0, rows, step)]


def _fill_packed(dests: list[np.ndarray], draw: Any, rows: int, dtype: str) -> None:
    """Fill ``[rows, width]`` views ``dests`` from ``draw(n)`` (one float64 chunk per dest)."""
    for r0, r1 in _chunks(rows, sum(d.shape[1] for d in dests)):
        parts = draw(r1 - r0)
        for dest, part in zip(dests, parts if isinstance(parts, tuple) else (parts,), strict=True):
            dest[r0:r1] = round_to(part, dtype)


def _fill_garbage(
    dests: list[np.ndarray], garbage: list[np.random.Generator], dtype: str, kind: str | None = None
) -> None:
    """Fill ``[rows, width]`` views with padding: garbage, one draw per value, +-[2, 4); NaN for ``kind`` 'nan'
    (the rows no batch reads: a kernel that reads them, even to multiply by a zero weight, leaks it)."""
    if kind == "nan":
        for dest in dests:
            dest[...] = np.nan
        return
    width = sum(d.shape[1] for d in dests)
    for dest, rng in zip(dests, garbage, strict=True):
        for r0, r1 in _chunks(dest.shape[0], width):
            values = rng.uniform(-1.0, 1.0, (r1 - r0, dest.shape[1]))
            values += np.copysign(1.0, values)
            values *= 2.0
            dest[r0:r1] = round_to(values, dtype)


def _fill_padded(dests: list[np.ndarray], draw: Any, spec: CaseSpec, garbage: list[np.random.Generator]) -> None:
    """Fill padded ``[B, S, width]`` tensors: each batch's valid rows from ``draw``, the rest garbage."""
    for b, length in enumerate(spec.kv_seqlen):
        _fill_packed([d[b] for d in dests], draw, length, spec.dtype)
        _fill_garbage([d[b, length:] for d in dests], garbage, spec.dtype, spec.padding)


def _fill_spare(dests: list[np.ndarray], draw: Any, spec: CaseSpec, garbage: list[np.random.Generator]) -> None:
    """Fill packed ``[rows, width]`` tensors: the kv rows from ``draw``, spare rows after them garbage."""
    _fill_packed(dests, draw, spec.total_kv, spec.dtype)
    _fill_garbage([d[spec.total_kv :] for d in dests], garbage, spec.dtype, spec.padding)


def generate_inputs(spec: CaseSpec, *, threads: int = 1) -> OpInputs:
    """All operator inputs of a case, in its layouts and dtype (see :class:`OpInputs`).

    Drawn in chunks of :data:`CHUNK_ELEMENTS` float64 values and rounded into the device-dtype
    tensors as they go: the only whole-tensor arrays are the results themselves (2 bytes a value).
    Each tensor draws from its own streams (:data:`STREAMS`), so with ``threads > 1`` the tensors fill
    side by side (the generator and the rounding release the GIL) with the same values.
    """
    if spec.inputs is not None:
        return explicit_inputs(spec)
    streams = case_streams(spec)
    t, h, hkv, dtype = spec.total_q, spec.head_num, max(spec.kv_head_num, 1), numpy_dtype(spec.dtype)
    q = np.empty((t, h * NOPE_DIM), dtype=dtype)
    q_rope = np.empty((t, h * ROPE_DIM), dtype=dtype)
    fills: list[Callable[[], None]] = [  # the largest first: q is most of a case's inputs
        lambda: _fill_packed([q], _Source(spec, streams, "q", h, NOPE_DIM).draw, t, spec.dtype),
        lambda: _fill_packed([q_rope], _Source(spec, streams, "q_rope", h, ROPE_DIM).draw, t, spec.dtype),
    ]
    padded = spec.kv_layout in ("padded", "strided")  # strided: the padded bytes with S = max kv, seen 3-D
    rows = (spec.batch, spec.padded_rows) if padded else (spec.kv_rows,)
    k = np.empty((*rows, hkv * NOPE_DIM), dtype=dtype)
    k_rope = np.empty((*rows, hkv * ROPE_DIM), dtype=dtype)
    v = np.empty((*rows, hkv * V_DIM), dtype=dtype)
    if spec.distribution == "near_tie":
        key_sources: list[tuple[list[np.ndarray], Any, list[str]]] = [
            ([k, k_rope], _NearTieKeys(streams, hkv).draw, ["pad_k", "pad_k_rope"])
        ]
    else:
        key_sources = [
            ([k], _Source(spec, streams, "k", hkv, NOPE_DIM).draw, ["pad_k"]),
            ([k_rope], _Source(spec, streams, "k_rope", hkv, ROPE_DIM).draw, ["pad_k_rope"]),
        ]
    key_sources.append(([v], _Source(spec, streams, "v", hkv, V_DIM).draw, ["pad_v"]))
    fill_kv = _fill_padded if padded else _fill_spare
    for dests, draw, pads in key_sources:
        fills.append(functools.partial(fill_kv, dests, draw, spec, [streams[name] for name in pads]))
    pool = shared_pool() if threads > 1 else None  # the process's pool: its thread budget
    if pool is None:
        for fill in fills:
            fill()
    else:
        for done in [pool.submit(fill) for fill in fills]:
            done.result()
    if spec.q_layout == "3d":
        q, q_rope = q.reshape(t, h, NOPE_DIM), q_rope.reshape(t, h, ROPE_DIM)
    if spec.kv_layout != "padded":
        k, k_rope, v = (x.reshape(spec.kv_rows, hkv, -1) for x in (k, k_rope, v))
    return OpInputs(
        q=q,
        q_rope=q_rope,
        k=k,
        k_rope=k_rope,
        v=v,
        q_seqlen=np.asarray(spec.q_seqlen, dtype=np.int32),
        kv_seqlen=np.asarray(spec.kv_seqlen, dtype=np.int32),
        mask=build_mask(spec) if spec.mask_type == 2 else None,
    )


def explicit_inputs(spec: CaseSpec) -> OpInputs:
    """A case's explicit inputs (``spec.inputs``, golden/store/bundles.py), exactly as stored, in the case's
    layouts: the padded and strided kv layouts get the generator's garbage beyond each kvSeqLen, a packed one
    with spare rows garbage in them (from the case's ``pad_*`` streams); the valid rows keep their bits."""
    from mlaconf.golden.store.bundles import InputBundleError, load_bundle

    assert spec.inputs is not None
    bundle = load_bundle(spec.inputs)
    t, h, hkv = spec.total_q, spec.head_num, spec.kv_head_num
    expected = {
        "q": (t, h, NOPE_DIM),
        "q_rope": (t, h, ROPE_DIM),
        "k": (spec.total_kv, hkv, NOPE_DIM),
        "k_rope": (spec.total_kv, hkv, ROPE_DIM),
        "v": (spec.total_kv, hkv, V_DIM),
    }
    for role, shape in expected.items():
        got = bundle[role]
        if got.shape != shape or got.dtype != numpy_dtype(spec.dtype):
            raise InputBundleError(
                f"input bundle {spec.inputs[:12]}: case {spec.name or spec.case_id}: {role} is {got.dtype}"
                f"{list(got.shape)}, the case needs {spec.dtype}{list(shape)}"
            )
    q, q_rope = bundle["q"], bundle["q_rope"]
    if spec.q_layout == "2d":
        q, q_rope = q.reshape(t, -1), q_rope.reshape(t, -1)
    kv = [bundle["k"], bundle["k_rope"], bundle["v"]]
    if spec.kv_rows != spec.total_kv or spec.kv_layout == "padded":
        streams = case_streams(spec)
        padded = spec.kv_layout != "packed"
        rows = (spec.batch, spec.padded_rows) if padded else (spec.kv_rows,)
        laid = [np.empty((*rows, x.shape[1] * x.shape[2]), dtype=x.dtype) for x in kv]
        for dest, packed, pad in zip(laid, kv, ("pad_k", "pad_k_rope", "pad_v"), strict=True):
            fill = _fill_padded if padded else _fill_spare
            fill([dest], _row_reader(packed.reshape(spec.total_kv, -1)), spec, [streams[pad]])
        kv = laid if spec.kv_layout == "padded" else [x.reshape(spec.kv_rows, hkv, -1) for x in laid]
    return OpInputs(
        q=q,
        q_rope=q_rope,
        k=kv[0],
        k_rope=kv[1],
        v=kv[2],
        q_seqlen=np.asarray(spec.q_seqlen, dtype=np.int32),
        kv_seqlen=np.asarray(spec.kv_seqlen, dtype=np.int32),
        mask=build_mask(spec) if spec.mask_type == 2 else None,
    )


def _row_reader(rows: np.ndarray) -> Any:
    """``draw(n)``: the next ``n`` rows of ``rows`` as float64 (exact: rounding them back keeps their bits)."""
    cursor = 0

    def draw(n: int) -> np.ndarray:
        nonlocal cursor
        cursor += n
        return rows[cursor - n : cursor].astype(np.float64)

    return draw
