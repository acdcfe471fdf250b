"""Metamorphic relations: invariances every correct MLA prefill has, which tolerances can miss.

Each test transforms a case's inputs and runs the backend on both versions; its kind and cases are
its ``[relations.NAME]`` table in ``cases/metamorphic.toml`` (NAME: the function less ``test_``), and the
suites' plugin parametrizes it over them as it does every suite (``mla_relation_case``):

* **exact**: the two outputs must be bit-identical on every valid row (rows of zero-length
  batches are "don't care").  Used where the backend sees the same numbers in the same memory, or
  only numbers it must never read: q layout 2-D vs 3-D, padding contents, reruns.  Differing
  outputs break the relation.
* **tolerance**: the transformed input is a different but equivalent problem whose arithmetic a
  kernel may legitimately order differently (batch order, head order, kv layout, batch
  composition, a prefix cache for the earlier tokens), so both outputs are judged against their own
  float64 golden with the run's tolerance policy (``--mla-policy``); no new threshold is invented.  The
  sides are :data:`mlaconf.golden.building.relations.SIDES`, whose goldens ``mlaconf regen metamorphic``
  builds ahead (else the run builds them once, into the store).  A side that fails its golden fails
  the test as that side's conformance failure (not as a broken relation); the message also reports
  how the related outputs differ.

Every test takes the one ``relation`` fixture (:class:`mlaconf.runner.metamorphic.Relation`) and
ends with ``relation.finish()``; ``--mla-seeds`` reseeds the cases as it reseeds the conformance
suite.  A case covered by a known deviation of the backend turns a failure into an xfail.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from mlaconf.facts.operator import V_DIM
from mlaconf.golden.specs.spec import CaseSpec
from mlaconf.golden.store.directory import GoldenStore
from mlaconf.harness.backend import Backend
from mlaconf.judge.deviations import DeviationSet
from mlaconf.judge.policy import PolicySet
from mlaconf.runner.applicability import not_applicable
from mlaconf.runner.execution import execute, make_call
from mlaconf.runner.identity import policy_name, relation_name
from mlaconf.runner.metamorphic import Relation, poison_padding, widen_padding
from mlaconf.runner.recording import MlaReport
from mlaconf.runner.selection import relation_table

pytestmark = pytest.mark.metamorphic

RERUNS = 5

PADDING_EXTRA_ROWS = 37


@pytest.fixture
def relation(
    request: pytest.FixtureRequest,
    mla_relation_case: CaseSpec,
    mla_backend: Backend,
    mla_policy_set: PolicySet,
    mla_deviation_set: DeviationSet,
    mla_report: MlaReport,
    mla_golden_store: GoldenStore,
) -> Relation:
    """The running relation: its name is the record's (one source: the test function's name)."""
    return Relation(
        relation_name(request.function.__name__),
        relation_table(request.function.__name__),
        mla_relation_case,
        mla_backend,
        mla_policy_set,
        policy_name(request.config),
        mla_deviation_set,
        mla_report,
        mla_golden_store,
    )


def test_batch_order(relation: Relation) -> None:
    """Rotating the batch order permutes the output rows; both outputs pass the policy."""
    relation.tolerance_pair(*relation.sides())
    relation.finish()


def test_head_order(relation: Relation) -> None:
    """Permuting kv heads, and query heads consistently within their GQA groups, permutes the
    output heads; both outputs pass the policy."""
    relation.tolerance_pair(*relation.sides())
    relation.finish()


def test_q_layout(relation: Relation) -> None:
    """q/qRope as ``[T, H*D]`` or ``[T, H, D]`` are the same bytes, so attenOut is too."""
    spec, inputs = relation.spec, relation.inputs
    other = "3d" if spec.q_layout == "2d" else "2d"
    t, h = spec.total_q, spec.head_num
    shape = (lambda d: (t, h * d)) if other == "2d" else (lambda d: (t, h, d))
    new_inputs = dataclasses.replace(inputs, q=inputs.q.reshape(shape(128)), q_rope=inputs.q_rope.reshape(shape(64)))
    base = relation.run("original", inputs, spec)
    flipped = relation.run(f"q layout {other}", new_inputs, dataclasses.replace(spec, q_layout=other))
    if base is not None and flipped is not None:
        relation.compare(base, flipped, spec, exact=True)
    relation.finish()


def test_padding_contents(relation: Relation) -> None:
    """Padded kv rows at or beyond kvSeqLen are never read, so other finite garbage or NaN there,
    or 37 more padding rows (S beyond max kvSeqLen: a stride bug), leave every valid output bit
    unchanged."""
    spec, inputs = relation.spec, relation.inputs
    base = relation.run("original", inputs, spec)
    variants = {f"{kind} padding": poison_padding(inputs, spec, kind) for kind in ("garbage", "nan")}
    variants[f"S + {PADDING_EXTRA_ROWS} padding rows"] = widen_padding(inputs, spec, PADDING_EXTRA_ROWS)
    for label, changed in variants.items():
        out = relation.run(label, changed, spec)
        if base is not None and out is not None:
            relation.compare(base, out, spec, exact=True, label=label)
    relation.finish()


def test_padded_vs_packed(relation: Relation) -> None:
    """With uniform kv lengths ``[B, S, N*D]`` and ``[B*S, N, D]`` hold the same keys in the same
    bytes; both layouts' outputs pass the policy (kernels may take different paths)."""
    relation.tolerance_pair(*relation.sides())
    relation.finish()


