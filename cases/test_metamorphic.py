"""Metamorphic relations: invariances every correct MLA prefill has, which tolerances can miss.

Each test transforms a case's inputs, runs the backend on both versions and states its kind:

* **exact**: the two outputs must be bit-identical on every valid row (rows of zero-length
  batches are "don't care").  Used where the backend sees the same numbers in the same memory, or
  only numbers it must never read: q layout 2-D vs 3-D, padding contents, reruns.
* **tolerance**: the transformed input is a different but equivalent problem whose arithmetic a
  kernel may legitimately order differently (batch order, head order, kv layout, batch
  composition, a prefix cache for the earlier tokens), so both outputs are judged against their own
  float64 golden, computed here, with the run's tolerance policy (``--mla-policy``); no new threshold
  is invented.  Failure messages still report the largest difference between the related outputs.

Cases are a handful of small specs (fp16/bf16, maskType 0/2/3, GQA, 2-D/3-D q, padded/packed kv);
``--mla-seeds`` reseeds them like the conformance suite.  A case covered by a known deviation of the
backend turns a failure into an xfail.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import numpy as np
import pytest

from mlaconf.facts.operator import V_DIM
from mlaconf.golden.inputs import generate_inputs
from mlaconf.golden.spec import CaseSpec, SpecError
from mlaconf.golden.spec_build import build_case
from mlaconf.golden.suites import read_toml, suites_dir
from mlaconf.harness.backend import Backend
from mlaconf.judge.deviations import DeviationSet
from mlaconf.judge.policy import PolicySet
from mlaconf.runner.applicability import not_applicable
from mlaconf.runner.collect import MlaReport
from mlaconf.runner.execution import execute, make_call
from mlaconf.runner.identity import policy_name
from mlaconf.runner.metamorphic import (
    Problems,
    attempt,
    judged,
    permute_heads,
    poison_padding,
    query_chunk,
    rotation,
    run,
    select_batches,
    token_map,
    tolerance_pair,
    widen_padding,
)
from mlaconf.runner.selection import runs_metamorphic

pytestmark = pytest.mark.metamorphic

RERUNS = 5

PADDING_EXTRA_ROWS = 37
#: The suite's named specs and, per relation (a test function less ``test_``), the specs it runs on.
CASES_FILE = suites_dir() / "metamorphic.toml"


def _cases_error(field_name: str, message: str) -> SpecError:
    return SpecError(str(CASES_FILE), "<file>", field_name, message)


@functools.cache
def _cases() -> tuple[dict[str, Any], dict[str, list[str]]]:
    """The named specs and each relation's spec names, read once per process."""
    document = read_toml(CASES_FILE, _cases_error)
    specs, relations = document.get("spec", {}), document.get("relations", {})
    for relation, names in relations.items():
        unknown = [name for name in names if name not in specs]
        if unknown:
            raise _cases_error(f"relations.{relation}", f"names no [spec.*] table: {', '.join(unknown)}")
    return specs, relations


def _spec(name: str, seed: int | None) -> CaseSpec:
    raw = dict(_cases()[0][name], suite="metamorphic")
    if seed is not None:
        raw["seed"] = seed
    return build_case(raw, source=f"{CASES_FILE}:{name}")


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    names = _cases()[1].get(metafunc.function.__name__.removeprefix("test_"))
    if names is None:
        return
    option = metafunc.config.getoption("mla_seeds")
    seeds: list[int | None] = [int(s) for s in option.split(",") if s.strip()] if option else [None]
    # deselected as an empty parameter set unless the run selects this suite (runner.selection)
    specs = [_spec(name, seed) for name in names for seed in seeds] if runs_metamorphic(metafunc.config) else []
    metafunc.parametrize(
        "mla_meta_spec",
        [
            pytest.param(s, id=s.case_id, marks=[getattr(pytest.mark, s.dtype), getattr(pytest.mark, s.mask_name)])
            for s in specs
        ],
    )


