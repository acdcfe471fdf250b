"""The goldens a metamorphic relation judges: each tolerance relation's sides, the transforms that make them.

A tolerance relation (``[relations.NAME]`` with ``kind = "tolerance"``, its test ``test_NAME`` in
``cases/test_metamorphic.py``) runs the backend on a case and on transformed inputs of an equivalent
problem, and judges every side against its own float64 golden.  The sides are made here, once, for the
test and for ``mlaconf regen`` alike (:data:`SIDES`), so the goldens regen builds are exactly the ones a
run asks for.  A transformed side is a case of its own: its inputs, which no seed draws, are an explicit
input bundle (``golden/store/bundles.py``) named by their hash (:func:`explicit_case`), so its golden has a
case id, a file in the store and a rebuild like any case.  The exact relations judge no golden (their
transforms, which only the backend sees, are the runner's).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from pathlib import Path

import numpy as np

from mlaconf.facts.operator import CAUSAL
from mlaconf.golden.building.inputs import generate_inputs
from mlaconf.golden.specs.layout import kv_starts, kv_views, offsets
from mlaconf.golden.specs.spec import CaseSpec
from mlaconf.golden.specs.suites import RelationTable, read_suite
from mlaconf.golden.specs.types import OpInputs
from mlaconf.golden.store.bundles import bundle_hash, save_bundle


@dataclasses.dataclass(frozen=True)
class Side:
    """One side of a tolerance relation: what the backend runs (``inputs`` in ``spec``'s layouts), the case
    whose golden judges it (``case``) and how the relation's first output maps onto its rows and heads."""

    label: str
    inputs: OpInputs
    spec: CaseSpec
    case: CaseSpec
    #: The first side's output rows this side's rows are (None: all, in order).
    rows: np.ndarray | None = None
    #: The first side's query heads this side's heads are (None: all, in order).
    heads: np.ndarray | None = None

    @property
    def derived(self) -> bool:
        """Whether the side's inputs are transformed ones (an explicit input bundle), not its case's draws."""
        return self.case.inputs is not None

    def align(self, first: np.ndarray) -> np.ndarray:
        """The first side's ``[T, H, 128]`` output on this side's rows and heads."""
        out = first if self.rows is None else first[self.rows]
        return out if self.heads is None else out[:, self.heads]

    def bundle(self) -> dict[str, np.ndarray]:
        """The side's inputs as a bundle: packed, ``[T, H, D]`` and ``[Tk, Hkv, D]``, valid kv rows only."""
        spec, inputs = self.spec, self.inputs
        t, h, hkv = spec.total_q, spec.head_num, spec.kv_head_num
        tensors = {"q": inputs.q.reshape(t, h, -1), "q_rope": inputs.q_rope.reshape(t, h, -1)}
        batches = [kv_views(inputs, spec, b) for b in range(spec.batch)]
        for index, name in enumerate(("k", "k_rope", "v")):
            rows = np.concatenate([views[index] for views in batches])
            tensors[name] = np.ascontiguousarray(rows.reshape(spec.total_kv, hkv, -1))
        return tensors


def original(label: str, inputs: OpInputs, spec: CaseSpec) -> Side:
    """The relation's case itself, judged by the case's own golden."""
    return Side(label, inputs, spec, spec)


def transformed(
    label: str, inputs: OpInputs, spec: CaseSpec, rows: np.ndarray | None = None, heads: np.ndarray | None = None
) -> Side:
    """A transformed side, judged by the golden of its explicit-input case."""
    side = Side(label, inputs, spec, spec, rows, heads)
    return dataclasses.replace(side, case=explicit_case(side))


def explicit_case(side: Side) -> CaseSpec:
    """The case of a side's transformed inputs: the side's spec with its bundle's hash (and its padded rows,
    when they exceed its longest kv sequence)."""
    spec = side.spec
    rows = side.inputs.k.shape[1] if spec.kv_layout == "padded" else None
    capacity = rows if rows is not None and rows != spec.max_kv else None
    case = dataclasses.replace(spec, inputs=bundle_hash(side.bundle()), kv_capacity=capacity, name="")
    return dataclasses.replace(case, name=case.case_id)


# -- the tolerance relations' sides ----------------------------------------------------------------


def batch_order(spec: CaseSpec, inputs: OpInputs) -> list[Side]:
    """The case and its batches rotated (padding kept)."""
    order = rotation(spec.batch)
    new_inputs, new_spec = select_batches(inputs, spec, order, trim=False)
    rows = token_map(spec, order)
    return [original("original", inputs, spec), transformed(f"batch order {order}", new_inputs, new_spec, rows)]


def head_order(spec: CaseSpec, inputs: OpInputs) -> list[Side]:
    """The case and its heads permuted within their GQA groups."""
    new_inputs, q_heads = permute_heads(inputs, spec)
    return [
        original("original", inputs, spec),
        transformed(f"heads {q_heads.tolist()}", new_inputs, spec, heads=q_heads),
    ]


def padded_vs_packed(spec: CaseSpec, inputs: OpInputs) -> list[Side]:
    """A uniform padded case and the same keys' bytes as the packed layout."""
    n = spec.kv_head_num
    packed = dataclasses.replace(
        inputs, **{name: getattr(inputs, name).reshape(spec.total_kv, n, -1) for name in ("k", "k_rope", "v")}
    )
    return [
        original("padded", inputs, spec),
        transformed("packed", packed, dataclasses.replace(spec, kv_layout="packed")),
    ]


def alone_vs_batch(spec: CaseSpec, inputs: OpInputs) -> list[Side]:
    """The batch and each non-empty sequence alone (padded S cut to its own length)."""
    sides = [original("batch", inputs, spec)]
    for b, (q_len, kv_len) in enumerate(zip(spec.q_seqlen, spec.kv_seqlen, strict=True)):
        if q_len == 0 or kv_len == 0:
            continue
        one_inputs, one_spec = select_batches(inputs, spec, [b], trim=True)
        sides.append(transformed(f"batch {b} alone", one_inputs, one_spec, token_map(spec, [b])))
    return sides


def chunked_prefill(spec: CaseSpec, inputs: OpInputs) -> list[Side]:
    """A causal prefill and its last tokens after the earlier ones as a prefix (a different length per
    batch, so a different bottom-right offset)."""
    last = [min(q, q // (b + 2) + 3) for b, q in enumerate(spec.q_seqlen)]
    starts = [q - n for q, n in zip(spec.q_seqlen, last, strict=True)]
    chunk_inputs, chunk_spec, rows = query_chunk(inputs, spec, starts, list(spec.q_seqlen))
    label = f"last {last} tokens after a prefix of {list(chunk_spec.kv_seqlen)} - {last}"
    return [original("one prefill", inputs, spec), transformed(label, chunk_inputs, chunk_spec, rows)]


def split_queries(spec: CaseSpec, inputs: OpInputs) -> list[Side]:
    """A causal prefill and its queries split into two calls, the second with the first's tokens as prefix."""
    split = [max(1, min(q - 1, 3 * q // 8 + b)) for b, q in enumerate(spec.q_seqlen)]
    zeros, ends = [0] * spec.batch, list(spec.q_seqlen)
    parts = {
        f"first part (queries up to {split})": query_chunk(inputs, spec, zeros, split),
        f"second part (queries from {split})": query_chunk(inputs, spec, split, ends),
    }
    sides = [original("one call", inputs, spec)]
    sides += [transformed(label, *part) for label, part in parts.items()]
    return sides


#: Each tolerance relation's sides, the first the relation's own case: the test runs and judges these, and
#: regen builds their goldens.
SIDES: dict[str, Callable[[CaseSpec, OpInputs], list[Side]]] = {
    "batch_order": batch_order,
    "head_order": head_order,
    "padded_vs_packed": padded_vs_packed,
    "alone_vs_batch": alone_vs_batch,
    "chunked_prefill": chunked_prefill,
    "split_queries": split_queries,
}


def judged_sides(relations: Mapping[str, RelationTable]) -> list[Side]:
    """Every transformed side the tolerance relations judge against a golden."""
    sides: list[Side] = []
    for name, relation in relations.items():
        if relation.kind == "tolerance" and name in SIDES:
            for spec in relation.cases:
                sides += [s for s in SIDES[name](spec, generate_inputs(spec)) if s.derived]
    return sides


def suite_cases(path: Path, store: Path | None = None) -> list[CaseSpec]:
    """A suite file's cases, then those of the transformed sides its relations judge (whose input bundles
    are saved in ``store`` when given: what building their goldens reads)."""
    suite = read_suite(path)
    sides = judged_sides(suite.relations)
    if store is not None:
        for side in sides:
            save_bundle(side.bundle(), store)
    return [*suite.cases, *(side.case for side in sides)]


# -- transformations -------------------------------------------------------------------------------


def token_map(spec: CaseSpec, order: list[int]) -> np.ndarray:
    """Row k of the reordered output corresponds to row ``token_map[k]`` of the original."""
    starts = offsets(spec.q_seqlen)
    return np.concatenate([np.arange(starts[b], starts[b + 1]) for b in order])


def select_batches(inputs: OpInputs, spec: CaseSpec, order: list[int], *, trim: bool) -> tuple[OpInputs, CaseSpec]:
    """The batches ``order`` (any order, any subset) as a new case; ``trim`` cuts padded S to max kv."""
    q_len = tuple(spec.q_seqlen[b] for b in order)
    kv_len = tuple(spec.kv_seqlen[b] for b in order)
    tensors = (inputs.k, inputs.k_rope, inputs.v)
    if spec.kv_layout == "padded":
        width = max(kv_len) if trim else inputs.k.shape[1]
        k, kr, v = (np.ascontiguousarray(t[order, :width]) for t in tensors)
    else:  # the 3-D forms: the batches' rows, packed (a strided case's subset need not stay ragged)
        starts = kv_starts(inputs, spec)
        kv_rows = np.concatenate([np.arange(starts[b], starts[b] + spec.kv_seqlen[b]) for b in order])
        k, kr, v = (t[kv_rows] for t in tensors)
        spec = dataclasses.replace(spec, kv_layout="packed", kv_capacity=None)
    rows = token_map(spec, order)
    new = dataclasses.replace(
        inputs,
        q=inputs.q[rows],
        q_rope=inputs.q_rope[rows],
        k=k,
        k_rope=kr,
        v=v,
        q_seqlen=np.asarray(q_len, dtype=np.int32),
        kv_seqlen=np.asarray(kv_len, dtype=np.int32),
    )
    return new, dataclasses.replace(spec, q_seqlen=q_len, kv_seqlen=kv_len)


def query_chunk(
    inputs: OpInputs, spec: CaseSpec, starts: list[int], stops: list[int]
) -> tuple[OpInputs, CaseSpec, np.ndarray]:
    """A CAUSAL prefill of the queries ``[starts[b], stops[b])`` of every batch b with the keys they see:
    the first ``kv_b - q_b + stops[b]`` (the earlier tokens are the prefix; bottom-right alignment
    then gives every row the keys it had).  Returns the inputs, the spec and, per output row, the
    original row it equals."""
    if spec.mask_type != CAUSAL or spec.kv_layout != "padded":
        raise ValueError(f"{spec.case_id}: a query chunk needs a causal (mask_type 3) case, padded kv")
    starts_q = offsets(spec.q_seqlen)
    bounds = list(zip(starts, stops, spec.q_seqlen, strict=True))
    if any(not 0 <= s <= e <= q for s, e, q in bounds):
        raise ValueError(f"{spec.case_id}: chunk bounds {starts}..{stops} outside q_seqlen {list(spec.q_seqlen)}")
    rows = np.concatenate([np.arange(starts_q[b] + s, starts_q[b] + e) for b, (s, e, _) in enumerate(bounds)])
    q_len = tuple(e - s for s, e, _ in bounds)
    kv_len = tuple(kv - q + e for (_, e, q), kv in zip(bounds, spec.kv_seqlen, strict=True))
    new = dataclasses.replace(
        inputs,
        q=np.ascontiguousarray(inputs.q[rows]),
        q_rope=np.ascontiguousarray(inputs.q_rope[rows]),
        q_seqlen=np.asarray(q_len, dtype=np.int32),
        kv_seqlen=np.asarray(kv_len, dtype=np.int32),
    )  # padded kv keeps its S: the keys beyond the new kv_seqlen are padding the kernel must not read
    return new, dataclasses.replace(spec, q_seqlen=q_len, kv_seqlen=kv_len), rows.astype(np.int64)


def rotation(n: int) -> list[int]:
    """A permutation that moves every element when n > 1."""
    return [(i + 1) % n for i in range(n)]


def permute_heads(inputs: OpInputs, spec: CaseSpec) -> tuple[OpInputs, np.ndarray]:
    """Permute kv heads and, consistently, the query heads of each group (GQA-safe).

    Returns the new inputs and, for every new query head, the original head it holds.
    """
    h, hkv = spec.head_num, spec.kv_head_num
    group = h // hkv
    kv_perm, in_group = rotation(hkv), rotation(group)
    q_heads = np.array([kv_perm[g] * group + in_group[r] for g in range(hkv) for r in range(group)])
    t = spec.total_q

    def q_side(x: np.ndarray) -> np.ndarray:
        return np.ascontiguousarray(x.reshape(t, h, -1)[:, q_heads].reshape(x.shape))

    def kv_side(x: np.ndarray) -> np.ndarray:
        if spec.kv_layout != "padded":  # [rows, Hkv, D]
            return np.ascontiguousarray(x[:, kv_perm])
        b, s, width = x.shape
        return np.ascontiguousarray(x.reshape(b, s, hkv, width // hkv)[:, :, kv_perm].reshape(x.shape))

    new = dataclasses.replace(
        inputs,
        q=q_side(inputs.q),
        q_rope=q_side(inputs.q_rope),
        k=kv_side(inputs.k),
        k_rope=kv_side(inputs.k_rope),
        v=kv_side(inputs.v),
    )
    return new, q_heads
