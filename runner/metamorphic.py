"""Metamorphic relations' machinery: one relation test's state, the transforms only the backend sees.

The relations themselves (which transform, exact or tolerance) are the tests in
``cases/test_metamorphic.py``; which cases each runs on and its kind are its ``[relations.NAME]`` table in
``cases/metamorphic.toml`` (read by the suites' loader, parametrized by the suites' plugin like every
suite); a tolerance relation's sides, judged against goldens the store keeps, are
:mod:`mlaconf.golden.building.relations`'s, so ``mlaconf regen metamorphic`` builds them ahead.

A relation fails for one of two reasons, and says which (:class:`Relation`):

* **broken**: two outputs of the backend disagree where the relation says they must not (an exact
  relation's outputs differ in a valid bit), or the backend rejected one side;
* **conformance**: a side of a tolerance relation fails its own float64 golden under the run's
  policy.  That is the conformance failure of that side, reported as such (the message and the
  record's ``conformance_failures``), never as a second, relational bug; the test still fails.
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Callable
from typing import Any

import numpy as np

from mlaconf.facts.operator import V_DIM
from mlaconf.golden.building.inputs import case_rng, generate_inputs, round_to
from mlaconf.golden.building.relations import SIDES, Side
from mlaconf.golden.specs.layout import row_valid
from mlaconf.golden.specs.spec import CaseSpec
from mlaconf.golden.specs.suites import RelationTable
from mlaconf.golden.specs.types import GoldenCase, OpInputs
from mlaconf.golden.store.bundles import save_bundle
from mlaconf.golden.store.directory import GoldenStore
from mlaconf.harness.backend import Backend, BackendError
from mlaconf.judge.deviations import Deviation, DeviationSet
from mlaconf.judge.metrics import locate
from mlaconf.judge.policy import PolicySet
from mlaconf.judge.verdict import Outcome, judge_output, mode_text, outcome_message, outcome_of
from mlaconf.reports.records import RelationEvidence
from mlaconf.reports.relations import conformance_text
from mlaconf.runner.ending import Ending, end, side_failure
from mlaconf.runner.execution import BackendOutputError, execute, make_call, output_digest
from mlaconf.runner.recording import MlaReport

# -- one relation test -----------------------------------------------------------------------------


class Relation:
    """One relation test: its spec and generated inputs, the backend and the run's tolerance policy,
    and what went wrong so far; :meth:`finish` ends the test with numbers, case and mode and makes
    its record (the relation, its kind, the largest difference, every problem)."""

    def __init__(
        self,
        name: str,
        table: RelationTable,
        spec: CaseSpec,
        backend: Backend,
        policy_set: PolicySet,
        policy: str,
        deviations: DeviationSet,
        report: MlaReport,
        store: GoldenStore,
    ) -> None:
        self.name = name
        self.table = table
        self.kind = table.kind
        self.spec = spec
        self.store = store
        self.backend = backend
        self.policy_set = policy_set
        self.policy = policy
        self.report = report
        self.inputs = generate_inputs(spec)
        #: Where two outputs disagree that must not (exact differences, a rejected side).
        self.broken: list[str] = []
        #: Sides that fail their own golden: ``{side, worst_slack, summary}``.
        self.conformance: list[dict[str, Any]] = []
        #: How the related outputs differ, told beside a conformance failure (no problem by itself).
        self.notes: list[str] = []
        self.deviation: Deviation | None = deviations.match(backend.name, backend.info().version, spec)
        self.max_abs_diff: float | None = None
        self.differing: int | None = None
        #: Digest of every compared output's valid rows, in order: equal across runs = same outputs.
        self.outputs = hashlib.sha256()
        self.compared = 0

    @property
    def failed(self) -> bool:
        """Whether the relation broke or a side failed its golden: either fails the test."""
        return bool(self.broken or self.conformance)

    def attempt(self, label: str, action: Callable[[], np.ndarray]) -> np.ndarray | None:
        """Run the backend; a rejection or a non-tensor output breaks the relation, not the test."""
        try:
            return action()
        except BackendError as exc:
            self.broken.append(f"{label}: backend raised {exc}")
        except BackendOutputError as exc:
            self.broken.append(f"{label}: interface contract broken: {exc}")
        return None

    def run(self, label: str, inputs: OpInputs, spec: CaseSpec) -> np.ndarray | None:
        """The backend's ``[T, H, 128]`` output on one side, None when it failed (recorded)."""
        return self.attempt(label, lambda: run(self.backend, inputs, spec))

    def sides(self) -> list[Side]:
        """The tolerance relation's sides on this case, the first the case itself (the ones regen builds)."""
        return SIDES[self.table.name](self.spec, self.inputs)

    def golden(self, side: Side) -> GoldenCase:
        """A side's golden from the run's store, built there on demand when regen has not built it."""
        if side.derived:
            save_bundle(side.bundle(), self.store.root)
        return self.store.ensure(side.case)

    def run_side(self, side: Side) -> np.ndarray | None:
        """The backend's output on one side (:meth:`run`)."""
        return self.run(side.label, side.inputs, side.spec)

    def judge(self, side: Side, out: np.ndarray) -> bool:
        """Whether one side's output passes the policy against its own float64 golden; a side that
        does not is recorded as a conformance failure of that side."""
        _, verdict = judge_output(self.golden(side), out, self.policy_set, self.policy, self.backend.name)
        if not verdict.passed:
            self.conformance.append(side_failure(side.label, verdict))
        return verdict.passed

    def compare(self, a: np.ndarray, b: np.ndarray, spec: CaseSpec, *, exact: bool, label: str = "") -> str | None:
        """:func:`difference` of two outputs, which breaks an ``exact`` relation when there is one
        (prefixed by ``label``); the largest difference is kept as the record's evidence."""
        valid = row_valid(spec)
        for out in (a, b):
            self.outputs.update(output_digest(out[valid]).encode())
        self.compared += 1
        count, gap = difference_stats(a, b, spec)
        if self.differing is None or count > self.differing:
            self.differing = count
        if count and (self.max_abs_diff is None or gap > self.max_abs_diff):
            self.max_abs_diff = gap
        found = difference(a, b, spec, exact=exact)
        if exact and found:
            self.broken.append(f"{label}: {found}" if label else found)
        return found

    def note_difference(self, a: np.ndarray, b: np.ndarray, spec: CaseSpec) -> None:
        """Compare two outputs of a tolerance relation; how they differ is told when a side failed."""
        found = self.compare(a, b, spec, exact=False)
        if self.conformance and found:
            self.notes.append(f"related outputs: {found}")

    def tolerance_pair(self, first: Side, second: Side) -> None:
        """Run both sides, judge each against its own golden and compare the outputs (the second side
        aligns the first output onto its rows and heads)."""
        out_first = self.run_side(first)
        out_second = self.run_side(second)
        if out_first is None or out_second is None:
            return
        for side, out in ((first, out_first), (second, out_second)):
            self.judge(side, out)
        self.note_difference(second.align(out_first), out_second, second.spec)

    def detail(self) -> str:
        """The failure in words: the conformance failure that explains it first, then what broke."""
        sides = [f"{conformance_text(c['side'], c['worst_slack'])}: {c['summary']}" for c in self.conformance]
        broken = [f"broken: {problem}" for problem in self.broken]
        return " | ".join([*sides, *broken, *self.notes]) if self.failed else "holds"

    def finish(self) -> None:
        """End the test: the relation held or failed, a known deviation applied by the one rule."""
        outcome = outcome_of(not self.failed, None, self.deviation)
        header = f"metamorphic {self.name} ({self.kind}) on {mode_text(self.spec, self.backend.name)}"
        message = outcome_message(header, outcome, self.detail(), self.deviation)
        conclude_relation(self, outcome, message)


