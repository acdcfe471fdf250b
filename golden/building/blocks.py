"""A sampled case's inputs drawn by blocks of rows: any row range of any tensor, without drawing the rest.

The whole-tensor generator (golden/building/inputs.py) draws each tensor from one stream in row order, so row
``r`` exists only after every row before it.  A sampled case (``rows`` set) is production sized (a q of 14 GB):
its golden needs a few hundred q rows and, per kv head, that head's keys and values; the device host needs the
whole tensors; the store keeps neither (golden/store/h5file.py keeps the seed, :data:`BLOCK_GENERATOR` and a
digest per tensor).  So each tensor is cut into blocks of a fixed number of rows (per kv head for k, kRope and v),
and every block draws from its own stream: PCG64 seeded by a seed sequence of (seed, the spec's inputs key, the
role) whose spawn key is (kv head, block), so any block's stream is made directly (about 20 us) from its
address.  A row's values depend only on its block's stream and its position, so
rows ``a..b`` drawn alone equal the same rows of the whole tensor.

The distributions and structures of golden/building/inputs.py are drawn alike (the same amplitudes and shapes,
other random numbers): a sampled case's inputs are not its full twin's.  Explicit inputs (an imported dump)
cannot be drawn again: a sampled case with them is refused when its spec is read (golden/specs/spec_build.py).
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import xxhash

from mlaconf.facts.operator import NOPE_DIM, ROPE_DIM, SCORE_DIM, V_DIM, kv_row_starts
from mlaconf.facts.processes import shared_pool
from mlaconf.golden.building import progress
from mlaconf.golden.building.inputs import (
    LARGE_LOGIT_STD,
    NEAR_TIE_NOISE,
    RAW_NOISE,
    V_OUTLIER_FRACTION,
    V_OUTLIER_MAGNITUDE,
    _uniform_amplitude_for_logit_std,
    build_mask,
    head_temperatures,
    key_trend,
    numpy_dtype,
    round_to,
    shift_amplitude,
    trend_amplitude,
    value_scales,
)
from mlaconf.golden.specs.layout import kv_shape
from mlaconf.golden.specs.spec import RAW_SCORE_LOGIT, CaseSpec
from mlaconf.golden.specs.types import GoldenCase, InputsRecord, OpInputs
from mlaconf.golden.store.integrity import BLOCK_GENERATOR, GoldenStaleError

#: float64 values a block holds (512 kB): q's blocks are this many values over every head (at least one row),
#: k's, kRope's and v's this many of one kv head.
BLOCK_ELEMENTS = 1 << 16
#: Rows of k a ``large_raw_scores`` key scale block covers (k and kRope scale each key row by the same draw).
SCALE_ROWS = 512
#: Rows per step of a whole tensor's fill or digest (whole blocks; about 64 MB of float64 at a time).
STEP_ELEMENTS = 1 << 23
#: The tensors drawn by blocks, with their head width.
TENSORS = {"q": NOPE_DIM, "q_rope": ROPE_DIM, "k": NOPE_DIM, "k_rope": ROPE_DIM, "v": V_DIM}
QUERY_TENSORS = ("q", "q_rope")
#: One seed sequence per role; new roles go at the end (a role's entropy ends in its index: earlier ones keep
#: their values).
ROLES = (
    *("q", "q_rope", "k", "k_rope", "v", "pad_k", "pad_k_rope", "pad_v", "v_hits", "v_signs", "tie_base", "v_mean"),
    "raw_keys",
)
#: Mixed into every role's entropy, so no block stream repeats the whole-tensor generator's seed sequence.
BLOCK_STREAM = 0x424C4B53  # "BLKS"


class BlockInputs:
    """Draws any rows of a sampled case's q, qRope (``[rows, H, D]``) and, per kv head, k, kRope and v
    (``[rows, D]`` in k's rows viewed ``[rows, Hkv, D]``, padding included), rounded to the case dtype."""

    def __init__(self, spec: CaseSpec) -> None:
        self.spec = spec
        self.heads, self.kv_heads = spec.head_num, spec.kv_head_num
        self.kv_rows = spec.kv_rows
        starts = kv_row_starts(kv_shape(spec), spec.kv_seqlen, spec.kv_head_num)
        assert starts is not None, "a spec's own kv shape is a kv layout"
        self._batch_starts = list(starts)
        order = np.argsort(starts, kind="stable")
        self._starts = np.asarray(starts, dtype=np.int64)[order]
        self._lengths = np.asarray(spec.kv_seqlen, dtype=np.int64)[order]
        seed = [spec.seed, int(spec.inputs_key[:16], 16), int(spec.inputs_key[16:32], 16), BLOCK_STREAM]
        self._entropy = {role: [*seed, i] for i, role in enumerate(ROLES)}
        self._offsets: np.ndarray | None = None
        if spec.structure is not None and spec.structure.v_mean is not None:
            signs = np.where(self._rng("v_mean", 0, 0).random((self.kv_heads, V_DIM)) < 0.5, -1.0, 1.0)
            self._offsets = spec.structure.v_mean * signs
        self._tie_base: np.ndarray | None = None
        if spec.distribution == "near_tie":
            self._tie_base = self._rng("tie_base", 0, 0).uniform(-1.0, 1.0, (self.kv_heads, SCORE_DIM))

    def _rng(self, role: str, head: int, block: int) -> np.random.Generator:
        """The stream of one block of one head of one role: PCG64 seeded by the role's entropy and (head, block)."""
        return np.random.Generator(
            np.random.PCG64(np.random.SeedSequence(self._entropy[role], spawn_key=(head, block)))
        )

    def block_rows(self, name: str) -> int:
        """Rows per block of tensor ``name`` (fixed by the case's head counts)."""
        width = TENSORS[name] * (self.heads if name in QUERY_TENSORS else 1)
        return max(1, BLOCK_ELEMENTS // width)

    def rows(self, name: str) -> int:
        """Rows of tensor ``name``: tokens for q and qRope, k's rows viewed ``[rows, Hkv, D]`` for the others."""
        return self.spec.total_q if name in QUERY_TENSORS else self.kv_rows

    # -- one block ---------------------------------------------------------------------------------

    def _random(self, name: str, head: int, block: int, shape: tuple[int, ...]) -> np.ndarray:
        """The float64 draws of a block's first rows (``shape[0]`` of them), before any structure."""
        rng, dist, kind = self._rng(name, head, block), self.spec.distribution, name.split("_")[0]
        if dist == "normal":
            return rng.standard_normal(shape)
        if dist == "large_logits" and kind in ("q", "k"):
            amp = _uniform_amplitude_for_logit_std(LARGE_LOGIT_STD[self.spec.dtype], self.spec.qk_scale)
            return rng.uniform(-amp, amp, shape)
        if dist == "large_raw_scores" and kind in ("q", "k"):
            amp = math.sqrt(RAW_SCORE_LOGIT / (self.spec.qk_scale * SCORE_DIM))
            return amp * (1.0 + RAW_NOISE * rng.uniform(-1.0, 1.0, shape))
        if dist == "near_tie" and kind == "k":
            assert self._tie_base is not None
            base = self._tie_base[head, :NOPE_DIM] if name == "k" else self._tie_base[head, NOPE_DIM:]
            return base + NEAR_TIE_NOISE * rng.uniform(-1.0, 1.0, shape)
        values = rng.uniform(-1.0, 1.0, shape)
        if dist == "v_outliers" and name == "v":
            hits = self._rng("v_hits", head, block).random(shape) < V_OUTLIER_FRACTION
            minus = self._rng("v_signs", head, block).random(shape) < 0.5
            values[hits] = np.where(minus[hits], -V_OUTLIER_MAGNITUDE, V_OUTLIER_MAGNITUDE)
        return values

    def _query_block(self, name: str, block: int, count: int) -> np.ndarray:
        """The first ``count`` rows of a q or qRope block, float64 ``[count, H, D]``."""
        values = self._random(name, 0, block, (count, self.heads, TENSORS[name]))
        structure = self.spec.structure
        if structure is not None:
            values *= head_temperatures(structure, self.heads)[None, :, None]
            if name == "q_rope" and structure.logits is not None:
                values[:, :, 0] = trend_amplitude(self.spec)
            if name == "q_rope" and structure.logit_shift is not None:
                values[:, :, 0] = shift_amplitude(self.spec)
        return values

    def _positions(self, first: int, count: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """kv rows ``first ..``: whether each holds a key, its position in its sequence and that sequence's length."""
        index = np.arange(first, first + count, dtype=np.int64)
        batch = np.clip(np.searchsorted(self._starts, index, side="right") - 1, 0, None)
        position = index - self._starts[batch]
        length = self._lengths[batch]
        valid = (index >= self._starts[batch]) & (position < length)
        # padding rows: the first key of a one-key sequence (their draws are replaced by padding after shaping)
        return valid, np.where(valid, position, 0).astype(np.float64), np.where(valid, length, 1).astype(np.float64)

    def _key_scales(self, first: int, count: int, position: np.ndarray) -> np.ndarray:
        """``large_raw_scores``: each key row's scale in [-1, 1) (the first key of a sequence 1), per row."""
        scales = np.empty(count)
        for block in range(first // SCALE_ROWS, (first + count - 1) // SCALE_ROWS + 1):
            lo, hi = max(first, block * SCALE_ROWS), min(first + count, (block + 1) * SCALE_ROWS)
            drawn = self._rng("raw_keys", 0, block).uniform(-1.0, 1.0, hi - block * SCALE_ROWS)
            scales[lo - first : hi - first] = drawn[lo - block * SCALE_ROWS :]
        scales[position == 0] = 1.0
        return scales

    def _kv_block(self, name: str, head: int, block: int, count: int) -> np.ndarray:
        """The first ``count`` rows of a block of one kv head of k, kRope or v, float64 ``[count, D]``: keys
        where a sequence has them, padding elsewhere."""
        width, first = TENSORS[name], block * self.block_rows(name)
        valid, position, length = self._positions(first, count)
        out = np.empty((count, width))
        if valid.any():
            values = self._random(name, head, block, (count, width))
            self._shape_keys(name, head, values, first, position, length)
            out[valid] = values[valid]
        if not valid.all():
            if self.spec.padding == "nan":  # the rows no batch reads (inputs.py _fill_garbage)
                garbage = np.full((count, width), np.nan)
            else:
                garbage = self._rng(f"pad_{name}", head, block).uniform(-1.0, 1.0, (count, width))
                garbage += np.copysign(1.0, garbage)
                garbage *= 2.0
            out[~valid] = garbage[~valid]
        return out

    def _shape_keys(
        self, name: str, head: int, values: np.ndarray, first: int, position: np.ndarray, length: np.ndarray
    ) -> None:
        """Key scales and the structure along the key position, in place (padding rows are overwritten after)."""
        if self.spec.distribution == "large_raw_scores" and name in ("k", "k_rope"):
            values *= self._key_scales(first, values.shape[0], position)[:, None]
        structure = self.spec.structure
        if structure is None:
            return
        if name == "k_rope" and structure.logit_shift is not None:
            values[:, 0] = math.copysign(shift_amplitude(self.spec), structure.logit_shift)
        if name == "k_rope" and structure.logits is not None:
            values[:, 0] = key_trend(structure, position, length) * trend_amplitude(self.spec)
        if name == "v":
            values *= value_scales(structure, position, length)[:, None]
            if self._offsets is not None:
                values += self._offsets[head][None, :]

    # -- rows ---------------------------------------------------------------------------------------

    def _float_rows(self, name: str, head: int, r0: int, r1: int) -> np.ndarray:
        """Rows ``[r0, r1)`` in float64: each block they touch drawn from its start to the last row needed."""
        size = self.block_rows(name)
        parts = []
        for block in range(r0 // size, (r1 - 1) // size + 1):
            start = block * size
            count = min(r1, start + size) - start
            drawn = (
                self._query_block(name, block, count)
                if name in QUERY_TENSORS
                else self._kv_block(name, head, block, count)
            )
            parts.append(drawn[max(r0, start) - start :])
        return np.concatenate(parts) if len(parts) > 1 else parts[0]

    def query_rows(self, name: str, r0: int, r1: int) -> np.ndarray:
        """q or qRope rows ``[r0, r1)``, ``[r1 - r0, H, D]`` in the case dtype."""
        return round_to(self._float_rows(name, 0, r0, r1), self.spec.dtype)

    def kv_rows_of(self, name: str, head: int, r0: int, r1: int) -> np.ndarray:
        """k, kRope or v rows ``[r0, r1)`` of kv head ``head``, ``[r1 - r0, D]`` in the case dtype."""
        return round_to(self._float_rows(name, head, r0, r1), self.spec.dtype)

    def gather_queries(self, name: str, rows: np.ndarray) -> np.ndarray:
        """q or qRope at token rows ``rows`` (any order), ``[len(rows), H, D]``: each block drawn once."""
        out = np.empty((rows.size, self.heads, TENSORS[name]), dtype=numpy_dtype(self.spec.dtype))
        size = self.block_rows(name)
        blocks = rows // size
        for block in np.unique(blocks).tolist():
            at = np.flatnonzero(blocks == block)
            start = block * size
            drawn = self.query_rows(name, start, int(rows[at].max()) + 1)
            out[at] = drawn[rows[at] - start]
        return out

    def keys(self, batch: int, head: int) -> tuple[np.ndarray, np.ndarray]:
        """Batch ``batch``'s keys of kv head ``head``: k and kRope side by side ``[kv_b, 192]``, v ``[kv_b, 128]``."""
        start = self._batch_starts[batch]
        end = start + self.spec.kv_seqlen[batch]
        k = np.concatenate([self.kv_rows_of(n, head, start, end) for n in ("k", "k_rope")], axis=1)
        return k, self.kv_rows_of("v", head, start, end)

    # -- whole tensors ------------------------------------------------------------------------------

    def steps(self, name: str) -> list[tuple[int, int]]:
        """Row ranges of whole blocks, about :data:`STEP_ELEMENTS` values each, covering the tensor."""
        size = self.block_rows(name)
        width = TENSORS[name] * (self.heads if name in QUERY_TENSORS else self.kv_heads)
        step = max(1, STEP_ELEMENTS // (size * width)) * size
        rows = self.rows(name)
        return [(r0, min(r0 + step, rows)) for r0 in range(0, rows, step)]

    def step_rows(self, name: str, r0: int, r1: int) -> np.ndarray:
        """Rows ``[r0, r1)`` of every head, ``[r1 - r0, heads, D]`` in the case dtype (the stored layout's rows)."""
        if name in QUERY_TENSORS:
            return self.query_rows(name, r0, r1)
        out = np.empty((r1 - r0, self.kv_heads, TENSORS[name]), dtype=numpy_dtype(self.spec.dtype))
        for head in range(self.kv_heads):
            out[:, head] = self.kv_rows_of(name, head, r0, r1)
        return out


def _in_order(
    work: Callable[[tuple[int, int]], np.ndarray], steps: list[tuple[int, int]], threads: int
) -> Iterator[np.ndarray]:
    """``work(step)`` of each step, in order, at most ``threads + 1`` steps in flight (bounded memory)."""
    pool = shared_pool() if threads > 1 else None
    if pool is None:
        yield from map(work, steps)
        return
    pending: list[Any] = []
    for step in steps:
        pending.append(pool.submit(work, step))
        if len(pending) > threads:
            yield pending.pop(0).result()
    for done in pending:
        yield done.result()


def _step(source: BlockInputs, name: str, step: tuple[int, int]) -> np.ndarray:
    return source.step_rows(name, *step)


def input_digests(spec: CaseSpec, *, threads: int = 1) -> dict[str, str]:
    """xxh3-128 of each block-drawn tensor's bytes as the store would hold them (C order, bf16 as its bits),
    hashed step by step: the tensors are drawn whole but never held."""
    source = BlockInputs(spec)
    digests = {}
    total, done = sum(len(source.steps(name)) for name in TENSORS), 0
    for name in TENSORS:
        hasher = xxhash.xxh3_128()
        draw: Callable[[tuple[int, int]], np.ndarray] = functools.partial(_step, source, name)
        for part in _in_order(draw, source.steps(name), threads):
            hasher.update(np.ascontiguousarray(part).view(np.uint8).data)
            done += 1
            progress.set_stage(f"input digests, {name}: step {done} of {total}")  # the build's work is done
        digests[name] = hasher.hexdigest()
    return digests


def inputs_record(spec: CaseSpec, *, threads: int = 1) -> InputsRecord:
    """What the store keeps of a sampled case's inputs: the seed, :data:`BLOCK_GENERATOR` and each digest."""
    return InputsRecord(BLOCK_GENERATOR, spec.seed, input_digests(spec, threads=threads))


def regenerate_inputs(spec: CaseSpec, record: InputsRecord, *, threads: int = 1) -> OpInputs:
    """The whole inputs of a sampled case, drawn step by step into preallocated tensors in its layouts; each
    tensor's digest must be the record's (else :class:`GoldenStaleError` naming ``record.origin`` and the tensor:
    this host draws other values than the one that built the golden)."""
    where = Path(record.origin or f"<golden of {spec.case_id} built here>")
    source, dtype = BlockInputs(spec), numpy_dtype(spec.dtype)
    arrays = {  # untouched until filled: memory is taken step by step
        name: np.empty((source.rows(name), source.heads if name in QUERY_TENSORS else source.kv_heads, width), dtype)
        for name, width in TENSORS.items()
    }
    with progress.case_work(spec.case_id, float(sum(a.size for a in arrays.values()))):
        progress.set_stage("regenerating inputs")
        for name, whole in arrays.items():

            def fill(step: tuple[int, int], whole: np.ndarray = whole, name: str = name) -> np.ndarray:
                whole[step[0] : step[1]] = source.step_rows(name, *step)
                return whole[step[0] : step[1]]

            hasher = xxhash.xxh3_128()
            for part in _in_order(fill, source.steps(name), threads):
                hasher.update(part.view(np.uint8).data)
                progress.add_work(part.size)
            if hasher.hexdigest() != record.digests.get(name):
                raise GoldenStaleError(
                    where,
                    f"regenerated {name} has digest {hasher.hexdigest()[:16]}…, the golden recorded "
                    f"{str(record.digests.get(name))[:16]}… (generator {record.generator}, seed {record.seed}): "
                    "these inputs are not the ones the golden was built from",
                    f"inputs/{name}",
                )
    return recorded_inputs(spec, arrays)


def recorded_inputs(spec: CaseSpec, tensors: dict[str, np.ndarray] | None = None) -> OpInputs:
    """The case's inputs in its layouts from ``tensors`` (name -> ``[rows, heads, D]``), or, without them, a
    record's inputs: the lengths and the mask, each tensor empty (as a golden that records them is read)."""
    empty = np.empty((0,), dtype=numpy_dtype(spec.dtype))
    if tensors is None:
        q = q_rope = k = k_rope = v = empty
    else:
        q, q_rope = tensors["q"], tensors["q_rope"]
        if spec.q_layout == "2d":
            q, q_rope = q.reshape(spec.total_q, -1), q_rope.reshape(spec.total_q, -1)
        k, k_rope, v = (tensors[n].reshape(kv_shape(spec, TENSORS[n])) for n in ("k", "k_rope", "v"))
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


def with_inputs(golden: GoldenCase, *, threads: int = 1) -> GoldenCase:
    """``golden`` with its inputs: as it is when it holds them, else drawn again from its record and checked."""
    if golden.holds_inputs:
        return golden
    assert golden.inputs_record is not None
    return dataclasses.replace(golden, inputs=regenerate_inputs(golden.spec, golden.inputs_record, threads=threads))
