"""Float64 magnitudes of the attention sums: what the error-model tolerance rule scales with.

A correct low-precision kernel's error at an output element does not scale with the element's
value |g| (which cancels) but with the magnitudes of the terms summed into it.  For every batch,
query head h, query row i and value column c (P the float64 softmax over the allowed keys A(i),
s the scaled scores, g = P.V the golden; docs/conformance.md derives the rule that uses them):

per element, attenOut's layout (stored as ``golden/<name>``):

* ``pv_abs``   A = sum_j P_ij |V_jc|                      (fp32 accumulation of P.V)
* ``pv_rss``   R = sqrt(sum_j P_ij^2 V_jc^2)              (P rounded to the input dtype)
* ``pvs_rss``  S = sqrt(sum_j (P_ij w_ij)^2 (V_jc - g_ic)^2),  w_ij = 2|s_ij| + |s_ij - m_i|
                                                           (score roundings, each ~ |score|)
* ``pv_scale`` T = sum_j P_ij s_ij (V_jc - g_ic)          (d g / d log(qkScale): a rounded scale)

per row and head, ``[T, H]``:

* ``score_absmax``  M = max_{j in A(i)} |s_ij|
* ``score_dot``     C = qkScale * ||q_i|| * max_{j in A(i)} ||k_j||   (bounds every |q_i|.|k_j| sum)
* ``p_rss``         rho = sqrt(sum_j P_ij^2)

(m_i is the row maximum of s.)  Computed in torch float64, tile by tile like the reference
(memory O(tile x S)), on the CPU or the golden device; stored as float32 (a magnitude's relative
rounding of 6e-8 is far inside the rule's safety factor).  Rows of zero-length batches are 0.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from facts.operator import V_DIM
from golden import progress
from golden.layout import out_shape
from golden.reference import (
    DEFAULT_GPU_TILE,
    DEFAULT_TILE,
    effective_scale,
    iter_head_tasks,
    tile_bounds,
    tile_flops,
)
from golden.spec import CaseSpec
from golden.types import OpInputs

ELEMENT_MAGNITUDES = ("pv_abs", "pv_rss", "pvs_rss", "pv_scale")
ROW_MAGNITUDES = ("score_absmax", "score_dot", "p_rss")
MAGNITUDES = ELEMENT_MAGNITUDES + ROW_MAGNITUDES


def allowed_keys(spec: CaseSpec) -> np.ndarray:
    """int64 ``[T]``: how many keys each output token row attends to (0 for zero-length batches)."""
    counts = np.zeros(spec.total_q, dtype=np.int64)
    start = 0
    for q_len, kv_len in zip(spec.q_seqlen, spec.kv_seqlen, strict=True):
        if q_len and kv_len:
            rows = np.arange(q_len)
            if spec.mask_type in (2, 3):
                counts[start : start + q_len] = np.minimum(kv_len, rows + 1 + (kv_len - q_len))
            else:
                counts[start : start + q_len] = kv_len
        start += q_len
    return counts


def _tile(q: Any, k: Any, v: Any, knorm: Any, i0: int, diag: tuple[int, int] | None,
          torch: Any) -> dict[str, Any]:
    """Magnitudes of one tile of query rows (``q`` already scaled) against keys ``k``."""
    s = q @ k.T
    allowed = None
    if diag is not None:
        i = torch.arange(i0, i0 + q.shape[0], device=q.device)[:, None]
        j = torch.arange(k.shape[0], device=q.device)[None, :]
        allowed = j <= i + diag[1]
    neg = torch.full_like(s, float("-inf"))
    s_masked = s if allowed is None else torch.where(allowed, s, neg)
    m = s_masked.amax(dim=1, keepdim=True)
    p = torch.exp(s_masked - m)
    p /= p.sum(dim=1, keepdim=True)  # masked keys: exp(-inf) = 0
    s0 = s if allowed is None else torch.where(allowed, s, torch.zeros_like(s))  # no inf * 0 below
    g = p @ v
    out: dict[str, Any] = {}
    out["pv_abs"] = p @ v.abs()
    p2 = p * p
    out["pv_rss"] = (p2 @ (v * v)).sqrt()
    out["p_rss"] = p2.sum(dim=1).sqrt()
    weight = p * (2.0 * s0.abs() + (s0 - m).abs())
    if allowed is not None:
        weight = torch.where(allowed, weight, torch.zeros_like(weight))
    w2 = weight * weight
    sq = w2 @ (v * v) - 2.0 * g * (w2 @ v) + g * g * w2.sum(dim=1, keepdim=True)
    out["pvs_rss"] = sq.clamp(min=0.0).sqrt()
    ps = p * s0
    out["pv_scale"] = ps @ v - ps.sum(dim=1, keepdim=True) * g
    out["score_absmax"] = s0.abs().amax(dim=1)
    qnorm = q.norm(dim=1)  # q is pre-scaled: qkScale * ||q_i||
    if diag is None:
        kmax = knorm.amax().expand(q.shape[0])
    else:
        last = torch.clamp(torch.arange(i0, i0 + q.shape[0], device=q.device) + diag[1], max=k.shape[0] - 1)
        kmax = torch.cummax(knorm, dim=0).values[last]
    out["score_dot"] = qnorm * kmax
    return out


def compute_magnitudes(inputs: OpInputs, spec: CaseSpec, *, device: str = "cpu",
                       tile: int | None = None) -> dict[str, np.ndarray]:
    """Every magnitude of :data:`MAGNITUDES` as float32, element ones in attenOut's layout."""
    import torch  # deferred like the reference's torch path

    dev = torch.device(device)
    tile = tile or (DEFAULT_TILE if dev.type == "cpu" else DEFAULT_GPU_TILE)
    scale = effective_scale(spec)
    t, h = spec.total_q, spec.head_num
    elem = {name: np.zeros((t, h, V_DIM), dtype=np.float32) for name in ELEMENT_MAGNITUDES}
    rows = {name: np.zeros((t, h), dtype=np.float32) for name in ROW_MAGNITUDES}
    cache: tuple[Any, Any, Any, Any] | None = None
    for task in iter_head_tasks(inputs, spec, np.float64):
        if cache is None or cache[0] is not task.k:
            k = torch.from_numpy(task.k).to(dev)
            cache = (task.k, k, torch.from_numpy(task.v).to(dev), k.norm(dim=1))
        _, k, v, knorm = cache
        q = torch.from_numpy(task.q).to(dev) * scale
        for i0, i1, k_end, diag in tile_bounds(task, tile):
            part = _tile(q[i0:i1], k[:k_end], v[:k_end], knorm[:k_end], i0, diag, torch)
            progress.add_work(tile_flops(i1 - i0, k_end, diag))
            sl = slice(task.q_start + i0, task.q_start + i1)
            for name in ELEMENT_MAGNITUDES:
                elem[name][sl, task.head] = part[name].cpu().numpy()
            for name in ROW_MAGNITUDES:
                rows[name][sl, task.head] = part[name].cpu().numpy()
    shape = out_shape(spec)
    return {**{n: a.reshape(shape) for n, a in elem.items()}, **rows}
