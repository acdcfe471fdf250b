"""What the factor model (``facts/factors.toml``) says about a set of cases: each case's levels, the valid
t-tuples of levels, and which of them no case covers.

A case is classified batch by batch (:func:`batch_rows`): case-level factors (dtype, mask, layouts, batch,
group, kv heads, inputs) are the same for every batch, the per-batch ones (q_len, kv_len, prefix) come from
that batch's lengths; a batch with q_b = 0 has no checked rows and no row.  A case covers a tuple of levels
when one of its rows holds every level of it.  A tuple is valid when no constraint of the model forbids it
and its per-batch levels can meet in one batch (kv_b = q_b + prefix; :func:`realizable_rows`).

Level rules are written once, as functions of an integer or a numpy array alike, so the realizable rows are
computed from the same rules that classify a case."""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cache
from typing import Any

from mlaconf.facts.factors import FactorModel, load_model
from mlaconf.facts.operator import padded_kv_misread
from mlaconf.golden.specs.spec import CaseSpec

#: One level per factor, as (factor, level) pairs in the model's factor order.
Tuple = tuple[tuple[str, str], ...]
Levels = dict[str, frozenset[str]]
Rule = Callable[[Any], Any]

#: ATB's query tile (rows) and key stack (keys): facts/branches.toml q-tile-rows, stack-of-four-blocks.
Q_TILE = 128
K_SLICE = 512

#: Per-batch level rules; each takes an int or an int numpy array and returns a bool (array).
Q_LEN_RULES: dict[str, Rule] = {
    "one": lambda q: q == 1,
    "lt16": lambda q: (q > 1) & (q < 16),
    "mod128_1": lambda q: (q > Q_TILE) & (q % Q_TILE == 1),
    "mod128_0": lambda q: (q > 0) & (q % Q_TILE == 0),
    "mod128_mid": lambda q: (q >= 16) & (q % Q_TILE > 1),
    "gt512": lambda q: q > K_SLICE,
}
KV_LEN_RULES: dict[str, Rule] = {
    "not_mult16": lambda kv: (kv > 0) & (kv % 16 != 0),
    "mult16_not64": lambda kv: (kv > 0) & (kv % 16 == 0) & (kv % 64 != 0),
    "mult64_not128": lambda kv: (kv > 0) & (kv % 64 == 0) & (kv % 128 != 0),
    "mult128_not512": lambda kv: (kv > 0) & (kv % 128 == 0) & (kv % K_SLICE != 0),
    "mult512": lambda kv: (kv > 0) & (kv % K_SLICE == 0),
    "ge4096": lambda kv: kv >= 4096,
}
PREFIX_RULES: dict[str, Rule] = {
    "zero": lambda p: p == 0,
    "lt128": lambda p: (p > 0) & (p < Q_TILE),
    "mult128": lambda p: (p > 0) & (p % Q_TILE == 0),
    "mid": lambda p: (p > Q_TILE) & (p < K_SLICE) & (p % Q_TILE != 0),
    "long": lambda p: (p > K_SLICE) & (p % Q_TILE != 0),
}
BATCH_RULES: dict[str, Rule] = {"q_len": lambda s: s[0], "kv_len": lambda s: s[1], "prefix": lambda s: s[1] - s[0]}
PER_BATCH: dict[str, dict[str, Rule]] = {"q_len": Q_LEN_RULES, "kv_len": KV_LEN_RULES, "prefix": PREFIX_RULES}
#: Smallest key position a late maximum may start at to count as late: after the first 128-key block.
LATE_FROM_MIN = 128


def _levels_of(rules: Mapping[str, Rule], value: int) -> frozenset[str]:
    return frozenset(name for name, rule in rules.items() if rule(value))


def batch_count_levels(q_seqlen: Sequence[int]) -> frozenset[str]:
    count = len(q_seqlen)
    levels = {"one" if count == 1 else "two" if count == 2 else "many"}
    if count > 1 and 0 in q_seqlen:
        levels.add("empty_row")
    return frozenset(levels)


def kv_heads_level(kv_head_num: int) -> str:
    return "one" if kv_head_num == 1 else "two" if kv_head_num == 2 else "many"


def inputs_levels(spec: CaseSpec) -> frozenset[str]:
    """The input structure levels of a case (golden/building/inputs.py draws them)."""
    structure = spec.structure
    trend = structure.logits if structure is not None else None
    levels = set()
    if spec.distribution in ("uniform", "normal") and trend is None:
        levels.add("random")
    if spec.distribution in ("near_tie", "large_logits"):
        levels.add(spec.distribution)
    late = structure is not None and (structure.late_from or 0) >= LATE_FROM_MIN
    if trend == "sinks" or (trend == "late_max" and late):
        levels.add(trend)
    if structure is not None and structure.v_mean is not None:
        levels.add("v_mean")
    return frozenset(levels)


