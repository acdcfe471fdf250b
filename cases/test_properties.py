"""Property-based conformance: random valid cases, each judged against a float64 golden built on the
fly (``mlaconf.golden.building.generate.build_golden``, no store) with the run's tolerance policy (``--mla-policy``).

Cases are small enough for a CPU: up to 3 batches of up to 48 query rows (zero lengths included),
1-4 heads (CAUSAL: 1 or 2 kv heads shared by 1, 2 or 4 query heads each, prefixes up to 80 keys),
both dtypes, maskType 0/2/3, both q and kv layouts, every input distribution, any seed, default
or random qkScale in [0.01, 1].
When a case fails, hypothesis shrinks it and the failure message prints it as a ``[[case]]``
TOML snippet to paste into a suite.  Examples per run come from the hypothesis profile
(``runner/hypothesis_profiles.py``; ``--hypothesis-profile mla-ci|mla-dev|mla-thorough``).  Cases that a known
deviation of the backend covers are not drawn for it (they would fail by design).
"""

from __future__ import annotations

import hashlib
from typing import Any

import pytest
from hypothesis import HealthCheck, assume, given, note, settings
from hypothesis import strategies as st

from mlaconf.facts.factors import load_model
from mlaconf.facts.operator import DEFAULT_QK_SCALE, DTYPES, KV_LAYOUTS, Q_LAYOUTS
from mlaconf.golden.building.generate import build_golden
from mlaconf.golden.specs.spec import DISTRIBUTIONS, CaseSpec
from mlaconf.golden.specs.spec_build import build_case
from mlaconf.harness.backend import Backend, BackendError
from mlaconf.judge.deviations import DeviationSet
from mlaconf.judge.policy import PolicySet
from mlaconf.judge.verdict import judge_resolved, mode_text
from mlaconf.reports.records import ErrorEvidence
from mlaconf.runner.ending import Ending, end, named, verdict_evidence
from mlaconf.runner.execution import execute, make_call, output_digest
from mlaconf.runner.failures import failure_of
from mlaconf.runner.identity import policy_name, spec_fields
from mlaconf.runner.recording import MlaReport

pytestmark = pytest.mark.property

MAX_BATCH = 3
MAX_Q = 48
MAX_PREFIX = 80
#: The kv layouts drawn: those the settled factor model holds (a pending layout joins with its covering sets).
DRAWN_KV_LAYOUTS = tuple(name for name in KV_LAYOUTS if name in load_model().settled().factor("kv_layout").level_names)
#: The distributions drawn: large_raw_scores too (with the drawn qkScale its raw products stay far below fp16's range).
DRAWN_DISTRIBUTIONS = DISTRIBUTIONS
#: The passing examples so far: a running digest of (case id, output digest) and their count.
EXAMPLES = pytest.StashKey[tuple[Any, int]]()


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
        raw.update(head_num=draw(st.integers(1, 4)), kv_layout=draw(st.sampled_from(DRAWN_KV_LAYOUTS)))
        raw["kv_head_num"] = raw["head_num"]
        if raw["kv_layout"] == "strided" and len(q) * max(q) == sum(q):
            raw["kv_layout"] = "packed"  # the strided form needs ragged lengths (else it is the packed one)
    if not any(n > 0 and m > 0 for n, m in zip(q, kv, strict=True)):  # something must be checked
        q[0], kv[0] = max(q[0], 1), max(kv[0], q[0], 1)
    raw.update(
        q_seqlen=q,
        kv_seqlen=kv,
        q_layout=draw(st.sampled_from(Q_LAYOUTS)),
        distribution=draw(st.sampled_from(DRAWN_DISTRIBUTIONS)),
        seed=draw(st.integers(0, 2**31 - 1)),
        qk_scale=draw(st.one_of(st.just(DEFAULT_QK_SCALE), st.floats(0.01, 1.0))),
    )
    return build_case(raw, source="<hypothesis>", suite="property")


@settings(suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(spec=case_specs())
def test_random_case_matches_float64_golden(
    spec: CaseSpec,
    mla_backend: Backend,
    mla_policy_set: PolicySet,
    mla_deviation_set: DeviationSet,
    pytestconfig: pytest.Config,
    mla_report: MlaReport,
) -> None:
    """Tolerance (the policy): any valid case passes against its own float64 golden.

    Every failing example leaves a pending record; hypothesis replays the shrunk example last, so
    the record of a failing test carries the shrunk spec (``shrunk``) and its evidence.
    """
    note(f"case as a suite entry:\n{spec.to_toml()}")
    assume(mla_deviation_set.match(mla_backend.name, mla_backend.info().version, spec) is None)
    policy = policy_name(pytestconfig)
    paste = f"\nPaste into a suite to keep it:\n{spec.to_toml()}"
    shrunk = {"spec": spec.content(), "toml": spec.to_toml()}
    evidence: dict[str, Any] = {
        **spec_fields(spec),
        "case_suite": "property",
        "shrunk": shrunk,
        "device": mla_backend.info().device,
    }

    subject = mode_text(spec, mla_backend.name)
    try:
        golden = build_golden(spec)
        try:
            out: Any = execute(mla_backend, make_call(golden.inputs, spec), spec).out
        except BackendError as exc:  # a failure like any other, so hypothesis shrinks it
            evidence["error"] = ErrorEvidence(observed_status=exc.status_name, observed_stage=exc.stage)
            failure: str | None = f"{subject}: backend rejected a valid case: {exc}"
        else:
            resolved = mla_policy_set.resolve(policy, mla_backend.name, spec.dtype, spec.mask_name, spec.case_id)
            metrics, verdict = judge_resolved(golden, out, resolved)
            evidence.update(verdict_evidence(golden, out, (metrics, verdict), resolved, failed=not verdict.passed))
            failure = None if verdict.passed else f"{subject}: {verdict.summary()}"
    except Exception as exc:  # outside the verdict path
        evidence["failure"] = failure_of(mla_report.node, pytest.ExceptionInfo.from_exception(exc))
        mla_report.pending(named(mla_report, Ending("failed", str(exc).split("\n")[0], evidence)))
        raise
    if failure is None:
        record_pass(mla_report, spec.case_id, output_digest(out))
        return
    # kept pending: hypothesis replays the shrunk example last, and its record is the one that stays
    first, _, rest = failure.partition("\n")
    end(mla_report, Ending("failed", first, evidence, note=(f"\n{rest}" if rest else "") + paste), pending=True)


def record_pass(mla_report: MlaReport, case_id: str, digest: str) -> None:
    """Attach the passing record so far: a digest over every passing example's case and output,
    so two runs over the same examples compare as identical (or not) in ``report diff``."""
    node = mla_report.node
    running, count = node.stash.get(EXAMPLES, (hashlib.sha256(), 0))
    running.update(f"{case_id}:{digest};".encode())
    node.stash[EXAMPLES] = (running, count + 1)
    examples = {"count": count + 1, "derandomized": bool(settings().derandomize)}
    passed = {"output_sha256": running.hexdigest(), "examples": examples}
    end(mla_report, Ending("passed", f"{count + 1} examples passed", passed))
