"""The rows a sampled golden holds (``rows`` in a case spec): chosen where kernels break, then seeded random ones.

A float64 golden costs every query row times the keys it sees; the error of an output row depends only on
that row, so a golden may hold a sample of rows (every head of each) and the judge compare those alone.
The sample is deterministic in the spec and chosen, not only random (each row carries the bits of
every reason it was chosen for, :data:`mlaconf.golden.specs.types.REASONS`):

* ``batch_edge``  each batch's first and last row;
* ``tile_edge``   the first and last row of the batch's query tiles of :data:`QUERY_TILE` rows (the kernels'
                  tile), at most :data:`TILES_PER_BATCH` tiles per batch, spread evenly and always the first
                  and the last;
* ``q_offset``    the rows on both sides of every power-of-two boundary, from 2^:data:`LOWEST_POWER` up, of
                  the flattened element offset and byte offset of q, qRope and attenOut (a row holds every
                  head, so a crossing inside any head's part picks its row);
* ``kv_offset``   the same boundaries of k, kRope and v, whose rows are keys: the first query row that sees
                  the crossing key and the row before it (without a causal mask every row sees every key:
                  the batch's first row);
* ``diagonal``    causal masks: the rows whose last visible key ends a block of :data:`KEY_BLOCK` keys and
                  the next row (its first key of a new block), at most :data:`TILES_PER_BATCH` such pairs
                  per batch;
* ``random``      ``spec.rows`` rows drawn without replacement from the rest, seeded by the spec's seed.

Only rows the operator promises a value for are chosen (zero-length batches have none).
"""

from __future__ import annotations

import numpy as np

from mlaconf.facts.operator import NOPE_DIM, ROPE_DIM, V_DIM, causal_offset, kv_row_starts
from mlaconf.golden.specs.layout import kv_shape
from mlaconf.golden.specs.spec import CaseSpec
from mlaconf.golden.specs.types import RowSample, reason_bit

#: Query rows per tile of the operator's kernels (ATB mla_prefill's split_m).
QUERY_TILE = 128
#: Keys per block along which a causal diagonal is cut (the kernels' key block).
KEY_BLOCK = 128
#: Most tiles (and diagonal block edges) per batch whose rows are chosen.
TILES_PER_BATCH = 16
#: The lowest power of two whose crossing is chosen (below it every golden holds every row anyway).
LOWEST_POWER = 16
#: Bytes per element of every floating tensor (fp16 and bf16).
ELEMENT_BYTES = 2
#: Mixed into the seed of the random rows, so they are not the inputs' draws.
RANDOM_STREAM = 0x524F5753  # "ROWS"


