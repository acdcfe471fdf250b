"""Golden store: one verified, atomically written HDF5 file per case.

Layout of ``<root>/<case_id>.h5`` (the case id ends in a short content hash, so the name addresses
the spec's content)::

    /                         root attributes (all strings unless noted)
      schema_version          int, SCHEMA_VERSION
      spec_json               CaseSpec.to_json()
      content_hash            full SHA-256 of the spec's content
      case_id                 readable id + short hash (equals the file stem)
      seed                    int, the spec's seed
      generator_version       golden.generate.GENERATOR_VERSION when written
      created_utc, created_pid, hostname
      python_version, numpy_version, h5py_version, hdf5_version, ml_dtypes_version
      blas                    JSON: numpy.show_config(mode="dicts") BLAS/LAPACK (+ threadpoolctl if present)
      provenance_json         JSON of the builder's provenance dict
      checksums_json          JSON {dataset path: sha256 hex}, the same values as each dataset's attribute
      baseline_stats_sha256   SHA-256 of the baseline statistics as sorted JSON (the benchmark rule's
                              denominators are checked like data)
    /inputs/{q,q_rope,k,k_rope,v,q_seqlen,kv_seqlen[,mask]}
                              exact device values: fp16 as float16 (device_dtype="fp16"); bf16 as uint16
                              holding the bf16 bit patterns (device_dtype="bf16": the upper half of a
                              float32; numpy: ``a.view(ml_dtypes.bfloat16)``, or
                              ``(a.astype(uint32) << 16).view(float32)``); seqlens int32
    /golden/out               float64 reference in the op's output layout (q's layout)
    /golden/row_valid         bool [T]: False for rows of zero-length batches ("don't care")
    /baseline/out             emulated same-dtype baseline, stored like the inputs
    /baseline (group attrs)   baseline error statistics (float / int / bool / str)

Every dataset carries ``sha256`` (of its raw stored bytes, C order, little-endian) and
``device_dtype``.  Datasets are contiguous and uncompressed so ``h5dump`` shows them and a byte's
file offset is known.  Files are written to ``.<name>.<pid>.tmp`` in the same directory, fsynced and
renamed with ``os.replace``: a killed writer never leaves a partial file under a final name.  Reads
use ``locking=False`` (read-only, safe under pytest-xdist) and verify every checksum; problems raise
:class:`GoldenCorruptError` or :class:`GoldenStaleError` naming the file and dataset.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import logging
import os
import platform
import socket
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import h5py
import ml_dtypes
import numpy as np
from filelock import FileLock

from golden.spec import CaseSpec
from golden.types import INPUT_NAMES, GoldenCase, OpInputs

SCHEMA_VERSION = 3  # 3: bf16 stored as uint16 bit patterns (2: as float32)
ENV_DIR = "MLA_GOLDEN_DIR"
#: The store when neither an argument nor $MLA_GOLDEN_DIR names one: ``.golden`` in the working directory.
DEFAULT_DIR_NAME = ".golden"

Builder = Callable[[CaseSpec], GoldenCase]
log = logging.getLogger(__name__)


class GoldenStoreError(Exception):
    """A golden file cannot be used; names the file and, where known, the dataset."""

    def __init__(self, path: Path, reason: str, dataset: str | None = None) -> None:
        self.path, self.reason, self.dataset = path, reason, dataset
        where = f"{path}: dataset {dataset!r}" if dataset else str(path)
        super().__init__(f"{where}: {reason}")


class GoldenMissingError(GoldenStoreError):
    """No file for the case."""


class GoldenCorruptError(GoldenStoreError):
    """Unreadable, truncated, or a checksum/dtype does not match: never use, regenerate."""


class GoldenStaleError(GoldenStoreError):
    """Readable and intact but written for another spec content or generator version."""


def current_generator_version() -> str:
    """Imported lazily: reading a store must not pull in the generator (or import it in a cycle)."""
    from golden.generate import GENERATOR_VERSION

    return str(GENERATOR_VERSION)


def default_builder() -> Builder:
    from golden.generate import build_golden

    return build_golden


@functools.cache
def blas_info() -> str:
    """BLAS/LAPACK identity as JSON; best effort because numpy's config format varies by version."""
    info: dict[str, Any] = {}
    try:
        deps = np.show_config(mode="dicts").get("Build Dependencies", {})  # type: ignore[func-returns-value]
        info.update({k: deps[k] for k in ("blas", "lapack") if k in deps})
    except Exception as exc:  # provenance must never block a write
        info["error"] = repr(exc)
    try:
        import threadpoolctl

        info["threadpools"] = threadpoolctl.threadpool_info()
    except ImportError:
        pass
    return json.dumps(info, sort_keys=True, default=str)


