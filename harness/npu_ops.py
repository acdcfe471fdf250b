"""Two more ways onto the NPU through torch_npu, as numerical comparators for ATB's C interface.

* ``ring-mla``: ``torch_npu.atb.npu_ring_mla`` (ATB's RingMLA kernels; op-plugin ``op_plugin/ops/atb/
  RingMlaAtb.cpp``, documented in ``op_plugin/python/atb/_atb_api_docs.py``): packed ``[tokens, heads,
  dim]`` tensors, GQA, ``mask_type`` "no_mask" or "mask_type_triu" (a 512x512 mask in the MASK_FREE
  encoding), host int32 ``seqlen [2, B]``; every batch needs ``qSeqLen > 0`` and ``kvSeqLen >= qSeqLen``
  (or 0); it returns ``(out [T, H, 128], softmax_lse [H, T] fp32)``.  A prefix cache takes two calls
  merged by the LSE (``pre_out``/``prev_lse`` with ``calc_type_default``).
* ``npu-fia``: ``torch_npu.npu_fused_infer_attention_score`` (aclnn FusedInferAttentionScore; op-plugin
  ``docs/zh/custom_APIs/torch_npu/torch_npu-npu_fused_infer_attention_score.md``): ``input_layout="TND"``
  with ``query_rope``/``key_rope`` (MLA with D 128 + rope 64), cumulative ``actual_seq_lengths`` and
  ``actual_seq_lengths_kv`` (at most 4096 batches), ``sparse_mode=3`` (bottom-right causal) or 0 (no
  mask), GQA ratio at most 64.  The 2048x2048 "optimised" mask of sparse modes 2-4 is written out only
  in the sibling op's page (``torch_npu-npu_fusion_attention.md``: ``torch.triu(torch.ones(2048, 2048,
  dtype=torch.bool), diagonal=1)``, True = not computed); that it means the same here is unconfirmed
  until a device run.  TND takes bf16 only: fp16 is ``Unsupported`` (never cast, which would judge
  another computation); the rules and their sources are ``facts/torch_npu_ops.py``.

Availability makes one tiny real call of the op (``tiny_call``): ``npu_ring_mla`` exists even when
``libatb.so`` cannot load (the error comes at the first call), and op-plugin 6.0.0's FIA op has no
``query_rope``; any exception is the reason, with torch_npu's version and the library path.

Both map an :class:`MlaPrefillCall` (the C interface's arguments) onto the op: the padded kv layout is
packed (batch b's rows ``b*S .. b*S + kv_b``, as documented), batches without query or key rows are left
out (their rows are never checked), MASK_FREE's causal mask is passed in the op's own encoding whatever the
case's fill, and what the op cannot express raises :class:`Unsupported`, so the case is skipped with the
reason.  Neither has the C interface's error contract.
"""

from __future__ import annotations

import importlib
import inspect
import itertools
import os
from collections.abc import Callable
from dataclasses import dataclass
from types import ModuleType

import torch

from mlaconf.facts.operator import CAUSAL, MASK_FREE, MASK_SIZE, MASKED_VALUE, NOPE_DIM, ROPE_DIM, V_DIM
from mlaconf.facts.releases import atb_mla_supports_soc
from mlaconf.facts.torch_npu_ops import FIA_MLA_KEYWORDS, FIA_TND_DTYPE, FIA_TND_MAX_TOKENS, rule_text
from mlaconf.harness.backend import Availability, BackendInfo, MlaPrefillCall, Unsupported
from mlaconf.harness.devices import worker_device_index

#: npu_ring_mla's mask and kernel choices (RingMlaAtb.cpp, mask_type_map / kernel_type_map / calc_type_map).
RING_NO_MASK, RING_TRIU = "no_mask", "mask_type_triu"
RING_HIGH_PRECISION = "kernel_type_high_precision"
RING_LAYOUT = "type_bsnd"
RING_FIRST, RING_MERGE = "calc_type_first_ring", "calc_type_default"
#: FusedInferAttentionScore's limits for TND: batches in actual_seq_lengths, query heads per kv head.
FIA_MAX_BATCH = 4096
FIA_MAX_GROUP = 64
FIA_MASK_SIZE = 2048
FIA_NO_MASK, FIA_BOTTOM_RIGHT_CAUSAL = 0, 3
_DTYPE_NAMES = {torch.float16: "fp16", torch.bfloat16: "bf16"}


