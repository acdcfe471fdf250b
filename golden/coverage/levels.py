"""What the factor model (``facts/factors.toml``) says about a set of cases: each case's levels, the valid
t-tuples of levels, and which of them no case covers.

A case is classified batch by batch (:func:`batch_rows`): case-level factors (dtype, mask, layouts, batch,
group, kv heads, ...) are the same for every batch, the per-batch ones come from that batch's lengths (q_len,
kv_len, prefix) or from what the case chooses and the batch's keys can show (inputs: a tie needs two keys); a
batch with q_b = 0 has no checked rows and no row.  A case covers a tuple of levels when one of its rows holds
every level of it.  A tuple is valid when no constraint of the model forbids it and its per-batch levels can meet
in one batch (kv_b = q_b + prefix; :func:`realizable_rows`).

Level rules are written once, as functions of an integer or a numpy array alike, so the realizable rows are
computed from the same rules that classify a case."""

from __future__ import annotations

import itertools
import random
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cache, cached_property
from typing import Any

from mlaconf.facts.factors import Constraint, FactorModel, KernelSet, load_model
from mlaconf.facts.operator import DEFAULT_QK_SCALE, MAX_HEADS, padded_kv_misread
from mlaconf.golden.coverage import valid_table
from mlaconf.golden.specs.spec import CaseSpec

#: One level per factor, as (factor, level) pairs in the model's factor order.
Tuple = tuple[tuple[str, str], ...]
Levels = dict[str, frozenset[str]]
Rule = Callable[[Any], Any]

#: ATB's query tile (rows) and key stack (keys): facts/branches.toml q-tile-rows, stack-of-four-blocks; a stack's
#: P.V slice (pv-slices) and the rows of a vector core's slice (q-rows-not-mult16).
Q_TILE = 128
K_SLICE = 512
PV_SLICE = 256
ROW_SLICE = 16

