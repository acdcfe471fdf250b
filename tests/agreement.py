"""The fused golden against the unfused float64 formula it replaced (they agree to 1e-12 relative).

"Relative" is to each element's own scale, |g| + A with A = sum_j P_j |V_j| (the pv_abs magnitude):
an output that cancels to near zero has float64 rounding of the size of its terms, not of itself, so
an element-wise |g|-relative comparison would measure cancellation, not agreement (it reaches ~4e-9
on shipped cases between any two float64 summation orders).  A is computed here with the unfused
formula too (``float64_tile`` applied to |V|), so nothing of the code under test scales its own check.
"""

from __future__ import annotations

import numpy as np

from mlaconf.golden.building.inputs import generate_inputs
from mlaconf.golden.building.magnitudes import reference_and_magnitudes
from mlaconf.golden.building.reference import attention, float64_tile
from mlaconf.golden.specs.layout import row_valid
from mlaconf.golden.specs.spec import CaseSpec

AGREEMENT = 1e-12


def unfused(spec: CaseSpec, inputs: object, *, absolute_values: bool = False) -> np.ndarray:
    """The golden before the fused tile kernel (numpy tiles, float64), or with |V| its pv_abs; ``[T, H, 128]``."""

    def kernel(q: np.ndarray, k: np.ndarray, v: np.ndarray, scale: float, diag: tuple[int, int] | None) -> np.ndarray:
        return float64_tile(q, k, np.abs(v) if absolute_values else v, scale, diag)

    return attention(inputs, spec, kernel, np.float64)  # type: ignore[arg-type]


def worst_disagreement(spec: CaseSpec) -> float:
    """max |fused - unfused| / (|unfused| + A) over the valid rows of ``spec``'s golden."""
    inputs = generate_inputs(spec)
    fused, _ = reference_and_magnitudes(inputs, spec, threads=2)
    old = unfused(spec, inputs)
    scale = np.abs(old) + unfused(spec, inputs, absolute_values=True)
    fused = fused.reshape(old.shape)
    valid = row_valid(spec)
    assert np.isfinite(fused[valid]).all(), f"{spec.case_id}: non-finite golden"
    diff = np.abs(fused[valid] - old[valid])
    return float((diff / np.maximum(scale[valid], np.finfo(np.float64).tiny)).max(initial=0.0))