@dataclass(frozen=True)
class Packed:
    """A call's batches with query and key rows, packed: ``[T, H, D]`` / ``[Tk, Hkv, D]`` on the host."""

    q: torch.Tensor
    q_rope: torch.Tensor
    k: torch.Tensor
    k_rope: torch.Tensor
    v: torch.Tensor
    q_lens: list[int]
    kv_lens: list[int]
    #: For each packed query row, its row in the call's q (to scatter the output back).
    rows: torch.Tensor


def pack(call: MlaPrefillCall) -> Packed:
    """The batches that have query and key rows, in the packed layout the torch_npu ops take."""
    h = call.head_num
    total_q = call.q.shape[0]
    q, q_rope = call.q.reshape(total_q, h, NOPE_DIM), call.q_rope.reshape(total_q, h, ROPE_DIM)
    q_lens_all = [int(n) for n in call.q_seqlen]
    kv_lens_all = [int(n) for n in call.kv_seqlen]
    every_kv = call.kv_parts()
    q_parts, kv_parts, q_lens, kv_lens = [], [], [], []
    q_start = 0
    for b, (q_len, kv_len) in enumerate(zip(q_lens_all, kv_lens_all, strict=True)):
        if q_len > 0 and kv_len > 0:
            q_parts.append(torch.arange(q_start, q_start + q_len))
            kv_parts.append(every_kv[b])
            q_lens.append(q_len)
            kv_lens.append(kv_len)
        q_start += q_len
    if not q_lens:
        raise Unsupported("no batch has both query and key rows: there is nothing to compute")
    rows = torch.cat(q_parts)
    return Packed(
        q=q[rows].contiguous(),
        q_rope=q_rope[rows].contiguous(),
        k=torch.cat([part[0] for part in kv_parts]).contiguous(),
        k_rope=torch.cat([part[1] for part in kv_parts]).contiguous(),
        v=torch.cat([part[2] for part in kv_parts]).contiguous(),
        q_lens=q_lens,
        kv_lens=kv_lens,
        rows=rows,
    )


def unpack(call: MlaPrefillCall, packed: Packed, out: torch.Tensor) -> torch.Tensor:
    """The op's packed ``[T', H, 128]`` output as the call's attenOut (q's layout, qRope's dtype)."""
    total_q = call.q.shape[0]
    full = torch.zeros(total_q, call.head_num, V_DIM, dtype=call.q_rope.dtype)
    full[packed.rows] = out.to("cpu", call.q_rope.dtype)
    return full.reshape(total_q, call.head_num * V_DIM) if call.q.dim() == 2 else full


def _prefix_and_starts(packed: Packed) -> tuple[list[int], list[int]]:
    """Each packed batch's cached prefix (kv - q) and its first key row."""
    prefix = [kv - q for q, kv in zip(packed.q_lens, packed.kv_lens, strict=True)]
    return prefix, [0, *itertools.accumulate(packed.kv_lens)][:-1]


def prefix_chunks(packed: Packed) -> tuple[torch.Tensor, torch.Tensor, list[int], list[int]]:
    """RingMLA's prefix step: query rows, key rows and the (q, kv) lengths of each chunk.

    RingMLA needs kvSeqLen >= qSeqLen per batch, so a batch's query rows go in chunks of at most its
    prefix length, each against the whole prefix."""
    prefix, starts = _prefix_and_starts(packed)
    q_rows, kv_rows, q_lens, kv_lens = [], [], [], []
    q_start = 0
    for b, (q_len, p) in enumerate(zip(packed.q_lens, prefix, strict=True)):
        for c in range(0, q_len if p else 0, max(p, 1)):
            chunk = min(p, q_len - c)
            q_rows.append(torch.arange(q_start + c, q_start + c + chunk))
            kv_rows.append(torch.arange(starts[b], starts[b] + p))
            q_lens.append(chunk)
            kv_lens.append(p)
        q_start += q_len
    return torch.cat(q_rows), torch.cat(kv_rows), q_lens, kv_lens


def op_output_rows(op_name: str, call: MlaPrefillCall) -> tuple[torch.Tensor, list[torch.Tensor | None]]:
    """How a route assembles attenOut from its op calls, for a repro that replays them (tools/repro.py):
    the call's q row of each packed row, and per op call the packed rows its first output fills (None: all)."""
    packed = pack(call)
    steps: list[torch.Tensor | None] = [None]
    prefix, _ = _prefix_and_starts(packed)
    if op_name == RingMlaBackend.op_name and any(prefix):
        steps.append(prefix_chunks(packed)[0])
    return packed.rows, steps