def test_batch_order(
    mla_meta_spec: CaseSpec,
    mla_backend: Backend,
    mla_policy_set: PolicySet,
    mla_deviation_set: DeviationSet,
    pytestconfig: pytest.Config,
    mla_report: MlaReport,
) -> None:
    """Tolerance: rotating the batch order permutes the output rows; both outputs pass the policy."""
    problems = Problems("batch order", "tolerance", mla_meta_spec, mla_backend, mla_deviation_set, mla_report)
    inputs = generate_inputs(mla_meta_spec)
    order = rotation(mla_meta_spec.batch)
    new_inputs, new_spec = select_batches(inputs, mla_meta_spec, order, trim=False)
    tolerance_pair(
        problems,
        mla_backend,
        mla_policy_set,
        policy_name(pytestconfig),
        ("original", inputs, mla_meta_spec),
        (f"batch order {order}", new_inputs, new_spec),
        lambda out: out[token_map(mla_meta_spec, order)],
    )
    problems.finish()


def test_head_order(
    mla_meta_spec: CaseSpec,
    mla_backend: Backend,
    mla_policy_set: PolicySet,
    mla_deviation_set: DeviationSet,
    pytestconfig: pytest.Config,
    mla_report: MlaReport,
) -> None:
    """Tolerance: permuting kv heads, and query heads consistently within their GQA groups, permutes
    the output heads; both outputs pass the policy."""
    problems = Problems("head order", "tolerance", mla_meta_spec, mla_backend, mla_deviation_set, mla_report)
    inputs = generate_inputs(mla_meta_spec)
    new_inputs, q_heads = permute_heads(inputs, mla_meta_spec)
    tolerance_pair(
        problems,
        mla_backend,
        mla_policy_set,
        policy_name(pytestconfig),
        ("original", inputs, mla_meta_spec),
        (f"heads {q_heads.tolist()}", new_inputs, mla_meta_spec),
        lambda out: out[:, q_heads],
    )
    problems.finish()


def test_q_layout(
    mla_meta_spec: CaseSpec, mla_backend: Backend, mla_deviation_set: DeviationSet, mla_report: MlaReport
) -> None:
    """Exact: q/qRope as ``[T, H*D]`` or ``[T, H, D]`` are the same bytes, so attenOut is too."""
    problems = Problems("q layout 2-D vs 3-D", "exact", mla_meta_spec, mla_backend, mla_deviation_set, mla_report)
    other = "3d" if mla_meta_spec.q_layout == "2d" else "2d"
    inputs = generate_inputs(mla_meta_spec)
    t, h = mla_meta_spec.total_q, mla_meta_spec.head_num
    shape = (lambda d: (t, h * d)) if other == "2d" else (lambda d: (t, h, d))
    new_inputs = dataclasses.replace(inputs, q=inputs.q.reshape(shape(128)), q_rope=inputs.q_rope.reshape(shape(64)))
    new_spec = dataclasses.replace(mla_meta_spec, q_layout=other)
    base = attempt(problems, lambda: run(mla_backend, inputs, mla_meta_spec), "original")
    flipped = attempt(problems, lambda: run(mla_backend, new_inputs, new_spec), f"q layout {other}")
    if base is not None and flipped is not None:
        problems.compare(base, flipped, mla_meta_spec, exact=True)
    problems.finish()


def test_padding_contents(
    mla_meta_spec: CaseSpec, mla_backend: Backend, mla_deviation_set: DeviationSet, mla_report: MlaReport
) -> None:
    """Exact: padded kv rows at or beyond kvSeqLen are never read, so other finite garbage or NaN
    there, or 37 more padding rows (S beyond max kvSeqLen: a stride bug), leave every valid output
    bit unchanged."""
    problems = Problems("padding contents", "exact", mla_meta_spec, mla_backend, mla_deviation_set, mla_report)
    inputs = generate_inputs(mla_meta_spec)
    base = attempt(problems, lambda: run(mla_backend, inputs, mla_meta_spec), "original")
    for kind in ("garbage", "nan"):
        poisoned = poison_padding(inputs, mla_meta_spec, kind)
        out = attempt(problems, functools.partial(run, mla_backend, poisoned, mla_meta_spec), f"{kind} padding")
        if base is not None and out is not None:
            problems.compare(base, out, mla_meta_spec, exact=True, label=f"{kind} padding")
    wider = widen_padding(inputs, mla_meta_spec, PADDING_EXTRA_ROWS)
    out = attempt(problems, lambda: run(mla_backend, wider, mla_meta_spec), f"S + {PADDING_EXTRA_ROWS} padding rows")
    if base is not None and out is not None:
        problems.compare(base, out, mla_meta_spec, exact=True, label=f"S + {PADDING_EXTRA_ROWS} padding rows")
    problems.finish()


