"""The ATB backend: ``AtbMLAPreFill`` on an Ascend NPU through the native harness (``native/``).

The device-independent part (:func:`describe_tensors`, :func:`launch`) takes any memory the caller
vouches for, which is how the CPU tests drive the real extension against a test double of libatb;
:class:`AtbBackend` adds torch_npu: device copies, the workspace, the current stream, synchronization.
"""

from __future__ import annotations

import atexit
import importlib
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from types import ModuleType
from typing import TYPE_CHECKING

import torch

from mlaconf.facts.releases import soc_rejection
from mlaconf.facts.versions import ascend_versions, atb_version_near
from mlaconf.harness.backend import Availability, BackendError, BackendInfo, MlaPrefillCall
from mlaconf.harness.devices import worker_device_index
from mlaconf.native.harness import (
    ACL_BF16,
    ACL_BOOL,
    ACL_FLOAT,
    ACL_FLOAT16,
    ACL_INT32,
    ACL_INT64,
    HostTensorDesc,
    TensorDesc,
)

if TYPE_CHECKING:
    from mlaconf.native._atb_harness import Context, Library

_ACL_DTYPES: dict[torch.dtype, int] = {
    torch.float16: ACL_FLOAT16,
    torch.bfloat16: ACL_BF16,
    torch.int32: ACL_INT32,
    torch.int64: ACL_INT64,
    torch.float32: ACL_FLOAT,
    torch.bool: ACL_BOOL,
}


def _dtype_code(name: str, tensor: torch.Tensor) -> int:
    code = _ACL_DTYPES.get(tensor.dtype)
    if code is None:
        raise ValueError(f"{name} has dtype {tensor.dtype}, which the ATB harness cannot pass")
    return code


def _describe(call: MlaPrefillCall, name: str, tensor: torch.Tensor) -> TensorDesc:
    if not tensor.is_contiguous():
        raise ValueError(f"{name} must be contiguous: ATB reads only shape and pointer, never strides")
    return TensorDesc(name, tensor.data_ptr(), tuple(tensor.shape), _dtype_code(name, tensor), call.format_of(name))


def describe_tensors(call: MlaPrefillCall, out: torch.Tensor) -> list[TensorDesc]:
    """The aclTensor descriptors of q, q_rope, k, k_rope, v, mask (if any) and out, in that order.

    An argument in ``call.null_args`` (and a ``None`` mask) gets no descriptor: the harness passes a
    null ``aclTensor*`` for it.
    """
    named = [
        ("q", call.q),
        ("q_rope", call.q_rope),
        ("k", call.k),
        ("k_rope", call.k_rope),
        ("v", call.v),
        ("mask", call.mask),
        ("out", out),
    ]
    return [
        _describe(call, name, tensor) for name, tensor in named if tensor is not None and name not in call.null_args
    ]


def describe_host_tensors(call: MlaPrefillCall) -> list[HostTensorDesc]:
    """qSeqLen and kvSeqLen as the C interface reads them, from host memory: their bytes, shape, dtype.

    The harness copies the bytes into buffers it owns for the whole call, so no device copy and no
    pointer into Python memory.  Arguments in ``call.null_args`` are passed as null.
    """
    descs = []
    for name, tensor in (("q_seqlen", call.q_seqlen), ("kv_seqlen", call.kv_seqlen)):
        if name in call.null_args:
            continue
        if tensor.device.type != "cpu":
            raise ValueError(
                f"{name} must be a host tensor: the C interface reads it from host memory, got one on {tensor.device}"
            )
        code = _dtype_code(name, tensor)
        data = tensor.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()
        descs.append(HostTensorDesc(name, data, tuple(tensor.shape), code, call.format_of(name)))
    return descs