def library_versions() -> dict[str, str]:
    return {
        "python_version": platform.python_version(),
        "numpy_version": np.__version__,
        "h5py_version": h5py.__version__,
        "hdf5_version": h5py.version.hdf5_version,
        "ml_dtypes_version": ml_dtypes.__version__,
    }


# -- array encoding ---------------------------------------------------------------------------


def _sha256(arr: np.ndarray) -> str:
    """SHA-256 of the array's raw bytes (C order), hashed in place: no copy of the data."""
    flat = np.ascontiguousarray(arr).reshape(-1).view(np.uint8)
    return hashlib.sha256(flat.data).hexdigest()


def stats_sha256(stats: dict[str, Any]) -> str:
    """Checksum of the baseline statistics (sorted JSON of plain Python scalars)."""
    return hashlib.sha256(json.dumps(stats, sort_keys=True).encode()).hexdigest()


#: How a device dtype is stored: bf16 as its 16-bit patterns (HDF5 has no bfloat16 type).
STORED_AS = {"bf16": "uint16", "fp16": "float16"}


def _encode(arr: np.ndarray) -> tuple[np.ndarray, str]:
    """Device array -> (array HDF5 can store natively, device_dtype tag); never copies."""
    if arr.dtype == ml_dtypes.bfloat16:
        return arr.view(np.uint16), "bf16"
    if arr.dtype == np.float16:
        return arr, "fp16"
    return arr, arr.dtype.name


def _decode(stored: np.ndarray, tag: str, path: Path, name: str) -> np.ndarray:
    """Stored array -> device array, checking the dtype agrees with the tag; never copies."""
    expected = STORED_AS.get(tag, tag)
    if stored.dtype.name != expected:
        message = f"stored as {stored.dtype.name}, device_dtype {tag!r} needs {expected}"
        raise GoldenCorruptError(path, message, name)
    if tag != "bf16":
        return stored
    device: np.ndarray = stored.view(ml_dtypes.bfloat16)
    return device


def _scalar(value: Any) -> float | int | bool | str:
    """An HDF5 attribute back to the Python type the builder gave it."""
    if isinstance(value, (str, bytes)):
        return value.decode() if isinstance(value, bytes) else value
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    if isinstance(value, (int, np.integer)):
        return int(value)
    return float(value)


# -- file format --------------------------------------------------------------------------------


def _datasets(golden: GoldenCase) -> dict[str, np.ndarray]:
    if golden.out.dtype != np.float64:
        raise TypeError(f"{golden.spec.case_id}: golden out must be float64, got {golden.out.dtype}")
    if golden.row_valid.dtype != np.bool_:
        raise TypeError(f"{golden.spec.case_id}: row_valid must be bool, got {golden.row_valid.dtype}")
    out = {f"inputs/{name}": arr for name, arr in golden.inputs.arrays().items()}
    out["golden/out"], out["golden/row_valid"] = golden.out, golden.row_valid
    out["baseline/out"] = golden.baseline_out
    return out


def write_golden(golden: GoldenCase, path: Path, generator_version: str) -> int:
    """Write atomically (temp name, fsync, rename, fsync dir); returns the bytes written."""
    spec = golden.spec
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        with h5py.File(tmp, "w", locking=False) as f:
            checksums: dict[str, str] = {}
            for name, arr in _datasets(golden).items():
                stored, tag = _encode(np.ascontiguousarray(arr))
                ds = f.create_dataset(name, data=stored)
                ds.attrs["device_dtype"] = tag
                ds.attrs["sha256"] = checksums[name] = _sha256(stored)
            for key, value in golden.baseline_stats.items():
                f["baseline"].attrs[key] = value
            f.attrs.update(
                {
                    "schema_version": SCHEMA_VERSION,
                    "spec_json": spec.to_json(),
                    "content_hash": spec.content_hash,
                    "case_id": spec.case_id,
                    "seed": spec.seed,
                    "generator_version": generator_version,
                    "created_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                    "created_pid": os.getpid(),
                    "hostname": socket.gethostname(),
                    "blas": blas_info(),
                    "provenance_json": json.dumps(golden.provenance, sort_keys=True),
                    "checksums_json": json.dumps(checksums, sort_keys=True),
                    "baseline_stats_sha256": stats_sha256(dict(golden.baseline_stats)),
                    **library_versions(),
                }
            )
        with open(tmp, "rb") as fh:
            os.fsync(fh.fileno())
        size = tmp.stat().st_size
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)
    return size