#: Per-batch level rules; each takes an int or an int numpy array and returns a bool (array).
Q_LEN_RULES: dict[str, Rule] = {
    "one": lambda q: q == 1,
    "lt16": lambda q: (q > 1) & (q < 16),
    "mod128_1": lambda q: (q > Q_TILE) & (q % Q_TILE == 1),
    "mod128_0": lambda q: (q > 0) & (q % Q_TILE == 0),
    "mod128_mid": lambda q: (q >= 16) & (q % Q_TILE > 1),
    "gt512": lambda q: q > K_SLICE,
    "single_tile": lambda q: (q > 0) & (q <= Q_TILE),
    "mod16_tail": lambda q: (q > ROW_SLICE) & (q % ROW_SLICE != 0),
    "mod128_1_long": lambda q: (q > PV_SLICE) & (q % Q_TILE == 1),
}
KV_LEN_RULES: dict[str, Rule] = {
    "not_mult16": lambda kv: (kv > 0) & (kv % 16 != 0),
    "mult16_not64": lambda kv: (kv > 0) & (kv % 16 == 0) & (kv % 64 != 0),
    "mult64_not128": lambda kv: (kv > 0) & (kv % 64 == 0) & (kv % 128 != 0),
    "mult128_not512": lambda kv: (kv > 0) & (kv % 128 == 0) & (kv % K_SLICE != 0),
    "mult512": lambda kv: (kv > 0) & (kv % K_SLICE == 0),
    "ge4096": lambda kv: kv >= 4096,
    "single_block": lambda kv: (kv > 0) & (kv <= Q_TILE),
    "several_blocks": lambda kv: kv > Q_TILE,
    "stack256": lambda kv: (kv > 0) & (kv % K_SLICE == PV_SLICE),
    "stack_over256": lambda kv: kv % K_SLICE > PV_SLICE,
    "stack_tail_short": lambda kv: (kv % K_SLICE > 0) & (kv % K_SLICE < 64),
}
PREFIX_RULES: dict[str, Rule] = {
    "zero": lambda p: p == 0,
    "lt128": lambda p: (p > 0) & (p < Q_TILE),
    "mult128": lambda p: (p > 0) & (p % Q_TILE == 0),
    "mid": lambda p: (p > Q_TILE) & (p < K_SLICE) & (p % Q_TILE != 0),
    "long": lambda p: (p > K_SLICE) & (p % Q_TILE != 0),
}
#: Smallest key position a late maximum may start at to count as late: after the first 128-key block.
LATE_FROM_MIN = 128
#: Which input structures a batch of kv_b keys can show (its last query row sees every key, whatever the mask): a
#: tie needs two keys, a sink a key beside it, a late maximum a key past the first block; the case chooses the
#: structure (:func:`inputs_levels`), a batch shows it or not (:func:`shown_inputs`, with the case's own sink count
#: and late start).
INPUTS_RULES: dict[str, Rule] = {
    "random": lambda kv: kv > 0,
    "near_tie": lambda kv: kv >= 2,
    "late_max": lambda kv: kv > LATE_FROM_MIN,
    "sinks": lambda kv: kv >= 2,
    "large_logits": lambda kv: kv > 0,
    "v_mean": lambda kv: kv > 0,
    "raw_overflow": lambda kv: kv > 0,
}
#: The per-batch factors, each with the number of a batch's (q_b, kv_b) its rules read.
BATCH_RULES: dict[str, Rule] = {
    "q_len": lambda s: s[0],
    "kv_len": lambda s: s[1],
    "prefix": lambda s: s[1] - s[0],
    "inputs": lambda s: s[1],
}
PER_BATCH: dict[str, dict[str, Rule]] = {
    "q_len": Q_LEN_RULES,
    "kv_len": KV_LEN_RULES,
    "prefix": PREFIX_RULES,
    "inputs": INPUTS_RULES,
}
#: The per-batch factors a batch's lengths decide alone (inputs: the case chooses, the batch shows).
LENGTH_FACTORS = ("q_len", "kv_len", "prefix")
#: logits negative / positive: every visible logit below -LOGIT_LEVEL (above it), P = exp(s) underflowing
#: (overflowing) the dtype it is kept in unless the running maximum is right: fp16's P below about -14, fp32's exp
#: below -87.  A shift counts with SPREAD_MARGIN to spare for the random part of the logits.
LOGIT_LEVEL = {"fp16": 14.0, "bf16": 87.0}
SPREAD_MARGIN = 6.0
#: Distributions whose random logits stay within SPREAD_MARGIN of their shift.
NARROW = ("uniform", "normal", "near_tie", "v_outliers")
#: qkScale tiny: below 2^-10 (the fp16 kernel's scale keeps 11 bits there, the raw scores need 2^10 times the
#: logits' size).
TINY_SCALE = 2.0**-10
#: Cube cores of the MLA chips (20 to 24): tasks few leave some idle on every chip, rounds give each several.
FEW_TASKS = 20
ROUNDS_TASKS = 48


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


def checked_batches(spec: CaseSpec) -> list[tuple[int, int, int]]:
    """``(index, q_b, kv_b)`` of the batches with query and key rows (the others get no query tile)."""
    pairs = zip(spec.q_seqlen, spec.kv_seqlen, strict=True)
    return [(b, q, kv) for b, (q, kv) in enumerate(pairs) if q > 0 and kv > 0]


def batch_levels(spec: CaseSpec) -> frozenset[str]:
    """How many batches, an empty one between others or at an end (facts/branches.toml empty-batch-ends)."""
    levels = set(batch_count_levels(spec.q_seqlen))
    if spec.batch > 1 and spec.q_seqlen[0] == 0:
        levels.add("empty_first")
    if spec.batch > 1 and spec.q_seqlen[-1] == 0:
        levels.add("empty_last")
    return frozenset(levels)


def heads_level(head_num: int) -> str:
    """H = 1, a few, DeepSeek's 128 / TP for TP 2..16 (8 .. 64) and what lies between, or all 128."""
    return "one" if head_num == 1 else "few" if head_num < 8 else "all" if head_num == 128 else "tp"


def batch_order_levels(spec: CaseSpec) -> frozenset[str]:
    """Whether a checked batch holds more (fewer) keys than a later one: offsets that grow unevenly."""
    kv = [n for _, _, n in checked_batches(spec)]
    steps = list(itertools.pairwise(kv))  # an earlier batch is longer iff some batch is longer than the next
    return frozenset(
        name
        for name, held in (
            ("longer_first", any(a > b for a, b in steps)),
            ("shorter_first", any(a < b for a, b in steps)),
        )
        if held
    )


