"""Metamorphic relations: invariances every correct MLA prefill has, which tolerances can miss.

Each test transforms a case's inputs, runs the backend on both versions and states its kind:

* **exact**: the two outputs must be bit-identical on every valid row (rows of zero-length
  batches are "don't care").  Used where the backend sees the same numbers in the same memory, or
  only numbers it must never read: q layout 2-D vs 3-D, padding contents, reruns.
* **tolerance**: the transformed input is a different but equivalent problem whose arithmetic a
  kernel may legitimately order differently (batch order, head order, kv layout, batch
  composition), so both outputs are judged against their own float64 golden, computed here, with
  the run's tolerance policy (``--policy``); no new threshold is invented.  Failure messages still
  report the largest difference between the related outputs.

Cases are a handful of small specs (fp16/bf16, maskType 0/2/3, GQA, 2-D/3-D q, padded/packed kv);
``--seeds`` reseeds them like the conformance suite.  A case covered by a known deviation of the
backend turns a failure into an xfail.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import numpy as np
import pytest

from cases.conformance import judge_output, mode_text
from cases.deviations import Deviation, DeviationSet
from cases.execution import execute, make_call
from cases.policy import PolicySet
from golden.generate import build_golden
from golden.inputs import case_rng, generate_inputs, round_to
from golden.layout import offsets, row_valid
from golden.metrics import locate
from golden.spec import V_DIM, CaseSpec, build_case
from golden.types import GoldenCase, OpInputs
from harness.backend import Backend, BackendError

pytestmark = pytest.mark.metamorphic

RERUNS = 5

#: Small representative cases; the relations below pick the ones they apply to.
SPECS: dict[str, dict[str, object]] = {
    "fp16-undefined": dict(q_seqlen=[37, 64, 19], head_num=4, dtype="fp16", mask_type=0, q_layout="3d",
                           kv_layout="packed", seed=21),
    "bf16-mask_free": dict(q_seqlen=[50, 0, 23, 64], head_num=2, dtype="bf16", mask_type=2, q_layout="2d",
                           kv_layout="packed", seed=22),
    "fp16-causal-gqa": dict(q_seqlen=[8, 136], kv_seqlen=[136, 136], head_num=4, kv_head_num=2, dtype="fp16",
                            mask_type=3, q_layout="3d", kv_layout="padded", seed=23),
    "bf16-causal-mqa": dict(q_seqlen=[8, 8], kv_seqlen=[136, 136], head_num=4, kv_head_num=1, dtype="bf16",
                            mask_type=3, q_layout="2d", kv_layout="padded", seed=24),
    "fp16-undefined-ragged-padded": dict(q_seqlen=[37, 64, 0, 19], head_num=2, dtype="fp16", mask_type=0,
                                         q_layout="2d", kv_layout="padded", seed=25),
    "bf16-mask_free-ragged-padded": dict(q_seqlen=[50, 23, 64], head_num=2, dtype="bf16", mask_type=2,
                                         q_layout="3d", kv_layout="padded", seed=26),
    "fp16-causal-ragged-padded": dict(q_seqlen=[24, 50], kv_seqlen=[152, 50], head_num=4, kv_head_num=2,
                                      dtype="fp16", mask_type=3, kv_layout="padded", seed=27),
    "fp16-undefined-uniform-padded": dict(q_seqlen=[64, 64], head_num=2, dtype="fp16", mask_type=0,
                                          q_layout="3d", kv_layout="padded", seed=28),
    "bf16-mask_free-uniform-padded": dict(q_seqlen=[48, 48, 48], head_num=2, dtype="bf16", mask_type=2,
                                          q_layout="2d", kv_layout="padded", seed=29),
}
PADDING_EXTRA_ROWS = 37
CORE = ("fp16-undefined", "bf16-mask_free", "fp16-causal-gqa", "bf16-causal-mqa")
#: test function -> the SPECS it runs on.
RELATION_SPECS: dict[str, tuple[str, ...]] = {
    "test_batch_order": CORE,
    "test_head_order": CORE,
    "test_q_layout": CORE,
    "test_alone_vs_batch": CORE,
    "test_determinism": CORE,
    "test_padding_contents": ("fp16-undefined-ragged-padded", "bf16-mask_free-ragged-padded",
                              "fp16-causal-ragged-padded"),
    "test_padded_vs_packed": ("fp16-undefined-uniform-padded", "bf16-mask_free-uniform-padded"),
}


def _spec(name: str, seed: int | None) -> CaseSpec:
    raw = dict(SPECS[name], suite="metamorphic")
    if seed is not None:
        raw["seed"] = seed
    return build_case(raw, source=f"{__name__}:{name}")


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    names = RELATION_SPECS.get(metafunc.function.__name__)
    if names is None:
        return
    option = metafunc.config.getoption("seeds")
    seeds: list[int | None] = [int(s) for s in option.split(",") if s.strip()] if option else [None]
    specs = [_spec(name, seed) for name in names for seed in seeds]
    metafunc.parametrize("meta_spec", [
        pytest.param(s, id=s.case_id, marks=[getattr(pytest.mark, s.dtype), getattr(pytest.mark, s.mask_name)])
        for s in specs
    ])


# -- running and comparing -------------------------------------------------------------------------


class Problems:
    """Collects what went wrong in one relation; ends the test with numbers, case and mode."""

    def __init__(self, relation: str, kind: str, spec: CaseSpec, backend: Backend,
                 deviations: DeviationSet) -> None:
        self.header = f"metamorphic {relation} ({kind}) on {mode_text(spec, backend.name)}"
        self.items: list[str] = []
        self.deviation: Deviation | None = deviations.match(backend.name, backend.info().version, spec)

    def add(self, text: str | None) -> None:
        if text:
            self.items.append(text)

    def finish(self) -> None:
        if not self.items:
            return
        message = f"{self.header}: " + " | ".join(self.items)
        if self.deviation is not None:
            pytest.xfail(f"known deviation: {message} [{self.deviation.describe()}]")
        pytest.fail(message, pytrace=False)


def run(backend: Backend, inputs: OpInputs, spec: CaseSpec) -> np.ndarray:
    """The backend's output as ``[T, H, 128]`` in the case dtype."""
    out = execute(backend, make_call(inputs, spec), spec).out
    return out.reshape(spec.total_q, spec.head_num, V_DIM)