def compressed_causal_mask(dtype: torch.dtype) -> torch.Tensor:
    """The 512x512 causal mask in the MASK_FREE encoding RingMLA's triu kernels read (facts.MASKED_VALUE)."""
    name = _DTYPE_NAMES.get(dtype)
    if name is None:
        raise Unsupported(f"dtype {dtype}: the torch_npu MLA ops take fp16 or bf16")
    upper = torch.ones(MASK_SIZE, MASK_SIZE, dtype=torch.bool).triu(1)
    return torch.where(upper, MASKED_VALUE[name], 0.0).to(dtype)


def tiny_call() -> MlaPrefillCall:
    """The smallest valid call (one bf16 token, one head, no mask): what a probe runs to prove the op runs."""
    gen = torch.Generator().manual_seed(0)

    def rand(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=gen).to(torch.bfloat16)

    one = torch.tensor([1], dtype=torch.int32)
    return MlaPrefillCall(
        q=rand(1, 1, NOPE_DIM),
        q_rope=rand(1, 1, ROPE_DIM),
        k=rand(1, 1, NOPE_DIM),
        k_rope=rand(1, 1, ROPE_DIM),
        v=rand(1, 1, V_DIM),
        q_seqlen=one,
        kv_seqlen=one.clone(),
        mask=None,
        head_num=1,
        qk_scale=0.1,
        kv_head_num=1,
        mask_type=0,
        cache_mode=1,
    )


def _first_line(err: BaseException) -> str:
    lines = str(err).strip().splitlines()
    return f"{type(err).__name__}: {lines[0]}" if lines else type(err).__name__


def _require_mask_type(call: MlaPrefillCall, op: str) -> None:
    if call.mask_type not in (0, MASK_FREE, CAUSAL):
        raise Unsupported(f"maskType {call.mask_type}: {op} has no such prefill mask (only 0, 2 and 3 map)")
    if call.mask_type != CAUSAL and call.q_seqlen.tolist() != call.kv_seqlen.tolist():
        raise Unsupported(f"maskType {call.mask_type} with qSeqLen != kvSeqLen is outside the operator's contract")
    if call.head_num < 1 or call.kv_head_num < 1 or call.head_num % call.kv_head_num:
        raise Unsupported(f"headNum {call.head_num} is not a multiple of kvHeadNum {call.kv_head_num}")


class _TorchNpuOpBackend:
    """What both backends share: probing torch_npu and the op, the device, synchronisation."""

    name = ""
    error_contract = False
    deterministic = True
    #: torch device type of torch_npu's devices (the CPU tests run the same path with "cpu").
    device_type = "npu"
    #: The op's name, for messages; :meth:`_op` finds it.
    op_name = ""

    def __init__(self) -> None:
        self._module: ModuleType | None = None
        self._availability: Availability | None = None

    def _op(self, torch_npu: ModuleType) -> object:
        raise NotImplementedError

    def available(self) -> Availability:
        if self._availability is None:
            self._availability = self._probe()
        return self._availability

    def _probe(self) -> Availability:
        try:
            torch_npu = importlib.import_module("torch_npu")
        except Exception as err:  # without CANN torch_npu raises RuntimeError/OSError, not only ImportError
            return Availability(False, f"torch_npu is missing or fails to import ({_first_line(err)})")
        try:
            self._op(torch_npu)
        except AttributeError:
            version = getattr(torch_npu, "__version__", "?")
            return Availability(
                False, f"torch_npu {version} has no {self.op_name} (a newer torch_npu/op-plugin ships it)"
            )
        try:
            devices = int(torch_npu.npu.device_count()) if torch_npu.npu.is_available() else 0
        except Exception as err:
            return Availability(False, f"no NPU device: the device query failed ({_first_line(err)})")
        if devices == 0:
            return Availability(False, "no NPU device visible to torch_npu")
        index = worker_device_index(devices)
        try:
            torch_npu.npu.set_device(index)
            soc = str(torch_npu.npu.get_device_name(index))
        except Exception as err:
            return Availability(False, f"cannot select the NPU or read its SoC name: {_first_line(err)}")
        if not atb_mla_supports_soc(soc):
            return Availability(
                False, f"SoC {soc!r}: {self.op_name} runs on Atlas 800I A2/A3 only (Ascend910B<n>, Ascend910_93*)"
            )
        missing = self._missing_keywords(torch_npu)
        if missing:
            return Availability(False, f"{self.op_name} in {self._versions(torch_npu)} has no keyword {missing}")
        self._module = torch_npu
        self._availability = Availability(True)  # for the probe call itself; available() overwrites it
        try:  # the op object exists even when its library cannot load: only a call proves it runs
            self._tiny_call()
            torch_npu.npu.synchronize()
        except Exception as err:
            self._module = None
            return Availability(
                False, f"{self.op_name} failed its probe call ({_first_line(err)}); {self._versions(torch_npu)}"
            )
        return Availability(True)

    def _missing_keywords(self, torch_npu: ModuleType) -> list[str]:
        """The keywords :meth:`run` passes that the installed op does not declare (signature, else docstring)."""
        return []

    def _tiny_call(self) -> None:
        """One smallest real call of the op on the device (loads its library, runs its kernel)."""
        raise NotImplementedError

    def _versions(self, torch_npu: ModuleType) -> str:
        """torch_npu's version and the library the op loads, for a reason line."""
        return f"torch_npu {getattr(torch_npu, '__version__', '?')}"

    def _torch_npu(self) -> ModuleType:
        if not self.available() or self._module is None:
            raise RuntimeError(f"the {self.name} backend is unavailable: {self.available().reason}")
        return self._module

    def _device(self) -> torch.device:
        return torch.device(self.device_type, int(self._torch_npu().npu.current_device()))

    def info(self) -> BackendInfo:
        if not self.available() or self._module is None:
            return BackendInfo(self.name, "unavailable", {})
        npu = self._module.npu
        index = int(npu.current_device())
        version = str(getattr(self._module, "__version__", "?"))
        versions = {"torch": torch.__version__, "torch_npu": version, "op": self.op_name}
        return BackendInfo(self.name, f"npu:{index} ({npu.get_device_name(index)})", versions, version)

    def synchronize(self) -> None:
        if self._module is not None:
            self._module.npu.synchronize()


