"""Backends by name: built-ins, ``auto``, and external ones by import path ``pkg.mod:factory``."""

from __future__ import annotations

import importlib
import os
from collections.abc import Callable

from mlaconf.harness.backend import Backend

ENV_VAR = "MLA_BACKEND"

#: Built-in backends: name -> zero-argument factory import path.
BUILTIN: dict[str, str] = {
    "atb": "mlaconf.harness.atb:AtbBackend",
    "torch-cuda": "mlaconf.harness.torch_backend:torch_cuda",
    "torch-cpu": "mlaconf.harness.torch_backend:torch_cpu",
    "torch-cpu-strict": "mlaconf.harness.contract:strict_torch_cpu",
    "flash-attn": "mlaconf.harness.cuda_extras:FlashAttnBackend",
    "flashinfer": "mlaconf.harness.cuda_extras:FlashInferBackend",
    "ring-mla": "mlaconf.harness.npu_ops:RingMlaBackend",
    "npu-fia": "mlaconf.harness.npu_ops:FusedInferAttentionBackend",
}
#: The backends that run on an Ascend NPU (native/run_on_ascend.sh runs and diffs each of them).
NPU_BACKENDS = ("atb", "ring-mla", "npu-fia")

#: ``auto`` picks the first available of these.
AUTO_ORDER = ("atb", "torch-cuda", "torch-cpu")


class BackendSelectionError(ValueError):
    """A ``--backend`` value names no backend or its factory cannot be imported."""


def _import_factory(path: str) -> Callable[[], Backend]:
    module_name, _, attr = path.partition(":")
    if not module_name or not attr:
        raise BackendSelectionError(f"backend {path!r}: expected a built-in name or 'pkg.module:factory'")
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:  # any import failure is the user's to read, with its cause
        raise BackendSelectionError(f"backend {path!r}: cannot import {module_name!r}: {exc}") from exc
    try:
        factory: Callable[[], Backend] = getattr(module, attr)
    except AttributeError as exc:
        raise BackendSelectionError(f"backend {path!r}: module {module_name!r} has no {attr!r}") from exc
    return factory


def choices_text() -> str:
    """The valid ``--backend`` values, for a usage error."""
    return "valid backends: auto, " + ", ".join(BUILTIN) + ", or an import path 'pkg.module:factory'"


def name_problem(name: str) -> str | None:
    """Why ``name`` can name no backend (neither ``auto``, a built-in name nor an import path), else None:
    checked before anything is imported, so ``mlaconf run --backend typo`` fails at once."""
    if name == "auto" or name in BUILTIN or ":" in name:
        return None
    from mlaconf.facts.near_miss import did_you_mean  # only on this error path: the plugin imports this module

    hint = did_you_mean(name, ["auto", *BUILTIN])
    return f"unknown backend {name!r}: expected a built-in name or 'pkg.module:factory'{hint}"


def create(name: str) -> Backend:
    """Instantiate a backend by built-in name or import path (``auto`` resolved first)."""
    if name == "auto":
        name = resolve_auto()
    problem = name_problem(name)
    if problem:
        raise BackendSelectionError(problem)
    factory = _import_factory(BUILTIN.get(name, name))
    if not callable(factory):
        raise BackendSelectionError(f"backend {name!r}: {BUILTIN.get(name, name)} is not callable")
    try:
        backend = factory()
    except Exception as exc:  # the user's factory: its failure in one line, with its cause
        raise BackendSelectionError(f"backend {name!r}: the factory raised {type(exc).__name__}: {exc}") from exc
    if not isinstance(backend, Backend):
        raise BackendSelectionError(
            f"backend {name!r}: the factory returned {type(backend).__name__}, "
            "which lacks the Backend protocol (name, run, available, info, ...)"
        )
    return backend


def resolve_auto() -> str:
    """ATB if usable, else CUDA, else CPU."""
    for name in AUTO_ORDER:
        try:
            if create(name).available():
                return name
        except BackendSelectionError:
            continue
    return "torch-cpu"


def selected_names(option_values: list[str] | None) -> list[str]:
    """Backends named by the ``--backend`` option, else ``$MLA_BACKEND`` (comma-separated), else auto."""
    values = option_values or [v for v in os.environ.get(ENV_VAR, "").split(",") if v.strip()] or ["auto"]
    names: list[str] = []
    for value in values:
        names.extend(part.strip() for part in value.split(",") if part.strip())
    return [resolve_auto() if name == "auto" else name for name in dict.fromkeys(names)]
