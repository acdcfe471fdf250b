"""One conformance case on one backend: run it, check the interface, judge it, classify it."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import h5py
import numpy as np

from mlaconf.golden.inputs import numpy_dtype
from mlaconf.golden.spec import CaseSpec
from mlaconf.golden.types import GoldenCase
from mlaconf.harness.backend import Backend, BackendError
from mlaconf.judge import causes
from mlaconf.judge.deviations import DeviationSet, explaining, release_note
from mlaconf.judge.policy import PolicySet
from mlaconf.judge.verdict import Outcome, error_map, judge_resolved, mode_text, outcome_message, outcome_of
from mlaconf.reports.records import ErrorEvidence, ResultRecord, make_record
from mlaconf.runner.execution import (
    BackendOutputError,
    Execution,
    disagreeing_reruns,
    execute,
    input_digest,
    make_call,
    output_digest,
)
from mlaconf.runner.identity import make_identity


@dataclass(frozen=True)
class CaseResult:
    """What happened for one (case, backend): the outcome, its explanation and the record."""

    outcome: Outcome
    message: str
    record: ResultRecord
    output: np.ndarray | None


def input_digests(golden: GoldenCase) -> dict[str, str]:
    """A digest of every input array, to notice a backend that writes into its inputs."""
    return {name: input_digest(array) for name, array in golden.inputs.arrays().items()}


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


def run_case(
    golden: GoldenCase,
    backend: Backend,
    *,
    policy_set: PolicySet,
    policy: str,
    deviations: DeviationSet,
    repeats: int = 1,
    warmup: int = 0,
    reruns: int = 1,
    try_causes: bool = False,
) -> CaseResult:
    """Run, judge and classify one case on one backend (never raises for a backend's error).

    With ``reruns`` > 1 the backend is called that many times and every output must be bitwise the first.
    A failing output is also judged against the likely-cause catalogue (:mod:`mlaconf.judge.causes`)
    when the case is small or ``try_causes`` asks for it."""
    spec = golden.spec
    subject = mode_text(spec, backend.name)
    info = backend.info()
    candidates = deviations.candidates(backend.name, info.version, spec)
    deviation = candidates[0] if candidates else None
    error: BackendError | None = None
    execution: Execution | None = None
    wrong_type: str | None = None
    digests = input_digests(golden)
    try:
        call = make_call(golden.inputs, spec)
        execution = execute(backend, call, spec, repeats=repeats, warmup=warmup)
    except BackendError as exc:
        error = exc
    except BackendOutputError as exc:
        wrong_type = str(exc)
    base: dict[str, Any] = make_identity(
        suite="conformance", test="", function="test_conformance", backend=backend.name, spec=spec, policy=policy
    ) | {
        "device": info.device,
        "backend_versions": dict(info.versions),
        "deviation": deviation.id if deviation else None,
    }
    if wrong_type is not None:  # no known deviation excuses a broken interface
        message = outcome_message(subject, "failed", f"interface contract broken: {wrong_type}", None)
        record = make_record(base, verdict="failed", failing=(wrong_type,), message=message)
        return CaseResult("failed", message, record, None)
    if execution is None:
        assert error is not None
        deviation = explaining(candidates, False, error.status_name)
        base["deviation"] = deviation.id if deviation else None
        outcome = outcome_of(False, error.status_name, deviation)  # a valid case rejected never conforms
        detail = f"backend raised {error}{release_note(info.version, deviation)}"
        message = outcome_message(subject, outcome, detail, deviation)
        record = make_record(
            base,
            verdict=outcome,
            failing=(f"error: {error}",),
            message=message,
            error=ErrorEvidence(observed_status=error.status_name, observed_stage=error.stage),
        )
        return CaseResult(outcome, message, record, None)
    violations = contract_violations(golden, execution.out, digests)
    if violations:  # no known deviation excuses a broken interface
        broken = "interface contract broken: " + "; ".join(violations)
        message = outcome_message(subject, "failed", broken, None)
        record = make_record(
            base,
            verdict="failed",
            failing=tuple(violations),
            timing=execution.timing(),
            output_sha256=output_digest(execution.out),
            message=message,
        )
        return CaseResult("failed", message, record, execution.out)
    timing = execution.timing()
    if reruns > 1:
        disagreeing = disagreeing_reruns(backend, call, execution.out, reruns - 1)
        timing.update(reruns=reruns - 1, disagreeing_runs=disagreeing)
        if disagreeing:  # a race: no known deviation excuses it
            race = f"{disagreeing} of {reruns - 1} reruns differ bitwise from the first call (a race?)"
            message = outcome_message(subject, "failed", race, None)
            record = make_record(base, verdict="failed", failing=(race,), timing=timing, message=message)
            return CaseResult("failed", message, record, execution.out)
    resolved = policy_set.resolve(policy, backend.name, spec.dtype, spec.mask_name, spec.case_id)
    metrics, verdict = judge_resolved(golden, execution.out, resolved)
    deviation = explaining(candidates, verdict.passed, None)
    base["deviation"] = deviation.id if deviation else None
    outcome = outcome_of(verdict.passed, None, deviation)
    cause = None
    if outcome == "failed" and causes.worth_trying(spec, try_causes):
        cause = causes.likely_cause(golden, execution.out)
    detail = verdict.summary() + release_note(info.version, deviation)
    detail += f" Likely cause: {cause.sentence()}." if cause else ""
    message = outcome_message(subject, outcome, detail, deviation)
    emap = None
    if outcome == "failed":  # only failing records carry a map: records stay small
        model = None
        if "model" in resolved.params:
            model = (resolved.param("model", "false_alarm", spec.dtype), resolved.param("model", "safety", spec.dtype))
        emap = error_map(golden, execution.out, verdict.worst_check(), model)
    record = make_record(
        base,
        verdict=outcome,
        checks=tuple(c.to_dict() for c in verdict.checks),
        worst_slack=float(verdict.worst_slack),
        metrics=metrics.to_dict(),
        failing=tuple(c.text() for c in verdict.failing),
        overrides=tuple(o.to_dict() for o in verdict.overrides),
        timing=timing,
        output_sha256=output_digest(execution.out),
        message=message,
        error_map=emap,
        likely_cause=cause.to_dict() if cause else None,
    )
    return CaseResult(outcome, message, record, execution.out)


def save_output(directory: Path, spec: CaseSpec, backend: str, out: np.ndarray) -> Path:
    """Keep a backend's raw output for forensic diffs (``--mla-save-outputs``)."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{spec.case_id}--{backend.replace(':', '_')}.h5"
    with h5py.File(path, "w") as handle:
        raw = out.view(np.uint16) if out.dtype.itemsize == 2 and out.dtype != np.float16 else out
        dataset = handle.create_dataset("out", data=raw)
        dataset.attrs["device_dtype"] = spec.dtype
        handle.attrs["case_id"] = spec.case_id
        handle.attrs["backend"] = backend
    return path