def test_alone_vs_batch(relation: Relation) -> None:
    """Each sequence run alone (padded S cut to its own length) and within the batch; every output
    passes the policy."""
    batch, *alone_sides = relation.sides()
    base = relation.run_side(batch)
    if base is not None:
        relation.judge(batch, base)
    for side in alone_sides:
        alone = relation.run_side(side)
        if alone is None:
            continue
        relation.judge(side, alone)
        if base is not None:
            relation.note_difference(side.align(base), alone, side.spec)
    relation.finish()


def test_determinism(relation: Relation) -> None:
    """Five runs of the same call give bit-identical valid rows (backends that declare
    ``deterministic = False`` are skipped)."""
    spec, backend = relation.spec, relation.backend
    if not backend.deterministic:
        not_applicable(f"backend {backend.name} declares deterministic = False")
    call = make_call(relation.inputs, spec)
    shape = (spec.total_q, spec.head_num, V_DIM)
    outs = [
        relation.attempt(f"run {i + 1}", lambda: execute(backend, call, spec).out.reshape(shape)) for i in range(RERUNS)
    ]
    first = outs[0]
    for i, out in enumerate(outs[1:], start=2):
        if first is not None and out is not None:
            relation.compare(first, out, spec, exact=True, label=f"run {i} vs run 1")
    relation.finish()


def test_chunked_prefill(relation: Relation) -> None:
    """A causal prefill of each sequence's last tokens with the earlier ones as a prefix (a
    different length per batch, so a different bottom-right offset) gives the last rows of the one
    causal prefill over all of them; both outputs pass the policy."""
    relation.tolerance_pair(*relation.sides())
    relation.finish()


def test_split_queries(relation: Relation) -> None:
    """Each sequence's queries split into two calls, the second with the first's tokens as its
    prefix, give the rows of the one call; all three outputs pass the policy."""
    one_call, *parts = relation.sides()
    base = relation.run_side(one_call)
    if base is not None:
        relation.judge(one_call, base)
    joined: np.ndarray | None = None if base is None else np.empty_like(base)
    for part in parts:
        out = relation.run_side(part)
        if out is None:
            joined = None
            continue
        relation.judge(part, out)
        if joined is not None:
            joined[part.rows] = out
    if base is not None and joined is not None:
        relation.note_difference(base, joined, relation.spec)
    relation.finish()
