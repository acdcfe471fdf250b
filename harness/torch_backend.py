"""PyTorch ``scaled_dot_product_attention`` backends (CPU and CUDA): devices under test.

They compute in the case dtype, one sequence at a time over ragged batches, and share no numerical
code with the golden generator: they exist to be checked, not to check.

Working memory per call is bounded: a sequence is attended in groups of heads (and, when one head's
``q x kv`` scores alone exceed the budget, in blocks of query rows with an explicit mask), so that
SDPA's math path never materialises more than :data:`SCORE_BUDGET` score elements and GQA's
repeated keys exist for one head group at a time.  128 heads x 16k tokens then runs in a few GB.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from mlaconf.facts.operator import MASK_FREE, NOPE_DIM, ROPE_DIM, V_DIM, causal_offset
from mlaconf.harness.backend import Availability, BackendError, BackendInfo, MlaPrefillCall

NOPE, ROPE, VDIM = NOPE_DIM, ROPE_DIM, V_DIM
#: Score elements (query rows x keys x heads) one SDPA call may touch: 2^26 = 256 MB in float32.
SCORE_BUDGET = 1 << 26


def head_chunk(q_len: int, kv_len: int, heads: int, group: int) -> int:
    """Query heads attended per call for one batch: whole GQA groups whose scores fit :data:`SCORE_BUDGET`."""
    return max(1, min(heads, SCORE_BUDGET // (q_len * kv_len))) // group * group or group


def query_heads(x: torch.Tensor, group: int) -> torch.Tensor:
    """``x`` ``[Hkv, kv, D]`` repeated for each query head of its GQA group: a contiguous ``[Hkv * group, kv, D]``,
    the tensor ``repeat_interleave(group, dim=0)`` makes, without its index gather (6 % of a profiled power run)."""
    hkv, kv, d = x.shape
    return x.unsqueeze(1).expand(hkv, group, kv, d).reshape(hkv * group, kv, d).contiguous()


class TorchSdpaBackend:
    """MLA prefill via ``F.scaled_dot_product_attention`` on one torch device."""

    error_contract = False
    deterministic = True

    def __init__(self, device: str) -> None:
        self.device = device
        self.name = f"torch-{torch.device(device).type}"

    def available(self) -> Availability:
        if torch.device(self.device).type == "cuda" and not torch.cuda.is_available():
            return Availability(False, "no CUDA device visible to torch")
        return Availability(True)

    def info(self) -> BackendInfo:
        device = self.device
        if torch.device(device).type == "cuda" and torch.cuda.is_available():
            device = f"{device} ({torch.cuda.get_device_name(torch.device(device))})"
        return BackendInfo(self.name, device, {"torch": torch.__version__}, version=torch.__version__)

    def synchronize(self) -> None:
        if torch.device(self.device).type == "cuda":
            torch.cuda.synchronize(self.device)

    def run(self, call: MlaPrefillCall) -> torch.Tensor:
        if call.mask_type not in (0, 2, 3):
            raise BackendError("ERROR_INVALID_PARAM", "create", f"maskType {call.mask_type} is not implemented")
        dev = torch.device(self.device)
        h, hkv = call.head_num, call.kv_head_num
        if hkv < 1 or h % hkv:
            raise BackendError("ERROR_INVALID_PARAM", "create", f"headNum {h} is not a multiple of kvHeadNum {hkv}")
        group = h // hkv
        total_q = call.q.shape[0]
        q_nope, q_rope = call.q.reshape(total_q, h, NOPE), call.q_rope.reshape(total_q, h, ROPE)
        out = torch.zeros(total_q, h, VDIM, dtype=call.q.dtype, device=dev)
        parts = call.kv_parts()
        q_start = 0
        for b in range(call.q_seqlen.shape[0]):
            q_len, kv_len = int(call.q_seqlen[b]), int(call.kv_seqlen[b])
            if q_len and kv_len:
                k_nope_b, k_rope_b, values = (t.to(dev) for t in parts[b])
                heads = head_chunk(q_len, kv_len, h, group)
                for h0 in range(0, h, heads):  # keys and queries are concatenated per head group only
                    rows = slice(q_start, q_start + q_len)
                    q = torch.cat([q_nope[rows, h0 : h0 + heads], q_rope[rows, h0 : h0 + heads]], -1).to(dev)
                    kv_heads = slice(h0 // group, (h0 + heads) // group)
                    keys = torch.cat([k_nope_b[:, kv_heads], k_rope_b[:, kv_heads]], -1)
                    out[rows, h0 : h0 + heads] = self._attend(
                        q, keys, values[:, kv_heads], group, call.qk_scale, call.mask_type
                    )
            q_start += q_len
        return out.reshape(total_q, h * VDIM) if call.q.dim() == 2 else out

    @staticmethod
    def _attend(
        q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, group: int, scale: float, mask_type: int
    ) -> torch.Tensor:
        """One sequence: q ``[q, H, 192]``, k ``[kv, Hkv, 192]``, v ``[kv, Hkv, 128]``."""
        qh = q.transpose(0, 1)
        kh, vh = query_heads(k.transpose(0, 1), group), query_heads(v.transpose(0, 1), group)
        q_len, kv_len, heads = q.shape[0], k.shape[0], q.shape[1]
        offset = causal_offset(mask_type, q_len, kv_len)  # key j visible to row i iff j <= i + offset
        if q_len * kv_len * heads <= SCORE_BUDGET:
            mask = None
            is_causal = mask_type == MASK_FREE  # offset 0: SDPA's own top-left causal mask
            if offset is not None and not is_causal:
                rows = torch.arange(q_len, device=q.device)[:, None]
                cols = torch.arange(kv_len, device=q.device)[None, :]
                mask = cols <= rows + offset
            out = F.scaled_dot_product_attention(qh, kh, vh, attn_mask=mask, is_causal=is_causal, scale=scale)
            return out.transpose(0, 1)
        # one head's scores exceed the budget: blocks of query rows, each against the keys it may see
        block = max(1, SCORE_BUDGET // (kv_len * heads))
        out = torch.empty(heads, q_len, v.shape[-1], dtype=q.dtype, device=q.device)
        for i0 in range(0, q_len, block):
            i1 = min(i0 + block, q_len)
            k_end = kv_len if offset is None else min(kv_len, i1 + offset)
            mask = None
            if offset is not None:
                rows = torch.arange(i0, i1, device=q.device)[:, None]
                mask = torch.arange(k_end, device=q.device)[None, :] <= rows + offset
            out[:, i0:i1] = F.scaled_dot_product_attention(
                qh[:, i0:i1], kh[:, :k_end], vh[:, :k_end], attn_mask=mask, scale=scale
            )
        return out.transpose(0, 1)


def torch_cpu() -> TorchSdpaBackend:
    return TorchSdpaBackend("cpu")


def torch_cuda() -> TorchSdpaBackend:
    """The CUDA backend on this xdist worker's pinned device."""
    from mlaconf.harness.devices import worker_device_index

    return TorchSdpaBackend(f"cuda:{worker_device_index(torch.cuda.device_count())}")
