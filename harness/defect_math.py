"""The planted defects' own attention arithmetic (harness/defects.py): plain float32 attention over an explicit
key mask, an online softmax whose running max or rescaling can be broken, P rounded to fewer bits.  Each is a
path of a correct kernel (``control_math`` must pass on it) until a defect's argument breaks it."""

from __future__ import annotations

from collections.abc import Callable

import torch

from mlaconf.facts.operator import causal_offset
from mlaconf.harness.zoo import fp32_heads, visible_keys

FLASH_BLOCK = 128  # frozen_max, late_rescale_missing: keys per block of their online softmax
HEALTHY_BLOCKS = 2  # frozen_max, late_rescale_missing: blocks handled correctly before the bug sets in


def allowed_keys(q_len: int, kv_len: int, width: int, mask_type: int) -> torch.Tensor:
    """``[q_len, width]``: key j is visible to row i (keys at or beyond ``kv_len`` never are)."""
    rows = torch.arange(q_len)[:, None]
    cols = torch.arange(width)[None, :]
    allowed = (cols < kv_len).expand(q_len, width)
    offset = causal_offset(mask_type, q_len, kv_len)
    return allowed if offset is None else allowed & (cols <= rows + offset)


def round_significand(x: torch.Tensor, bits: int) -> torch.Tensor:
    """Round to ``bits`` significant bits (4 = fp8 e4m3's precision), exponent unbounded."""
    mantissa, exponent = torch.frexp(x)
    return torch.ldexp(torch.round(mantissa * 2.0**bits) / 2.0**bits, exponent)


def math_attend(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    group: int,
    scale: float,
    mask_type: int,
    kv_len: int | None = None,
    p_round: Callable[[torch.Tensor], torch.Tensor] | None = None,
) -> torch.Tensor:
    """Plain float32 attention for one sequence: q ``[q, H, 192]``, k ``[S, Hkv, 192]``, v ``[S, Hkv, 128]``.

    Keys at or beyond ``kv_len`` (default: all of k) are masked with -inf *after* Q.K, which is
    how ``padding_nan_unsafe`` can still be hurt by NaN values there.
    """
    kv_len = k.shape[0] if kv_len is None else kv_len
    qh, kh, vh = fp32_heads(q, k, v, group)
    scores = (qh @ kh.transpose(1, 2)) * scale
    scores = scores.masked_fill(~allowed_keys(q.shape[0], kv_len, k.shape[0], mask_type), float("-inf"))
    p = torch.softmax(scores, dim=-1)
    if p_round is not None:
        p = p_round(p)
    return (p @ vh).transpose(0, 1).to(q.dtype)


def flash_attend(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    group: int,
    scale: float,
    mask_type: int,
    *,
    frozen_max: bool = False,
    skip_rescale: bool = False,
) -> torch.Tensor:
    """Online softmax over blocks of :data:`FLASH_BLOCK` keys, P rounded to the input dtype per block;
    after :data:`HEALTHY_BLOCKS` blocks the running max stops moving (``frozen_max``) or the
    accumulator is no longer rescaled when it moves (``skip_rescale``; the running sum still is)."""
    qh, kh, vh = fp32_heads(q, k, v, group)
    allowed = visible_keys(q.shape[0], k.shape[0], mask_type)
    heads, rows, kv = qh.shape[0], qh.shape[1], kh.shape[1]
    acc = torch.zeros(heads, rows, vh.shape[2])
    m = torch.full((heads, rows, 1), float("-inf"))
    total = torch.zeros(heads, rows, 1)
    for index, j0 in enumerate(range(0, kv, FLASH_BLOCK)):
        j1 = min(j0 + FLASH_BLOCK, kv)
        s = (qh @ kh[:, j0:j1].transpose(1, 2)) * torch.tensor(scale, dtype=torch.float32)
        if allowed is not None:
            s = s.masked_fill(~allowed[:, j0:j1], float("-inf"))
        late = index >= HEALTHY_BLOCKS
        m_new = m if frozen_max and late else torch.maximum(m, s.amax(dim=-1, keepdim=True))
        safe = torch.where(torch.isinf(m_new), torch.zeros_like(m_new), m_new)
        p = torch.exp(s - safe)
        alpha = torch.exp(m - safe)
        total = total * alpha + p.sum(dim=-1, keepdim=True)
        acc = (acc if skip_rescale and late else acc * alpha) + p.to(q.dtype).float() @ vh[:, j0:j1]
        m = m_new
    return (acc / total).transpose(0, 1).to(q.dtype)


def causal_attend(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    group: int,
    scale: float,
    allowed: torch.Tensor,
) -> torch.Tensor:
    """float32 attention of one sequence over an explicit ``[q, kv]`` key mask (every row keeps a key)."""
    allowed = allowed.clone()
    allowed[allowed.sum(dim=1) == 0, 0] = True
    qh, kh, vh = fp32_heads(q, k, v, group)
    scores = ((qh @ kh.transpose(1, 2)) * scale).masked_fill(~allowed, float("-inf"))
    return (torch.softmax(scores, dim=-1) @ vh).transpose(0, 1).to(q.dtype)