def repro_manifest(call: MlaPrefillCall) -> tuple[list[str], dict[str, bytes]]:
    """The call the harness makes, as the standalone C++ repro reads it (tools/repro_templates/repro_atb.cpp.tmpl):
    the lines of ``atb_call.txt`` and each tensor's raw bytes by name.  Same descriptors as :func:`launch`."""
    lines = [
        f"scalar head_num {call.head_num}",
        f"scalar qk_scale {call.qk_scale!r}",
        f"scalar kv_head_num {call.kv_head_num}",
        f"scalar mask_type {call.mask_type}",
        f"scalar cache_mode {call.cache_mode}",
    ]
    data: dict[str, bytes] = {}
    out = torch.empty(call.atten_out_shape, dtype=call.atten_out_dtype)
    for desc in describe_tensors(call, out):
        dims = " ".join(str(d) for d in desc.shape)
        if desc.name == "out":
            lines.append(f"out {desc.dtype} {desc.format} {len(desc.shape)} {dims}")
            continue
        lines.append(f"device {desc.name} {desc.dtype} {desc.format} {len(desc.shape)} {dims}")
        tensor = getattr(call, desc.name).contiguous().reshape(-1)
        data[desc.name] = tensor.view(torch.uint8).numpy().tobytes()
    for host in describe_host_tensors(call):
        dims = " ".join(str(d) for d in host.shape)
        lines.append(f"host {host.name} {host.dtype} {host.format} {len(host.shape)} {dims}")
        data[host.name] = host.data
    return lines, data


@contextmanager
def _status_as_backend_error() -> Iterator[None]:
    """Re-raise the extension's AtbStatusError as the framework's BackendError."""
    from mlaconf.native import _atb_harness

    try:
        yield
    except _atb_harness.AtbStatusError as err:
        raise BackendError(err.status, err.stage, err.detail) from err


def output_buffer(call: MlaPrefillCall, device: torch.device | str = "cpu") -> torch.Tensor:
    """attenOut filled with NaN before the launch: an element the kernel never writes fails every check
    (``torch.empty`` could hand back the previous call's answer, which the exact relations would pass)."""
    return torch.full(call.atten_out_shape, float("nan"), dtype=call.atten_out_dtype, device=device)


def launch(
    context: Context,
    call: MlaPrefillCall,
    out: torch.Tensor,
    *,
    stream: int,
    alloc_workspace: Callable[[int], int],
    synchronize: Callable[[], None],
) -> int:
    """GetWorkspaceSize + AtbMLAPreFill on memory the caller owns; returns the workspace size.

    ``alloc_workspace(n)`` returns the address of n bytes that stay valid until ``synchronize()``,
    which the harness calls after AtbMLAPreFill, before it releases the operation. Raises
    :class:`BackendError` for a non-zero ATB status.
    """
    from mlaconf.native import _atb_harness

    with _status_as_backend_error():
        return _atb_harness.prefill(
            context,
            describe_tensors(call, out),
            describe_host_tensors(call),
            call.head_num,
            call.qk_scale,
            call.kv_head_num,
            call.mask_type,
            call.cache_mode,
            stream,
            alloc_workspace,
            synchronize,
        )


def _first_line(err: BaseException) -> str:
    lines = str(err).strip().splitlines()
    return f"{type(err).__name__}: {lines[0]}" if lines else type(err).__name__


@dataclass(frozen=True)
class Probe:
    """What :func:`probe` found: availability, the handles a run needs, the chip and the ATB release."""

    availability: Availability
    torch_npu: ModuleType | None = None
    library: Library | None = None
    #: ``aclrtGetSocName`` through torch_npu, e.g. "Ascend910B3"; None when never read.
    soc: str | None = None
    #: The NNAL/ATB release next to the loaded libatb (facts.versions.atb_version_near).
    release: str | None = None


def probe() -> Probe:
    """Check, cheapest first, what the ATB backend needs; never raises.

    Order: torch_npu, a device, the chip (ATB's MLA runs on Atlas A2/A3 only, so another SoC skips
    with the reason instead of failing every case), the extension, libatb and its release."""
    try:
        torch_npu = importlib.import_module("torch_npu")
    except Exception as err:  # without CANN torch_npu raises RuntimeError/OSError, not only ImportError
        return Probe(Availability(False, f"torch_npu is missing or fails to import ({_first_line(err)})"))
    try:
        devices = int(torch_npu.npu.device_count()) if torch_npu.npu.is_available() else 0
    except Exception as err:
        return Probe(Availability(False, f"no NPU device: the device query failed ({_first_line(err)})"))
    if devices == 0:
        return Probe(Availability(False, "no NPU device visible to torch_npu"))
    index = worker_device_index(devices)
    try:  # pin this xdist worker to its NPU (gwN -> N mod K) before anything touches a device
        torch_npu.npu.set_device(index)
    except Exception as err:
        return Probe(Availability(False, f"cannot select an NPU: {_first_line(err)}"))
    try:
        soc = str(torch_npu.npu.get_device_name(index))
    except Exception as err:
        return Probe(Availability(False, f"cannot read the NPU's SoC name: {_first_line(err)}"))
    rejected = soc_rejection(soc)
    if rejected is not None:
        return Probe(Availability(False, rejected), soc=soc)
    try:
        from mlaconf.native import _atb_harness
    except Exception as err:
        return Probe(
            Availability(
                False,
                "the native extension mlaconf.native._atb_harness failed to import "
                f"({_first_line(err)}); build it with `pip install -e .`",
            )
        )
    try:
        library = _atb_harness.Library()
    except Exception as err:  # AtbLoadError names the paths tried or the missing entry point
        return Probe(Availability(False, str(err)), soc=soc)
    return Probe(Availability(True), torch_npu, library, soc, atb_version_near(library.path))


