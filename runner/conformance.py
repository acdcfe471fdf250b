"""One conformance case on one backend: run it, check the interface, judge it, classify it."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import h5py
import numpy as np

from mlaconf.facts.processes import thread_share
from mlaconf.golden.building.blocks import with_inputs
from mlaconf.golden.building.inputs import numpy_dtype
from mlaconf.golden.specs.layout import out_shape
from mlaconf.golden.specs.spec import CaseSpec
from mlaconf.golden.specs.types import GoldenCase
from mlaconf.harness.backend import Backend, BackendError, BackendInfo
from mlaconf.judge import causes
from mlaconf.judge.deviations import Deviation, DeviationSet, explaining, release_note
from mlaconf.judge.policy import PolicySet
from mlaconf.judge.verdict import Outcome, judge_resolved, mode_text, outcome_message, outcome_of
from mlaconf.reports.records import ErrorEvidence
from mlaconf.runner.ending import Ending, RecordOutcome, verdict_evidence
from mlaconf.runner.execution import (
    BackendOutputError,
    disagreeing_reruns,
    execute,
    input_digest,
    make_call,
    output_digest,
)


@dataclass(frozen=True)
class CaseResult:
    """What happened for one (case, backend): how the test ends and the backend's output (None when it gave none)."""

    ending: Ending
    output: np.ndarray | None

    @property
    def outcome(self) -> RecordOutcome:
        return self.ending.outcome

    @property
    def message(self) -> str:
        return self.ending.message


def input_digests(golden: GoldenCase) -> dict[str, str]:
    """A digest of every input array, to notice a backend that writes into its inputs."""
    return {name: input_digest(array) for name, array in golden.inputs.arrays().items()}


def contract_violations(golden: GoldenCase, out: np.ndarray, before: dict[str, str]) -> list[str]:
    """What the output or the inputs say about the interface contract, whatever the numbers."""
    spec = golden.spec
    problems = []
    if out.dtype != numpy_dtype(spec.dtype):
        problems.append(f"attenOut dtype is {out.dtype}, expected {spec.dtype} (qRope's dtype)")
    if out.shape != out_shape(spec):
        problems.append(f"attenOut shape is {list(out.shape)}, expected {list(out_shape(spec))} (q's layout)")
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
    causes_for: causes.CauseScope = "small",
) -> CaseResult:
    """Run, judge and classify one case on one backend (never raises for a backend's error).

    With ``reruns`` > 1 the backend is called that many times and every output must be bitwise the first.
    A failing output is also judged against the likely-cause catalogue (:mod:`mlaconf.judge.causes`)
    as ``causes_for`` says (by default when the case is small).  The test's identity is the caller's
    (:mod:`mlaconf.runner.ending`).  A sampled golden that records its inputs gets them drawn again first
    (golden/building/blocks.py; a digest that differs is a :class:`GoldenStaleError`)."""
    golden = with_inputs(golden, threads=thread_share())
    spec = golden.spec
    info = backend.info()
    candidates = deviations.candidates(backend.name, info.version, spec)
    about = _Subject(mode_text(spec, backend.name), info, candidates)
    digests = input_digests(golden)
    try:
        call = make_call(golden.inputs, spec)
        execution = execute(backend, call, spec, repeats=repeats, warmup=warmup)
    except BackendError as exc:
        return CaseResult(about.rejected(exc), None)
    except BackendOutputError as exc:  # no known deviation excuses a broken interface
        return CaseResult(about.broken((str(exc),)), None)
    out = execution.out
    timing = execution.timing()
    facts = {"timing": timing, "output_sha256": output_digest(out)}
    if violations := contract_violations(golden, out, digests):  # no known deviation excuses a broken interface
        return CaseResult(about.broken(tuple(violations), **facts), out)
    if reruns > 1:
        disagreeing = disagreeing_reruns(backend, call, out, reruns - 1)
        timing.update(reruns=reruns - 1, disagreeing_runs=disagreeing)
        if disagreeing:  # a race: no known deviation excuses it
            race = f"{disagreeing} of {reruns - 1} reruns differ bitwise from the first call (a race?)"
            return CaseResult(about.failed(race, (race,), timing=timing), out)
    resolved = policy_set.resolve(policy, backend.name, spec.dtype, spec.mask_name, spec.case_id)
    metrics, verdict = judge_resolved(golden, out, resolved)
    deviation = explaining(candidates, verdict.passed, None)
    outcome = outcome_of(verdict.passed, None, deviation)
    cause = None
    if outcome == "failed" and causes.worth_trying(spec, causes_for):
        cause = causes.likely_cause(golden, out)
    detail = verdict.summary() + release_note(info.version, deviation)
    detail += f" Likely cause: {cause.sentence()}." if cause else ""
    evidence = verdict_evidence(golden, out, (metrics, verdict), resolved, failed=outcome == "failed", cause=cause)
    return CaseResult(about.ending(outcome, detail, deviation, **evidence, **facts), out)


@dataclass(frozen=True)
class _Subject:
    """One case on one backend, what every ending of :func:`run_case` says: the subject of its message,
    the backend's device and versions, and the known deviation (the first candidate unless one explains)."""

    text: str
    info: BackendInfo
    candidates: list[Deviation]

    def ending(self, outcome: Outcome, detail: str, deviation: Deviation | None, **evidence: Any) -> Ending:
        """An outcome ``deviation`` classified (None: no known deviation applies)."""
        message = outcome_message(self.text, outcome, detail, deviation)
        return Ending(outcome, message, self._about(deviation) | evidence)

    def failed(self, detail: str, failing: tuple[str, ...], **evidence: Any) -> Ending:
        """A failure no known deviation excuses (a broken interface, a race): the message names none, the
        record the deviation that would have applied (the first candidate)."""
        first = self.candidates[0] if self.candidates else None
        message = outcome_message(self.text, "failed", detail, None)
        return Ending("failed", message, self._about(first) | {"failing": failing} | evidence)

    def broken(self, violations: tuple[str, ...], **evidence: Any) -> Ending:
        return self.failed("interface contract broken: " + "; ".join(violations), violations, **evidence)

    def rejected(self, error: BackendError) -> Ending:
        """A valid case rejected: it never conforms, unless a known deviation predicts the rejection."""
        deviation = explaining(self.candidates, False, error.status_name)
        outcome = outcome_of(False, error.status_name, deviation)
        detail = f"backend raised {error}{release_note(self.info.version, deviation)}"
        evidence = ErrorEvidence(observed_status=error.status_name, observed_stage=error.stage)
        return self.ending(outcome, detail, deviation, failing=(f"error: {error}",), error=evidence)

    def _about(self, deviation: Deviation | None) -> dict[str, Any]:
        return {
            "device": self.info.device,
            "backend_versions": dict(self.info.versions),
            "deviation": deviation.id if deviation else None,
        }


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
