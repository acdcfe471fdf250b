"""A covering set, generated: the cheapest valid cases (greedy, AETG-style) that hold every valid tuple of
levels the shipped suites' hand-written cases leave uncovered, written as ``[[case]]`` tables in a marked
section at the end of the suite file.

Deterministic: no randomness, ties broken by the model's level order and then by cost, so the same model
and the same hand-written cases give the same file.  ``python -m mlaconf.golden.coverage.covering`` rewrites the
sections (minutes on the grown model); ``--check`` exits 1 when a checked-in section differs from a fresh one.
Each section records a digest of what made it (:func:`inputs_digest`: the suite's hand-written part, the model
and the generator's sources), so that a section is known current without running the generator again
(``--check-inputs``, tests/nocover/test_covering.py).  The same command rewrites (and checks) the shipped model's
valid tuples counted ahead, golden/coverage/valid_tuples.json (:mod:`.valid_table`).

Smoke holds every valid pair and every kernel's tiling pairs (facts/factors.toml ``[[kernel]]``); standard these
and every triple of the kernel-structure sets."""

from __future__ import annotations

import argparse
import hashlib
import importlib
import inspect
import json
import os
import sys
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mlaconf.facts.factors import DEFAULT_PATH, FactorModel, load_model
from mlaconf.facts.operator import DEFAULT_QK_SCALE, DOCUMENTED_FILL, SCORE_DIM, V_DIM
from mlaconf.golden.coverage import valid_table
from mlaconf.golden.coverage.levels import (
    FEW_TASKS,
    LENGTH_FACTORS,
    PER_BATCH,
    Q_TILE,
    ROUNDS_TASKS,
    Levels,
    Tuple,
    all_factor_sets,
    batch_rows,
    cheapest_heads,
    cheapest_lengths,
    distinct_rows,
    kernel_factor_sets,
    kernel_tuples,
    length_levels,
    row_tuples,
    searched_bits,
    structure_factor_sets,
    valid_tuples,
    validity,
)
from mlaconf.golden.specs.spec import CaseSpec
from mlaconf.golden.specs.spec_build import build_case
from mlaconf.golden.specs.suites import load_suite, suite_path
from mlaconf.golden.store.directory import create_temp, temp_path

