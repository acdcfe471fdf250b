"""One conformance check: run a backend on a golden, judge it, and describe the outcome.

Ties the pieces together (the golden store, a backend, the tolerance policy and the known
deviations) and produces the result record the reports plugin consumes.
"""

from __future__ import annotations

import functools
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import h5py
import numpy as np
import pytest

from cases.deviations import Deviation, DeviationSet
from cases.execution import Execution, execute, make_call, output_digest
from cases.policy import PolicySet, Verdict, VerdictContext
from golden.error_model import ModelResult, model_ratio
from golden.inputs import numpy_dtype
from golden.metrics import Metrics, compute_metrics
from golden.spec import V_DIM, CaseSpec
from golden.types import GoldenCase
from harness.backend import Backend, BackendError

Outcome = Literal["passed", "failed", "xfailed", "xpassed"]
#: How a known deviation's classification of what happened becomes a test outcome.
DEVIATION_OUTCOMES: dict[str, Outcome] = {"expected": "xfailed", "unexpected_pass": "xpassed", "different": "failed"}


@dataclass(frozen=True)
class CaseResult:
    """What happened for one (case, backend): the outcome, its explanation and the record."""

    outcome: Outcome
    message: str
    record: dict[str, Any]
    output: np.ndarray | None


class UnexpectedPassWarning(UserWarning):
    """A known deviation did not reproduce: confirm it and update cases/known_deviations.toml."""


def conclude(outcome: Outcome, message: str) -> None:
    """Turn an outcome into pytest's: xfail, a loud warning for an unexpected pass, or a failure."""
    if outcome == "xfailed":
        pytest.xfail(message)
    if outcome == "xpassed":
        warnings.warn(UnexpectedPassWarning(message), stacklevel=2)
    if outcome == "failed":
        pytest.fail(message, pytrace=False)


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
    return metrics, resolved.evaluate(metrics, baseline, verdict_context(golden, out))


def verdict_context(golden: GoldenCase, out: np.ndarray) -> VerdictContext:
    """The case's context, with the error-model rule bound to ``out`` and the golden's magnitudes
    (no model when the golden carries none: that rule then fails rather than pass vacuously)."""
    spec = golden.spec
    if not golden.magnitudes:
        return VerdictContext.from_spec(spec)

    @functools.cache
    def model(false_alarm: float, safety: float) -> ModelResult:
        return model_ratio(out, golden.out, golden.row_valid, golden.magnitudes, spec,
                           false_alarm=false_alarm, safety=safety)

    return VerdictContext.from_spec(spec, model)


def input_digests(golden: GoldenCase) -> dict[str, str]:
    """SHA-256 of every input array, to notice a backend that writes into its inputs."""
    return {name: output_digest(array) for name, array in golden.inputs.arrays().items()}


def contract_violations(golden: GoldenCase, out: np.ndarray, before: dict[str, str]) -> list[str]:
    """What the output or the inputs say about the interface contract, whatever the numbers."""
    spec = golden.spec
    problems = []
    if out.dtype != numpy_dtype(spec.dtype):
        problems.append(f"attenOut dtype is {out.dtype}, expected {spec.dtype} (qRope's dtype)")
    if out.shape != golden.out.shape:
        problems.append(f"attenOut shape is {list(out.shape)}, expected {list(golden.out.shape)} (q's layout)")
    after = input_digests(golden)
    problems += [f"the backend modified its input {name}" for name in before if after[name] != before[name]]
    return problems


def _outcome(passed: bool, error: BackendError | None, deviation: Deviation | None) -> Outcome:
    if deviation is None:
        return "passed" if passed and error is None else "failed"
    return DEVIATION_OUTCOMES[deviation.classify(error.status_name if error else None, None if error else passed)]


def run_case(
    golden: GoldenCase,
    backend: Backend,
    *,
    policy_set: PolicySet,
    policy: str,
    deviations: DeviationSet,
    repeats: int = 1,
    warmup: int = 0,
) -> CaseResult:
    """Run, judge and classify one case on one backend (never raises for a backend's error)."""
    spec = golden.spec
    info = backend.info()
    deviation = deviations.match(backend.name, info.version, spec)
    error: BackendError | None = None
    execution: Execution | None = None
    digests = input_digests(golden)
    try:
        execution = execute(backend, make_call(golden.inputs, spec), spec, repeats=repeats, warmup=warmup)
    except BackendError as exc:
        error = exc
    record: dict[str, Any] = {
        "case_id": spec.case_id,
        "suite": spec.suite,
        "spec": spec.content(),
        "backend": backend.name,
        "device": info.device,
        "backend_versions": info.versions,
        "dtype": spec.dtype,
        "mask": spec.mask_name,
        "cache": spec.cache_name,
        "policy": policy,
        "deviation": deviation.id if deviation else None,
    }
    if execution is None:
        assert error is not None
        outcome = _outcome(False, error, deviation)
        detail = f"backend raised {error}"
        message = _message(spec, backend.name, outcome, detail, deviation)
        record.update(verdict=outcome, checks=[], worst_slack=None, metrics={}, failing=[f"error: {error}"],
                      timing=None, output_sha256=None, message=message,
                      error={"status": error.status, "name": error.status_name, "stage": error.stage})
        return CaseResult(outcome, message, record, None)
    violations = contract_violations(golden, execution.out, digests)
    if violations:  # no known deviation excuses a broken interface
        message = _message(spec, backend.name, "failed", "interface contract broken: " + "; ".join(violations), None)
        record.update(verdict="failed", checks=[], worst_slack=None, metrics={}, failing=violations,
                      timing=execution.timing(), output_sha256=output_digest(execution.out), message=message)
        return CaseResult("failed", message, record, execution.out)
    metrics, verdict = judge_output(golden, execution.out, policy_set, policy, backend.name)
    outcome = _outcome(verdict.passed, None, deviation)
    record.update(
        verdict=outcome,
        checks=[c.to_dict() for c in verdict.checks],
        worst_slack=float(verdict.worst_slack),
        metrics=metrics.to_dict(),
        failing=[c.text() for c in verdict.failing],
        overrides=[o.to_dict() for o in verdict.overrides],
        timing=execution.timing(),
        output_sha256=output_digest(execution.out),
    )
    message = _message(spec, backend.name, outcome, verdict.summary(), deviation)
    record["message"] = message
    return CaseResult(outcome, message, record, execution.out)


def _message(spec: CaseSpec, backend: str, outcome: Outcome, detail: str, deviation: Deviation | None) -> str:
    prefix = {"passed": "", "failed": "", "xfailed": "known deviation: ",
              "xpassed": "UNEXPECTED PASS of known deviation: "}[outcome]
    known = f" [{deviation.describe()}]" if deviation else ""
    return f"{prefix}{mode_text(spec, backend)}: {detail}{known}"


def save_output(directory: Path, spec: CaseSpec, backend: str, out: np.ndarray) -> Path:
    """Keep a backend's raw output for forensic diffs (``--save-outputs``)."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{spec.case_id}--{backend.replace(':', '_')}.h5"
    with h5py.File(path, "w") as handle:
        raw = out.view(np.uint16) if out.dtype.itemsize == 2 and out.dtype != np.float16 else out
        dataset = handle.create_dataset("out", data=raw)
        dataset.attrs["device_dtype"] = spec.dtype
        handle.attrs["case_id"] = spec.case_id
        handle.attrs["backend"] = backend
    return path