def golden_of(inputs: OpInputs, spec: CaseSpec) -> GoldenCase:
    """A float64 golden (and emulated baseline) for inputs that are not the spec's generated ones."""
    return build_golden(spec, inputs=inputs)


def judged(label: str, out: np.ndarray, inputs: OpInputs, spec: CaseSpec, backend: Backend,
           policy_set: PolicySet, policy: str) -> str | None:
    """None when ``out`` passes the policy against its own golden, else the verdict's summary."""
    _, verdict = judge_output(golden_of(inputs, spec), out, policy_set, policy, backend.name)
    return None if verdict.passed else f"{label}: {verdict.summary()}"


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
    return (f"{int(differ.sum())} of {int(valid.sum())} elements differ, max |diff| {gap.max():.4g} at "
            f"batch {where.batch} row {where.row_in_batch} head {head} col {col} "
            f"({float(a64[token, head, col]):.6g} vs {float(b64[token, head, col]):.6g})")


def attempt(problems: Problems, action: Callable[[], np.ndarray], label: str) -> np.ndarray | None:
    """Run the backend; a rejection is a problem of the relation, not a crash of the test."""
    try:
        return action()
    except BackendError as exc:
        problems.add(f"{label}: backend raised {exc}")
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
    new = dataclasses.replace(inputs, q=inputs.q[rows], q_rope=inputs.q_rope[rows], k=k, k_rope=kr, v=v,
                              q_seqlen=np.asarray(q_len, dtype=np.int32),
                              kv_seqlen=np.asarray(kv_len, dtype=np.int32))
    return new, dataclasses.replace(spec, q_seqlen=q_len, kv_seqlen=kv_len)


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

    new = dataclasses.replace(inputs, q=q_side(inputs.q), q_rope=q_side(inputs.q_rope), k=kv_side(inputs.k),
                              k_rope=kv_side(inputs.k_rope), v=kv_side(inputs.v))
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