class RingMlaBackend(_TorchNpuOpBackend):
    """``torch_npu.atb.npu_ring_mla``: one call, or two merged by the LSE when a prefix is cached."""

    name = "ring-mla"
    op_name = "torch_npu.atb.npu_ring_mla"

    def _op(self, torch_npu: ModuleType) -> object:
        return torch_npu.atb.npu_ring_mla

    def _tiny_call(self) -> None:
        RingMlaBackend.run(self, tiny_call())  # this class's mapping, whatever a subclass overrides

    def _versions(self, torch_npu: ModuleType) -> str:
        home = os.environ.get("ATB_HOME_PATH")
        library = f"{home}/lib/libatb.so" if home else "libatb.so (ATB_HOME_PATH unset)"
        return f"torch_npu {getattr(torch_npu, '__version__', '?')}, {library}"

    def run(self, call: MlaPrefillCall) -> torch.Tensor:
        ring = self._torch_npu().atb.npu_ring_mla
        _require_mask_type(call, self.op_name)
        packed = pack(call)
        if any(kv < q for q, kv in zip(packed.q_lens, packed.kv_lens, strict=True)):
            raise Unsupported("a batch with fewer keys than queries: RingMLA needs kvSeqLen >= qSeqLen")
        device = self._device()
        dtype = call.q.dtype
        # MASK_FREE's mask is the C interface's input, whose fill (facts/branches.toml) is a question for ATB's MLA
        # prefill kernels: RingMLA gets the same causal mask in its own documented encoding.
        mask = compressed_causal_mask(dtype).to(device).contiguous()
        # 1. each batch's own (newest) q_b keys against its q_b query rows, causal for masks 2 and 3
        prefix, starts = _prefix_and_starts(packed)
        new_rows = torch.cat(
            [torch.arange(s + p, s + p + q) for s, p, q in zip(starts, prefix, packed.q_lens, strict=True)]
        )
        lens = torch.tensor([packed.q_lens, packed.q_lens], dtype=torch.int32)
        out, lse = ring(
            packed.q.to(device),
            packed.q_rope.to(device),
            packed.k[new_rows].to(device),
            packed.k_rope[new_rows].to(device),
            packed.v[new_rows].to(device),
            mask,
            lens,
            call.head_num,
            call.kv_head_num,
            qk_scale=call.qk_scale,
            kernel_type=RING_HIGH_PRECISION,
            mask_type=RING_NO_MASK if call.mask_type == 0 else RING_TRIU,
            input_layout=RING_LAYOUT,
            calc_type=RING_FIRST,
        )
        if any(prefix):
            out = self._merge_prefix(ring, call, packed, mask, out, lse, device)
        return unpack(call, packed, out)

    def _merge_prefix(
        self,
        ring: Callable[..., tuple[torch.Tensor, torch.Tensor]],
        call: MlaPrefillCall,
        packed: Packed,
        mask: torch.Tensor,
        out: torch.Tensor,
        lse: torch.Tensor,
        device: torch.device,
    ) -> torch.Tensor:
        """2. the cached prefix (every key visible, in :func:`prefix_chunks`), merged into step 1 through
        ``pre_out``/``prev_lse``."""
        rows, keys, q_lens, kv_lens = prefix_chunks(packed)
        host_rows = rows.to(out.device)
        merged, _ = ring(
            packed.q[rows].to(device),
            packed.q_rope[rows].to(device),
            packed.k[keys].to(device),
            packed.k_rope[keys].to(device),
            packed.v[keys].to(device),
            mask,
            torch.tensor([q_lens, kv_lens], dtype=torch.int32),
            call.head_num,
            call.kv_head_num,
            pre_out=out[host_rows].contiguous(),
            prev_lse=lse[:, host_rows].contiguous(),
            qk_scale=call.qk_scale,
            kernel_type=RING_HIGH_PRECISION,
            mask_type=RING_NO_MASK,
            input_layout=RING_LAYOUT,
            calc_type=RING_MERGE,
        )
        out = out.clone()
        out[host_rows] = merged
        return out


