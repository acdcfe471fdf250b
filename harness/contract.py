"""A pure-Python model of AtbMLAPreFill's documented error contract, and a backend built on it.

The model validates an :class:`MlaPrefillCall` the way docs/operator.md §1-3 describe, in the
order ATB runs its checks (read from hicann/ascend-transformer-boost at
ddcc8b6225b8b7d4703c69c319244bdea0f0c9a1; paths relative to src/):

* **create** (``CreateOperation``: the chip gate ``Config::Is910B``, then ``ParamRangeCheck`` and
  ``ParamPrefillCheck`` in ``ops/ops_infer/multi_latent_attention/multi_latent_attention_operation.cpp``):
  an unsupported SoC and every scalar problem is ``ERROR_INVALID_PARAM``;
* **setup** (``atb/operation/operation_base.cpp``, ``OperationBase::SetupCheck`` ->
  ``CheckVariantPack``): every input tensor, then attenOut, must have 1..8 dims (a null
  ``aclTensor*`` has 0; ``TensorCheck::CheckTensorShape`` -> ``ERROR_INVALID_TENSOR_DIM``); dtypes
  *and formats* of inputs and attenOut must be one combination the op's IR lists (all fp16 or all
  bf16, seqlens int32, every format ND: ``CheckIniMatch`` -> ``ERROR_INVALID_TENSOR_INI_MATCH``);
  then ``SetupCheckImpl``: ``InTensorDimCheckPrefill`` (ranks -> ``ERROR_INVALID_TENSOR_DIM_NUM``,
  sizes -> ``ERROR_INVALID_TENSOR_DIM``; a rank-3 mask passes), attenOut against q
  (``TensorCheck::TensorDescsEqual``: rank -> ``ERROR_INVALID_TENSOR_DIM_NUM``, dims ->
  ``ERROR_INVALID_TENSOR_DIM``); then the runner, still inside Setup: the prefill runner's
  ``ModifyKernelGraph`` rejects unequal q/kv lengths without CAUSAL (``ERROR_INVALID_PARAM``), and
  ``OpsRunner::PlanKernel`` turns the kernel's failed InferShape (``MLAOperation::CheckNdMask``
  wants a 2-D mask) into ``ERROR_RT_FAIL``.

The model stands for one :class:`Installation`: the SoC (checked only when given, since no call
names it) and the ATB release, where releases differ (facts/releases.py: a rank-3 MASK_FREE mask is
refused by the operation on 8.2.RC1, by the kernel from 8.3.RC1).  By default it is the documented,
newest contract on a supported chip.

Where ATB is known to disagree with its documentation the model follows the documentation: a NaN
qkScale is rejected (ATB's ``qkScale <= 0 || qkScale > 1`` lets NaN through), CAUSAL without a
mask is accepted (ATB's C interface miscounts its input slots), and a CAUSAL batch with fewer keys
than queries is rejected with ``ERROR_INVALID_PARAM`` in Setup (docs/operator.md §4 asks kv_b >= q_b;
ATB's runner and kernel check no such thing for CAUSAL), and a k too short for the rows its layout reads
(``facts.operator.kv_layout_of``: S < max kvSeqLen, or a 3-D first dim below sum kvSeqLen that is not
B * max kvSeqLen) is rejected with ``ERROR_INVALID_TENSOR_DIM`` where ATB checks no first dim and reads past
the tensor.  Those disagreements are data in
``judge/known_deviations.toml``, so the error-contract suite must pass against this model.

:func:`strict_torch_cpu` is the model in front of the torch CPU backend: a device under test that
declares an error contract, so the error-contract suite can run (and be shown to fail) without an
NPU.  ``skip`` removes named checks, which is how tests plant a forgetful validator.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch

from mlaconf.facts.operator import (
    CAUSAL,
    KROPE_CTKV,
    MASK_FREE,
    MASK_SIZE,
    MAX_BATCH,
    MAX_HEADS,
    NOPE_DIM,
    ROPE_DIM,
    kv_layout_of,
)
from mlaconf.facts.releases import MASK_FREE_OP_RANKS, SWA_NORM_REJECTION, soc_rejection
from mlaconf.harness.backend import Availability, Backend, BackendError, BackendInfo, MlaPrefillCall, Stage
from mlaconf.harness.torch_backend import TorchSdpaBackend
from mlaconf.native.harness import ACL_FORMAT_ND

NOPE, ROPE = NOPE_DIM, ROPE_DIM
MAX_DIMS = 8  # atb::MAX_DIM
SWA_NORM = 4
DEVICE_DTYPES = (torch.float16, torch.bfloat16)


@dataclass(frozen=True)
class Installation:
    """The box the model stands for: its SoC name and ATB release (None: a supported chip, the newest
    release, i.e. what the documentation describes)."""

    soc: str | None = None
    release: str | None = None


#: The box the documentation describes: a supported chip and the newest release.
DOCUMENTED = Installation()

#: A check returns what is wrong with a call on an installation, or None when the call passes it.
CheckFn = Callable[[MlaPrefillCall, Installation], "str | None"]


@dataclass(frozen=True)
class ContractCheck:
    """One documented rejection: its name, the stage it happens at and the status it returns."""

    name: str
    stage: Stage
    status: str
    check: CheckFn


def _on_any(check: Callable[[MlaPrefillCall], str | None]) -> CheckFn:
    """A check whose outcome is the same on every chip and release."""
    return lambda call, _installation: check(call)


def _shape(tensor: torch.Tensor | None) -> tuple[int, ...]:
    return () if tensor is None else tuple(tensor.shape)


def _attached(call: MlaPrefillCall) -> dict[str, torch.Tensor | None]:
    """The input tensors the C interface hands to Setup (the mask only for MASK_FREE); None: null."""
    named: dict[str, torch.Tensor | None] = {
        "q": call.q,
        "q_rope": call.q_rope,
        "k": call.k,
        "k_rope": call.k_rope,
        "v": call.v,
        "q_seqlen": call.q_seqlen,
        "kv_seqlen": call.kv_seqlen,
    }
    if call.mask_type == MASK_FREE:
        named["mask"] = call.mask
    return {name: None if name in call.null_args else tensor for name, tensor in named.items()}


def _out_shape(call: MlaPrefillCall) -> tuple[int, ...] | None:
    """attenOut's shape as the caller passes it; None when it is a null pointer."""
    return None if "out" in call.null_args else call.atten_out_shape


