"""The contract every device under test implements.

A backend receives the operator's inputs exactly as ``AtbMLAPreFillGetWorkspaceSize`` takes them
(:class:`MlaPrefillCall`, host torch tensors in the case's layout and dtype) and returns ``attenOut``
in q's layout and the case dtype, or raises :class:`BackendError` with the ATB status and stage.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal, Protocol, runtime_checkable

from mlaconf.facts.operator import NOPE_DIM, ROPE_DIM, V_DIM, kv_row_starts
from mlaconf.facts.status import STATUS_CODES, status_name
from mlaconf.native.harness import ACL_FORMAT_ND

if TYPE_CHECKING:  # the registry imports this module; importing torch waits until a backend runs
    import torch

Stage = Literal["create", "setup", "execute"]

#: The C interface's tensor arguments, in its order (``out`` is attenOut).
TENSOR_ARGS = ("q", "q_rope", "k", "k_rope", "v", "q_seqlen", "kv_seqlen", "mask", "out")


@dataclass(frozen=True)
class MlaPrefillCall:
    """The C interface's arguments; tensors live on the host, contiguous, in the case's layout.

    ``q_seqlen`` and ``kv_seqlen`` are host tensors, int32 of shape ``[B]`` in a valid call.  ``mask``
    is the 512x512 MASK_FREE mask in the case dtype, or ``None`` (a null pointer).

    The optional fields describe how a caller may get the rest of the interface wrong; their defaults
    are a correct call.  ``out_shape``/``out_dtype``: the attenOut the caller allocates (default q's
    shape and qRope's dtype).  ``formats``: an aclFormat per argument named in :data:`TENSOR_ARGS`
    (default ``ACL_FORMAT_ND``, the only one the operator accepts).  ``null_args``: arguments passed
    as a null ``aclTensor*``.
    """

    q: torch.Tensor
    q_rope: torch.Tensor
    k: torch.Tensor
    k_rope: torch.Tensor
    v: torch.Tensor
    q_seqlen: torch.Tensor
    kv_seqlen: torch.Tensor
    mask: torch.Tensor | None
    head_num: int
    qk_scale: float
    kv_head_num: int
    mask_type: int
    cache_mode: int
    out_shape: tuple[int, ...] | None = None
    out_dtype: torch.dtype | None = None
    formats: Mapping[str, int] = field(default_factory=dict)
    null_args: frozenset[str] = frozenset()

    def __post_init__(self) -> None:
        unknown = (set(self.formats) | self.null_args) - set(TENSOR_ARGS)
        if unknown:
            raise ValueError(f"unknown tensor arguments {sorted(unknown)}; known: {list(TENSOR_ARGS)}")

    def format_of(self, name: str) -> int:
        """The aclFormat argument ``name`` is passed with."""
        return self.formats.get(name, ACL_FORMAT_ND)

    @property
    def atten_out_shape(self) -> tuple[int, ...]:
        """The shape of the attenOut the caller passes."""
        return tuple(self.q.shape) if self.out_shape is None else self.out_shape

    @property
    def atten_out_dtype(self) -> torch.dtype:
        """The dtype of the attenOut the caller passes."""
        return self.q_rope.dtype if self.out_dtype is None else self.out_dtype

    def kv_parts(self) -> list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
        """Each batch's k, kRope and v as ``[kv_b, Hkv, D]`` views, read where the contract reads them for k's
        shape (padded, packed or strided: :func:`mlaconf.facts.operator.kv_row_starts`, the one fact every
        backend, the golden and the contract model use); a k of no kv layout is refused as ATB's shape check."""
        lengths = [int(n) for n in self.kv_seqlen.tolist()]
        starts = kv_row_starts(tuple(self.k.shape), lengths, self.kv_head_num)
        if starts is None:
            raise BackendError(
                "ERROR_INVALID_TENSOR_DIM",
                "setup",
                f"k {list(self.k.shape)} is no kv layout for kvSeqLen {lengths} and kvHeadNum {self.kv_head_num}",
            )
        hkv = self.kv_head_num
        flat = [t.reshape(-1, hkv, d) for t, d in ((self.k, NOPE_DIM), (self.k_rope, ROPE_DIM), (self.v, V_DIM))]
        return [
            (flat[0][s : s + n], flat[1][s : s + n], flat[2][s : s + n]) for s, n in zip(starts, lengths, strict=True)
        ]


class BackendError(RuntimeError):
    """The backend rejected the call: carries the ATB status code, its name and the stage."""

    def __init__(self, status: int | str, stage: Stage, detail: str = "") -> None:
        if isinstance(status, str):
            self.status_name = status
            self.status = STATUS_CODES.get(status, -1)
        else:
            self.status = int(status)
            self.status_name = status_name(self.status)
        self.stage: Stage = stage
        self.detail = detail
        message = f"{self.status_name} ({self.status}) at {stage}"
        super().__init__(f"{message}: {detail}" if detail else message)


class Unsupported(Exception):
    """The backend cannot express this call: a limit of what it maps the interface onto, not a wrong
    answer.  The runner skips the case with this reason; raise it before doing any work."""


@dataclass(frozen=True)
class Availability:
    """Whether a backend can run here, and a human reason when it cannot."""

    ok: bool
    reason: str = ""

    def __bool__(self) -> bool:
        return self.ok


@dataclass(frozen=True)
class BackendInfo:
    """What a result record says about the device under test."""

    name: str
    device: str
    versions: dict[str, str] = field(default_factory=dict)
    #: The version that known-deviation ranges are compared with (e.g. the CANN release for ATB).
    version: str | None = None
    #: An ATB whose release cannot be read (a source build): release-bound expectations are then judged
    #: against every release they name and the run says so in one line.  With ``version`` None and this
    #: False no release applies (a CPU backend, the documented contract model): the documented answer.
    release_unknown: bool = False


@runtime_checkable
class Backend(Protocol):
    """A device under test for MLA prefill."""

    name: str
    #: True when the backend promises ATB's status codes for invalid input (error-contract suite).
    error_contract: bool
    #: True when repeated runs of the same input are expected to be bit-identical.
    deterministic: bool

    def available(self) -> Availability: ...

    def info(self) -> BackendInfo: ...

    def run(self, call: MlaPrefillCall) -> torch.Tensor:
        """Return attenOut (q's shape, case dtype, any device) or raise :class:`BackendError`."""
        ...

    def synchronize(self) -> None:
        """Wait for queued device work (a no-op on the CPU); used around timing."""
        ...