def test_padded_vs_packed(
    mla_meta_spec: CaseSpec,
    mla_backend: Backend,
    mla_policy_set: PolicySet,
    mla_deviation_set: DeviationSet,
    pytestconfig: pytest.Config,
    mla_report: MlaReport,
) -> None:
    """Tolerance: with uniform kv lengths ``[B, S, N*D]`` and ``[B*S, N, D]`` hold the same keys in
    the same bytes; both layouts' outputs pass the policy (kernels may take different paths)."""
    problems = Problems("padded vs packed kv", "tolerance", mla_meta_spec, mla_backend, mla_deviation_set, mla_report)
    inputs = generate_inputs(mla_meta_spec)
    n = mla_meta_spec.kv_head_num
    packed = dataclasses.replace(
        inputs, **{name: getattr(inputs, name).reshape(mla_meta_spec.total_kv, n, -1) for name in ("k", "k_rope", "v")}
    )
    packed_spec = dataclasses.replace(mla_meta_spec, kv_layout="packed")
    tolerance_pair(
        problems,
        mla_backend,
        mla_policy_set,
        policy_name(pytestconfig),
        ("padded", inputs, mla_meta_spec),
        ("packed", packed, packed_spec),
        lambda out: out,
    )
    problems.finish()


def test_alone_vs_batch(
    mla_meta_spec: CaseSpec,
    mla_backend: Backend,
    mla_policy_set: PolicySet,
    mla_deviation_set: DeviationSet,
    pytestconfig: pytest.Config,
    mla_report: MlaReport,
) -> None:
    """Tolerance: each sequence run alone (padded S cut to its own length) and within the batch;
    every output passes the policy."""
    problems = Problems("alone vs batch", "tolerance", mla_meta_spec, mla_backend, mla_deviation_set, mla_report)
    policy = policy_name(pytestconfig)
    inputs = generate_inputs(mla_meta_spec)
    base = attempt(problems, lambda: run(mla_backend, inputs, mla_meta_spec), "batch")
    if base is not None:
        problems.add(judged("batch", base, inputs, mla_meta_spec, mla_backend, mla_policy_set, policy))
    for b, (q_len, kv_len) in enumerate(zip(mla_meta_spec.q_seqlen, mla_meta_spec.kv_seqlen, strict=True)):
        if q_len == 0 or kv_len == 0:
            continue
        one_inputs, one_spec = select_batches(inputs, mla_meta_spec, [b], trim=True)
        alone = attempt(problems, functools.partial(run, mla_backend, one_inputs, one_spec), f"batch {b} alone")
        if alone is None:
            continue
        verdict = judged(f"batch {b} alone", alone, one_inputs, one_spec, mla_backend, mla_policy_set, policy)
        problems.add(verdict)
        if base is not None:
            found = problems.compare(base[token_map(mla_meta_spec, [b])], alone, one_spec, exact=False)
            problems.add(found if verdict else None)
    problems.finish()