# -- create: the chip, then parameters ------------------------------------------------------------


def _soc(_call: MlaPrefillCall, installation: Installation) -> str | None:
    return None if installation.soc is None else soc_rejection(installation.soc)


def _qk_scale(call: MlaPrefillCall) -> str | None:
    scale = call.qk_scale
    if math.isnan(scale) or not 0.0 < scale <= 1.0:
        return f"qkScale {scale} outside (0, 1] (docs/operator.md §3)"
    return None


def _mask_type(call: MlaPrefillCall) -> str | None:
    if call.mask_type not in (0, MASK_FREE, CAUSAL, SWA_NORM):
        return f"maskType {call.mask_type} is not UNDEFINED, MASK_FREE, CAUSAL or SWA_NORM (docs/operator.md §3)"
    return None


def _cache_mode(call: MlaPrefillCall) -> str | None:
    if call.cache_mode != KROPE_CTKV:
        return f"cacheMode {call.cache_mode}: prefill accepts only KROPE_CTKV (1) (docs/operator.md §3)"
    return None


def _head_num(call: MlaPrefillCall) -> str | None:
    if not 1 <= call.head_num <= MAX_HEADS:
        return f"headNum {call.head_num} outside [1, {MAX_HEADS}] (docs/operator.md §2)"
    return None


def _kv_head_num(call: MlaPrefillCall) -> str | None:
    h, hkv = call.head_num, call.kv_head_num
    if call.mask_type != CAUSAL and hkv != h:
        return f"kvHeadNum {hkv} must equal headNum {h} unless maskType is CAUSAL (docs/operator.md §2)"
    if call.mask_type == CAUSAL and (hkv < 1 or h % hkv):
        return f"CAUSAL needs headNum {h} to be a multiple of kvHeadNum {hkv} (docs/operator.md §2)"
    return None