@dataclass(frozen=True)
class FileMeta:
    """Root attributes of a golden file (cheap to read, not checksum-verified)."""

    path: Path
    attrs: dict[str, Any]

    @property
    def content_hash(self) -> str:
        return str(self.attrs.get("content_hash", ""))

    @property
    def generator_version(self) -> str:
        return str(self.attrs.get("generator_version", ""))

    def spec(self) -> CaseSpec:
        return CaseSpec.from_json(str(self.attrs["spec_json"]))


@contextlib.contextmanager
def _open(path: Path) -> Iterator[h5py.File]:
    if not path.exists():
        raise GoldenMissingError(path, "no golden file")
    try:
        f = h5py.File(path, "r", locking=False)
    except OSError as exc:
        raise GoldenCorruptError(path, f"cannot open as HDF5 (truncated or damaged): {exc}") from exc
    with f:
        yield f


def read_meta(path: Path) -> FileMeta:
    with _open(path) as f:
        try:
            attrs = {k: v.decode() if isinstance(v, bytes) else v for k, v in f.attrs.items()}
        except (OSError, RuntimeError, ValueError) as exc:
            raise GoldenCorruptError(path, f"root attributes unreadable: {exc}") from exc
    return FileMeta(path, attrs)


def _read_verified(f: h5py.File, path: Path) -> dict[str, np.ndarray]:
    """Every dataset as its device array, after checking both recorded checksums."""
    try:
        listed: dict[str, str] = json.loads(f.attrs["checksums_json"])
    except (KeyError, OSError, ValueError, TypeError) as exc:
        raise GoldenCorruptError(path, f"root attribute 'checksums_json' unusable: {exc}") from exc
    found: list[str] = []  # every dataset, one group deep (a deeper object is listed by its group's name)
    for top, obj in f.items():
        found.extend(f"{top}/{name}" for name in obj) if isinstance(obj, h5py.Group) else found.append(top)
    if sorted(found) != sorted(listed):
        raise GoldenCorruptError(path, f"datasets {sorted(found)} but checksums_json lists {sorted(listed)}")
    arrays: dict[str, np.ndarray] = {}
    for name in sorted(listed):
        try:
            ds = f[name]
            stored = np.asarray(ds[()])
            recorded, tag = str(ds.attrs["sha256"]), str(ds.attrs["device_dtype"])
        except (KeyError, OSError, RuntimeError, ValueError) as exc:
            raise GoldenCorruptError(path, f"unreadable: {exc}", name) from exc
        actual = _sha256(stored)
        if actual != recorded or actual != listed[name]:
            message = f"SHA-256 mismatch: data {actual[:16]}…, recorded {recorded[:16]}…"
            raise GoldenCorruptError(path, message, name)
        arrays[name] = _decode(stored, tag, path, name)
    return arrays


def read_golden(
    path: Path, spec: CaseSpec | None = None, meta: FileMeta | None = None
) -> tuple[GoldenCase, FileMeta]:
    """Read and verify every checksum; ``spec`` (else the file's spec_json) labels the result.

    ``meta``: the file's root attributes when the caller has just read them (saves a second read).
    """
    meta = meta if meta is not None and meta.path == path else read_meta(path)
    try:
        stored_spec = meta.spec()
    except (KeyError, ValueError, TypeError) as exc:
        raise GoldenCorruptError(path, f"root attribute 'spec_json' unusable: {exc}") from exc
    if stored_spec.content_hash != meta.content_hash:
        raise GoldenCorruptError(path, "spec_json does not hash to the recorded content_hash")
    with _open(path) as f:
        arrays = _read_verified(f, path)
        try:
            stats = {k: _scalar(v) for k, v in f["baseline"].attrs.items()}
            provenance = {str(k): str(v) for k, v in json.loads(meta.attrs["provenance_json"]).items()}
        except (KeyError, OSError, ValueError, TypeError) as exc:
            raise GoldenCorruptError(path, f"baseline/provenance attributes unusable: {exc}") from exc
    if stats_sha256(stats) != meta.attrs.get("baseline_stats_sha256"):
        raise GoldenCorruptError(path, "baseline statistics do not match baseline_stats_sha256",
                                 "baseline (attributes)")
    try:
        inputs = OpInputs(**{n: arrays.get(f"inputs/{n}") for n in INPUT_NAMES})  # type: ignore[arg-type]
        golden = GoldenCase(
            spec=spec or stored_spec,
            inputs=inputs,
            out=arrays["golden/out"],
            row_valid=arrays["golden/row_valid"],
            baseline_out=arrays["baseline/out"],
            baseline_stats=stats,
            provenance=provenance,
        )
    except (KeyError, TypeError) as exc:
        raise GoldenCorruptError(path, f"required dataset missing: {exc}") from exc
    return golden, meta