#: The line that opens a suite file's generated section; everything after it is the generator's.
MARKER = "# -- generated covering set: do not edit below; rewrite with `python -m mlaconf.golden.coverage.covering`"
#: Which tuples each suite's generated section completes beyond every pair and each kernel's tiling pairs: with the
#: kernel-structure triples (True) or not.
TARGETS = {"smoke": False, "standard": True}
#: Most query rows per candidate batch list and most batches one generated case holds.
MAX_ROWS = 6
#: Rough seconds of one case in a run (open, execute, judge) and its FLOP and byte rates (torch-cpu, 2
#: cores); only their ratios matter: they trade one more case against a larger one.
CASE_SECONDS = 0.2
RUN_FLOPS = 2e9
RUN_BYTES = 2e8
#: Estimated seconds from which a candidate is built again without each of its free choices in turn, the one
#: covering most per second kept (heads 128 or a long batch chosen for a tuple a cheaper case holds as well).
EXPENSIVE = 1.0
#: Rough seconds one more batch adds to a case beyond its FLOPs.
ROW_SECONDS = 0.01
#: Input structure options (levels a case holds together) and the fields that produce them.
INPUTS: dict[frozenset[str], dict[str, Any]] = {
    frozenset({"random"}): {},
    frozenset({"random", "v_mean"}): {"structure": {"v_mean": 4.0}},
    frozenset({"near_tie"}): {"distribution": "near_tie"},
    frozenset({"near_tie", "v_mean"}): {"distribution": "near_tie", "structure": {"v_mean": 4.0}},
    frozenset({"large_logits"}): {"distribution": "large_logits"},
    frozenset({"late_max"}): {"structure": {"logits": "late_max", "late_from": 128}},
    frozenset({"late_max", "v_mean"}): {"structure": {"logits": "late_max", "late_from": 128, "v_mean": 4.0}},
    frozenset({"sinks"}): {"structure": {"logits": "sinks", "rise": 7.0, "sink_keys": 1}},
    frozenset({"sinks", "v_mean"}): {"structure": {"logits": "sinks", "rise": 7.0, "sink_keys": 1, "v_mean": 4.0}},
    frozenset({"large_logits", "late_max"}): {
        "distribution": "large_logits",
        "structure": {"logits": "late_max", "late_from": 128},
    },
    frozenset({"large_logits", "sinks"}): {
        "distribution": "large_logits",
        "structure": {"logits": "sinks", "rise": 7.0, "sink_keys": 1},
    },
    frozenset({"raw_overflow"}): {"distribution": "large_raw_scores"},
    frozenset({"raw_overflow", "v_mean"}): {"distribution": "large_raw_scores", "structure": {"v_mean": 4.0}},
}
#: late_max's rise per dtype: above ln of the largest finite P accumulator (fp16 11.1, fp32 88.7).
LATE_RISE = {"fp16": 16.0, "bf16": 96.0}
#: "many" first: on a tie the case gets room for several batches' per-batch levels.
BATCH_OPTIONS = (
    frozenset({"many"}),
    frozenset({"two"}),
    frozenset({"one"}),
    frozenset({"two", "empty_row"}),
    frozenset({"many", "empty_row"}),
    frozenset({"two", "empty_row", "empty_first"}),
    frozenset({"many", "empty_row", "empty_first"}),
    frozenset({"many", "empty_row", "empty_last"}),
)
#: The case-level factors in the order the generator chooses them (heads after group and kv heads, tasks after
#: heads: each choice narrows the next).
CASE_FACTORS = (
    "dtype",
    "mask",
    "q_layout",
    "kv_layout",
    "batch_order",
    "padding",
    "batch",
    "group",
    "kv_heads",
    "heads",
    "tasks",
    "inputs",
    "qk_scale",
    "logits",
    "mask_fill",
)
#: Levels the generator tries first where open tuples tie: CAUSAL reads fewer keys than a full row (and needs no
#: q_b = kv_b), MASK_FREE half a row; a padded cache with unread rows keeps batches of different lengths.
PREFERRED = {"mask": ("causal", "mask_free", "undefined"), "padding": ("garbage", "none", "nan")}
#: Factors a case may also leave without a level (no demand: neither order, a task count between the levels).
OPTIONAL = ("batch_order", "tasks")
#: qkScale per level (default: the field left out); tiny is 1e-4 where the raw scores must pass fp16's 65504.
QK_SCALES = {"one": 1.0, "fp16_exact": 0.125, "tiny": 5e-4}
RAW_OVERFLOW_SCALE = 1e-4
#: logit_shift per dtype for logits negative / positive: past LOGIT_LEVEL + SPREAD_MARGIN (levels.py).
LOGIT_SHIFT = {"fp16": 20.0, "bf16": 110.0}
#: Extra kv rows of a padded cache past max kv (padded_over_capacity) or a packed k past the sum (packed_spare).
SPARE_ROWS = 16
#: The kv layout field each kv_layout level is written with.
KV_LAYOUT_FIELD = {"padded_full": "padded", "padded_short_before_last": "padded", "padded_over_capacity": "padded"}
KV_LAYOUT_FIELD["packed_spare"] = "packed"


def case_cost(spec: CaseSpec) -> float:
    """Estimated seconds of a case in a run, from the cost model (golden/building/cost.py)."""
    from mlaconf.golden.building.cost import stored_bytes

    return CASE_SECONDS + spec.useful_flops / RUN_FLOPS + stored_bytes(spec) / RUN_BYTES