def tolerance_pair(problems: Problems, backend: Backend, policy_set: PolicySet, policy: str, first: Side,
                   second: Side, align: Callable[[np.ndarray], np.ndarray]) -> None:
    """Run both sides, judge each against its own golden; on failure also describe how the outputs
    differ (``align`` maps the first output onto the second's rows and heads)."""
    outs = [attempt(problems, lambda s=side: run(backend, s[1], s[2]), side[0]) for side in (first, second)]
    if outs[0] is None or outs[1] is None:
        return
    for (label, inputs, spec), out in zip((first, second), outs, strict=True):
        problems.add(judged(label, out, inputs, spec, backend, policy_set, policy))
    if problems.items:
        problems.add(difference(align(outs[0]), outs[1], second[2], exact=False))


def test_batch_order(meta_spec: CaseSpec, backend: Backend, policy_set: PolicySet, deviation_set: DeviationSet,
                     pytestconfig: pytest.Config) -> None:
    """Tolerance: rotating the batch order permutes the output rows; both outputs pass the policy."""
    problems = Problems("batch order", "tolerance", meta_spec, backend, deviation_set)
    inputs = generate_inputs(meta_spec)
    order = rotation(meta_spec.batch)
    new_inputs, new_spec = select_batches(inputs, meta_spec, order, trim=False)
    tolerance_pair(problems, backend, policy_set, pytestconfig.getoption("policy"),
                   ("original", inputs, meta_spec), (f"batch order {order}", new_inputs, new_spec),
                   lambda out: out[token_map(meta_spec, order)])
    problems.finish()


def test_head_order(meta_spec: CaseSpec, backend: Backend, policy_set: PolicySet, deviation_set: DeviationSet,
                    pytestconfig: pytest.Config) -> None:
    """Tolerance: permuting kv heads, and query heads consistently within their GQA groups, permutes
    the output heads; both outputs pass the policy."""
    problems = Problems("head order", "tolerance", meta_spec, backend, deviation_set)
    inputs = generate_inputs(meta_spec)
    new_inputs, q_heads = permute_heads(inputs, meta_spec)
    tolerance_pair(problems, backend, policy_set, pytestconfig.getoption("policy"),
                   ("original", inputs, meta_spec), (f"heads {q_heads.tolist()}", new_inputs, meta_spec),
                   lambda out: out[:, q_heads])
    problems.finish()


def test_q_layout(meta_spec: CaseSpec, backend: Backend, deviation_set: DeviationSet) -> None:
    """Exact: q/qRope as ``[T, H*D]`` or ``[T, H, D]`` are the same bytes, so attenOut is too."""
    problems = Problems("q layout 2-D vs 3-D", "exact", meta_spec, backend, deviation_set)
    other = "3d" if meta_spec.q_layout == "2d" else "2d"
    inputs = generate_inputs(meta_spec)
    t, h = meta_spec.total_q, meta_spec.head_num
    shape = (lambda d: (t, h * d)) if other == "2d" else (lambda d: (t, h, d))
    new_inputs = dataclasses.replace(inputs, q=inputs.q.reshape(shape(128)), q_rope=inputs.q_rope.reshape(shape(64)))
    new_spec = dataclasses.replace(meta_spec, q_layout=other)
    base = attempt(problems, lambda: run(backend, inputs, meta_spec), "original")
    flipped = attempt(problems, lambda: run(backend, new_inputs, new_spec), f"q layout {other}")
    if base is not None and flipped is not None:
        problems.add(difference(base, flipped, meta_spec, exact=True))
    problems.finish()