def tasks_levels(spec: CaseSpec) -> frozenset[str]:
    """Tasks (query heads x query tiles) against the cube cores (facts/branches.toml tasks-vs-cores)."""
    tasks = spec.head_num * sum(-(-q // Q_TILE) for _, q, _ in checked_batches(spec))
    return frozenset({"few"} if tasks < FEW_TASKS else {"rounds"} if tasks >= ROUNDS_TASKS else set())


def qk_scale_levels(spec: CaseSpec) -> frozenset[str]:
    """1.0 (the documented default), 1/sqrt(192) (the usual one, inexact in fp16), another value exact in fp16,
    or a tiny one; any other value has no level."""
    import numpy as np

    scale = spec.qk_scale
    if scale == 1.0:
        return frozenset({"one"})
    if scale == DEFAULT_QK_SCALE:
        return frozenset({"default"})
    if 0.0 < scale < TINY_SCALE:
        return frozenset({"tiny"})
    return frozenset({"fp16_exact"} if float(np.float16(scale)) == scale else set())


def logits_levels(spec: CaseSpec) -> frozenset[str]:
    """Where every visible logit lies: centred (no shift), or all far below (above) zero (:data:`LOGIT_LEVEL`)."""
    shift = spec.structure.logit_shift if spec.structure is not None else None
    if shift is None:
        return frozenset({"centred"})
    if spec.distribution not in NARROW or abs(shift) < LOGIT_LEVEL[spec.dtype] + SPREAD_MARGIN:
        return frozenset()
    return frozenset({"negative" if shift < 0 else "positive"})


def padding_level(spec: CaseSpec) -> str:
    """What the kv rows no batch reads hold: none such, finite garbage, or NaN."""
    return "none" if spec.kv_rows == spec.total_kv else spec.padding or "garbage"


def inputs_levels(spec: CaseSpec) -> frozenset[str]:
    """The input structure levels a case chooses (golden/building/inputs.py draws them); a batch holds those it
    can show (:func:`shown_inputs`)."""
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
    if spec.raw_scores_past_fp16:
        levels.add("raw_overflow")
    return frozenset(levels)


def shown_inputs(spec: CaseSpec, kv: int) -> frozenset[str]:
    """The input structures a batch of ``kv`` keys can show (:data:`INPUTS_RULES`), with the case's own sink count
    and late start: a late maximum from key 200 needs 201 keys."""
    shown = set(_levels_of(INPUTS_RULES, kv))
    structure = spec.structure
    if structure is not None and kv <= (structure.late_from or 0):
        shown.discard("late_max")
    if structure is not None and kv <= (structure.sink_keys or 0):
        shown.discard("sinks")
    return frozenset(shown)


def length_levels(q: int, kv: int) -> Levels:
    """The per-batch levels a batch of ``q`` query rows over ``kv`` keys can hold (inputs: those it can show)."""
    return {factor: _levels_of(rules, BATCH_RULES[factor]((q, kv))) for factor, rules in PER_BATCH.items()}


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
        "batch": batch_levels(spec),
        "group": frozenset({str(group)}),
        "kv_heads": frozenset({kv_heads_level(spec.kv_head_num)}),
        "inputs": inputs_levels(spec),
        "heads": frozenset({heads_level(spec.head_num)}),
        "batch_order": batch_order_levels(spec),
        "tasks": tasks_levels(spec),
        "qk_scale": qk_scale_levels(spec),
        "logits": logits_levels(spec),
        "mask_fill": frozenset({spec.mask_fill_name or "none"}),
        "padding": frozenset({padding_level(spec)}),
    }


def batch_rows(spec: CaseSpec, common: Levels | None = None) -> list[Levels]:
    """One level set per factor for each batch with query rows (case-level factors repeated: ``common``, the
    case's own level sets when the caller has them; inputs: the case's that the batch can show)."""
    common = _case_level_sets(spec) if common is None else common
    rows = []
    for q, kv in zip(spec.q_seqlen, spec.kv_seqlen, strict=True):
        if q > 0:
            row = dict(common)
            for factor in LENGTH_FACTORS:
                row[factor] = _levels_of(PER_BATCH[factor], BATCH_RULES[factor]((q, kv)))
            row["inputs"] = common["inputs"] & shown_inputs(spec, kv)
            rows.append(row)
    return rows


def case_levels(spec: CaseSpec) -> Levels:
    """Every level a case hits, per factor (the union over its batches for the per-batch factors)."""
    levels = _case_level_sets(spec)
    rows = batch_rows(spec, levels)
    for factor in PER_BATCH:
        levels[factor] = frozenset().union(*(row[factor] for row in rows))
    return levels


def cheapest_lengths(model: FactorModel | None = None) -> dict[tuple[str, ...], tuple[int, int]]:
    """For every (q_len, kv_len, prefix, inputs) one batch can hold, the cheapest (q_b, kv_b) holding it (fewest
    q_b * kv_b, then q_b): the level rules of ``model`` (default: the settled model) applied to a grid of lengths
    that reaches every residue class and threshold (q_b up to 700 and around 4096, the prefix up to 4736; without
    a prefix q_b up to 1100 too, every residue of a 512-key stack past 512 rows: the masks with q_b = kv_b)."""
    model = model or load_model().settled()
    return _cheapest_lengths(tuple(tuple(model.factor(f).level_names) for f in PER_BATCH))


@cache
def _cheapest_lengths(names_per_factor: tuple[tuple[str, ...], ...]) -> dict[tuple[str, ...], tuple[int, int]]:
    import numpy as np

    span = np.concatenate([np.arange(1, 700, dtype=np.int32), np.arange(3968, 4736, dtype=np.int32)])
    prefixes = np.arange(0, 4736, dtype=np.int32)
    square = np.arange(700, 1100, dtype=np.int32)  # q_b = kv_b between the spans
    q = np.concatenate([np.repeat(span, len(prefixes)), square])
    prefix = np.concatenate([np.tile(prefixes, len(span)), np.zeros_like(square)])
    kv = q + prefix
    width = np.int32 if sum(len(wanted) for wanted in names_per_factor) < 32 else np.int64  # a bit per level
    code = np.zeros(len(q), dtype=width)
    bit = 0
    names: list[tuple[str, str]] = []
    for factor, wanted in zip(PER_BATCH, names_per_factor, strict=True):
        values = BATCH_RULES[factor]((q, kv))
        for level in wanted:
            code |= np.asarray(PER_BATCH[factor][level](values), dtype=width) << bit
            names.append((factor, level))
            bit += 1
    # the cheapest length pair of each code: the smallest (q * kv, q), packed in one integer (q below 2^q_bits),
    # taken per run of equal codes after one sort (q and q * kv name the pair: no ties, no order inside a run)
    q_bits = 13
    key = (q.astype(np.int64) * kv) << q_bits | q
    by_code = np.argsort(code, kind="stable")  # a radix sort for these integers
    sorted_codes = code[by_code]
    starts = np.flatnonzero(np.r_[True, sorted_codes[1:] != sorted_codes[:-1]])
    smallest = np.minimum.reduceat(key[by_code], starts)
    codes, best_q = sorted_codes[starts], smallest & (1 << q_bits) - 1
    best_kv = (smallest >> q_bits) // best_q
    cheapest: dict[tuple[str, ...], tuple[int, int]] = {}
    for value, pair in zip(codes.tolist(), zip(best_q.tolist(), best_kv.tolist(), strict=True), strict=True):
        hit = [names[i] for i in range(bit) if value >> i & 1]
        for atom in itertools.product(*([lv for f, lv in hit if f == factor] for factor in PER_BATCH)):
            best = cheapest.get(atom)
            if best is None or (pair[0] * pair[1], pair[0]) < (best[0] * best[1], best[0]):
                cheapest[atom] = pair
    return cheapest


def realizable_rows(model: FactorModel | None = None) -> frozenset[tuple[str, ...]]:
    """Every (q_len, kv_len, prefix, inputs) that one batch can hold (levels of ``model``, default the settled
    one)."""
    return frozenset(cheapest_lengths(model))


def cheapest_heads(model: FactorModel | None = None) -> dict[tuple[str, str, str], tuple[int, int]]:
    """For every (group, kv_heads, heads) some headNum / kvHeadNum holds, the fewest heads holding it:
    ``(head_num, kv_head_num)`` (the heads block's levels derive from these two numbers, as a batch's from its
    lengths)."""
    return _cheapest_heads(frozenset((model or load_model().settled()).factor("group").level_names))


@cache
def _cheapest_heads(groups: frozenset[str]) -> dict[tuple[str, str, str], tuple[int, int]]:
    found: dict[tuple[str, str, str], tuple[int, int]] = {}
    for head_num in range(1, MAX_HEADS + 1):
        for kv_head_num in range(1, head_num + 1):
            group = str(head_num // kv_head_num)
            if head_num % kv_head_num or group not in groups:
                continue
            found.setdefault((group, kv_heads_level(kv_head_num), heads_level(head_num)), (head_num, kv_head_num))
    return found


#: Factors whose levels derive together from a few numbers: a batch's lengths (q_len, kv_len, prefix, and the inputs
#: its keys can show) and the head counts (group, kv_heads, heads); which level tuples exist is computed from the
#: rules, not listed as constraints.
BLOCKS = (tuple(PER_BATCH), ("group", "kv_heads", "heads"))


@dataclass
class Validity:
    """Which tuples of levels some valid case can hold: a partial assignment is valid when it extends to one level
    of every constrained factor and one realizable tuple of every block (:data:`BLOCKS`) that no constraint
    forbids (a backtracking search, smallest domain first, values in a drawn order, each answer kept).  Every
    extension the search finds is kept as a witness: a tuple one of them holds is valid without a search, and one
    with an invalid part is invalid (the grown model's 1-, 2- and 3-way counts: 72,878 searches -> 4,268, 3,659
    witnesses; 54 s -> 5 s)."""

    model: FactorModel
    _memo: dict[tuple[tuple[str, str], ...], bool] = field(default_factory=dict)
    #: (factor, level) -> the witnesses holding it, as a bit set over the witnesses found so far.
    _holding: dict[tuple[str, str], int] = field(default_factory=dict)
    _witnesses: int = 0
    _rows: dict[tuple[tuple[str, ...], Tuple], tuple[list[tuple[str, ...]], Domain]] = field(default_factory=dict)
    _order: random.Random = field(default_factory=lambda: random.Random(0))

    @cached_property
    def constrained(self) -> tuple[str, ...]:
        """The factors a constraint names or a block ties (the others take any level)."""
        tied = self._named | {f for block in self._blocks for f in block}
        return tuple(f for f in self.model.names if f in tied)

    @cached_property
    def _blocks(self) -> dict[tuple[str, ...], tuple[tuple[str, ...], ...]]:
        names = set(self.model.names)
        tables: dict[tuple[str, ...], tuple[tuple[str, ...], ...]] = {}
        for block in BLOCKS:
            if set(block) <= names:
                table = realizable_rows(self.model) if block == BLOCKS[0] else frozenset(cheapest_heads(self.model))
                tables[block] = tuple(sorted(table))
        return tables

    def valid(self, items: Tuple) -> bool:
        assignment = dict(items)
        if not self.model.allows(assignment):
            return False
        key = tuple((f, lv) for f, lv in items if f in self.constrained)
        if key not in self._memo:
            smaller = (key[:i] + key[i + 1 :] for i in range(len(key)))  # one of them invalid: so is the key
            refuted = any(self._memo.get(sub) is False for sub in smaller)
            self._memo[key] = not refuted and (self._witnessed(key) or self._extends(dict(key)))
        return self._memo[key]

    def _witnessed(self, key: Tuple) -> bool:
        held = (1 << self._witnesses) - 1
        for item in key:
            held &= self._holding.get(item, 0)
        return held != 0

    @cached_property
    def _named(self) -> frozenset[str]:
        """The factors a constraint names."""
        return frozenset(
            {c.when[0] for c in self.model.constraints} | {f for c in self.model.constraints for f, _ in c.then}
        )

    def _extends(self, fixed: dict[str, str]) -> bool:
        named = self._named
        domains: list[Domain] = []
        in_block = set()
        matching: dict[tuple[str, ...], list[tuple[str, ...]]] = {}
        for block in self._blocks:
            in_block |= set(block)
            matching[block], domain = self._matching(block, tuple((f, fixed[f]) for f in block if f in fixed))
            if not matching[block]:
                return False
            domains.append(domain)
        for name in self.constrained:
            if name not in in_block and name not in fixed:
                domains.append(self._domain((name,), [(lv,) for lv in self.model.factor(name).level_names]))
        found = self._search({f: lv for f, lv in fixed.items() if f not in in_block or f in named}, domains)
        if found is None:
            return False
        self._keep({**fixed, **found}, matching)
        return True

    def _matching(self, block: tuple[str, ...], fixed: Tuple) -> tuple[list[tuple[str, ...]], Domain]:
        """The block's realizable rows that hold its fixed levels, and their values of the factors a constraint
        names as a search domain (a few distinct ``fixed``: each kept)."""
        if (block, fixed) not in self._rows:
            wanted = dict(fixed)
            rows = [
                r for r in self._blocks[block] if all(wanted.get(f, lv) == lv for f, lv in zip(block, r, strict=True))
            ]
            kept = [i for i, f in enumerate(block) if f in self._named]
            values = sorted({tuple(r[i] for i in kept) for r in rows})
            self._rows[block, fixed] = rows, self._domain(tuple(block[i] for i in kept), values)
        return self._rows[block, fixed]

    def _keep(self, found: dict[str, str], matching: dict[tuple[str, ...], list[tuple[str, ...]]]) -> None:
        """Keep an extension the search found as a witness, each block completed by a table row that agrees."""
        witness = dict(found)
        for block, rows in matching.items():
            row = next(r for r in rows if all(found.get(f, lv) == lv for f, lv in zip(block, r, strict=True)))
            witness.update(zip(block, row, strict=True))
        bit = 1 << self._witnesses
        self._witnesses += 1
        for item in witness.items():
            self._holding[item] = self._holding.get(item, 0) | bit

    def _shuffled(self, values: list[tuple[str, ...]]) -> list[tuple[str, ...]]:
        """The values in a drawn order: witnesses that differ hold more tuples between them (the answer does not
        depend on the order, only the work does)."""
        drawn = list(values)
        self._order.shuffle(drawn)
        return drawn

    def _domain(self, names: tuple[str, ...], values: list[tuple[str, ...]]) -> Domain:
        relevant = tuple(c for c in self.model.constraints if c.when[0] in names or any(f in names for f, _ in c.then))
        return names, values, relevant

    def _search(self, assignment: dict[str, str], domains: list[Domain]) -> dict[str, str] | None:
        """An extension of ``assignment`` taking one value of every domain that breaks no constraint, or None."""
        if not domains:
            return assignment
        narrowed = []
        for names, values, relevant in domains:
            kept = [v for v in values if _fits(assignment, dict(zip(names, v, strict=True)), relevant)]
            if not kept:
                return None
            narrowed.append((names, kept, relevant))
        narrowed.sort(key=lambda d: len(d[1]))
        (names, values, _), rest = narrowed[0], narrowed[1:]
        for value in self._shuffled(values):
            found = self._search({**assignment, **dict(zip(names, value, strict=True))}, rest)
            if found is not None:
                return found
        return None


#: A search variable: its factors, the level tuples left, the constraints that name one of its factors.
Domain = tuple[tuple[str, ...], list[tuple[str, ...]], tuple[Constraint, ...]]


def _fits(assignment: Mapping[str, str], local: Mapping[str, str], relevant: Iterable[Constraint]) -> bool:
    """Whether new levels (``local``) break none of the constraints naming them, given the levels assigned."""
    for constraint in relevant:
        factor, levels = constraint.when
        level = local.get(factor, assignment.get(factor))
        if level is None or level not in levels:
            continue
        for name, allowed in constraint.then:
            value = local.get(name, assignment.get(name))
            if value is not None and value not in allowed:
                return False
    return True


@cache
def validity(model: FactorModel) -> Validity:
    return Validity(model)


def valid_tuples(model: FactorModel, factor_sets: Iterable[Sequence[str]]) -> list[Tuple]:
    """The valid tuples with one level of each factor of each set, in model order, without repeats (the shipped
    model's from golden/coverage/valid_tuples.json while it is current: :mod:`.valid_table`)."""
    return list(_valid_tuples(model, tuple(tuple(names) for names in factor_sets)))


@cache
def _valid_tuples(model: FactorModel, factor_sets: tuple[tuple[str, ...], ...]) -> tuple[Tuple, ...]:
    shipped = model == _shipped_model()
    seen: dict[Tuple, None] = {}
    order = {name: i for i, name in enumerate(model.names)}
    for names in factor_sets:
        ordered = tuple(sorted(names, key=order.__getitem__))
        bits = valid_table.valid_bits(ordered) if shipped else None
        if bits is None:
            bits = searched_bits(model, ordered)
        for i, levels in enumerate(itertools.product(*(model.factor(f).level_names for f in ordered))):
            if bits >> i & 1:
                seen.setdefault(tuple(zip(ordered, levels, strict=True)), None)
    return tuple(seen)


@cache
def _shipped_model() -> FactorModel:
    return load_model().settled()


def searched_bits(model: FactorModel, names: tuple[str, ...]) -> int:
    """Bit i set when the i-th level tuple of ``names`` (the levels' product, names in model order) is valid: by
    the search, whatever golden/coverage/valid_tuples.json says."""
    check = validity(model)
    bits = 0
    for i, levels in enumerate(itertools.product(*(model.factor(f).level_names for f in names))):
        if check.valid(tuple(zip(names, levels, strict=True))):
            bits |= 1 << i
    return bits


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


def kernel_factor_sets(model: FactorModel) -> list[tuple[str, ...]]:
    """Every kernel's factors with each pair of the factors it tiles by, and with each factor of a level it meets
    once (model order; facts/factors.toml ``[[kernel]]``)."""
    return list(dict.fromkeys(s for kernel in model.kernels for s in _kernel_sets(model, kernel)))


def _kernel_sets(model: FactorModel, kernel: KernelSet) -> list[tuple[str, ...]]:
    order = {name: i for i, name in enumerate(model.names)}
    tiled = [*itertools.combinations(kernel.factors, 2), *dict.fromkeys((f,) for f, _ in kernel.once)]
    return [tuple(sorted((*kernel.kernel, *names), key=order.__getitem__)) for names in tiled]


def kernel_tuples(model: FactorModel) -> list[Tuple]:
    """The valid tuples a kernel must meet: one level of each kernel factor with a level pair of the factors it
    tiles by (a pair holding a level of ``once`` left out), and with each level of ``once`` alone."""
    wanted: dict[Tuple, None] = {}
    for kernel in model.kernels:
        once = set(kernel.once)
        for items in valid_tuples(model, _kernel_sets(model, kernel)):
            tiled = [item for item in items if item[0] in kernel.factors]
            if (len(tiled) == 1) == any(item in once for item in tiled):  # alone exactly when a level of once
                wanted[items] = None
    return list(wanted)


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


#: The label of the kernel tiling pairs' coverage.
KERNEL_PAIRS = "2-way per kernel"


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
    """t-way coverage for each strength over all factors, each kernel's tiling pairs (with strength 2) and the
    triples of the kernel-structure sets (with strength 3), of the settled model (without its pending levels:
    :meth:`FactorModel.settled`)."""
    model = (model or load_model()).settled()
    rows = distinct_rows(cases)
    plans: list[tuple[str, list[tuple[str, ...]], list[Tuple] | None]]
    plans = [(f"{t}-way", all_factor_sets(model, t), None) for t in strengths]
    if 2 in strengths and model.kernels:
        plans.append((KERNEL_PAIRS, kernel_factor_sets(model), kernel_tuples(model)))
    if 3 in strengths and model.structures:
        plans.append(("3-way structure", structure_factor_sets(model), None))
    results = []
    for label, sets, chosen in plans:
        wanted = valid_tuples(model, sets) if chosen is None else chosen
        hit = set().union(*(row_tuples(row, sets) for row in rows))
        results.append(Coverage(label, len(wanted), tuple(t for t in wanted if t not in hit)))
    return results