def _swa_window(call: MlaPrefillCall, installation: Installation) -> str | None:
    if call.mask_type == SWA_NORM:
        return f"{SWA_NORM_REJECTION.at(installation.release)} (docs/operator.md §3, §7)"
    return None


# -- setup: tensors ------------------------------------------------------------------------------


def _tensor_dims(call: MlaPrefillCall) -> str | None:
    for name, tensor in _attached(call).items():
        dims = len(_shape(tensor))
        if not 1 <= dims <= MAX_DIMS:
            what = "missing" if tensor is None else f"{dims}-D"
            return f"{name} is {what}; every attached tensor needs 1..{MAX_DIMS} dims (docs/operator.md §1-2)"
    return None


def _out_tensor_dims(call: MlaPrefillCall) -> str | None:
    shape = _out_shape(call)
    if shape is None or not 1 <= len(shape) <= MAX_DIMS:
        what = "missing" if shape is None else f"{len(shape)}-D"
        return f"attenOut is {what}; it needs 1..{MAX_DIMS} dims (docs/operator.md §1-2)"
    return None


def _dtypes(call: MlaPrefillCall) -> str | None:
    attached = {name: t for name, t in _attached(call).items() if t is not None}
    floats = {name: t.dtype for name, t in attached.items() if not name.endswith("seqlen")}
    if _out_shape(call) is not None:
        floats["out"] = call.atten_out_dtype
    kinds = set(floats.values())
    if len(kinds) != 1 or next(iter(kinds)) not in DEVICE_DTYPES:
        return f"dtypes {floats}: all must be fp16 or all bf16 (docs/operator.md §2)"
    ints = {name: t.dtype for name, t in attached.items() if name.endswith("seqlen")}
    if any(dtype != torch.int32 for dtype in ints.values()):
        return f"qSeqLen/kvSeqLen dtypes {ints}: must be int32 (docs/operator.md §2)"
    return None


def _formats(call: MlaPrefillCall) -> str | None:
    passed = [name for name, t in _attached(call).items() if t is not None]
    if _out_shape(call) is not None:
        passed.append("out")
    odd = {name: call.format_of(name) for name in passed if call.format_of(name) != ACL_FORMAT_ND}
    if odd:
        return f"aclFormat {odd}: every tensor must be ND ({ACL_FORMAT_ND}) (docs/operator.md §1)"
    return None


def _ranks(call: MlaPrefillCall, installation: Installation) -> str | None:
    ranks = {name: len(_shape(t)) for name, t in _attached(call).items()}
    wanted = {"q_rope": ranks["q"], "k": 3, "k_rope": 3, "v": 3, "q_seqlen": 1, "kv_seqlen": 1}
    bad = {name: ranks[name] for name, rank in wanted.items() if ranks[name] != rank}
    mask_ranks = MASK_FREE_OP_RANKS.at(installation.release)
    mask_bad = call.mask_type == MASK_FREE and ranks["mask"] not in mask_ranks
    if ranks["q"] not in (2, 3) or bad or mask_bad:
        masks = " or ".join(f"{r}-D" for r in mask_ranks)
        return (
            f"ranks {ranks}: q 2-D or 3-D, qRope like q, k/kRope/v 3-D, seqlens 1-D, mask {masks} "
            "(docs/operator.md §2, §7)"
        )
    return None


def _batch_limit(call: MlaPrefillCall) -> str | None:
    batch = call.q_seqlen.shape[0]
    if batch > MAX_BATCH:
        return f"batch {batch} > {MAX_BATCH} (docs/operator.md §2)"
    return None


def _seqlen_lengths(call: MlaPrefillCall) -> str | None:
    if call.q_seqlen.shape[0] != call.kv_seqlen.shape[0]:
        return f"qSeqLen has {call.q_seqlen.shape[0]} entries, kvSeqLen {call.kv_seqlen.shape[0]} (docs/operator.md §2)"
    return None


