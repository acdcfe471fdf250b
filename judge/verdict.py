"""From a backend's output and its golden to a verdict: metrics, the policy, known deviations."""

from __future__ import annotations

from typing import Literal

import numpy as np

from facts.operator import V_DIM
from golden.metrics import Metrics, compute_metrics
from golden.spec import CaseSpec
from golden.types import GoldenCase
from judge.deviations import Deviation
from judge.policy import PolicySet, Verdict, VerdictContext

Outcome = Literal["passed", "failed", "xfailed", "xpassed"]
#: How a known deviation's classification of what happened becomes a test outcome.
DEVIATION_OUTCOMES: dict[str, Outcome] = {"expected": "xfailed", "unexpected_pass": "xpassed", "different": "failed"}


def mode_text(spec: CaseSpec, backend: str) -> str:
    return f"{spec.case_id} [backend {backend}, dtype {spec.dtype}, mask {spec.mask_name}, cache {spec.cache_name}]"


def judge_output(golden: GoldenCase, out: np.ndarray, policy_set: PolicySet, policy: str, backend: str) -> tuple[
    Metrics, Verdict
]:
    """Metrics of ``out`` against the golden and the verdict under the resolved policy."""
    spec = golden.spec
    shape = (spec.total_q, spec.head_num, V_DIM)
    if out.size != int(np.prod(shape)):
        raise ValueError(f"{spec.case_id}: backend output has shape {out.shape}, expected {golden.out.shape}")
    metrics = compute_metrics(out.reshape(shape), golden.out.reshape(shape), golden.row_valid, spec.dtype,
                              spec.q_seqlen)
    baseline = Metrics.from_dict(golden.baseline_stats) if golden.baseline_stats else None
    resolved = policy_set.resolve(policy, backend, spec.dtype, spec.mask_name, spec.case_id)
    return metrics, resolved.evaluate(metrics, baseline, VerdictContext.from_spec(spec))


def outcome_of(passed: bool, error_status: str | None, deviation: Deviation | None) -> Outcome:
    """The outcome of a numeric verdict (``passed``) or a rejection (``error_status``), deviations applied."""
    if deviation is None:
        return "passed" if passed and error_status is None else "failed"
    return DEVIATION_OUTCOMES[deviation.classify(error_status, None if error_status else passed)]


def outcome_message(spec: CaseSpec, backend: str, outcome: Outcome, detail: str, deviation: Deviation | None) -> str:
    prefix = {"passed": "", "failed": "", "xfailed": "known deviation: ",
              "xpassed": "UNEXPECTED PASS of known deviation: "}[outcome]
    known = f" [{deviation.describe()}]" if deviation else ""
    return f"{prefix}{mode_text(spec, backend)}: {detail}{known}"