class FusedInferAttentionBackend(_TorchNpuOpBackend):
    """``torch_npu.npu_fused_infer_attention_score`` in the TND layout with the rope tensors apart."""

    name = "npu-fia"
    op_name = "torch_npu.npu_fused_infer_attention_score"

    def _op(self, torch_npu: ModuleType) -> object:
        return torch_npu.npu_fused_infer_attention_score

    def _missing_keywords(self, torch_npu: ModuleType) -> list[str]:
        op = self._op(torch_npu)
        try:
            parameters = inspect.signature(op).parameters  # type: ignore[arg-type]
        except (TypeError, ValueError):  # a C++ op: its docstring carries the schema, if it has one
            doc = getattr(op, "__doc__", None) or ""
            return [k for k in FIA_MLA_KEYWORDS if doc and k not in doc]  # no doc: the probe call decides
        if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values()):
            return []
        return [k for k in FIA_MLA_KEYWORDS if k not in parameters]

    def _tiny_call(self) -> None:
        FusedInferAttentionBackend.run(self, tiny_call())

    def run(self, call: MlaPrefillCall) -> torch.Tensor:
        fia = self._torch_npu().npu_fused_infer_attention_score
        _require_mask_type(call, self.op_name)
        name = _DTYPE_NAMES.get(call.q.dtype, str(call.q.dtype))
        if name != FIA_TND_DTYPE:
            raise Unsupported(f"{name}: {rule_text('fia-tnd-bf16')}")
        if call.head_num // call.kv_head_num > FIA_MAX_GROUP:
            raise Unsupported(f"GQA ratio {call.head_num // call.kv_head_num} > {FIA_MAX_GROUP}, the op's limit")
        packed = pack(call)
        if len(packed.q_lens) > FIA_MAX_BATCH:
            raise Unsupported(f"{len(packed.q_lens)} batches: the TND layout takes at most {FIA_MAX_BATCH}")
        longest = max(packed.q.shape[0], packed.k.shape[0])
        if longest > FIA_TND_MAX_TOKENS:
            raise Unsupported(f"{longest} tokens: {rule_text('fia-tnd-max-tokens')}")
        device = self._device()
        sparse_mode, mask = self._sparse(call)
        out, _ = fia(
            packed.q.to(device),
            packed.k.to(device),
            packed.v.to(device),
            query_rope=packed.q_rope.to(device),
            key_rope=packed.k_rope.to(device),
            atten_mask=None if mask is None else mask.to(device),
            actual_seq_lengths=list(itertools.accumulate(packed.q_lens)),
            actual_seq_lengths_kv=list(itertools.accumulate(packed.kv_lens)),
            num_heads=call.head_num,
            scale=call.qk_scale,
            input_layout="TND",
            num_key_value_heads=call.kv_head_num,
            sparse_mode=sparse_mode,
        )
        return unpack(call, packed, out)

    @staticmethod
    def _sparse(call: MlaPrefillCall) -> tuple[int, torch.Tensor | None]:
        """``sparse_mode`` and ``atten_mask``: bottom-right causal with the 2048x2048 optimised mask for
        CAUSAL and MASK_FREE (q == kv, where bottom-right is top-left), none for UNDEFINED."""
        if call.mask_type in (MASK_FREE, CAUSAL):
            return FIA_BOTTOM_RIGHT_CAUSAL, torch.ones(FIA_MASK_SIZE, FIA_MASK_SIZE, dtype=torch.bool).triu(1)
        return FIA_NO_MASK, None
