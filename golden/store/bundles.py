"""Explicit input bundles: the exact tensors of a case that is not drawn from a seed (an imported dump's
call), stored by content hash beside the goldens, in ``<golden store>/inputs/<sha256>.npz``.

A bundle holds the five operator inputs in the packed layout of :class:`~mlaconf.golden.specs.types.OpInputs`
(``q [T, H, 128]``, ``q_rope [T, H, 64]``, ``k [Tk, Hkv, 128]``, ``k_rope [Tk, Hkv, 64]``,
``v [Tk, Hkv, 128]``, fp16 or bf16, bf16 kept as its bits).  Its name is the sha256 of its content (role,
dtype, shape and bytes in :data:`ROLES` order); a reader re-hashes what it loads and refuses a bundle whose
content is not its name.  Beside it, ``<case id>.dumped_out.npz`` keeps a case's dumped device output
``[T, H, 128]`` as evidence, judged like a backend's output; it is no part of the case's content.  Writes
are atomic (an exclusive temp name in the folder, then ``os.replace``).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import secrets
from collections.abc import Iterator
from contextvars import ContextVar
from pathlib import Path

import ml_dtypes
import numpy as np

from mlaconf.golden.store.locations import chosen_root

INPUTS_DIR = "inputs"
ROLES = ("q", "q_rope", "k", "k_rope", "v")
DUMPED_OUT = "dumped_out"
_DTYPES = {"fp16": np.dtype(np.float16), "bf16": np.dtype(ml_dtypes.bfloat16)}
#: The golden store whose golden is being built (GoldenStore sets it around its builder).
_BUILDING: ContextVar[Path | None] = ContextVar("mlaconf_inputs_store", default=None)


class InputBundleError(ValueError):
    """A bundle is missing, unreadable or not what its name says; names the file."""


@contextlib.contextmanager
def inputs_from(store: Path) -> Iterator[None]:
    """Within: bundles are read from ``store`` (the golden store building a golden)."""
    token = _BUILDING.set(store)
    try:
        yield
    finally:
        _BUILDING.reset(token)


def inputs_dir(store: Path | str | None = None) -> Path:
    """The bundles' folder of a golden store (None: the store building a golden, else the one a run uses,
    $MLA_GOLDEN_DIR, else .golden in the working directory)."""
    return chosen_root(store if store is not None else _BUILDING.get()) / INPUTS_DIR


def dtype_name(array: np.ndarray) -> str:
    """``fp16`` or ``bf16``; anything else is not an operator input."""
    for name, dtype in _DTYPES.items():
        if array.dtype == dtype:
            return name
    raise InputBundleError(f"dtype {array.dtype} is not an operator input dtype (fp16 or bf16)")


def bundle_hash(tensors: dict[str, np.ndarray]) -> str:
    """The sha256 of the inputs: each role's name, dtype, shape and bytes, in :data:`ROLES` order."""
    digest = hashlib.sha256()
    for role in ROLES:
        array = np.ascontiguousarray(tensors[role])
        digest.update(f"{role}:{dtype_name(array)}:{list(array.shape)}\n".encode())
        digest.update(array.view(np.uint16).tobytes())
    return digest.hexdigest()


def save_bundle(tensors: dict[str, np.ndarray], store: Path | str | None = None) -> Path:
    """Write the five inputs as ``<hash>.npz`` (an existing bundle of that name is the same and kept)."""
    if set(tensors) != set(ROLES):
        raise InputBundleError(f"a bundle holds exactly {list(ROLES)}, got {sorted(tensors)}")
    path = inputs_dir(store) / f"{bundle_hash(tensors)}.npz"
    if not path.is_file():
        _write_npz(path, tensors)
    return path


def load_bundle(digest: str, store: Path | str | None = None) -> dict[str, np.ndarray]:
    """The bundle named ``digest``: its five inputs, checked against the name."""
    path = inputs_dir(store) / f"{digest}.npz"
    if not path.is_file():
        raise InputBundleError(f"{path}: no such input bundle (copy the importer's inputs/ folder into the store)")
    tensors = _read_npz(path, ROLES)
    if bundle_hash(tensors) != digest:
        raise InputBundleError(f"{path}: its content does not hash to its name (a corrupt or edited bundle)")
    return tensors


def save_dumped_output(case_id: str, out: np.ndarray, store: Path | str | None = None) -> Path:
    """Keep a case's dumped device output (evidence) as ``<case id>.dumped_out.npz``; the first one stays."""
    path = inputs_dir(store) / f"{case_id}.{DUMPED_OUT}.npz"
    if not path.is_file():
        _write_npz(path, {DUMPED_OUT: out})
    return path


def load_dumped_output(case_id: str, store: Path | str | None = None) -> np.ndarray | None:
    """A case's dumped device output, or None when its dump had none."""
    path = inputs_dir(store) / f"{case_id}.{DUMPED_OUT}.npz"
    return _read_npz(path, (DUMPED_OUT,))[DUMPED_OUT] if path.is_file() else None


def _write_npz(path: Path, tensors: dict[str, np.ndarray]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    arrays: dict[str, np.ndarray] = {}
    for name, array in tensors.items():
        arrays[name] = np.ascontiguousarray(array).view(np.uint16)
        arrays[f"{name}.dtype"] = np.array(dtype_name(array))
    temp = path.parent / f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp"
    fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o644)
    try:
        with os.fdopen(fd, "wb") as fh:
            np.savez(fh, **arrays)  # type: ignore[arg-type]
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(temp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            temp.unlink()
        raise


def _read_npz(path: Path, names: tuple[str, ...]) -> dict[str, np.ndarray]:
    try:
        with np.load(path, allow_pickle=False) as data:
            return {name: data[name].view(_DTYPES[str(data[f"{name}.dtype"])]) for name in names}
    except (OSError, ValueError, KeyError) as err:
        raise InputBundleError(f"{path}: unreadable ({type(err).__name__}: {err})") from err