# -- the store -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class EnsureResult:
    """What :meth:`GoldenStore.ensure_result` did: ``up-to-date`` or ``generated`` (``why`` says why)."""

    golden: GoldenCase
    path: Path
    action: str
    why: str = ""
    bytes_written: int = 0


class GoldenStore:
    """Golden files under ``root`` (argument, else ``$MLA_GOLDEN_DIR``, else ``./.golden``)."""

    def __init__(self, root: Path | str | None = None, *, generator_version: str | None = None) -> None:
        chosen = root if root is not None else os.environ.get(ENV_DIR) or Path.cwd() / DEFAULT_DIR_NAME
        self.root = Path(chosen).expanduser().resolve()
        self._generator_version = generator_version

    @property
    def generator_version(self) -> str:
        if self._generator_version is None:
            self._generator_version = current_generator_version()
        return self._generator_version

    def path_for(self, spec: CaseSpec) -> Path:
        return self.root / f"{spec.case_id}.h5"

    def lock_for(self, spec: CaseSpec) -> FileLock:
        lock_dir = self.root / ".locks"
        lock_dir.mkdir(parents=True, exist_ok=True)
        return FileLock(str(lock_dir / f"{spec.case_id}.lock"))

    def files(self) -> list[Path]:
        return sorted(self.root.glob("*.h5"))

    def check_stale(self, meta: FileMeta, spec: CaseSpec) -> None:
        if meta.attrs.get("schema_version") != SCHEMA_VERSION:
            raise GoldenStaleError(meta.path, f"schema_version {meta.attrs.get('schema_version')!r}, "
                                   f"store reads {SCHEMA_VERSION}")
        if meta.content_hash != spec.content_hash:
            raise GoldenStaleError(meta.path, f"content_hash {meta.content_hash[:12]}… is not the spec's "
                                   f"{spec.content_hash[:12]}…")
        if meta.generator_version != self.generator_version:
            raise GoldenStaleError(meta.path, f"generator_version {meta.generator_version!r}, "
                                   f"current is {self.generator_version!r}")

    def load(self, spec: CaseSpec) -> GoldenCase:
        """Load and verify; raises a :class:`GoldenStoreError` subclass rather than return bad data."""
        path = self.path_for(spec)
        meta = read_meta(path)
        self.check_stale(meta, spec)
        return read_golden(path, spec, meta)[0]

    def save(self, golden: GoldenCase) -> Path:
        """Write under the case lock, so concurrent savers never interleave."""
        with self.lock_for(golden.spec):
            self._write(golden)
        return self.path_for(golden.spec)

    def ensure(self, spec: CaseSpec, builder: Builder | None = None, *, force: bool = False) -> GoldenCase:
        """A valid golden for ``spec``: loaded, or built once under the case lock and saved."""
        return self.ensure_result(spec, builder, force=force).golden

    def ensure_result(
        self, spec: CaseSpec, builder: Builder | None = None, *, force: bool = False
    ) -> EnsureResult:
        path = self.path_for(spec)
        if not force and path.exists():
            with contextlib.suppress(GoldenStoreError):
                return EnsureResult(self.load(spec), path, "up-to-date")
        with self.lock_for(spec):
            why = "forced"
            if not force:
                try:
                    return EnsureResult(self.load(spec), path, "up-to-date")  # another process built it
                except GoldenMissingError:
                    why = "missing"
                except GoldenStoreError as exc:
                    why = f"{type(exc).__name__}: {exc}"
                    log.warning("rebuilding golden %s: %s", path, why)
            golden = (builder or default_builder())(spec)
            size = self._write(golden)
        return EnsureResult(golden, path, "generated", why, size)

    def _write(self, golden: GoldenCase) -> int:
        """Caller holds the case lock: any temp file for this case is a dead writer's leftover."""
        path = self.path_for(golden.spec)
        for leftover in self.root.glob(f".{path.name}.*.tmp"):
            leftover.unlink(missing_ok=True)
        return write_golden(golden, path, self.generator_version)
