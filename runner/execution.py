"""Running a backend on a golden's inputs: numpy -> host torch tensors, timing, output digest."""

from __future__ import annotations

import hashlib
import statistics
import time
from dataclasses import dataclass, field

import ml_dtypes
import numpy as np
import torch
import xxhash

from mlaconf.golden.specs.spec import CaseSpec
from mlaconf.golden.specs.types import OpInputs
from mlaconf.harness.backend import Backend, BackendError, MlaPrefillCall, Unsupported
from mlaconf.runner.applicability import not_applicable


def to_torch(array: np.ndarray) -> torch.Tensor:
    """A host tensor with the same values; bf16 goes through its bit pattern (numpy has no bf16)."""
    if array.dtype == np.dtype(ml_dtypes.bfloat16):
        return torch.from_numpy(np.ascontiguousarray(array).view(np.int16)).view(torch.bfloat16)
    return torch.from_numpy(np.ascontiguousarray(array))


def to_numpy(tensor: torch.Tensor) -> np.ndarray:
    """Host numpy copy of an output tensor, keeping bf16 values exact."""
    tensor = tensor.detach().to("cpu").contiguous()
    if tensor.dtype == torch.bfloat16:
        return tensor.view(torch.int16).numpy().view(ml_dtypes.bfloat16)
    return tensor.numpy()


def make_call(inputs: OpInputs, spec: CaseSpec) -> MlaPrefillCall:
    """The C interface's arguments for a case."""
    return MlaPrefillCall(
        q=to_torch(inputs.q),
        q_rope=to_torch(inputs.q_rope),
        k=to_torch(inputs.k),
        k_rope=to_torch(inputs.k_rope),
        v=to_torch(inputs.v),
        q_seqlen=to_torch(inputs.q_seqlen),
        kv_seqlen=to_torch(inputs.kv_seqlen),
        mask=None if inputs.mask is None else to_torch(inputs.mask),
        head_num=spec.head_num,
        qk_scale=spec.qk_scale,
        kv_head_num=spec.kv_head_num,
        mask_type=spec.mask_type,
        cache_mode=spec.cache_mode,
    )


class BackendOutputError(TypeError):
    """``backend.run`` returned something that is not a tensor (None, a numpy array, a list ...)."""


@dataclass(frozen=True)
class Execution:
    """A backend's output for a case, and how long the calls took."""

    out: np.ndarray
    latencies_ms: list[float]
    flops: int
    #: The host calibration of each timed call (:func:`calibration_ms` just before and just after it, their
    #: mean), when timed more than once: what lets ``report diff`` tell a busy host from a slower kernel.
    calibration_ms: list[float] = field(default_factory=list)

    @property
    def median_ms(self) -> float:
        return statistics.median(self.latencies_ms)

    def timing(self) -> dict[str, float | int | list[float]]:
        seconds = self.median_ms / 1e3
        timing: dict[str, float | int | list[float]] = {
            "latency_ms_median": round(self.median_ms, 4),
            "repeats": len(self.latencies_ms),
            "latencies_ms": [round(v, 4) for v in self.latencies_ms],  # per call: what the diff's test compares
            "tflops": round(self.flops / seconds / 1e12, 6) if seconds > 0 else 0.0,
        }
        if self.calibration_ms:
            timing["calibration_ms"] = [round(v, 4) for v in self.calibration_ms]
        return timing


def execute(backend: Backend, call: MlaPrefillCall, spec: CaseSpec, *, repeats: int = 1, warmup: int = 0) -> Execution:
    """Run the backend (after ``warmup`` untimed calls) ``repeats`` times; keep the first timed output."""
    try:
        return _timed(backend, call, spec, repeats, warmup)
    except Unsupported as exc:
        not_applicable(f"backend {backend.name} cannot express case {spec.case_id}: {exc}")


#: Side of the square float32 CPU matmul timed as the host calibration (~33 MFLOP), and how many are timed
#: together: about 3 ms on this 2-core host, long enough that the timer, a cache miss or one scheduler tick
#: is not what is measured (one matmul, 0.4 ms, was: three of a run's calibrations read a burst as the host).
CALIBRATION_SIZE = 256
CALIBRATION_ROUNDS = 8


def calibration_ms() -> float:
    """Time of a fixed CPU matmul workload on torch's threads: it slows down with the host's load as a
    kernel's call beside it does, and not when only the kernel got slower."""
    a = torch.ones(CALIBRATION_SIZE, CALIBRATION_SIZE)
    start = time.perf_counter()
    for _ in range(CALIBRATION_ROUNDS):
        torch.mm(a, a)
    return (time.perf_counter() - start) * 1e3


def _timed(backend: Backend, call: MlaPrefillCall, spec: CaseSpec, repeats: int, warmup: int) -> Execution:
    for _ in range(warmup):
        backend.run(call)
    latencies: list[float] = []
    calibration: list[float] = []
    # a CPU matmul calibrates a kernel on the CPU only: a device kernel does not slow with the host's load
    # as it does, so dividing by it would hide a device's own slowdown on a busier host
    calibrate = repeats > 1 and backend.info().device.split(":")[0].strip().lower() == "cpu"
    first: torch.Tensor | None = None
    before = calibration_ms() if calibrate else 0.0
    for _ in range(max(1, repeats)):
        backend.synchronize()
        start = time.perf_counter()
        result = backend.run(call)
        if not isinstance(result, torch.Tensor):
            raise BackendOutputError(
                f"backend.run returned {type(result).__name__}, expected a torch.Tensor (attenOut)"
            )
        backend.synchronize()
        latencies.append((time.perf_counter() - start) * 1e3)
        if calibrate:  # interleaved: each call's host speed is that of its own moment, timed on both sides of it
            after = calibration_ms()
            calibration.append((before + after) / 2)
            before = after
        first = result if first is None else first
    assert first is not None
    return Execution(to_numpy(first), latencies, spec.useful_flops, calibration)


def disagreeing_reruns(backend: Backend, call: MlaPrefillCall, first: np.ndarray, reruns: int) -> int:
    """How many of ``reruns`` further calls return other bits than ``first``: a race shows only so
    (``--mla-repeat``); a rerun that raises disagrees too."""
    expected = np.ascontiguousarray(first).reshape(-1).view(np.uint8)
    count = 0
    for _ in range(reruns):
        try:
            again = backend.run(call)
        except BackendError:
            count += 1
            continue
        got = to_numpy(again) if isinstance(again, torch.Tensor) else np.empty(0)
        count += not np.array_equal(np.ascontiguousarray(got).reshape(-1).view(np.uint8), expected)
    return count


def input_digest(array: np.ndarray) -> str:
    """xxh3-128 of an array's bytes in C order, in place: notices a backend that writes into an input
    (accidental change; ~17 GB/s against SHA-256's 1.6, so a deepseek-sized case's inputs cost ~25 ms)."""
    return str(xxhash.xxh3_128_hexdigest(np.ascontiguousarray(array).reshape(-1).view(np.uint8).data))


def output_digest(out: np.ndarray) -> str:
    """SHA-256 of an output's bytes in C order, hashed in place (identical digests = bitwise identical
    outputs; the record's and the reruns' check, where :func:`input_digest` only notices a change)."""
    return hashlib.sha256(np.ascontiguousarray(out).reshape(-1).view(np.uint8).data).hexdigest()
