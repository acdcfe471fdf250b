"""A planted defect that imports nothing of mlaconf (numpy and torch only): a top-left CAUSAL mask.

The repro test copies a repro directory of this backend into a venv without mlaconf and checks the
failure reproduces there; ``mlaconf.harness.defects`` cannot serve (its defects build on mlaconf's backends).
It satisfies the Backend protocol structurally.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

NOPE, ROPE, VDIM = 128, 64, 128


@dataclass(frozen=True)
class Info:
    name: str
    device: str = "cpu"
    versions: dict[str, str] = field(default_factory=lambda: {"torch": torch.__version__})
    version: str | None = None


@dataclass(frozen=True)
class Ok:
    ok: bool = True
    reason: str = ""

    def __bool__(self) -> bool:
        return self.ok


class TopLeftCausal:
    """float32 attention whose CAUSAL mask is aligned top-left (j <= i) instead of bottom-right."""

    name = "standalone-top-left"
    error_contract = False
    deterministic = True

    def available(self) -> Ok:
        return Ok()

    def info(self) -> Info:
        return Info(self.name)

    def synchronize(self) -> None:
        return None

    def run(self, call: Any) -> torch.Tensor:
        h, hkv = call.head_num, call.kv_head_num
        total = int(call.q_seqlen.sum())
        q = torch.cat([call.q.reshape(total, h, NOPE), call.q_rope.reshape(total, h, ROPE)], dim=2).float()
        out = torch.zeros(total, h, VDIM, dtype=call.q_rope.dtype)
        padded = call.k.dim() == 3 and call.k.shape[2] == hkv * NOPE and call.k.shape[0] == len(call.q_seqlen)
        start_q = start_kv = 0
        for b, (q_len, kv_len) in enumerate(zip(call.q_seqlen.tolist(), call.kv_seqlen.tolist(), strict=True)):
            if padded:
                k, kr, v = call.k[b, :kv_len], call.k_rope[b, :kv_len], call.v[b, :kv_len]
            else:
                k, kr, v = (x[start_kv : start_kv + kv_len] for x in (call.k, call.k_rope, call.v))
            if q_len and kv_len:
                keys = torch.cat([k.reshape(kv_len, hkv, NOPE), kr.reshape(kv_len, hkv, ROPE)], dim=2).float()
                keys = keys.repeat_interleave(h // hkv, dim=1)
                values = v.reshape(kv_len, hkv, VDIM).float().repeat_interleave(h // hkv, dim=1)
                scores = torch.einsum("qhd,khd->hqk", q[start_q : start_q + q_len], keys) * call.qk_scale
                if call.mask_type in (2, 3):  # the bug: offset 0 for CAUSAL too
                    rows, cols = torch.arange(q_len)[:, None], torch.arange(kv_len)[None, :]
                    scores = scores.masked_fill(cols > rows, float("-inf"))
                p = torch.softmax(scores, dim=-1)
                out[start_q : start_q + q_len] = torch.einsum("hqk,khd->qhd", p, values).to(out.dtype)
            start_q, start_kv = start_q + q_len, start_kv + kv_len
        return out.reshape((*call.q.shape[:-1], h * VDIM) if call.q.dim() == 2 else (total, h, VDIM))


def top_left() -> TopLeftCausal:
    return TopLeftCausal()
