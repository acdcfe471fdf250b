"""A covering set, generated: the cheapest valid cases (greedy, AETG-style) that hold every valid tuple of
levels the shipped suites' hand-written cases leave uncovered, written as ``[[case]]`` tables in a marked
section at the end of the suite file.

Deterministic: no randomness, ties broken by the model's level order and then by cost, so the same model
and the same hand-written cases give the same file.  ``python -m mlaconf.golden.coverage.covering`` rewrites the
sections; ``--check`` exits 1 when a checked-in section differs from a fresh one.
Each section records a digest of what made it (:func:`inputs_digest`: the suite's hand-written part, the model
and the generator's sources), so that a section is known current without running the generator again
(``--check-inputs``, tests/nocover/test_covering.py).

Smoke holds every valid pair; standard every valid pair and every triple of the kernel-structure sets."""

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
from mlaconf.facts.operator import SCORE_DIM, V_DIM
from mlaconf.golden.coverage.levels import (
    PER_BATCH,
    Levels,
    Tuple,
    all_factor_sets,
    batch_rows,
    cheapest_lengths,
    distinct_rows,
    row_tuples,
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
#: Which tuples each suite's generated section completes: (suite, strengths, with structure triples).
TARGETS = {"smoke": False, "standard": True}
#: Most query rows per candidate batch list and most batches one generated case holds.
MAX_ROWS = 6
#: Rough seconds of one case in a run (open, execute, judge) and its FLOP and byte rates (torch-cpu, 2
#: cores); only their ratios matter: they trade one more case against a larger one.
CASE_SECONDS = 0.2
RUN_FLOPS = 2e9
RUN_BYTES = 2e8
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
)
KV_HEADS = {"one": 1, "two": 2, "many": 3}
CASE_FACTORS = ("dtype", "mask", "q_layout", "kv_layout", "batch", "group", "kv_heads", "inputs")


def case_cost(spec: CaseSpec) -> float:
    """Estimated seconds of a case in a run, from the cost model (golden/building/cost.py)."""
    from mlaconf.golden.building.cost import stored_bytes

    return CASE_SECONDS + spec.useful_flops / RUN_FLOPS + stored_bytes(spec) / RUN_BYTES


def row_flops(q: int, kv: int) -> int:
    """Score and value FLOPs of one batch's q_b x kv_b block per head (the mask halves it at most)."""
    return 2 * q * kv * (SCORE_DIM + V_DIM)


@dataclass(frozen=True)
class Length:
    """A concrete batch (q_b, kv_b) and the per-batch levels it holds."""

    q: int
    kv: int
    levels: Levels


def length_menu(model: FactorModel | None = None) -> list[Length]:
    """For each realizable (q_len, kv_len, prefix) of ``model`` (default: the settled one), the cheapest (q_b, kv_b)
    that holds it; cheapest first."""
    menu = {}
    pairs = set(cheapest_lengths(model).values())
    for q, kv in sorted(pairs, key=lambda pair: (pair[0] * pair[1] + pair[0], *pair)):
        row = {
            f: frozenset(n for n, rule in PER_BATCH[f].items() if rule(v))
            for f, v in zip(PER_BATCH, (q, kv, kv - q), strict=True)
        }
        menu[(q, kv)] = Length(q, kv, row)
    return list(menu.values())