def test_padding_contents(meta_spec: CaseSpec, backend: Backend, deviation_set: DeviationSet) -> None:
    """Exact: padded kv rows at or beyond kvSeqLen are never read, so other finite garbage or NaN
    there, or 37 more padding rows (S beyond max kvSeqLen: a stride bug), leave every valid output
    bit unchanged."""
    problems = Problems("padding contents", "exact", meta_spec, backend, deviation_set)
    inputs = generate_inputs(meta_spec)
    base = attempt(problems, lambda: run(backend, inputs, meta_spec), "original")
    for kind in ("garbage", "nan"):
        poisoned = poison_padding(inputs, meta_spec, kind)
        out = attempt(problems, lambda p=poisoned: run(backend, p, meta_spec), f"{kind} padding")
        if base is not None and out is not None:
            found = difference(base, out, meta_spec, exact=True)
            problems.add(f"{kind} padding: {found}" if found else None)
    wider = widen_padding(inputs, meta_spec, PADDING_EXTRA_ROWS)
    out = attempt(problems, lambda: run(backend, wider, meta_spec), f"S + {PADDING_EXTRA_ROWS} padding rows")
    if base is not None and out is not None:
        found = difference(base, out, meta_spec, exact=True)
        problems.add(f"S + {PADDING_EXTRA_ROWS} padding rows: {found}" if found else None)
    problems.finish()


def test_padded_vs_packed(meta_spec: CaseSpec, backend: Backend, policy_set: PolicySet,
                          deviation_set: DeviationSet, pytestconfig: pytest.Config) -> None:
    """Tolerance: with uniform kv lengths ``[B, S, N*D]`` and ``[B*S, N, D]`` hold the same keys in
    the same bytes; both layouts' outputs pass the policy (kernels may take different paths)."""
    problems = Problems("padded vs packed kv", "tolerance", meta_spec, backend, deviation_set)
    inputs = generate_inputs(meta_spec)
    n = meta_spec.kv_head_num
    packed = dataclasses.replace(inputs, **{name: getattr(inputs, name).reshape(meta_spec.total_kv, n, -1)
                                           for name in ("k", "k_rope", "v")})
    packed_spec = dataclasses.replace(meta_spec, kv_layout="packed")
    tolerance_pair(problems, backend, policy_set, pytestconfig.getoption("policy"),
                   ("padded", inputs, meta_spec), ("packed", packed, packed_spec), lambda out: out)
    problems.finish()


def test_alone_vs_batch(meta_spec: CaseSpec, backend: Backend, policy_set: PolicySet, deviation_set: DeviationSet,
                        pytestconfig: pytest.Config) -> None:
    """Tolerance: each sequence run alone (padded S cut to its own length) and within the batch;
    every output passes the policy."""
    problems = Problems("alone vs batch", "tolerance", meta_spec, backend, deviation_set)
    policy = pytestconfig.getoption("policy")
    inputs = generate_inputs(meta_spec)
    base = attempt(problems, lambda: run(backend, inputs, meta_spec), "batch")
    if base is not None:
        problems.add(judged("batch", base, inputs, meta_spec, backend, policy_set, policy))
    for b, (q_len, kv_len) in enumerate(zip(meta_spec.q_seqlen, meta_spec.kv_seqlen, strict=True)):
        if q_len == 0 or kv_len == 0:
            continue
        one_inputs, one_spec = select_batches(inputs, meta_spec, [b], trim=True)
        alone = attempt(problems, lambda i=one_inputs, s=one_spec: run(backend, i, s), f"batch {b} alone")
        if alone is None:
            continue
        verdict = judged(f"batch {b} alone", alone, one_inputs, one_spec, backend, policy_set, policy)
        problems.add(verdict)
        if verdict and base is not None:
            problems.add(difference(base[token_map(meta_spec, [b])], alone, one_spec, exact=False))
    problems.finish()


def test_determinism(meta_spec: CaseSpec, backend: Backend, deviation_set: DeviationSet) -> None:
    """Exact: five runs of the same call give bit-identical valid rows (backends that declare
    ``deterministic = False`` are skipped)."""
    if not backend.deterministic:
        pytest.skip(f"backend {backend.name} declares deterministic = False")
    problems = Problems("determinism", "exact", meta_spec, backend, deviation_set)
    call = make_call(generate_inputs(meta_spec), meta_spec)
    shape = (meta_spec.total_q, meta_spec.head_num, V_DIM)
    outs = [attempt(problems, lambda: execute(backend, call, meta_spec).out.reshape(shape), f"run {i + 1}")
            for i in range(RERUNS)]
    first = outs[0]
    for i, out in enumerate(outs[1:], start=2):
        if first is not None and out is not None:
            found = difference(first, out, meta_spec, exact=True)
            problems.add(f"run {i} vs run 1: {found}" if found else None)
    problems.finish()