def conclude_relation(relation: Relation, outcome: Outcome, message: str) -> None:
    """End a relation test through the suites' one ending (:func:`mlaconf.runner.ending.end`)."""
    evidence: dict[str, Any] = {
        "difference": RelationEvidence(
            relation.kind, relation.max_abs_diff, relation.differing, tuple(relation.broken)
        ),
        "output_sha256": relation.outputs.hexdigest() if relation.compared else None,
        "device": relation.backend.info().device,
        "deviation": relation.deviation.id if relation.deviation is not None else None,
    }
    if relation.conformance:
        evidence["conformance_failures"] = relation.conformance
    end(relation.report, Ending(outcome, message, evidence))


def run(backend: Backend, inputs: OpInputs, spec: CaseSpec) -> np.ndarray:
    """The backend's output as ``[T, H, 128]`` in the case dtype."""
    out = execute(backend, make_call(inputs, spec), spec).out
    return out.reshape(spec.total_q, spec.head_num, V_DIM)


def difference_stats(a: np.ndarray, b: np.ndarray, spec: CaseSpec) -> tuple[int, float]:
    """How many valid elements of two ``[T, H, 128]`` outputs differ in bits, and the largest
    absolute difference among them (inf where only one is NaN; 0.0 when none differ)."""
    valid = np.broadcast_to(row_valid(spec)[:, None, None], a.shape)
    differ = valid & (a.view(np.uint16) != b.view(np.uint16))
    if not differ.any():
        return 0, 0.0
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    with np.errstate(invalid="ignore"):
        gap = np.where(np.isnan(a64) ^ np.isnan(b64), np.inf, np.nan_to_num(np.abs(a64 - b64), nan=0.0))
    return int(differ.sum()), float(np.where(differ, gap, -1.0).max())