def _fields(case: Levels, lengths: Sequence[Length]) -> dict[str, Any]:
    """The suite fields of a candidate: case-level options and concrete batches."""
    (mask,) = case["mask"]
    (group,) = case["group"]
    (kv_heads,) = case["kv_heads"]
    (dtype,) = case["dtype"]
    kv_head_num = KV_HEADS[kv_heads]
    q = [item.q for item in lengths]
    kv = [item.kv for item in lengths]
    if "empty_row" in case["batch"]:
        q.insert(1, 0)
        kv.insert(1, 0 if mask != "causal" else 16)
    raw: dict[str, Any] = {
        "dtype": dtype,
        "mask_type": mask,
        "q_layout": next(iter(case["q_layout"])),
        "kv_layout": next(iter(case["kv_layout"])),
        "head_num": int(group) * kv_head_num,
        "kv_head_num": kv_head_num,
        "q_seqlen": q,
        "kv_seqlen": kv,
        **json.loads(json.dumps(INPUTS[case["inputs"]])),
    }
    structure = raw.get("structure")
    if structure and structure.get("logits") == "late_max":
        structure["rise"] = LATE_RISE[dtype]
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
        self.menu = length_menu(model)
        self.options: dict[str, list[frozenset[str]]] = {
            f: [frozenset({lv}) for lv in model.factor(f).level_names] for f in CASE_FACTORS
        }
        self.options["batch"] = list(BATCH_OPTIONS)
        self.options["inputs"] = list(INPUTS)

    def _gain(self, rows: Sequence[Levels]) -> set[Tuple]:
        return {t for row in rows for t in row_tuples(row, self.factor_sets) if t in self.open}

    def _consistent(self, case: Levels) -> bool:
        items = tuple((f, lv) for f in case for lv in sorted(case[f]) if len(case[f]) == 1)
        return self.valid.valid(tuple(sorted(items, key=lambda i: self.model.names.index(i[0]))))

    def _partial_score(self, case: Levels) -> int:
        """Open tuples whose case-level factors are all chosen and held (per-batch ones still free)."""
        score = 0
        for items in self.open:
            if all(f in PER_BATCH or (f in case and lv in case[f]) for f, lv in items):
                score += 1
        return score

    def _candidate(self, seed: Tuple) -> tuple[CaseSpec, set[Tuple]] | None:
        """The best case for a seed tuple; one ``accept`` refuses is built again without one of its case-level
        choices at a time (each factor the seed leaves free, in order), the first accepted one kept."""
        built = self._build(seed, frozenset())
        if built is None or self.accept is None or self.accept(built[0]):
            return None if built is None else (built[0], self._gain(batch_rows(built[0])))
        fixed = {f for f, _ in seed}
        for factor in (f for f in CASE_FACTORS if f not in fixed):
            again = self._build(seed, frozenset({(factor, built[1][factor])}))
            if again is not None and self.accept(again[0]):
                return again[0], self._gain(batch_rows(again[0]))
        return None

    def _build(self, seed: Tuple, banned: frozenset[tuple[str, frozenset[str]]]) -> tuple[CaseSpec, Levels] | None:
        want = dict(seed)
        case: Levels = {}
        for factor in CASE_FACTORS:
            choices = [
                o
                for o in self.options[factor]
                if (factor not in want or want[factor] in o) and (factor, o) not in banned
            ]
            best: tuple[int, int] | None = None
            for rank, option in enumerate(choices):
                trial = {**case, factor: option}
                seeded = {f: frozenset({lv}) for f, lv in want.items()}
                if not self._consistent({**seeded, **trial}):
                    continue
                score = (self._partial_score(trial), -rank)
                if best is None or score > best:
                    best, case[factor] = score, option
            if factor not in case:
                return None
        rows = self._choose_lengths(case, want)
        if rows is None:
            return None
        raw = _fields(case, rows)
        try:
            spec = build_case(raw, source=f"{self.suite} (generated)", suite=self.suite)
        except ValueError:
            return None  # a level combination the validator refuses beyond the model's constraints
        return spec, case

    def _choose_lengths(self, case: Levels, want: dict[str, str]) -> list[Length] | None:
        causal = "causal" in case["mask"]
        menu = [m for m in self.menu if causal or m.q == m.kv]
        count = 1 if "one" in case["batch"] else 2 if "two" in case["batch"] else MAX_ROWS
        if "empty_row" in case["batch"]:
            count -= 1
        heads = int(next(iter(case["group"]))) * KV_HEADS[next(iter(case["kv_heads"]))]
        need_kv = 129 if "late_max" in case["inputs"] else 2 if "sinks" in case["inputs"] else 1
        relevant = [t for t in self.open if all(f in PER_BATCH or lv in case[f] for f, lv in t)]
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
            unmet = max((c.kv for c in chosen), default=0) < need_kv
            if unmet and (slot > 0 or any(m.kv >= need_kv for m in pool)):
                pool = [m for m in pool if m.kv >= need_kv]
            best: tuple[float, int] | None = None
            pick = None
            for item in pool:  # cheapest first: a later item must add more per second to win
                new = len(held[(item.q, item.kv)] - gained)
                score = (new / (ROW_SECONDS + heads * row_flops(item.q, item.kv) / RUN_FLOPS), new)
                if best is None or score > best:
                    best, pick = score, item
            if pick is None:
                return None
            if slot >= 3 and not unmet and best is not None and best[1] == 0:
                break  # "many" holds at least three batches; more only while they add tuples
            chosen.append(pick)
            gained |= held[(pick.q, pick.kv)]
        return chosen

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
    sets = all_factor_sets(model, 2) + (structure_factor_sets(model) if structure else [])
    return valid_tuples(model, sets)


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
    if spec.distribution != "uniform":
        fields.append(("distribution", spec.distribution))
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
    what = "pair and every kernel-structure triple" if TARGETS[suite] else "pair"
    intro = (
        f"{MARKER}\n# The cheapest cases (golden/coverage/covering.py) that, with the cases above, "
        f"hold every valid {what}\n"
        "# of the factor model (facts/factors.toml); `mlaconf coverage` reports what they reach.\n"
        f"{DIGEST_LINE}{inputs_digest(head)} (the hand-written part, the model, the generator's sources)\n"
    )
    return intro + "".join("\n" + case_toml(spec) for spec in made)


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