def kv_layout_levels(spec: CaseSpec) -> frozenset[str]:
    """The case's kv layout and, for padded kv, how ATB's kernel addresses it (facts/branches.toml kv-factor-*)."""
    levels = {spec.kv_layout}
    if spec.kv_layout == "packed" and spec.kv_rows > spec.total_kv:
        levels.add("packed_spare")
    if spec.kv_layout == "padded":
        misread = padded_kv_misread(spec.q_seqlen, spec.kv_seqlen, spec.padded_rows)
        levels.add("padded_short_before_last" if misread else "padded_full")
        if spec.padded_rows > spec.max_kv:
            levels.add("padded_over_capacity")
    return frozenset(levels)


def _case_level_sets(spec: CaseSpec) -> Levels:
    group = spec.head_num // spec.kv_head_num if spec.head_num % spec.kv_head_num == 0 else 0
    return {
        "dtype": frozenset({spec.dtype}),
        "mask": frozenset({spec.mask_name}),
        "q_layout": frozenset({spec.q_layout}),
        "kv_layout": kv_layout_levels(spec),
        "batch": batch_count_levels(spec.q_seqlen),
        "group": frozenset({str(group)}),
        "kv_heads": frozenset({kv_heads_level(spec.kv_head_num)}),
        "inputs": inputs_levels(spec),
    }


def batch_rows(spec: CaseSpec) -> list[Levels]:
    """One level set per factor for each batch with query rows (case-level factors repeated)."""
    common = _case_level_sets(spec)
    rows = []
    for q, kv in zip(spec.q_seqlen, spec.kv_seqlen, strict=True):
        if q > 0:
            row = dict(common)
            for factor, rules in PER_BATCH.items():
                row[factor] = _levels_of(rules, BATCH_RULES[factor]((q, kv)))
            rows.append(row)
    return rows


def case_levels(spec: CaseSpec) -> Levels:
    """Every level a case hits, per factor (the union over its batches for q_len, kv_len and prefix)."""
    levels = _case_level_sets(spec)
    for factor in PER_BATCH:
        levels[factor] = frozenset().union(*(row[factor] for row in batch_rows(spec)))
    return levels


@cache
def cheapest_lengths() -> dict[tuple[str, str, str], tuple[int, int]]:
    """For every (q_len, kv_len, prefix) one batch can hold, the cheapest (q_b, kv_b) holding it (fewest
    q_b * kv_b, then q_b): the level rules applied to a grid of lengths that reaches every residue class
    and threshold (q_b and the prefix up to 700 and around 4096)."""
    import numpy as np

    span = np.concatenate([np.arange(0, 700), np.arange(3968, 4736)])
    q = np.repeat(span[span > 0], len(span))
    prefix = np.tile(span, len(span) - 1)
    kv = q + prefix
    code = np.zeros(len(q), dtype=np.int64)
    bit = 0
    names: list[tuple[str, str]] = []
    for factor, values in (("q_len", q), ("kv_len", kv), ("prefix", prefix)):
        for level, rule in PER_BATCH[factor].items():
            code |= np.asarray(rule(values), dtype=np.int64) << bit
            names.append((factor, level))
            bit += 1
    order = np.lexsort((q, q * kv))
    codes, first = np.unique(code[order], return_index=True)
    cheapest: dict[tuple[str, str, str], tuple[int, int]] = {}
    for value, index in zip(codes.tolist(), first.tolist(), strict=True):
        pair = (int(q[order[index]]), int(kv[order[index]]))
        hit = [names[i] for i in range(bit) if value >> i & 1]
        q_levels, kv_levels, prefix_levels = ([lv for f, lv in hit if f == factor] for factor in PER_BATCH)
        for atom in itertools.product(q_levels, kv_levels, prefix_levels):
            best = cheapest.get(atom)
            if best is None or (pair[0] * pair[1], pair[0]) < (best[0] * best[1], best[0]):
                cheapest[atom] = pair
    return cheapest


def realizable_rows() -> frozenset[tuple[str, str, str]]:
    """Every (q_len, kv_len, prefix) that one batch can hold."""
    return frozenset(cheapest_lengths())