def difference(a: np.ndarray, b: np.ndarray, spec: CaseSpec, *, exact: bool) -> str | None:
    """Compare the bit patterns of two ``[T, H, 128]`` outputs on valid rows.

    Describes the differing elements (count, largest difference, where); bit-identical outputs
    give None for an ``exact`` relation and a note saying so for a tolerance one (whose failure
    message it completes).
    """
    valid = np.broadcast_to(row_valid(spec)[:, None, None], a.shape)
    differ = valid & (a.view(np.uint16) != b.view(np.uint16))
    if not differ.any():
        return None if exact else "bit-identical"
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    with np.errstate(invalid="ignore"):
        gap = np.where(np.isnan(a64) ^ np.isnan(b64), np.inf, np.nan_to_num(np.abs(a64 - b64), nan=0.0))
    gap = np.where(differ, gap, -1.0)
    token, head, col = (int(i) for i in np.unravel_index(int(np.argmax(gap)), gap.shape))
    where = locate(token, head, col, spec.q_seqlen)
    return (
        f"{int(differ.sum())} of {int(valid.sum())} elements differ, max |diff| {gap.max():.4g} at "
        f"batch {where.batch} row {where.row_in_batch} head {head} col {col} "
        f"({float(a64[token, head, col]):.6g} vs {float(b64[token, head, col]):.6g})"
    )


# -- the exact relations' transforms (no golden judges them) ---------------------------------------


def widen_padding(inputs: OpInputs, spec: CaseSpec, extra: int) -> OpInputs:
    """Padded kv with ``extra`` more rows of garbage per batch: S larger than max(kvSeqLen)."""
    rng = case_rng(spec)
    changed = {}
    for name in ("k", "k_rope", "v"):
        array = getattr(inputs, name)
        shape = (array.shape[0], extra, array.shape[2])
        fill = round_to(rng.uniform(2.0, 4.0, shape) * rng.choice([-1.0, 1.0], shape), spec.dtype)
        changed[name] = np.ascontiguousarray(np.concatenate([array, fill], axis=1))
    return dataclasses.replace(inputs, **changed)


def poison_padding(inputs: OpInputs, spec: CaseSpec, kind: str) -> OpInputs:
    """Padded kv with every row at or beyond kvSeqLen replaced by ``kind``: 'garbage' or 'nan'."""
    rng = case_rng(spec)
    changed = {}
    for name in ("k", "k_rope", "v"):
        array = getattr(inputs, name).copy()
        for b, length in enumerate(spec.kv_seqlen):
            pad = array[b, length:]
            if kind == "nan":
                fill = np.full(pad.shape, np.nan)
            else:  # finite, representable in fp16 and bf16, and unlike the generator's +-[2, 4)
                fill = rng.uniform(100.0, 1000.0, pad.shape) * rng.choice([-1.0, 1.0], pad.shape)
            array[b, length:] = round_to(fill, spec.dtype)
        changed[name] = array
    return dataclasses.replace(inputs, **changed)
