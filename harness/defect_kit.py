"""What every planted defect is built from: the torch CPU backend with hooks (:class:`Defect`), the defects' own
float32 attention path as a backend (:class:`ControlMath`, over :mod:`mlaconf.harness.defect_math`), and a
catalogue entry (:class:`DefectEntry`: the trigger in the factor model's terms, the probe a run needs, the upstream
bug it reproduces).

The catalogue itself is :mod:`mlaconf.harness.defects` (its ``ENTRIES``); the defects of ATB's own branches
(facts/branches.toml) are :mod:`mlaconf.harness.branch_defects`.  Both build on this module,
so neither imports the other's defects."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal

import torch

from mlaconf.facts.factors import load_model
from mlaconf.harness.backend import MlaPrefillCall
from mlaconf.harness.defect_math import math_attend
from mlaconf.harness.torch_backend import TorchSdpaBackend


def replace_call(call: MlaPrefillCall, **changes: object) -> MlaPrefillCall:
    return dataclasses.replace(call, **changes)  # type: ignore[arg-type]


class Defect(TorchSdpaBackend):
    """The torch CPU backend with hooks before the call, inside attention and after the output."""

    description = "no defect"

    def __init__(self, name: str) -> None:
        super().__init__("cpu")
        self.name = f"torch-cpu-defect-{name}"

    def before(self, call: MlaPrefillCall) -> MlaPrefillCall:
        return call

    def after(self, call: MlaPrefillCall, out: torch.Tensor) -> torch.Tensor:
        return out

    def run(self, call: MlaPrefillCall) -> torch.Tensor:
        return self.after(call, super().run(self.before(call)))


class ControlMath(Defect):
    description = "control: the float32 math path of the defects below, without a bug (must pass)"

    def _attend(  # type: ignore[override]  # an instance method (the base's is static)
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, group: int, scale: float, mask_type: int
    ) -> torch.Tensor:
        return math_attend(q, k, v, group, scale, mask_type)


#: How a run must treat a case for a defect to show (beside judging the plain output against its golden).
Probe = Literal["rerun", "nan_padding"]
#: Probe -> what it does to a conformance case, and the suite option or relation that does it in a pytest run.
PROBES: dict[str, str] = {
    "rerun": "every case called twice and the outputs compared bitwise (--mla-repeat 2)",
    "nan_padding": "padded kv's rows beyond kvSeqLen filled with NaN (the metamorphic relation padding_contents)",
}


@dataclass(frozen=True)
class RealBug:
    """An upstream bug a defect reproduces: where it is in the public record and which releases carried it."""

    source: str
    releases: str


@dataclass(frozen=True)
class DefectEntry:
    """One planted defect: its backend class, and the cases that can reach it.

    ``trigger`` is a necessary condition in the factor model's terms (``{factor: levels}``): a case reaches
    the defect only if, for every factor named, its levels meet the listed ones; off the trigger the defect
    computes exactly what its correct path does, so a power run skips those cases."""

    name: str
    backend: type[Defect]
    trigger: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    probe: Probe | None = None
    real_bug: RealBug | None = None

    @property
    def description(self) -> str:
        return self.backend.description

    @property
    def pending(self) -> bool:
        """Whether the trigger needs a pending level of the factor model (no shipped covering set holds it yet)."""
        pending = set(load_model().pending)
        return any(all((factor, level) in pending for level in wanted) for factor, wanted in self.trigger.items())

    def make(self) -> Defect:
        return self.backend(self.name)
