"""Property-based conformance: random valid cases, each judged against a float64 golden built on the
fly (``golden.generate.build_golden``, no store) with the run's tolerance policy (``--policy``).

Cases are small enough for a CPU: up to 3 batches of up to 48 query rows (zero lengths included),
1-4 heads (CAUSAL: 1 or 2 kv heads shared by 1, 2 or 4 query heads each, prefixes up to 80 keys),
both dtypes, maskType 0/2/3, both q and kv layouts, every input distribution, any seed, default
or random qkScale in [0.01, 1].
When a case fails, hypothesis shrinks it and the failure message prints it as a ``[[case]]``
TOML snippet to paste into a suite.  Examples per run come from the hypothesis profile
(``cases/hypothesis_profiles.py``; ``--hypothesis-profile ci|dev|thorough``).  Cases that a known
deviation of the backend covers are not drawn for it (they would fail by design).
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import HealthCheck, assume, given, note, settings
from hypothesis import strategies as st

from facts.operator import DEFAULT_QK_SCALE, DTYPES, KV_LAYOUTS, Q_LAYOUTS
from golden.generate import build_golden
from golden.spec import DISTRIBUTIONS, CaseSpec, build_case
from harness.backend import Backend, BackendError
from judge.deviations import DeviationSet
from judge.policy import PolicySet
from judge.verdict import judge_output, mode_text
from runner import hypothesis_profiles  # noqa: F401  (registers and selects the profiles)
from runner.execution import execute, make_call

pytestmark = pytest.mark.property

MAX_BATCH = 3
MAX_Q = 48
MAX_PREFIX = 80


@st.composite
def case_specs(draw: st.DrawFn) -> CaseSpec:
    """A valid, CPU-sized case spec (validated by ``build_case`` like any suite case)."""
    mask = draw(st.sampled_from((0, 2, 3)))
    batch = draw(st.integers(1, MAX_BATCH))
    q = draw(st.lists(st.integers(0, MAX_Q), min_size=batch, max_size=batch))
    raw: dict[str, Any] = {"mask_type": mask, "dtype": draw(st.sampled_from(DTYPES))}
    if mask == 3:  # bottom-right causal with a cached prefix, GQA, padded kv only
        prefix = draw(st.lists(st.integers(0, MAX_PREFIX), min_size=batch, max_size=batch))
        kv = [n + p for n, p in zip(q, prefix, strict=True)]
        kv_heads = draw(st.sampled_from((1, 2)))
        raw.update(kv_head_num=kv_heads, head_num=kv_heads * draw(st.sampled_from((1, 2, 4))), kv_layout="padded")
    else:
        kv = q
        raw.update(head_num=draw(st.integers(1, 4)), kv_layout=draw(st.sampled_from(KV_LAYOUTS)))
        raw["kv_head_num"] = raw["head_num"]
    if not any(n > 0 and m > 0 for n, m in zip(q, kv, strict=True)):  # something must be checked
        q[0], kv[0] = max(q[0], 1), max(kv[0], q[0], 1)
    raw.update(
        q_seqlen=q, kv_seqlen=kv,
        q_layout=draw(st.sampled_from(Q_LAYOUTS)),
        distribution=draw(st.sampled_from(DISTRIBUTIONS)),
        seed=draw(st.integers(0, 2**31 - 1)),
        qk_scale=draw(st.one_of(st.just(DEFAULT_QK_SCALE), st.floats(0.01, 1.0))),
    )
    return build_case(raw, source="<hypothesis>", suite="property")


@settings(suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(spec=case_specs())
def test_random_case_matches_float64_golden(spec: CaseSpec, backend: Backend, policy_set: PolicySet,
                                            deviation_set: DeviationSet, pytestconfig: pytest.Config) -> None:
    """Tolerance (the policy): any valid case passes against its own float64 golden."""
    note(f"case as a suite entry:\n{spec.to_toml()}")
    assume(deviation_set.match(backend.name, backend.info().version, spec) is None)
    golden = build_golden(spec)
    paste = f"\nPaste into a suite to keep it:\n{spec.to_toml()}"
    try:
        out = execute(backend, make_call(golden.inputs, spec), spec).out
    except BackendError as exc:  # pytest.fail: hypothesis shrinks it like any failure
        pytest.fail(f"{mode_text(spec, backend.name)}: backend rejected a valid case: {exc}{paste}", pytrace=False)
    _, verdict = judge_output(golden, out, policy_set, pytestconfig.getoption("policy"), backend.name)
    if not verdict.passed:  # no traceback: it would print every fixture's repr (the policy set's ~300 lines)
        pytest.fail(f"{mode_text(spec, backend.name)}: {verdict.summary()}{paste}", pytrace=False)
