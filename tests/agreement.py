"""The fused golden against the unfused float64 formula it replaced (they agree to 1e-12 relative).

"Relative" is to each element's own scale, |g| + A with A = sum_j P_j |V_j| (the pv_abs magnitude):
an output that cancels to near zero has float64 rounding of the size of its terms, not of itself, so
an element-wise |g|-relative comparison would measure cancellation, not agreement (it reaches ~4e-9
on shipped cases between any two float64 summation orders).  A is computed here with the unfused
formula too (``float64_tile`` applied to |V|, beside V), so nothing of the code under test scales its own check.

The fused side is :func:`reference_attention`, which the generator's one pass with the magnitudes
(``reference_and_magnitudes``) equals bit for bit (tests/cover/test_error_model.py): the same golden in less than half
the time.
"""

from __future__ import annotations

import numpy as np

from mlaconf.facts.operator import V_DIM
from mlaconf.golden.building.inputs import generate_inputs
from mlaconf.golden.building.reference import (
    HeadTask,
    effective_scale,
    float64_tile,
    for_each_tile,
    reference_attention,
)
from mlaconf.golden.specs.layout import row_valid
from mlaconf.golden.specs.spec import CaseSpec
from mlaconf.golden.specs.types import OpInputs

AGREEMENT = 1e-12


def unfused(spec: CaseSpec, inputs: OpInputs) -> tuple[np.ndarray, np.ndarray]:
    """The golden before the fused tile kernel (numpy tiles, float64) and its pv_abs, ``[T, H, 128]`` each:
    one ``float64_tile`` pass per tile with V and |V| side by side, the scores made once for both."""
    out = np.zeros((spec.total_q, spec.head_num, 2 * V_DIM))
    scale = effective_scale(spec)
    both: list[np.ndarray] = []  # [v, [v | |v|]] of the kv head the last tile read

    def visit(task: HeadTask, i0: int, i1: int, k_end: int, diag: tuple[int, int] | None) -> None:
        if not both or both[0] is not task.v:
            both[:] = [task.v, np.concatenate([task.v, np.abs(task.v)], axis=1)]
        rows = slice(task.q_start + i0, task.q_start + i1)
        out[rows, task.head] = float64_tile(task.q[i0:i1], task.k[:k_end], both[1][:k_end], scale, diag)

    for_each_tile(inputs, spec, visit, np.float64)
    return out[..., :V_DIM], out[..., V_DIM:]


def worst_disagreement(spec: CaseSpec) -> float:
    """max |fused - unfused| / (|unfused| + A) over the valid rows of ``spec``'s golden."""
    inputs = generate_inputs(spec)
    fused, _ = reference_attention(inputs, spec)  # the stored golden's values, bit for bit (test_error_model)
    old, pv_abs = unfused(spec, inputs)
    scale = np.abs(old) + pv_abs
    fused = fused.reshape(old.shape)
    valid = row_valid(spec)
    assert np.isfinite(fused[valid]).all(), f"{spec.case_id}: non-finite golden"
    diff = np.abs(fused[valid] - old[valid])
    return float((diff / np.maximum(scale[valid], np.finfo(np.float64).tiny)).max(initial=0.0))