def row_flops(q: int, kv: int) -> int:
    """Score and value FLOPs of one batch's q_b x kv_b block per head (the mask halves it at most)."""
    return 2 * q * kv * (SCORE_DIM + V_DIM)


@dataclass(frozen=True)
class Length:
    """A concrete batch (q_b, kv_b) and the per-batch levels it can hold (inputs: those its keys can show)."""

    q: int
    kv: int
    levels: Levels


def length_menu(model: FactorModel | None = None) -> list[Length]:
    """For each realizable (q_len, kv_len, prefix, inputs) of ``model`` (default: the settled one), the cheapest
    (q_b, kv_b) that holds it; cheapest first."""
    pairs = set(cheapest_lengths(model).values())
    return [Length(q, kv, length_levels(q, kv)) for q, kv in sorted(pairs, key=lambda p: (p[0] * p[1] + p[0], *p))]


def _one(case: Levels, factor: str) -> str | None:
    """The single level a case option names for a factor (None: no demand)."""
    return next(iter(case[factor])) if len(case[factor]) == 1 else None


def head_counts(case: Levels) -> tuple[int, int]:
    """``(head_num, kv_head_num)``: the fewest heads with the case's group, kv heads and heads levels."""
    (group,) = case["group"]
    (kv_heads,) = case["kv_heads"]
    (heads,) = case["heads"]
    return cheapest_heads()[(group, kv_heads, heads)]