def _boundary_units(width: int, count: int) -> list[int]:
    """Element offsets ``E`` where an element or byte offset crosses 2^p (p >= LOWEST_POWER) inside a tensor
    of ``count`` rows of ``width`` elements: the crossing lies between element E - 1 and element E."""
    total = width * count
    found = []
    for unit in (1, ELEMENT_BYTES):  # element offsets, then byte offsets (2^p bytes = element 2^p / 2)
        power = 1 << LOWEST_POWER
        while power // unit < total:
            found.append(power // unit)
            power <<= 1
    return sorted(set(found))


def _crossing_rows(width: int, count: int) -> np.ndarray:
    """Rows (of ``count`` rows of ``width`` elements) on both sides of each power-of-two boundary."""
    edges = np.asarray(_boundary_units(width, count), dtype=np.int64)
    return np.unique(np.concatenate([(edges - 1) // width, edges // width])) if edges.size else edges


def _spread(count: int, most: int) -> np.ndarray:
    """At most ``most`` of ``range(count)``, evenly spread, the first and the last always among them."""
    if count <= most:
        return np.arange(count, dtype=np.int64)
    return np.unique(np.round(np.linspace(0, count - 1, most)).astype(np.int64))


class _Chooser:
    """Accumulates rows and their reason bits."""

    def __init__(self, total: int) -> None:
        self.bits = np.zeros(total, dtype=np.uint8)

    def add(self, rows: np.ndarray | list[int], reason: str) -> None:
        picked = np.asarray(rows, dtype=np.int64)
        picked = picked[(picked >= 0) & (picked < self.bits.size)]
        self.bits[picked] |= np.uint8(reason_bit(reason))


def choose_rows(spec: CaseSpec) -> RowSample:
    """The sample of ``spec`` (``spec.rows`` random rows beside the chosen ones); see the module docstring."""
    if spec.rows is None:
        raise ValueError(f"{spec.case_id}: the case holds every row (rows is not set)")
    chooser = _Chooser(spec.total_q)
    starts = np.concatenate([[0], np.cumsum(np.asarray(spec.q_seqlen, dtype=np.int64))])
    valid = np.zeros(spec.total_q, dtype=bool)
    for b, (q_len, kv_len) in enumerate(zip(spec.q_seqlen, spec.kv_seqlen, strict=True)):
        if not (q_len and kv_len):
            continue
        start = int(starts[b])
        valid[start : start + q_len] = True
        chooser.add([start, start + q_len - 1], "batch_edge")
        tiles = _spread(-(-q_len // QUERY_TILE), TILES_PER_BATCH)
        firsts = start + tiles * QUERY_TILE
        chooser.add(np.concatenate([firsts, np.minimum(firsts + QUERY_TILE, start + q_len) - 1]), "tile_edge")
        offset = causal_offset(spec.mask_type, q_len, kv_len)
        if offset is not None:  # rows i whose visible keys i + offset + 1 end a key block, and the next
            ends = np.arange(KEY_BLOCK, min(kv_len, q_len + offset) + 1, KEY_BLOCK, dtype=np.int64) - offset - 1
            ends = ends[(ends >= 0) & (ends < q_len)]
            ends = ends[_spread(ends.size, TILES_PER_BATCH)]
            chooser.add(start + np.concatenate([ends, ends + 1]), "diagonal")
    for width in (spec.head_num * NOPE_DIM, spec.head_num * ROPE_DIM, spec.head_num * V_DIM):  # q, qRope, attenOut
        chooser.add(_crossing_rows(width, spec.total_q), "q_offset")
    chooser.add(_kv_crossings(spec, starts), "kv_offset")
    chooser.bits[~valid] = 0
    rest = np.flatnonzero(valid & (chooser.bits == 0))
    rng = np.random.default_rng(np.random.SeedSequence([spec.seed, RANDOM_STREAM]))
    chooser.add(rng.choice(rest, size=min(spec.rows, rest.size), replace=False), "random")
    rows = np.flatnonzero(chooser.bits).astype(np.int64)
    return RowSample(rows, chooser.bits[rows])


def _kv_crossings(spec: CaseSpec, q_starts: np.ndarray) -> np.ndarray:
    """Query rows on both sides of the first sight of every key whose k, kRope or v row holds a crossing."""
    hkv = spec.kv_head_num
    starts = np.asarray(kv_row_starts(kv_shape(spec), spec.kv_seqlen, hkv) or [], dtype=np.int64)
    crossing = np.unique(
        np.concatenate([_crossing_rows(hkv * width, spec.kv_rows) for width in (NOPE_DIM, ROPE_DIM, V_DIM)])
    )
    picked: list[int] = []
    for flat in crossing.tolist():
        b = int(np.searchsorted(starts, flat, side="right")) - 1
        key = flat - int(starts[b])
        q_len, kv_len = spec.q_seqlen[b], spec.kv_seqlen[b]
        if key >= kv_len or q_len == 0:
            continue  # padding, spare rows or a batch without queries: no row reads it
        offset = causal_offset(spec.mask_type, q_len, kv_len)
        first = 0 if offset is None else min(max(key - offset, 0), q_len - 1)
        picked += [int(q_starts[b]) + first, int(q_starts[b]) + max(first - 1, 0)]
    return np.asarray(picked, dtype=np.int64)
