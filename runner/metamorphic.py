"""Metamorphic relations' machinery: the cases file, one relation test's state, the input transforms.

The relations themselves (which transform, exact or tolerance) are the tests in
``cases/test_metamorphic.py``; which specs each runs on and its kind are ``cases/metamorphic.toml``
(:func:`relation_table`); this module is what they share.

A relation fails for one of two reasons, and says which (:class:`Relation`):

* **broken**: two outputs of the backend disagree where the relation says they must not (an exact
  relation's outputs differ in a valid bit), or the backend rejected one side;
* **conformance**: a side of a tolerance relation fails its own float64 golden under the run's
  policy.  That is the conformance failure of that side, reported as such (the message and the
  record's ``conformance_failures``), never as a second, relational bug; the test still fails.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from mlaconf.facts.operator import CAUSAL, V_DIM
from mlaconf.golden.build.generate import build_golden
from mlaconf.golden.build.inputs import case_rng, generate_inputs, round_to
from mlaconf.golden.specs.layout import offsets, row_valid
from mlaconf.golden.specs.spec import CaseSpec, SpecError
from mlaconf.golden.specs.spec_build import build_case
from mlaconf.golden.specs.suites import read_toml, suites_dir
from mlaconf.golden.specs.types import GoldenCase, OpInputs
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
from mlaconf.runner.selection import reseeded, runs_metamorphic

# -- the cases file --------------------------------------------------------------------------------

#: The suite's named specs and, per relation (a test function less ``test_``), its kind and specs.
RELATIONS_FILE = suites_dir() / "metamorphic.toml"
#: An exact relation's outputs must be bit-identical; a tolerance relation's sides each pass their golden.
KINDS = ("exact", "tolerance")


@dataclasses.dataclass(frozen=True)
class RelationEntry:
    """One ``[relations.NAME]`` table: the relation's kind and the names of the specs it runs on."""

    kind: str
    specs: tuple[str, ...]


def _file_error(field_name: str, message: str) -> SpecError:
    return SpecError(str(RELATIONS_FILE), "<file>", field_name, message)


@functools.cache
def relation_table() -> tuple[dict[str, Any], dict[str, RelationEntry]]:
    """The named specs and every relation's entry, read and checked once per process."""
    document = read_toml(RELATIONS_FILE, _file_error)
    specs, relations = document.get("spec", {}), document.get("relations", {})
    entries: dict[str, RelationEntry] = {}
    for name, table in relations.items():
        where = f"relations.{name}"
        if not isinstance(table, dict) or set(table) != {"kind", "specs"}:
            raise _file_error(where, "expected a table with exactly 'kind' and 'specs'")
        if table["kind"] not in KINDS:
            raise _file_error(f"{where}.kind", f"{table['kind']!r} is not one of {', '.join(KINDS)}")
        names = table["specs"]
        if not isinstance(names, list) or not names or not all(isinstance(n, str) for n in names):
            raise _file_error(f"{where}.specs", "expected a non-empty list of spec names")
        unknown = [n for n in names if n not in specs]
        if unknown:
            raise _file_error(f"{where}.specs", f"names no [spec.*] table: {', '.join(unknown)}")
        entries[name] = RelationEntry(table["kind"], tuple(names))
    return specs, entries


def relation_entry(function: str) -> RelationEntry:
    """The entry of the relation a test function checks (its name less ``test_``)."""
    name = function.removeprefix("test_")
    entry = relation_table()[1].get(name)
    if entry is None:
        raise _file_error(f"relations.{name}", f"no table for the relation test {function}")
    return entry


def relation_params(config: pytest.Config, function: str) -> list[Any]:
    """The specs a relation runs on as parameters, reseeded by ``--mla-seeds`` as every suite is;
    none unless the run selects the metamorphic suite (an empty parameter set deselects the test)."""
    if not runs_metamorphic(config):
        return []
    named = relation_table()[0]
    specs = [
        build_case(dict(named[name], suite="metamorphic"), source=f"{RELATIONS_FILE}:{name}")
        for name in relation_entry(function).specs
    ]
    return [
        pytest.param(s, id=s.case_id, marks=[getattr(pytest.mark, s.dtype), getattr(pytest.mark, s.mask_name)])
        for s in reseeded(config, specs)
    ]


# -- one relation test -----------------------------------------------------------------------------

Side = tuple[str, OpInputs, CaseSpec]  # label, inputs, spec of one side of a relation


class Relation:
    """One relation test: its spec and generated inputs, the backend and the run's tolerance policy,
    and what went wrong so far; :meth:`finish` ends the test with numbers, case and mode and makes
    its record (the relation, its kind, the largest difference, every problem)."""

    def __init__(
        self,
        name: str,
        kind: str,
        spec: CaseSpec,
        backend: Backend,
        policy_set: PolicySet,
        policy: str,
        deviations: DeviationSet,
        report: MlaReport,
    ) -> None:
        self.name = name
        self.kind = kind
        self.spec = spec
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

    def judge(self, label: str, out: np.ndarray, inputs: OpInputs, spec: CaseSpec) -> bool:
        """Whether one side's output passes the policy against its own float64 golden; a side that
        does not is recorded as a conformance failure of that side."""
        _, verdict = judge_output(golden_of(inputs, spec), out, self.policy_set, self.policy, self.backend.name)
        if not verdict.passed:
            self.conformance.append(side_failure(label, verdict))
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

    def tolerance_pair(self, first: Side, second: Side, align: Callable[[np.ndarray], np.ndarray]) -> None:
        """Run both sides, judge each against its own golden and compare the outputs (``align`` maps
        the first output onto the second's rows and heads)."""
        out_first = self.run(*first)
        out_second = self.run(*second)
        if out_first is None or out_second is None:
            return
        for (label, inputs, spec), out in ((first, out_first), (second, out_second)):
            self.judge(label, out, inputs, spec)
        self.note_difference(align(out_first), out_second, second[2])

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


def golden_of(inputs: OpInputs, spec: CaseSpec) -> GoldenCase:
    """A float64 golden (and emulated baseline) for inputs that are not the spec's generated ones."""
    return build_golden(spec, inputs=inputs)


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