def tiles(lengths: Sequence[Length]) -> int:
    return sum(-(-item.q // Q_TILE) for item in lengths)


def _order(case: Levels, lengths: list[Length]) -> list[Length]:
    """The batches in the order the case's batch order (or a misread padded cache) asks for."""
    order = _one(case, "batch_order")
    layout = _one(case, "kv_layout")
    if order == "longer_first" or layout == "padded_full":
        return sorted(lengths, key=lambda item: -item.kv)
    if order == "shorter_first" or layout == "padded_short_before_last":
        return sorted(lengths, key=lambda item: item.kv)
    return lengths


def _fits(case: Levels, factor: str, option: frozenset[str]) -> bool:
    """What the model's constraints cannot say, given the levels known so far (``case``, the seed's among them): a
    batch order needs two checked batches (B = 2 with an empty one has one) of different lengths (a padded cache
    without unread rows has every kv_b = S); in fp16 a logits trend's rise or a logit shift over a tiny qkScale
    passes the raw score fp16 keeps (the spec validator's FP16_RAW_SCORE_LIMIT)."""
    ordered = bool(case.get("batch_order"))
    if factor == "batch" and {"two", "empty_row"} <= option and ordered:
        return False
    if factor == "padding" and "none" in option and ordered and next(iter(case["kv_layout"])).startswith("padded"):
        return False
    trial = {**case, factor: option}
    none: frozenset[str] = frozenset()
    lifted = trial.get("inputs", none) & {"late_max", "sinks"} or trial.get("logits", none) & {"negative", "positive"}
    return not (trial.get("dtype") == frozenset({"fp16"}) and "tiny" in trial.get("qk_scale", none) and lifted)


def _fields(case: Levels, lengths: Sequence[Length]) -> dict[str, Any]:
    """The suite fields of a candidate: case-level options and concrete batches."""
    mask = _one(case, "mask")
    dtype = _one(case, "dtype")
    layout = _one(case, "kv_layout")
    assert mask is not None and dtype is not None and layout is not None
    head_num, kv_head_num = head_counts(case)
    ordered = _order(case, list(lengths))
    q = [item.q for item in ordered]
    kv = [item.kv for item in ordered]
    if "rounds" in case["tasks"]:  # one-row batches until every core of the largest chip takes several tasks
        extra = max(0, -(-ROUNDS_TASKS // head_num) - tiles(ordered))
        q, kv = q + [1] * extra, kv + [1] * extra
    if "empty_row" in case["batch"]:
        full = layout == "padded_full" or (layout == "padded" and "none" in case["padding"])
        at = 0 if "empty_first" in case["batch"] else len(q) if "empty_last" in case["batch"] else 1
        if full and mask != "causal":
            at = len(q)  # an empty batch holds 0 keys there: only after the last checked one is every start b * S
        q.insert(at, 0)
        kv.insert(at, 0 if mask != "causal" else max(kv) if full else 16)
    raw: dict[str, Any] = {
        "dtype": dtype,
        "mask_type": mask,
        "q_layout": _one(case, "q_layout"),
        "kv_layout": KV_LAYOUT_FIELD.get(layout, layout),
        "head_num": head_num,
        "kv_head_num": kv_head_num,
        "q_seqlen": q,
        "kv_seqlen": kv,
        **json.loads(json.dumps(INPUTS[case["inputs"]])),
    }
    if layout == "padded_over_capacity":
        raw["kv_capacity"] = max(kv) + SPARE_ROWS
    if layout == "packed_spare":
        spare = sum(kv) + SPARE_ROWS
        raw["kv_capacity"] = spare + SPARE_ROWS if spare == len(kv) * max(kv) else spare
    if "nan" in case["padding"]:
        raw["padding"] = "nan"
    scale = _one(case, "qk_scale")
    if scale in QK_SCALES:
        raw["qk_scale"] = RAW_OVERFLOW_SCALE if "raw_overflow" in case["inputs"] else QK_SCALES[scale]
    fill = _one(case, "mask_fill")
    if fill is not None and fill != "none" and fill != DOCUMENTED_FILL[dtype]:
        raw["mask_fill"] = fill
    structure = raw.get("structure")
    if structure and structure.get("logits") == "late_max":
        structure["rise"] = LATE_RISE[dtype]
    logits = _one(case, "logits")
    if logits in ("negative", "positive"):
        shift = LOGIT_SHIFT[dtype] * (-1.0 if logits == "negative" else 1.0)
        raw["structure"] = {**(structure or {}), "logit_shift": shift}
    return raw


class Generator:
    """Greedy covering-set construction over the target tuples the existing cases leave open.

    ``accept`` (None: every valid case) keeps only the candidates it accepts, e.g. those one backend runs to a
    numeric verdict (``mlaconf coverage --backend NAME --complete``); then a tuple no accepted candidate holds is
    set aside in :attr:`unreachable` instead of failing the run."""

    def __init__(
        self,
        model: FactorModel,
        targets: Sequence[Tuple],
        existing: Sequence[CaseSpec],
        suite: str,
        accept: Callable[[CaseSpec], bool] | None = None,
    ) -> None:
        self.model = model
        self.suite = suite
        self.accept = accept
        self.unreachable: list[Tuple] = []
        self.valid = validity(model)
        self.factor_sets = sorted({tuple(f for f, _ in items) for items in targets})
        covered = set().union(*(row_tuples(row, self.factor_sets) for row in distinct_rows(existing)))
        self.open: dict[Tuple, None] = {items: None for items in targets if items not in covered}
        self.targets = set(self.open)
        self._case_items = {items: frozenset(i for i in items if i[0] not in LENGTH_FACTORS) for items in self.targets}
        self.menu = length_menu(model)
        self.options: dict[str, list[frozenset[str]]] = {
            f: [frozenset({lv}) for lv in model.factor(f).level_names] for f in CASE_FACTORS
        }
        for factor, order in PREFERRED.items():  # on a tie the cheaper level wins
            self.options[factor] = [frozenset({lv}) for lv in order]
        self.options["batch"] = list(BATCH_OPTIONS)
        self.options["inputs"] = list(INPUTS)
        for factor in OPTIONAL:  # no demand first: on a tie a case keeps its lengths and heads free
            self.options[factor].insert(0, frozenset())

    def _gain(self, rows: Sequence[Levels]) -> set[Tuple]:
        return {t for row in rows for t in row_tuples(row, self.factor_sets) if t in self.open}

    def _consistent(self, case: Levels) -> bool:
        """Whether the single-level choices meet in a valid case, and each level of a several-level one with them."""
        order = self.model.names.index
        items = [(f, next(iter(levels))) for f, levels in case.items() if len(levels) == 1]
        several = [(f, lv) for f, levels in case.items() if len(levels) > 1 for lv in sorted(levels)]
        return all(
            self.valid.valid(tuple(sorted(items + extra, key=lambda i: order(i[0]))))
            for extra in ([[]] if not several else [[item] for item in several])
        )

    def _partial_score(self, case: Levels) -> int:
        """Open tuples whose case-level factors are all chosen and held (per-batch ones still free)."""
        chosen = {(f, lv) for f, levels in case.items() for lv in levels}
        return sum(1 for items in self.open if self._case_items[items] <= chosen)

    def _candidate(self, seed: Tuple) -> tuple[CaseSpec, set[Tuple]] | None:
        """The best case for a seed tuple; one the validator or ``accept`` refuses is built again without one of
        its case-level choices at a time (each factor the seed leaves free, in order), the first kept."""
        built = self._build(seed, frozenset())
        if built is None:
            return None
        spec, case = built
        fixed = {f for f, _ in seed}
        if spec is not None and (self.accept is None or self.accept(spec)):
            found = spec, self._gain(batch_rows(spec))
            if case_cost(spec) < EXPENSIVE:
                return found
            for factor in (f for f in CASE_FACTORS if f not in fixed):  # a costly case: is one choice less worth?
                again = self._build(seed, frozenset({(factor, case[factor])}))
                if again is not None and again[0] is not None and (self.accept is None or self.accept(again[0])):
                    other = again[0], self._gain(batch_rows(again[0]))
                    if seed in other[1] and len(other[1]) / case_cost(other[0]) > len(found[1]) / case_cost(found[0]):
                        found = other
            return found
        for factor in (f for f in CASE_FACTORS if f not in fixed):
            again = self._build(seed, frozenset({(factor, case[factor])}))
            if again is not None and again[0] is not None and (self.accept is None or self.accept(again[0])):
                return again[0], self._gain(batch_rows(again[0]))
        return None

    def _build(
        self, seed: Tuple, banned: frozenset[tuple[str, frozenset[str]]]
    ) -> tuple[CaseSpec | None, Levels] | None:
        """The case-level choices for a seed and the case they give (None where no batches fit the choices or the
        validator refuses the case; None alone where no choice is consistent)."""
        want = dict(seed)
        seeded = {f: frozenset({lv}) for f, lv in want.items()}
        case: Levels = {}
        for factor in CASE_FACTORS:
            choices = [
                o
                for o in self.options[factor]
                if (factor not in want or want[factor] in o)
                and (factor, o) not in banned
                and _fits({**seeded, **case}, factor, o)
            ]
            best: tuple[int, int] | None = None
            for rank, option in enumerate(choices):
                trial = {**case, factor: option}
                if not self._consistent({**seeded, **trial}):
                    continue
                score = (self._partial_score(trial), -rank)
                if best is None or score > best:
                    best, case[factor] = score, option
            if factor not in case:
                return None
        rows = self._choose_lengths(case, want)
        if rows is None:
            return None, case  # no batch fits the choices (few tasks under 32 heads): rebuilt without one of them
        raw = _fields(case, rows)
        try:
            spec = build_case(raw, source=f"{self.suite} (generated)", suite=self.suite)
        except ValueError:
            return None, case  # a level combination the validator refuses beyond the model's constraints
        return spec, case

    def _choose_lengths(self, case: Levels, want: dict[str, str]) -> list[Length] | None:
        causal = "causal" in case["mask"]
        menu = [m for m in self.menu if causal or m.q == m.kv]
        count = 1 if "one" in case["batch"] else 2 if "two" in case["batch"] else MAX_ROWS
        if "empty_row" in case["batch"]:
            count -= 1
        heads, _ = head_counts(case)
        few = "few" in case["tasks"]
        layout = _one(case, "kv_layout") or ""
        uniform = layout == "padded_full" or (layout == "padded" and "none" in case["padding"])
        # a batch holds a tuple's case-level levels (inputs: chosen) through the case, its per-batch ones (inputs:
        # shown by its keys) itself
        relevant = [t for t in self.open if all(f in LENGTH_FACTORS or lv in case[f] for f, lv in t)]
        held = {
            (m.q, m.kv): {t for t in relevant if all(f not in PER_BATCH or lv in m.levels[f] for f, lv in t)}
            for m in menu
        }
        chosen: list[Length] = []
        gained: set[Tuple] = set()
        for slot in range(count):
            pool = menu
            if slot == 0:
                pool = [m for m in menu if all(lv in m.levels[f] for f, lv in want.items() if f in PER_BATCH)]
            if few:  # fewer tasks than cores: heads x query tiles stays under FEW_TASKS
                pool = [m for m in pool if heads * (tiles(chosen) + tiles([m])) < FEW_TASKS]
            if uniform and chosen:  # every batch holds S keys (but a last one, below)
                pool = [m for m in pool if m.kv == chosen[0].kv]
            best: tuple[float, int] | None = None
            pick = None
            for item in pool:  # cheapest first: a later item must add more per second to win
                new = len(held[(item.q, item.kv)] - gained)
                score = (new / (ROW_SECONDS + heads * row_flops(item.q, item.kv) / RUN_FLOPS), new)
                if best is None or score > best:
                    best, pick = score, item
            if pick is None:
                return chosen or None
            if slot >= 3 and best is not None and best[1] == 0:
                break  # "many" holds at least three batches; more only while they add tuples
            chosen.append(pick)
            gained |= held[(pick.q, pick.kv)]
        if count == 1 or not chosen:
            return chosen
        room = [m for m in menu if not few or heads * (tiles(chosen) + tiles([m])) < FEW_TASKS]
        unread = "none" not in case["padding"]
        if uniform and ("longer_first" in case["batch_order"] or unread):
            room = [m for m in room if m.kv < chosen[0].kv]  # padded_full with unread rows or an order: a shorter last
        elif layout == "strided" or case["batch_order"] or (layout.startswith("padded") and unread):
            room = [m for m in room if len({c.kv for c in chosen}) == 1 and m.kv != chosen[0].kv]  # ragged kv
        else:
            room = []
        return chosen + room[:1]

    def run(self, cost: Callable[[CaseSpec], float] = case_cost, seeds: int = 24) -> list[CaseSpec]:
        """Cases until every open tuple is covered (or no candidate covers one: an error naming it)."""
        made: list[CaseSpec] = []
        while self.open:
            best: tuple[float, CaseSpec, set[Tuple]] | None = None
            tried = list(self.open)[:seeds]
            for seed in tried:
                found = self._candidate(seed)
                if found is None or not found[1]:
                    continue
                spec, gain = found
                score = len(gain) / cost(spec)
                if best is None or score > best[0]:
                    best = (score, spec, gain)
            if best is None and self.accept is not None:
                for items in tried:  # no accepted candidate holds these: set aside, go on with the rest
                    self.unreachable.append(items)
                    self.open.pop(items)
                continue
            if best is None:
                raise RuntimeError(f"{self.suite}: no valid case covers {tried}")
            made.append(best[1])
            for items in best[2]:
                self.open.pop(items, None)
        return self._drop_redundant(made, cost)

    def _drop_redundant(self, made: list[CaseSpec], cost: Callable[[CaseSpec], float]) -> list[CaseSpec]:
        """Reverse delete: the costliest first, a case whose target tuples the others also hold goes."""
        held = [self._targets_held(spec) for spec in made]
        keep = list(range(len(made)))
        for index in sorted(keep, key=lambda i: (-cost(made[i]), i)):
            others = set().union(*(held[i] for i in keep if i != index))
            if held[index] <= others:
                keep.remove(index)
        return [made[i] for i in keep]

    def _targets_held(self, spec: CaseSpec) -> set[Tuple]:
        return {t for row in batch_rows(spec) for t in row_tuples(row, self.factor_sets) if t in self.targets}


def targets(model: FactorModel, structure: bool) -> list[Tuple]:
    structures = valid_tuples(model, structure_factor_sets(model)) if structure else []
    return list(dict.fromkeys([*valid_tuples(model, all_factor_sets(model, 2)), *kernel_tuples(model), *structures]))


def case_toml(spec: CaseSpec) -> str:
    """One ``[[case]]`` table with every field the case sets (defaults of the file not relied on)."""
    lines = ["[[case]]"]
    fields: list[tuple[str, Any]] = [
        ("dtype", spec.dtype),
        ("mask_type", spec.mask_name),
        ("q_layout", spec.q_layout),
        ("kv_layout", spec.kv_layout),
        ("head_num", spec.head_num),
        ("kv_head_num", spec.kv_head_num),
        ("q_seqlen", list(spec.q_seqlen)),
        ("kv_seqlen", list(spec.kv_seqlen)),
    ]
    if spec.kv_capacity is not None:
        fields.append(("kv_capacity", spec.kv_capacity))
    if spec.qk_scale != DEFAULT_QK_SCALE:
        fields.append(("qk_scale", spec.qk_scale))
    if spec.distribution != "uniform":
        fields.append(("distribution", spec.distribution))
    fields += [(key, getattr(spec, key)) for key in ("mask_fill", "padding") if getattr(spec, key) is not None]
    lines += [f"{key} = {json.dumps(value)}" for key, value in fields]
    if spec.structure is not None:
        lines.append(f"structure = {spec.structure.toml()}")
    return "\n".join(lines) + "\n"


def split_suite(text: str) -> tuple[str, str]:
    """A suite file's hand-written part and its generated section (empty when it has none)."""
    head, marker, tail = text.partition(MARKER)
    return head.rstrip("\n") + "\n", (marker + tail if marker else "")


#: The modules whose text decides a section beside the suite's hand-written part: the model, the generator and
#: what it builds cases with.  A change elsewhere that alters the cases would go unseen until the next rewrite;
#: what the sections reach is checked directly either way (``mlaconf coverage``).
GENERATOR_MODULES = (
    "mlaconf.facts.factors",
    "mlaconf.facts.operator",
    "mlaconf.golden.coverage.covering",
    "mlaconf.golden.coverage.levels",
    "mlaconf.golden.specs.spec",
    "mlaconf.golden.specs.spec_build",
)
#: The section's line that records :func:`inputs_digest`.
DIGEST_LINE = "# made from inputs "


def inputs_digest(head: str, model_path: Path = DEFAULT_PATH) -> str:
    """sha256 (16 hex digits) of a suite's hand-written part ``head``, the model file and GENERATOR_MODULES."""
    digest = hashlib.sha256(head.encode("utf-8"))
    digest.update(model_path.read_bytes())
    for name in GENERATOR_MODULES:
        digest.update(Path(inspect.getfile(importlib.import_module(name))).read_bytes())
    return digest.hexdigest()[:16]


def recorded_digest(section: str) -> str | None:
    """The inputs digest a checked-in section records (None: written before sections recorded one)."""
    for line in section.splitlines():
        if line.startswith(DIGEST_LINE):
            return line[len(DIGEST_LINE) :].split()[0]
    return None


def generated_section(suite: str, model: FactorModel | None = None) -> str:
    """The section the generator writes for a shipped suite, given the suite's hand-written part: it targets the
    settled model (pending levels join when the sections are regenerated without their mark)."""
    model = (model or load_model()).settled()
    path = suite_path(suite)
    head, _ = split_suite(path.read_text(encoding="utf-8"))
    with tempfile.TemporaryDirectory() as folder:
        hand = Path(folder) / path.name
        hand.write_text(head, encoding="utf-8")
        existing = load_suite(hand)
    made = Generator(model, targets(model, TARGETS[suite]), existing, suite).run()
    what = "pair, each kernel's tiling pairs" + (" and every kernel-structure triple" if TARGETS[suite] else "")
    intro = (
        f"{MARKER}\n# The cheapest cases (golden/coverage/covering.py) that, with the cases above, "
        f"hold every valid {what}\n"
        "# of the factor model (facts/factors.toml); `mlaconf coverage` reports what they reach.\n"
        f"{DIGEST_LINE}{inputs_digest(head)} (the hand-written part, the model, the generator's sources)\n"
    )
    return intro + "".join("\n" + case_toml(spec) for spec in made)


def valid_table_text(model: FactorModel | None = None) -> str:
    """golden/coverage/valid_tuples.json as the search makes it today (:mod:`.valid_table`): every factor set that
    coverage reports and the targets ask about (1-, 2- and 3-way, each kernel's, the structure triples)."""
    model = (model or load_model()).settled()
    sets = [s for t in (1, 2, 3) for s in all_factor_sets(model, t)]
    sets += kernel_factor_sets(model) + structure_factor_sets(model)
    return valid_table.table_text({",".join(s): format(searched_bits(model, s), "x") for s in dict.fromkeys(sets)})


def write_atomic(path: Path, text: str) -> None:
    """A temp file beside the target (created exclusively, mode 0644, never through a link), synced, then
    renamed over it: a suite file is never half-written."""
    temp = temp_path(path)
    try:
        with create_temp(temp) as out:
            out.write(text.encode("utf-8"))
            out.flush()
            os.fsync(out.fileno())
        os.replace(temp, path)
    except BaseException:
        temp.unlink(missing_ok=True)
        raise


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m mlaconf.golden.coverage.covering", description=__doc__)
    parser.add_argument("suites", nargs="*", default=list(TARGETS), help=f"suites to rewrite (default {list(TARGETS)})")
    parser.add_argument("--check", action="store_true", help="exit 1 when a checked-in section differs")
    parser.add_argument(
        "--check-inputs",
        action="store_true",
        help="exit 1 when what made a section (its recorded digest) differs from today's inputs (seconds, not minutes)",
    )
    args = parser.parse_args(argv)
    stale = []
    for suite in args.suites:
        if suite not in TARGETS:
            parser.error(f"no generated section in suite {suite!r}; have {list(TARGETS)}")
        path = suite_path(suite)
        text = path.read_text(encoding="utf-8")
        head, current = split_suite(text)
        if args.check_inputs:
            if recorded_digest(current) != inputs_digest(head):
                stale.append(suite)
            continue
        fresh = generated_section(suite)
        if current != fresh:
            stale.append(suite)
            if not args.check:
                write_atomic(path, head + "\n" + fresh)
    table = valid_table.TABLE
    if args.check_inputs:
        if valid_table.recorded_sources(table) != valid_table.sources_digest():
            stale.append(table.name)
    else:
        fresh_table = valid_table_text()
        if (table.read_text(encoding="ascii") if table.exists() else "") != fresh_table:
            stale.append(table.name)
            if not args.check:
                write_atomic(table, fresh_table)
    if stale:
        verb = (
            "was made from other inputs than today's"
            if args.check_inputs
            else "differs from what the generator writes"
            if args.check
            else "rewritten"
        )
        print(f"generated section {verb}: {', '.join(stale)}", file=sys.stderr)
    return 1 if stale and (args.check or args.check_inputs) else 0


if __name__ == "__main__":
    raise SystemExit(main())
