"""A fake ``torch_npu`` for the CPU tests of the torch_npu backends (harness/npu_ops.py).

It carries the two ops with the signatures op-plugin declares (``npu_ring_mla``: RingMlaAtb.cpp's
``TORCH_LIBRARY_FRAGMENT``; ``npu_fused_infer_attention_score``: op_plugin_functions.yaml), checks every
argument against what their documentation requires (shapes, dtypes, layouts, mode strings, the mask's
encoding, host int32 ``seqlen``, cumulative ``actual_seq_lengths``, ``sparse_mode``) and raises
:class:`FakeOpError` naming the argument on any mismatch, then computes the answer with a float32
torch reference (and the RingMLA LSE merge).  Every call is recorded.  Tensors live on the CPU, so the
backends under test run with ``device_type = "cpu"`` (``ring_mla_on_cpu``, ``npu_fia_on_cpu``).

Each refusal the real ops make is a rule in ``mlaconf.facts.torch_npu_ops.RULES`` (with its source);
the fake's message names the rule's id in brackets, and it refuses nothing that is not a rule or an
argument the MLA mapping never passes.  ``load_error`` makes every op call raise it (the lazy
``libatb.so`` load of a missing or mismatched ATB), ``fia_without_rope`` gives the FIA op op-plugin
6.0.0's keyword set (no ``query_rope``/``key_rope``).

Never a real torch_npu: ``install(monkeypatch)`` puts it into ``sys.modules`` for one test.
"""

from __future__ import annotations

import importlib.machinery
import sys
from dataclasses import dataclass, field
from types import ModuleType, SimpleNamespace
from typing import Any

import pytest
import torch

from mlaconf.facts.torch_npu_ops import FIA_TND_MAX_TOKENS, RING_KERNEL_TYPES
from mlaconf.harness.npu_ops import FusedInferAttentionBackend, RingMlaBackend

SOC = "Ascend910B3"
FLOATS = (torch.float16, torch.bfloat16)
RING_KERNELS = RING_KERNEL_TYPES
RING_MASKS = ("no_mask", "mask_type_triu")
RING_LAYOUTS = ("type_bsnd",)
RING_CALCS = ("calc_type_default", "calc_type_first_ring")
#: fp16 kernels add -10000 above the diagonal, bf16 kernels multiply 1 there by -3e38.
MASKED = {torch.float16: -10000.0, torch.bfloat16: 1.0}


#: npu_fused_infer_attention_score's optional tensors an MLA prefill never passes.
_UNUSED_BY_MLA_PREFILL = (
    "pse_shift",
    "dequant_scale1",
    "quant_scale1",
    "dequant_scale2",
    "quant_scale2",
    "quant_offset2",
    "antiquant_scale",
    "antiquant_offset",
    "key_antiquant_scale",
    "key_antiquant_offset",
    "value_antiquant_scale",
    "value_antiquant_offset",
    "block_table",
    "query_padding_size",
    "kv_padding_size",
    "key_shared_prefix",
    "value_shared_prefix",
    "actual_shared_prefix_len",
    "key_rope_antiquant_scale",
)


class FakeOpError(ValueError):
    """An argument the real op would refuse (or that the fake cannot vouch for)."""


def _need(condition: bool, message: str) -> None:
    if not condition:
        raise FakeOpError(message)


def _check_tensor(name: str, tensor: Any, shape: tuple[int, ...], dtype: torch.dtype) -> None:
    _need(isinstance(tensor, torch.Tensor), f"{name} must be a tensor, got {type(tensor).__name__}")
    _need(tuple(tensor.shape) == shape, f"{name} has shape {tuple(tensor.shape)}, expected {shape}")
    _need(tensor.dtype == dtype, f"{name} has dtype {tensor.dtype}, expected {dtype}")
    _need(tensor.is_contiguous(), f"{name} must be contiguous (ND)")
    _need(tensor.device.type == "cpu", f"{name} is on {tensor.device}, the fake's device is the CPU")