def _q_dims(call: MlaPrefillCall) -> str | None:
    h = call.head_num
    q, qr = _shape(call.q), _shape(call.q_rope)
    want_q = (q[0], h * NOPE) if len(q) == 2 else (q[0], h, NOPE)
    want_qr = (q[0], h * ROPE) if len(q) == 2 else (q[0], h, ROPE)
    if q != want_q or qr != want_qr:
        return f"q {q} / qRope {qr}: expected {want_q} / {want_qr} for headNum {h} (docs/operator.md §2)"
    return None


def _kv_dims(call: MlaPrefillCall) -> str | None:
    k, kr, v = _shape(call.k), _shape(call.k_rope), _shape(call.v)
    hkv, batch, lengths = call.kv_head_num, call.q_seqlen.shape[0], call.kv_seqlen.tolist()
    layout = kv_layout_of(k, lengths, hkv)  # the one fact: which rows each layout reads, and that they exist
    padded = layout == "padded" or (layout is not None and k[0] == batch and k[2] == hkv * NOPE)  # Hkv = S = 1
    if layout is None or (call.mask_type == CAUSAL and not padded):
        forms = "[B, S, Hkv*128]" + ("" if call.mask_type == CAUSAL else ", [Tk, Hkv, 128] or [B*max kv, Hkv, 128]")
        return (
            f"k {k}: expected {forms} with B {batch}, Hkv {hkv}, S >= max kvSeqLen, Tk >= sum kvSeqLen "
            f"(kvSeqLen {lengths}; docs/operator.md §2)"
        )
    if kr != (k[0], k[1], k[2] // 2) or v != k:
        return f"kRope {kr} / v {v}: expected k's dims with the last halved / exactly k's {k} (docs/operator.md §2)"
    return None


def _mask_dims(call: MlaPrefillCall) -> str | None:
    shape = _shape(call.mask)
    if call.mask_type == MASK_FREE and len(shape) == 2 and shape != (MASK_SIZE, MASK_SIZE):
        return f"mask {shape}: MASK_FREE needs [{MASK_SIZE}, {MASK_SIZE}] (docs/operator.md §2)"
    return None


def _out_rank(call: MlaPrefillCall) -> str | None:
    out, q = call.atten_out_shape, _shape(call.q)
    if len(out) != len(q):
        return (
            f"attenOut {out} has {len(out)} dims, q {q} has {len(q)}: attenOut is exactly q's shape "
            "(docs/operator.md §2)"
        )
    return None


def _out_dims(call: MlaPrefillCall) -> str | None:
    out, q = call.atten_out_shape, _shape(call.q)
    if out != q:
        return f"attenOut {out}: must be exactly q's shape {q} (docs/operator.md §2)"
    return None


def _seqlen_values(call: MlaPrefillCall) -> str | None:
    if call.mask_type != CAUSAL and not torch.equal(call.q_seqlen, call.kv_seqlen):
        return "qSeqLen must equal kvSeqLen element-wise unless maskType is CAUSAL (docs/operator.md §4)"
    if call.mask_type == CAUSAL and bool((call.kv_seqlen < call.q_seqlen).any()):
        return (
            f"kvSeqLen {call.kv_seqlen.tolist()} below qSeqLen {call.q_seqlen.tolist()}: CAUSAL needs "
            "kv_b >= q_b in every batch (docs/operator.md §4)"
        )
    return None


def _kernel_mask(call: MlaPrefillCall) -> str | None:
    if call.mask_type == MASK_FREE and len(_shape(call.mask)) != 2:
        return f"mask {_shape(call.mask)}: the kernel takes only a 2-D mask (docs/operator.md §2)"
    return None


_PARAM = "ERROR_INVALID_PARAM"
_DIM = "ERROR_INVALID_TENSOR_DIM"
_DIM_NUM = "ERROR_INVALID_TENSOR_DIM_NUM"
_INI_MATCH = "ERROR_INVALID_TENSOR_INI_MATCH"

#: The documented rejections in ATB's order; the first failing one decides status and stage.
CHECKS: tuple[ContractCheck, ...] = (
    ContractCheck("soc", "create", _PARAM, _soc),
    ContractCheck("qk_scale", "create", _PARAM, _on_any(_qk_scale)),
    ContractCheck("mask_type", "create", _PARAM, _on_any(_mask_type)),
    ContractCheck("cache_mode", "create", _PARAM, _on_any(_cache_mode)),
    ContractCheck("head_num", "create", _PARAM, _on_any(_head_num)),
    ContractCheck("kv_head_num", "create", _PARAM, _on_any(_kv_head_num)),
    ContractCheck("swa_window", "create", _PARAM, _swa_window),
    ContractCheck("tensor_dims", "setup", _DIM, _on_any(_tensor_dims)),
    ContractCheck("out_tensor_dims", "setup", _DIM, _on_any(_out_tensor_dims)),
    ContractCheck("dtypes", "setup", _INI_MATCH, _on_any(_dtypes)),
    ContractCheck("formats", "setup", _INI_MATCH, _on_any(_formats)),
    ContractCheck("ranks", "setup", _DIM_NUM, _ranks),
    ContractCheck("batch_limit", "setup", _DIM, _on_any(_batch_limit)),
    ContractCheck("seqlen_lengths", "setup", _DIM, _on_any(_seqlen_lengths)),
    ContractCheck("q_dims", "setup", _DIM, _on_any(_q_dims)),
    ContractCheck("kv_dims", "setup", _DIM, _on_any(_kv_dims)),
    ContractCheck("mask_dims", "setup", _DIM, _on_any(_mask_dims)),
    ContractCheck("out_rank", "setup", _DIM_NUM, _on_any(_out_rank)),
    ContractCheck("out_dims", "setup", _DIM, _on_any(_out_dims)),
    ContractCheck("seqlen_values", "setup", _PARAM, _on_any(_seqlen_values)),
    ContractCheck("kernel_mask", "setup", "ERROR_RT_FAIL", _on_any(_kernel_mask)),
)
CHECK_NAMES = tuple(c.name for c in CHECKS)


def _require_known(skip: frozenset[str]) -> None:
    unknown = skip - set(CHECK_NAMES)
    if unknown:
        raise ValueError(f"unknown contract checks {sorted(unknown)}; known: {list(CHECK_NAMES)}")


def validate(call: MlaPrefillCall, skip: frozenset[str] = frozenset(), installation: Installation = DOCUMENTED) -> None:
    """Raise :class:`BackendError` with the status and stage ``installation`` gives an invalid call."""
    _require_known(skip)
    for entry in CHECKS:
        if entry.name in skip:
            continue
        problem = entry.check(call, installation)
        if problem is not None:
            raise BackendError(entry.status, entry.stage, f"{entry.name}: {problem}")


class ContractBackend:
    """The documented error contract in front of another backend's computation."""

    error_contract = True

    def __init__(
        self,
        inner: Backend,
        name: str,
        skip: frozenset[str] = frozenset(),
        installation: Installation = DOCUMENTED,
    ) -> None:
        self.inner = inner
        self.name = name
        self.skip = skip
        self.installation = installation
        self.deterministic = inner.deterministic
        _require_known(skip)

    def available(self) -> Availability:
        return self.inner.available()

    def info(self) -> BackendInfo:
        """The inner backend's device and versions; *the* version is the ATB release the model stands
        for (None: the documented contract), since release-bound expectations are compared with it."""
        inner = self.inner.info()
        versions = dict(inner.versions)
        if self.installation.soc is not None:
            versions["soc"] = self.installation.soc
        return BackendInfo(self.name, inner.device, versions, self.installation.release)

    def synchronize(self) -> None:
        self.inner.synchronize()

    def run(self, call: MlaPrefillCall) -> torch.Tensor:
        validate(call, self.skip, self.installation)
        return self.inner.run(call)


def strict_torch_cpu() -> ContractBackend:
    """``torch-cpu-strict``: contract validation, then the torch CPU computation."""
    return ContractBackend(TorchSdpaBackend("cpu"), "torch-cpu-strict")
