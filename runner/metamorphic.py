"""Metamorphic relations' machinery: run both sides, compare, describe, and the input transforms.

The relations themselves (which transform, which cases, exact or tolerance) are the tests in
``cases/test_metamorphic.py``; this module is what they share.
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Callable

import numpy as np

from mlaconf.facts.operator import CAUSAL, V_DIM
from mlaconf.golden.generate import build_golden
from mlaconf.golden.inputs import case_rng, round_to
from mlaconf.golden.layout import offsets, row_valid
from mlaconf.golden.spec import CaseSpec
from mlaconf.golden.types import GoldenCase, OpInputs
from mlaconf.harness.backend import Backend, BackendError
from mlaconf.judge.deviations import Deviation, DeviationSet
from mlaconf.judge.metrics import locate
from mlaconf.judge.policy import PolicySet
from mlaconf.judge.verdict import judge_output, mode_text, outcome_message, outcome_of
from mlaconf.reports.records import RelationEvidence
from mlaconf.runner.collect import MlaReport
from mlaconf.runner.execution import BackendOutputError, array_digest, execute, make_call

# -- running and comparing -------------------------------------------------------------------------


class Problems:
    """Collects what went wrong in one relation; ends the test with numbers, case and mode, and
    attaches its record (the relation, its kind, the largest difference, every problem)."""

    def __init__(
        self,
        relation: str,
        kind: str,
        spec: CaseSpec,
        backend: Backend,
        deviations: DeviationSet,
        report: MlaReport,
    ) -> None:
        self.header = f"metamorphic {relation} ({kind}) on {mode_text(spec, backend.name)}"
        self.kind = kind
        self.items: list[str] = []
        self.deviation: Deviation | None = deviations.match(backend.name, backend.info().version, spec)
        self.report = report
        self.device = backend.info().device
        self.max_abs_diff: float | None = None
        self.differing: int | None = None
        #: Digest of every compared output's valid rows, in order: equal across runs = same outputs.
        self.outputs = hashlib.sha256()
        self.compared = 0

    def add(self, text: str | None) -> None:
        if text:
            self.items.append(text)

    def compare(self, a: np.ndarray, b: np.ndarray, spec: CaseSpec, *, exact: bool, label: str = "") -> str | None:
        """:func:`difference` of two outputs, added as a problem (prefixed by ``label``) when an
        exact relation finds one; the largest difference is kept as the record's evidence."""
        valid = row_valid(spec)
        for out in (a, b):
            self.outputs.update(array_digest(out[valid]).encode())
        self.compared += 1
        count, gap = difference_stats(a, b, spec)
        if self.differing is None or count > self.differing:
            self.differing = count
        if count and (self.max_abs_diff is None or gap > self.max_abs_diff):
            self.max_abs_diff = gap
        found = difference(a, b, spec, exact=exact)
        if exact and found:
            self.add(f"{label}: {found}" if label else found)
        return found

    def finish(self) -> None:
        """End the test: the relation held or broke, a known deviation applied by the one rule."""
        holds = not self.items
        outcome = outcome_of(holds, None, self.deviation)
        message = outcome_message(self.header, outcome, "holds" if holds else " | ".join(self.items), self.deviation)
        evidence = RelationEvidence(self.kind, self.max_abs_diff, self.differing, tuple(self.items))
        record = self.report.record(
            verdict=outcome,
            message=message,
            difference=evidence,
            output_sha256=self.outputs.hexdigest() if self.compared else None,
            device=self.device,
            deviation=self.deviation.id if self.deviation is not None else None,
        )
        self.report.conclude(record, outcome, message)


def run(backend: Backend, inputs: OpInputs, spec: CaseSpec) -> np.ndarray:
    """The backend's output as ``[T, H, 128]`` in the case dtype."""
    out = execute(backend, make_call(inputs, spec), spec).out
    return out.reshape(spec.total_q, spec.head_num, V_DIM)


def golden_of(inputs: OpInputs, spec: CaseSpec) -> GoldenCase:
    """A float64 golden (and emulated baseline) for inputs that are not the spec's generated ones."""
    return build_golden(spec, inputs=inputs)


def judged(
    label: str, out: np.ndarray, inputs: OpInputs, spec: CaseSpec, backend: Backend, policy_set: PolicySet, policy: str
) -> str | None:
    """None when ``out`` passes the policy against its own golden, else the verdict's summary."""
    _, verdict = judge_output(golden_of(inputs, spec), out, policy_set, policy, backend.name)
    return None if verdict.passed else f"{label}: {verdict.summary()}"


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
        return None if exact else "outputs bit-identical"
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


def attempt(problems: Problems, action: Callable[[], np.ndarray], label: str) -> np.ndarray | None:
    """Run the backend; a rejection or a non-tensor output is a problem of the relation, not a
    crash of the test."""
    try:
        return action()
    except BackendError as exc:
        problems.add(f"{label}: backend raised {exc}")
    except BackendOutputError as exc:
        problems.add(f"{label}: interface contract broken: {exc}")
    return None


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
    else:
        starts = offsets(spec.kv_seqlen)
        kv_rows = np.concatenate([np.arange(starts[b], starts[b + 1]) for b in order])
        k, kr, v = (t[kv_rows] for t in tensors)
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
        if spec.kv_layout == "packed":
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


# -- the relations ---------------------------------------------------------------------------------

Side = tuple[str, OpInputs, CaseSpec]  # label, inputs, spec of one side of a relation


def tolerance_pair(
    problems: Problems,
    backend: Backend,
    policy_set: PolicySet,
    policy: str,
    first: Side,
    second: Side,
    align: Callable[[np.ndarray], np.ndarray],
) -> None:
    """Run both sides, judge each against its own golden; on failure also describe how the outputs
    differ (``align`` maps the first output onto the second's rows and heads)."""

    def run_side(side: Side) -> np.ndarray | None:
        return attempt(problems, lambda: run(backend, side[1], side[2]), side[0])

    out_first, out_second = run_side(first), run_side(second)
    if out_first is None or out_second is None:
        return
    for (label, inputs, spec), out in ((first, out_first), (second, out_second)):
        problems.add(judged(label, out, inputs, spec, backend, policy_set, policy))
    found = problems.compare(align(out_first), out_second, second[2], exact=False)
    if problems.items:
        problems.add(found)
