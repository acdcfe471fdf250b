"""The contract every device under test implements.

A backend receives the operator's inputs exactly as ``AtbMLAPreFillGetWorkspaceSize`` takes them
(:class:`MlaPrefillCall`, host torch tensors in the case's layout and dtype) and returns ``attenOut``
in q's layout and the case dtype, or raises :class:`BackendError` with the ATB status and stage.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal, Protocol, runtime_checkable

from facts.status import STATUS_CODES, status_name

if TYPE_CHECKING:  # the registry imports this module; importing torch waits until a backend runs
    import torch

Stage = Literal["create", "setup", "execute"]


@dataclass(frozen=True)
class MlaPrefillCall:
    """The C interface's arguments; tensors live on the host, contiguous, in the case's layout.

    ``q_seqlen`` and ``kv_seqlen`` are host int32 tensors of shape ``[B]``.  ``mask`` is the 512x512
    MASK_FREE mask in the case dtype, or ``None``.
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