def _attend(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float, offset: int | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """One batch in float32: q ``[q, H, 192]``, k ``[kv, H, 192]``, v ``[kv, H, 128]`` (heads repeated);
    key j visible to row i iff ``j <= i + offset`` (None: all).  Returns out ``[q, H, 128]``, lse ``[H, q]``."""
    scores = torch.einsum("qhd,khd->hqk", q.float(), k.float()) * scale
    if offset is not None:
        rows = torch.arange(q.shape[0])[:, None]
        cols = torch.arange(k.shape[0])[None, :]
        scores = scores.masked_fill(cols > rows + offset, float("-inf"))
    lse = torch.logsumexp(scores, dim=-1)
    out = torch.einsum("hqk,khd->qhd", torch.softmax(scores, dim=-1), v.float())
    return out, lse


@dataclass
class FakeTorchNpu:
    """The module's state: the calls each op received, and the device the fake reports."""

    soc: str = SOC
    devices: int = 1
    ring_calls: list[dict[str, Any]] = field(default_factory=list)
    fia_calls: list[dict[str, Any]] = field(default_factory=list)
    syncs: int = 0
    #: Raised by every op call (e.g. the OSError of a libatb.so that cannot load).
    load_error: BaseException | None = None
    #: The FIA op as op-plugin 6.0.0 declares it: no query_rope/key_rope keywords.
    fia_without_rope: bool = False

    def _loaded(self) -> None:
        if self.load_error is not None:
            raise self.load_error

    # -- torch_npu.atb.npu_ring_mla ------------------------------------------------------------------

    def npu_ring_mla(
        self,
        q_nope: torch.Tensor,
        q_rope: torch.Tensor,
        k_nope: torch.Tensor,
        k_rope: torch.Tensor,
        value: torch.Tensor,
        mask: torch.Tensor,
        seqlen: torch.Tensor,
        head_num: int,
        kv_head_num: int,
        *,
        pre_out: torch.Tensor | None = None,
        prev_lse: torch.Tensor | None = None,
        qk_scale: float = 1.0,
        kernel_type: str | None = None,
        mask_type: str | None = None,
        input_layout: str | None = None,
        calc_type: str | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        self.ring_calls.append(dict(locals()))
        self._loaded()
        _need(isinstance(head_num, int) and isinstance(kv_head_num, int), "head_num/kv_head_num must be ints")
        _need(head_num >= 1 and kv_head_num >= 1 and head_num % kv_head_num == 0, f"heads {head_num}/{kv_head_num}")
        dtype = q_nope.dtype
        _need(dtype in FLOATS, f"q_nope dtype {dtype}: float16/bf16 only")
        tokens, kv_tokens = q_nope.shape[0], k_nope.shape[0]
        _check_tensor("q_nope", q_nope, (tokens, head_num, 128), dtype)
        _check_tensor("q_rope", q_rope, (tokens, head_num, 64), dtype)
        _check_tensor("k_nope", k_nope, (kv_tokens, kv_head_num, 128), dtype)
        _check_tensor("k_rope", k_rope, (kv_tokens, kv_head_num, 64), dtype)
        _check_tensor("value", value, (kv_tokens, kv_head_num, 128), dtype)
        _check_tensor("mask", mask, (512, 512), dtype)
        _need(
            isinstance(seqlen, torch.Tensor) and seqlen.device.type == "cpu",
            "seqlen must be a host (CPU) tensor [ring-seqlen-host]",
        )
        _need(seqlen.dtype == torch.int32, f"seqlen dtype {seqlen.dtype}, expected int32")
        _need(
            seqlen.dim() in (1, 2) and (seqlen.dim() == 1 or seqlen.shape[0] == 2),
            f"seqlen shape {tuple(seqlen.shape)}",
        )
        q_lens = (seqlen if seqlen.dim() == 1 else seqlen[0]).tolist()
        kv_lens = (seqlen if seqlen.dim() == 1 else seqlen[1]).tolist()
        _need(
            sum(q_lens) == tokens and sum(kv_lens) == kv_tokens,
            f"seqlen {seqlen.tolist()} vs {tokens}/{kv_tokens} tokens",
        )
        for q, kv in zip(q_lens, kv_lens, strict=True):
            _need(q > 0, "RingMLA: qSeqLen may not be 0 [ring-q-nonzero]")
            _need(
                mask_type != "mask_type_triu" or kv >= q or kv == 0,
                f"RingMLA: kvSeqLen {kv} < qSeqLen {q} with a mask [ring-kv-ge-q-with-mask]",
            )
        _need(
            kernel_type in RING_KERNELS,
            f"kernel_type {kernel_type!r} not in {RING_KERNELS} [ring-kernel-high-precision]",
        )
        _need(mask_type in RING_MASKS, f"mask_type {mask_type!r} not in {RING_MASKS} [ring-mode-strings]")
        _need(input_layout in RING_LAYOUTS, f"input_layout {input_layout!r} not in {RING_LAYOUTS} [ring-mode-strings]")
        _need(calc_type in RING_CALCS, f"calc_type {calc_type!r} not in {RING_CALCS} [ring-mode-strings]")
        _need(isinstance(qk_scale, float), f"qk_scale must be a float, got {type(qk_scale).__name__}")
        if mask_type == "mask_type_triu":
            upper = torch.ones(512, 512, dtype=torch.bool).triu(1)
            expected = torch.where(upper, MASKED[dtype], 0.0).to(dtype)
            _need(torch.equal(mask, expected), f"the triu mask is not the {dtype} encoding (0 / {MASKED[dtype]})")
            _need(q_lens == kv_lens, "the fake knows mask_type_triu only for qSeqLen == kvSeqLen (top-left causal)")
        if calc_type == "calc_type_first_ring":
            _need(pre_out is None and prev_lse is None, "calc_type_first_ring takes neither pre_out nor prev_lse")
        else:
            _need(pre_out is not None and prev_lse is not None, "calc_type_default merges pre_out and prev_lse")
            assert pre_out is not None and prev_lse is not None
            _check_tensor("pre_out", pre_out, (tokens, head_num, 128), dtype)
            _check_tensor("prev_lse", prev_lse, (head_num, tokens), torch.float32)
        group = head_num // kv_head_num
        out = torch.zeros(tokens, head_num, 128)
        lse = torch.full((head_num, tokens), float("-inf"))
        q_start = kv_start = 0
        for q, kv in zip(q_lens, kv_lens, strict=True):
            if kv:
                qs = torch.cat([q_nope[q_start : q_start + q], q_rope[q_start : q_start + q]], -1)
                ks = torch.cat([k_nope[kv_start : kv_start + kv], k_rope[kv_start : kv_start + kv]], -1)
                vs = value[kv_start : kv_start + kv]
                offset = 0 if mask_type == "mask_type_triu" else None
                o, s = _attend(qs, ks.repeat_interleave(group, 1), vs.repeat_interleave(group, 1), qk_scale, offset)
                out[q_start : q_start + q], lse[:, q_start : q_start + q] = o, s
            q_start += q
            kv_start += kv
        if calc_type == "calc_type_default":
            assert pre_out is not None and prev_lse is not None
            merged_lse = torch.logaddexp(prev_lse, lse)
            old = torch.exp(prev_lse - merged_lse).T[..., None]
            new = torch.exp(lse - merged_lse).T[..., None]
            out, lse = old * pre_out.float() + new * out, merged_lse
        return out.to(dtype), lse

    # -- torch_npu.npu_fused_infer_attention_score -----------------------------------------------------

    def npu_fused_infer_attention_score(
        self,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        *,
        pse_shift: torch.Tensor | None = None,
        atten_mask: torch.Tensor | None = None,
        actual_seq_lengths: list[int] | None = None,
        actual_seq_lengths_kv: list[int] | None = None,
        dequant_scale1: torch.Tensor | None = None,
        quant_scale1: torch.Tensor | None = None,
        dequant_scale2: torch.Tensor | None = None,
        quant_scale2: torch.Tensor | None = None,
        quant_offset2: torch.Tensor | None = None,
        antiquant_scale: torch.Tensor | None = None,
        antiquant_offset: torch.Tensor | None = None,
        key_antiquant_scale: torch.Tensor | None = None,
        key_antiquant_offset: torch.Tensor | None = None,
        value_antiquant_scale: torch.Tensor | None = None,
        value_antiquant_offset: torch.Tensor | None = None,
        block_table: torch.Tensor | None = None,
        query_padding_size: torch.Tensor | None = None,
        kv_padding_size: torch.Tensor | None = None,
        key_shared_prefix: torch.Tensor | None = None,
        value_shared_prefix: torch.Tensor | None = None,
        actual_shared_prefix_len: list[int] | None = None,
        query_rope: torch.Tensor | None = None,
        key_rope: torch.Tensor | None = None,
        key_rope_antiquant_scale: torch.Tensor | None = None,
        num_heads: int = 1,
        scale: float = 1.0,
        pre_tokens: int = 2147483647,
        next_tokens: int = 2147483647,
        input_layout: str = "BSH",
        num_key_value_heads: int = 0,
        sparse_mode: int = 0,
        inner_precise: int = 0,
        block_size: int = 0,
        antiquant_mode: int = 0,
        key_antiquant_mode: int = 0,
        value_antiquant_mode: int = 0,
        softmax_lse_flag: bool = False,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        arguments = dict(locals())
        self.fia_calls.append(arguments)
        self._loaded()
        unused = [name for name in _UNUSED_BY_MLA_PREFILL if arguments[name] is not None]
        _need(not unused, f"the MLA prefill mapping needs none of {unused}")
        _need(
            (
                pre_tokens,
                next_tokens,
                inner_precise,
                block_size,
                antiquant_mode,
                key_antiquant_mode,
                value_antiquant_mode,
            )
            == (2147483647, 2147483647, 0, 0, 0, 0, 0),
            "pre/next_tokens, inner_precise, block_size and the quant modes keep their defaults",
        )
        _need(input_layout == "TND", f"input_layout {input_layout!r}: the fake implements TND")
        _need(not softmax_lse_flag, "softmax_lse_flag: no LSE is needed for one call")
        heads, kv_heads = num_heads, num_key_value_heads or num_heads
        _need(
            heads % kv_heads == 0 and heads // kv_heads <= 64,
            f"num_heads {heads} / num_key_value_heads {kv_heads} [fia-gqa-ratio]",
        )
        dtype = query.dtype
        _need(dtype == torch.bfloat16, f"query dtype {dtype}: TND takes bf16 only [fia-tnd-bf16]")
        tokens, kv_tokens = query.shape[0], key.shape[0]
        _need(
            max(tokens, kv_tokens) <= FIA_TND_MAX_TOKENS,
            f"{max(tokens, kv_tokens)} tokens: TND takes at most {FIA_TND_MAX_TOKENS} [fia-tnd-max-tokens]",
        )
        _check_tensor("query", query, (tokens, heads, 128), dtype)
        _check_tensor("key", key, (kv_tokens, kv_heads, 128), dtype)
        _check_tensor("value", value, (kv_tokens, kv_heads, 128), dtype)
        _need(query_rope is not None and key_rope is not None, "MLA: query_rope and key_rope together")
        assert query_rope is not None and key_rope is not None
        _check_tensor("query_rope", query_rope, (tokens, heads, 64), dtype)
        _check_tensor("key_rope", key_rope, (kv_tokens, kv_heads, 64), dtype)
        for name, lengths, total in (
            ("actual_seq_lengths", actual_seq_lengths, tokens),
            ("actual_seq_lengths_kv", actual_seq_lengths_kv, kv_tokens),
        ):
            _need(
                isinstance(lengths, list) and all(isinstance(n, int) for n in lengths),
                f"{name} must be a list of ints (TND)",
            )
            assert isinstance(lengths, list)
            _need(0 < len(lengths) <= 4096, f"{name}: 1..4096 batches, got {len(lengths)} [fia-tnd-max-batch]")
            _need(all(b >= a for a, b in zip([0, *lengths], lengths, strict=False)), f"{name} must be cumulative")
            _need(lengths[-1] == total, f"{name} ends at {lengths[-1]}, the tensor has {total} rows")
        assert actual_seq_lengths is not None and actual_seq_lengths_kv is not None
        _need(len(actual_seq_lengths) == len(actual_seq_lengths_kv), "one batch count for q and kv")
        _need(
            sparse_mode in (0, 3), f"sparse_mode {sparse_mode}: the fake knows 0 (no mask) and 3 (bottom-right causal)"
        )
        if sparse_mode == 3:
            expected = torch.ones(2048, 2048, dtype=torch.bool).triu(1)
            _need(
                isinstance(atten_mask, torch.Tensor) and atten_mask.dtype == torch.bool,
                "sparse_mode 3 takes a bool mask",
            )
            assert isinstance(atten_mask, torch.Tensor)
            _need(
                torch.equal(atten_mask, expected),
                "sparse_mode 3 takes the 2048x2048 optimised mask (upper triangle True)",
            )
        else:
            _need(atten_mask is None, "sparse_mode 0 without a mask computes every pair")
        _need(isinstance(scale, float), f"scale must be a float, got {type(scale).__name__}")
        group = heads // kv_heads
        out = torch.zeros(tokens, heads, 128)
        q_ends, kv_ends = [0, *actual_seq_lengths], [0, *actual_seq_lengths_kv]
        for b in range(len(actual_seq_lengths)):
            qr, kr = slice(q_ends[b], q_ends[b + 1]), slice(kv_ends[b], kv_ends[b + 1])
            q_len, kv_len = qr.stop - qr.start, kr.stop - kr.start
            if q_len and kv_len:
                qs = torch.cat([query[qr], query_rope[qr]], -1)
                ks = torch.cat([key[kr], key_rope[kr]], -1).repeat_interleave(group, 1)
                offset = kv_len - q_len if sparse_mode == 3 else None
                out[qr] = _attend(qs, ks, value[kr].repeat_interleave(group, 1), scale, offset)[0]
        return out.to(dtype), torch.zeros(1)

    # -- torch_npu.npu -------------------------------------------------------------------------------

    def module(self) -> ModuleType:
        module = ModuleType("torch_npu")
        module.__spec__ = importlib.machinery.ModuleSpec("torch_npu", None)  # find_spec() must work
        module.__version__ = "2.5.1-fake"  # type: ignore[attr-defined]
        module.atb = SimpleNamespace(npu_ring_mla=self.npu_ring_mla)  # type: ignore[attr-defined]
        module.npu_fused_infer_attention_score = (  # type: ignore[attr-defined]
            self._fia_6_0_0 if self.fia_without_rope else self.npu_fused_infer_attention_score
        )
        module.npu = SimpleNamespace(  # type: ignore[attr-defined]
            is_available=lambda: self.devices > 0,
            device_count=lambda: self.devices,
            set_device=lambda index: None,
            current_device=lambda: 0,
            get_device_name=lambda index=0: self.soc,
            synchronize=self._synchronize,
        )
        return module

    def _fia_6_0_0(
        self,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        *,
        atten_mask: torch.Tensor | None = None,
        actual_seq_lengths: list[int] | None = None,
        actual_seq_lengths_kv: list[int] | None = None,
        num_heads: int = 1,
        scale: float = 1.0,
        input_layout: str = "BSH",
        num_key_value_heads: int = 0,
        sparse_mode: int = 0,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """op-plugin 6.0.0's keyword set (the MLA keywords missing [fia-mla-keywords]); never computes."""
        raise FakeOpError("the 6.0.0 op cannot split the rope part [fia-mla-keywords]")

    def _synchronize(self) -> None:
        self.syncs += 1


def install(monkeypatch: pytest.MonkeyPatch, fake: FakeTorchNpu | None = None) -> FakeTorchNpu:
    """Put a fake torch_npu into ``sys.modules`` for the running test; returns its state."""
    fake = fake or FakeTorchNpu()
    monkeypatch.setitem(sys.modules, "torch_npu", fake.module())
    return fake


def install_for_process() -> FakeTorchNpu:
    """The same for a whole process (a pytest run in a subprocess): ``import tests.fake_torch_npu``."""
    fake = FakeTorchNpu()
    sys.modules["torch_npu"] = fake.module()
    return fake


class CpuRingMla(RingMlaBackend):
    device_type = "cpu"


class CpuFusedInferAttention(FusedInferAttentionBackend):
    device_type = "cpu"


def ring_mla_on_cpu() -> CpuRingMla:
    """``--mla-backend tests.fake_torch_npu:ring_mla_on_cpu`` (with the fake installed for the process)."""
    return CpuRingMla()


def npu_fia_on_cpu() -> CpuFusedInferAttention:
    return CpuFusedInferAttention()
