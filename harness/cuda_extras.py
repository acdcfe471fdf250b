"""Optional CUDA backends: FlashAttention varlen and FlashInfer ragged prefill (qk 192 / v 128).

Both libraries align causal masks bottom-right, which is MLA's CAUSAL (maskType 3) and equals
top-left for MASK_FREE (q == kv).  They take packed kv, so the padded layout is packed first.
Unavailable (with the import error as the reason) wherever the package or a GPU is missing.
"""

from __future__ import annotations

import importlib
from typing import Any

import torch

from mlaconf.facts.operator import NOPE_DIM, ROPE_DIM, V_DIM
from mlaconf.harness.backend import Availability, BackendError, BackendInfo, MlaPrefillCall
from mlaconf.harness.devices import worker_device_index

NOPE, ROPE, VDIM = NOPE_DIM, ROPE_DIM, V_DIM


def _probe(module: str) -> tuple[Any, str]:
    """Import a module; never raise (a broken CUDA extension raises more than ImportError)."""
    try:
        return importlib.import_module(module), ""
    except Exception as exc:  # report the first line of whatever the import raised
        lines = str(exc).strip().splitlines()
        return None, f"{module} not importable: {type(exc).__name__}: {lines[0] if lines else ''}"


def packed_inputs(call: MlaPrefillCall, device: torch.device) -> tuple[torch.Tensor, ...]:
    """q ``[T, H, 192]``, k ``[Tk, Hkv, 192]``, v ``[Tk, Hkv, 128]`` and int32 cu_seqlens on ``device``."""
    h = call.head_num
    total_q = call.q.shape[0]
    q = torch.cat([call.q.reshape(total_q, h, NOPE), call.q_rope.reshape(total_q, h, ROPE)], -1)
    lengths = [int(n) for n in call.kv_seqlen]
    parts = call.kv_parts()
    k = torch.cat([torch.cat([k_b, k_rope_b], -1) for k_b, k_rope_b, _ in parts])
    v = torch.cat([v_b for _, _, v_b in parts])
    cu_q = torch.cumsum(torch.tensor([0, *[int(n) for n in call.q_seqlen]]), 0).to(torch.int32)
    cu_k = torch.cumsum(torch.tensor([0, *lengths]), 0).to(torch.int32)
    return (
        q.to(device).contiguous(),
        k.to(device).contiguous(),
        v.to(device).contiguous(),
        cu_q.to(device),
        cu_k.to(device),
    )


def _check_mask(call: MlaPrefillCall) -> bool:
    if call.mask_type not in (0, 2, 3):
        raise BackendError("ERROR_INVALID_PARAM", "create", f"maskType {call.mask_type} is not implemented")
    return call.mask_type in (2, 3)


class _CudaLibraryBackend:
    error_contract = False
    deterministic = True
    name = ""
    module = ""

    def __init__(self) -> None:
        self.lib, self.reason = _probe(self.module)
        self.device = torch.device("cuda", worker_device_index(torch.cuda.device_count()))

    def available(self) -> Availability:
        if self.lib is None:
            return Availability(False, self.reason)
        if not torch.cuda.is_available():
            return Availability(False, "no CUDA device visible to torch")
        return Availability(True)

    def info(self) -> BackendInfo:
        version = str(getattr(self.lib, "__version__", "unknown"))
        return BackendInfo(self.name, str(self.device), {self.module: version, "torch": torch.__version__}, version)

    def synchronize(self) -> None:
        torch.cuda.synchronize(self.device)


class FlashAttnBackend(_CudaLibraryBackend):
    """``flash_attn_varlen_func``; v is zero-padded to 192 where the kernel needs equal head dims."""

    name = "flash-attn"
    module = "flash_attn"

    def run(self, call: MlaPrefillCall) -> torch.Tensor:
        causal = _check_mask(call)
        q, k, v, cu_q, cu_k = packed_inputs(call, self.device)
        v_padded = torch.nn.functional.pad(v, (0, NOPE + ROPE - VDIM))
        out = self.lib.flash_attn_varlen_func(
            q,
            k,
            v_padded,
            cu_q,
            cu_k,
            int(call.q_seqlen.max()),
            int(call.kv_seqlen.max()),
            softmax_scale=call.qk_scale,
            causal=causal,
        )[..., :VDIM]
        assert isinstance(out, torch.Tensor)
        return out.reshape(call.q.shape[0], -1) if call.q.dim() == 2 else out


class FlashInferBackend(_CudaLibraryBackend):
    """FlashInfer's ragged-kv batch prefill with ``head_dim_qk=192, head_dim_vo=128``."""

    name = "flashinfer"
    module = "flashinfer"

    def run(self, call: MlaPrefillCall) -> torch.Tensor:
        causal = _check_mask(call)
        q, k, v, cu_q, cu_k = packed_inputs(call, self.device)
        workspace = torch.empty(128 * 1024 * 1024, dtype=torch.uint8, device=self.device)
        wrapper = self.lib.prefill.BatchPrefillWithRaggedKVCacheWrapper(workspace, "NHD")
        wrapper.plan(
            cu_q,
            cu_k,
            call.head_num,
            call.kv_head_num,
            NOPE + ROPE,
            head_dim_vo=VDIM,
            causal=causal,
            sm_scale=call.qk_scale,
            q_data_type=q.dtype,
        )
        out = wrapper.run(q, k, v)
        assert isinstance(out, torch.Tensor)
        return out.reshape(call.q.shape[0], -1) if call.q.dim() == 2 else out