#: One atb::Context per library and process, as ATB expects under torch_npu.
_CONTEXTS: dict[str, Context] = {}


def _release_contexts() -> None:
    """Destroy the contexts at exit while the NPU runtime is still up."""
    _CONTEXTS.clear()


def _context_for(library: Library) -> Context:
    context = _CONTEXTS.get(library.path)
    if context is None:
        from mlaconf.native import _atb_harness

        with _status_as_backend_error():
            context = _atb_harness.Context(library)
        _CONTEXTS[library.path] = context
        # (Re-)registered after torch_npu's exit hooks, so it runs before them (atexit is LIFO).
        atexit.unregister(_release_contexts)
        atexit.register(_release_contexts)
    return context


class AtbBackend:
    """ATB's MLA prefill via its C interface on the current NPU and stream."""

    name = "atb"
    error_contract = True
    deterministic = True
    #: torch device type of torch_npu's devices (the CPU tests run the same path with "cpu").
    device_type = "npu"

    def __init__(self) -> None:
        self._probe: Probe | None = None

    def _probed(self) -> Probe:
        if self._probe is None:
            self._probe = probe()
        return self._probe

    def available(self) -> Availability:
        return self._probed().availability

    def _require(self) -> tuple[ModuleType, Library]:
        found = self._probed()
        if found.torch_npu is None or found.library is None:
            raise RuntimeError(f"the ATB backend is unavailable: {found.availability.reason}")
        return found.torch_npu, found.library

    def info(self) -> BackendInfo:
        found = self._probed()
        if found.torch_npu is None or found.library is None:
            return BackendInfo(self.name, "unavailable", {})
        npu = found.torch_npu.npu
        index = int(npu.current_device())
        versions = {
            "torch": torch.__version__,
            "torch_npu": str(getattr(found.torch_npu, "__version__", "?")),
            "libatb": found.library.path,
            "aclCreateTensor": found.library.acl_source,
            "soc": str(found.soc),
        }
        for var in ("ATB_HOME_PATH", "ASCEND_HOME_PATH"):
            if var in os.environ:
                versions[var] = os.environ[var]
        for part, found_file in ascend_versions().items():  # CANN toolkit and driver, when installed
            if found_file and found_file.get("version") and part != "atb":
                versions[part] = str(found_file["version"])
        if found.release:
            versions["atb"] = found.release
        return BackendInfo(
            self.name, f"npu:{index} ({found.soc})", versions, found.release, release_unknown=found.release is None
        )

    def synchronize(self) -> None:
        torch_npu = self._probed().torch_npu
        if torch_npu is not None:
            torch_npu.npu.synchronize()

    def run(self, call: MlaPrefillCall) -> torch.Tensor:
        torch_npu, library = self._require()
        npu = torch_npu.npu
        device = torch.device(self.device_type, int(npu.current_device()))
        on_device = replace(
            call,
            q=call.q.to(device),
            q_rope=call.q_rope.to(device),
            k=call.k.to(device),
            k_rope=call.k_rope.to(device),
            v=call.v.to(device),
            mask=None if call.mask is None else call.mask.to(device),
        )
        out = output_buffer(call, device)
        workspaces: list[torch.Tensor] = []

        def alloc_workspace(size: int) -> int:
            workspaces.append(torch.empty(size, dtype=torch.uint8, device=device))
            return workspaces[-1].data_ptr()

        context = _context_for(library)
        npu.synchronize()  # the input copies must have landed before ATB's stream reads them
        # on_device, out and workspaces stay referenced here until launch's final synchronize.
        launch(
            context,
            on_device,
            out,
            stream=int(npu.current_stream().npu_stream),
            alloc_workspace=alloc_workspace,
            synchronize=npu.synchronize,
        )
        return out