def test_determinism(
    mla_meta_spec: CaseSpec, mla_backend: Backend, mla_deviation_set: DeviationSet, mla_report: MlaReport
) -> None:
    """Exact: five runs of the same call give bit-identical valid rows (backends that declare
    ``deterministic = False`` are skipped)."""
    if not mla_backend.deterministic:
        not_applicable(f"backend {mla_backend.name} declares deterministic = False")
    problems = Problems("determinism", "exact", mla_meta_spec, mla_backend, mla_deviation_set, mla_report)
    call = make_call(generate_inputs(mla_meta_spec), mla_meta_spec)
    shape = (mla_meta_spec.total_q, mla_meta_spec.head_num, V_DIM)
    outs = [
        attempt(problems, lambda: execute(mla_backend, call, mla_meta_spec).out.reshape(shape), f"run {i + 1}")
        for i in range(RERUNS)
    ]
    first = outs[0]
    for i, out in enumerate(outs[1:], start=2):
        if first is not None and out is not None:
            problems.compare(first, out, mla_meta_spec, exact=True, label=f"run {i} vs run 1")
    problems.finish()


def test_chunked_prefill(
    mla_meta_spec: CaseSpec,
    mla_backend: Backend,
    mla_policy_set: PolicySet,
    mla_deviation_set: DeviationSet,
    pytestconfig: pytest.Config,
    mla_report: MlaReport,
) -> None:
    """Tolerance: a causal prefill of each sequence's last tokens with the earlier ones as a prefix
    (a different length per batch, so a different bottom-right offset) gives the last rows of the
    one causal prefill over all of them; both outputs pass the policy."""
    problems = Problems("chunked prefill", "tolerance", mla_meta_spec, mla_backend, mla_deviation_set, mla_report)
    inputs = generate_inputs(mla_meta_spec)
    last = [min(q, q // (b + 2) + 3) for b, q in enumerate(mla_meta_spec.q_seqlen)]
    starts = [q - n for q, n in zip(mla_meta_spec.q_seqlen, last, strict=True)]
    chunk_inputs, chunk_spec, rows = query_chunk(inputs, mla_meta_spec, starts, list(mla_meta_spec.q_seqlen))
    tolerance_pair(
        problems,
        mla_backend,
        mla_policy_set,
        policy_name(pytestconfig),
        ("one prefill", inputs, mla_meta_spec),
        (f"last {last} tokens after a prefix of {list(chunk_spec.kv_seqlen)} - {last}", chunk_inputs, chunk_spec),
        lambda out: out[rows],
    )
    problems.finish()


def test_split_queries(
    mla_meta_spec: CaseSpec,
    mla_backend: Backend,
    mla_policy_set: PolicySet,
    mla_deviation_set: DeviationSet,
    pytestconfig: pytest.Config,
    mla_report: MlaReport,
) -> None:
    """Tolerance: each sequence's queries split into two calls, the second with the first's tokens
    as its prefix, give the rows of the one call; all three outputs pass the policy."""
    problems = Problems("split queries", "tolerance", mla_meta_spec, mla_backend, mla_deviation_set, mla_report)
    policy = policy_name(pytestconfig)
    inputs = generate_inputs(mla_meta_spec)
    split = [max(1, min(q - 1, 3 * q // 8 + b)) for b, q in enumerate(mla_meta_spec.q_seqlen)]
    zeros, ends = [0] * mla_meta_spec.batch, list(mla_meta_spec.q_seqlen)
    parts = {
        "first part": query_chunk(inputs, mla_meta_spec, zeros, split),
        "second part": query_chunk(inputs, mla_meta_spec, split, ends),
    }
    base = attempt(problems, lambda: run(mla_backend, inputs, mla_meta_spec), "one call")
    if base is not None:
        problems.add(judged("one call", base, inputs, mla_meta_spec, mla_backend, mla_policy_set, policy))
    joined = None if base is None else np.empty_like(base)
    for label, (part_inputs, part_spec, rows) in parts.items():
        label = f"{label} (queries {'up to' if label == 'first part' else 'from'} {split})"
        out = attempt(problems, functools.partial(run, mla_backend, part_inputs, part_spec), label)
        if out is None:
            joined = None
            continue
        problems.add(judged(label, out, part_inputs, part_spec, mla_backend, mla_policy_set, policy))
        if joined is not None:
            joined[rows] = out
    if base is not None and joined is not None:
        found = problems.compare(base, joined, mla_meta_spec, exact=False)
        if problems.items:
            problems.add(found)
    problems.finish()