@dataclass
class Validity:
    """Which tuples of levels some valid case can hold (constraints and per-batch arithmetic)."""

    model: FactorModel
    _projections: dict[tuple[str, ...], frozenset[tuple[str, ...]]] = field(default_factory=dict)
    _found: list[dict[str, str]] = field(default_factory=list)

    @property
    def constrained(self) -> tuple[str, ...]:
        named = {c.when[0] for c in self.model.constraints} | {f for c in self.model.constraints for f, _ in c.then}
        return tuple(f for f in self.model.names if f in named or f in PER_BATCH)

    def _assignments(self) -> list[dict[str, str]]:
        """Every valid assignment of one level to each constrained factor."""
        if self._found:
            return self._found
        free = [f for f in self.constrained if f not in PER_BATCH]
        found = []
        for levels in itertools.product(*(self.model.factor(f).level_names for f in free)):
            base = dict(zip(free, levels, strict=True))
            if not self.model.allows(base):
                continue
            for row in realizable_rows():
                full = {**base, **dict(zip(PER_BATCH, row, strict=True))}
                if self.model.allows(full):
                    found.append(full)
        self._found = found
        return found

    def valid(self, items: Tuple) -> bool:
        assignment = dict(items)
        if not self.model.allows(assignment):
            return False
        key = tuple(f for f in self.constrained if f in assignment)
        if not key:
            return True
        if key not in self._projections:
            self._projections[key] = frozenset(tuple(a[f] for f in key) for a in self._assignments())
        return tuple(assignment[f] for f in key) in self._projections[key]


@cache
def validity(model: FactorModel) -> Validity:
    return Validity(model)


def valid_tuples(model: FactorModel, factor_sets: Iterable[Sequence[str]]) -> list[Tuple]:
    """The valid tuples with one level of each factor of each set, in model order, without repeats."""
    return list(_valid_tuples(model, tuple(tuple(names) for names in factor_sets)))


@cache
def _valid_tuples(model: FactorModel, factor_sets: tuple[tuple[str, ...], ...]) -> tuple[Tuple, ...]:
    check = validity(model)
    seen: dict[Tuple, None] = {}
    order = {name: i for i, name in enumerate(model.names)}
    for names in factor_sets:
        ordered = sorted(names, key=order.__getitem__)
        for levels in itertools.product(*(model.factor(f).level_names for f in ordered)):
            items = tuple(zip(ordered, levels, strict=True))
            if items not in seen and check.valid(items):
                seen[items] = None
    return tuple(seen)


def all_factor_sets(model: FactorModel, t: int) -> list[tuple[str, ...]]:
    return list(itertools.combinations(model.names, t))


def structure_factor_sets(model: FactorModel) -> list[tuple[str, ...]]:
    """Every triple of factors inside one of the model's kernel-structure sets (in model order)."""
    order = {name: i for i, name in enumerate(model.names)}
    sets: dict[tuple[str, ...], None] = {}
    for structure in model.structures:
        ordered = sorted(structure.factors, key=order.__getitem__)
        sets.update(dict.fromkeys(itertools.combinations(ordered, 3)))
    return list(sets)


def row_tuples(row: Levels, factor_sets: Iterable[Sequence[str]]) -> set[Tuple]:
    """Every tuple one row holds over the given factor sets (factor names in model order)."""
    held: set[Tuple] = set()
    for names in factor_sets:
        for levels in itertools.product(*(sorted(row[f]) for f in names)):
            held.add(tuple(zip(names, levels, strict=True)))
    return held


def distinct_rows(cases: Iterable[CaseSpec]) -> list[Levels]:
    """The rows of the valid cases (error cases hold none), each distinct row once."""
    seen: dict[tuple[tuple[str, frozenset[str]], ...], Levels] = {}
    for spec in cases:
        if spec.expect_error is None:
            for row in batch_rows(spec):
                seen.setdefault(tuple(sorted(row.items())), row)
    return list(seen.values())


@dataclass(frozen=True)
class Coverage:
    """The valid tuples of one strength over some factor sets, and those no case covers."""

    label: str
    total: int
    uncovered: tuple[Tuple, ...]

    @property
    def percent(self) -> float:
        return 100.0 * (self.total - len(self.uncovered)) / self.total if self.total else 100.0


def describe(items: Tuple) -> str:
    """``no case with group 6 and mask causal``."""
    return "no case with " + " and ".join(f"{factor} {level}" for factor, level in items)


def coverage(
    cases: Sequence[CaseSpec], strengths: Sequence[int] = (1, 2, 3), model: FactorModel | None = None
) -> list[Coverage]:
    """t-way coverage for each strength over all factors, and the triples of the kernel-structure sets, of the
    settled model (without its pending levels: :meth:`FactorModel.settled`)."""
    model = (model or load_model()).settled()
    rows = distinct_rows(cases)
    plans = [(f"{t}-way", all_factor_sets(model, t)) for t in strengths]
    if 3 in strengths and model.structures:
        plans.append(("3-way structure", structure_factor_sets(model)))
    results = []
    for label, sets in plans:
        wanted = valid_tuples(model, sets)
        hit = set().union(*(row_tuples(row, sets) for row in rows))
        results.append(Coverage(label, len(wanted), tuple(t for t in wanted if t not in hit)))
    return results
