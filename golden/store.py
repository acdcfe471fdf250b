"""Golden store: one verified, atomically written HDF5 file per case.

One file per case, ``<root>/<case_id>.h5`` (the case id ends in a short content hash, so the name
addresses the spec's content). Its datasets and attributes are documented in docs/golden-files.md
(that table's one home).

Every dataset carries ``xxh3_128`` (of its raw stored bytes, C order, little-endian) and
``device_dtype``.  Datasets are contiguous and uncompressed so ``h5dump`` shows them and a byte's
file offset is known.

Whole-file integrity (schema >= 4).  HDF5 parses object headers and attributes before any checksum of
ours could be looked at, and a damaged header can crash or hang it; so every file starts with an
HDF5 *user block* (HDF5 skips it; ``h5dump`` and h5py read the file as usual) holding a text header::

    MLA-GOLDEN-HDF5 schema 7 header 4096
    size <file size in bytes>
    dataset <path> <file offset> <bytes> <xxh3-128 of those bytes>   (one line per dataset)
    xxh3_128 <xxh3-128 of the lines above + every byte after the header>
    NUL padding to the header size

The digest is XXH3-128 (package ``xxhash``; ~17 GB/s here against SHA-256's 1.6): a non-cryptographic
128-bit hash made to catch accidental damage (bit flips, truncation, torn or mixed writes; a random
change goes unnoticed with probability 2^-128), not an adversary, who could forge a matching file as
easily as they could reseal one under SHA-256.  Files of another schema are stale, never verified
under the wrong hash.  Reads check it with plain Python I/O before HDF5 sees a byte: any change anywhere (header, HDF5
metadata, attributes such as provenance, raw data, truncation or extension) is a
:class:`GoldenCorruptError` naming the file (and the dataset when the damage lies in raw data); a file
without the header (schema < 3) is stale.  HDF5 then reads the very file object that was hashed, so a
rename between check and parse cannot substitute another file.  A verified file's
(device, inode, size, mtime_ns, ctime_ns) is remembered for the life of the process so that it is not
re-hashed on every read; an in-place change updates ctime, which misses the cache.

Writes go to ``.<name>.<pid>.<random>.tmp`` in the same directory, created exclusively (a symlink, FIFO or
file planted at that name is refused, never followed; ``os.replace`` replaces a symlink planted at the
final name instead of writing through it): the file is first reserved to the data's
size (``posix_fallocate``, so a full disk fails before HDF5 writes a byte), HDF5 writes it through a
Python file object (h5py re-raises the ``OSError`` of a failed write), the header is sealed in place,
and the file is fsynced and renamed with ``os.replace``.  A killed writer never leaves a partial
file under a final name (and the store opens only regular files: a FIFO or directory named ``*.h5``
is one corrupt file, never a hang), memory holds the arrays but never a copy of the file, and a full
disk or any other OS error surfaces as :class:`GoldenWriteError` naming the store and the case
(the temp file is removed).

After the header, every dataset's two recorded checksums (its attribute and ``checksums_json``) must
equal its bytes' xxh3-128: the integrity header's digest when this open has just hashed the whole
file, else hashed again from the data read (a load the digest cache vouched for); problems raise
:class:`GoldenCorruptError` or :class:`GoldenStaleError` naming the file and dataset."""

from __future__ import annotations

import contextlib
import errno
import functools
import json
import logging
import os
import re
import secrets
import socket
import stat
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import h5py
import ml_dtypes
import numpy as np
import xxhash
from filelock import FileLock

from mlaconf.golden.layout import out_shape
from mlaconf.golden.magnitudes import ROW_MAGNITUDES, magnitude_names
from mlaconf.golden.spec import CaseSpec
from mlaconf.golden.spec_build import spec_from_json
from mlaconf.golden.types import INPUT_NAMES, GoldenCase, OpInputs

#: 4: whole-file integrity header, error-model magnitudes, bf16 as uint16 bit patterns (2: none of them);
#: 5: element magnitudes as bf16 rounded up, S and T only on the fp16 score path; 6: T on every case;
#: 7: xxh3-128 digests instead of SHA-256 (header, datasets, statistics).
SCHEMA_VERSION = 7
#: The digest of every integrity check (header lines, datasets, statistics): 128-bit XXH3.
DIGEST_NAME = "xxh3_128"
HDF5_SIGNATURE = b"\x89HDF\r\n\x1a\n"
#: Largest integrity header (HDF5 user block) a reader accepts.
MAX_HEADER = 1 << 20
#: A verified file enters the process's digest cache only once its ctime is this old, so that a
#: change within the same clock tick as the check (ctime unchanged) cannot hide behind the cache.
CACHE_SETTLE_NS = 1_000_000_000
_CHUNK = 8 << 20
#: Bytes reserved for HDF5's metadata and attributes beyond the datasets and the header.
RESERVE_METADATA = 1 << 20
_FIRST_LINE = re.compile(rb"MLA-GOLDEN-HDF5 schema ([0-9]{1,6}) header ([0-9]{3,8})\n")
_SEALED = re.compile(rb"((?:[^\n\x00]*\n)*?)xxh3_128 ([0-9a-f]{32})\n\x00*")
_SIZE_LINE = re.compile(rb"size ([0-9]{1,20})")
_DATASET_LINE = re.compile(rb"dataset ([A-Za-z0-9_/]{1,200}) ([0-9]{1,20}) ([0-9]{1,20}) ([0-9a-f]{32})")
#: (st_dev, st_ino) -> (size, mtime_ns, ctime_ns) of files whose whole-file digest matched.
_VERIFIED: dict[tuple[int, int], tuple[int, int, int]] = {}
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
    """Readable and intact but written for another spec content, generator or schema version."""


class GoldenWriteError(GoldenStoreError):
    """A golden file could not be written (disk full, permissions, ...); no partial file is left."""


def current_generator_version() -> str:
    """Imported lazily: reading a store must not pull in the generator (or import it in a cycle)."""
    from mlaconf.golden.generate import GENERATOR_VERSION

    return str(GENERATOR_VERSION)


def default_builder() -> Builder:
    from mlaconf.golden.generate import build_golden

    return build_golden


@functools.cache
def blas_info() -> str:
    """BLAS/LAPACK identity as JSON; best effort because numpy's config format varies by version."""
    info: dict[str, Any] = {}
    try:
        deps = np.show_config(mode="dicts").get("Build Dependencies", {})
        info.update({k: deps[k] for k in ("blas", "lapack") if k in deps})
    except Exception as exc:  # provenance must never block a write
        info["error"] = repr(exc)
    try:
        import threadpoolctl

        info["threadpools"] = threadpoolctl.threadpool_info()
    except ImportError:
        pass
    return json.dumps(info, sort_keys=True, default=str)


# -- array encoding ---------------------------------------------------------------------------


def _digest(arr: np.ndarray) -> str:
    """xxh3-128 of the array's raw bytes (C order), hashed in place: no copy of the data."""
    flat = np.ascontiguousarray(arr).reshape(-1).view(np.uint8)
    return xxhash.xxh3_128_hexdigest(flat.data)


def stats_digest(stats: dict[str, Any]) -> str:
    """Checksum of the baseline statistics (sorted JSON of plain Python scalars)."""
    return xxhash.xxh3_128_hexdigest(json.dumps(stats, sort_keys=True).encode())


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
    needed = magnitude_names(golden.spec)
    missing = [name for name in needed if name not in golden.magnitudes]
    if missing:
        raise TypeError(f"{golden.spec.case_id}: golden lacks the magnitudes {missing}")
    for name in needed:
        _check_magnitude(golden.magnitudes[name], name, golden.spec, golden.spec.case_id)
    out.update({f"golden/{name}": golden.magnitudes[name] for name in needed})
    out["baseline/out"] = golden.baseline_out
    return out


def _check_magnitude(arr: np.ndarray, name: str, spec: CaseSpec, where: str) -> None:
    """Element magnitudes are bf16 in attenOut's shape, row magnitudes float32 ``[T, H]``."""
    row = name in ROW_MAGNITUDES
    dtype = np.dtype(np.float32 if row else ml_dtypes.bfloat16)
    shape = (spec.total_q, spec.head_num) if row else tuple(out_shape(spec))
    if arr.dtype != dtype or arr.shape != shape:
        raise TypeError(f"{where}: magnitude {name} is {arr.dtype}{list(arr.shape)}, must be {dtype}{list(shape)}")


def _header_size(names: list[str]) -> int:
    """User block size (a power of two >= 512, as HDF5 requires) that fits the header for ``names``."""
    need = 160 + sum(len(name) + 130 for name in names)  # first, size and seal lines; one line per dataset
    return max(512, 1 << (need - 1).bit_length())


def _write_hdf5(
    fh: IO[bytes],
    golden: GoldenCase,
    arrays: dict[str, np.ndarray],
    generator_version: str,
    reserve: Callable[[], None],
) -> dict[str, str]:
    """HDF5 writes the file through ``fh``, leaving an empty user block for the integrity header;
    returns each dataset's xxh3-128 (of its stored bytes, which contiguous datasets keep as they are).

    ``reserve`` runs once the file exists and before any data is written (HDF5 creates a file only
    over an empty one; it truncates the reservation's unused tail when it closes)."""
    spec = golden.spec
    checksums: dict[str, str] = {}
    with h5py.File(fh, "w", userblock_size=_header_size(list(arrays))) as f:
        reserve()
        for name, arr in arrays.items():
            stored, tag = _encode(np.ascontiguousarray(arr))
            ds = f.create_dataset(name, data=stored)
            ds.attrs["device_dtype"] = tag
            ds.attrs[DIGEST_NAME] = checksums[name] = _digest(stored)
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
                "baseline_stats_xxh3_128": stats_digest(dict(golden.baseline_stats)),
            }
        )
    return checksums


def _dataset_ranges(f: h5py.File) -> list[tuple[str, int, int]]:
    """(path, file offset, bytes) of every dataset with stored data (contiguous layout)."""
    found: list[tuple[str, int, int]] = []

    def visit(name: str, obj: object) -> None:
        if isinstance(obj, h5py.Dataset) and obj.id.get_storage_size() > 0:
            found.append((name, int(obj.id.get_offset()), int(obj.id.get_storage_size())))

    f.visititems(visit)
    return sorted(found)


def _hash_rest(fh: IO[bytes], digest: Any, size: int | None = None) -> None:
    """Feed ``size`` bytes (all to the end when None) from ``fh``'s position into ``digest``, through one
    reused buffer: the hash runs at ~17 GB/s, so allocating a chunk per read would be the cost."""
    buffer = bytearray(_CHUNK)
    view = memoryview(buffer)
    remaining = size
    while remaining is None or remaining > 0:
        want = _CHUNK if remaining is None else min(_CHUNK, remaining)
        got = fh.readinto(view[:want])  # type: ignore[attr-defined]
        if not got:
            break
        digest.update(view[:got])
        if remaining is not None:
            remaining -= got


def _hash_range(fh: IO[bytes], offset: int, size: int) -> str:
    digest = xxhash.xxh3_128()
    fh.seek(offset)
    _hash_rest(fh, digest, size)
    return str(digest.hexdigest())


def seal(fh: IO[bytes], known: dict[str, str] | None = None) -> int:
    """Write the integrity header into the user block of the HDF5 file open in ``fh`` (read/write,
    seekable); returns the file's size.  ``known`` gives datasets' digests already computed from
    the arrays written (others are hashed from the file).  The store seals every file it writes."""
    fh.seek(0)
    with h5py.File(fh, "r", locking=False) as f:
        header_size = int(f.userblock_size)
        ranges = _dataset_ranges(f)
    size = fh.seek(0, os.SEEK_END)
    known = known or {}
    lines = [f"MLA-GOLDEN-HDF5 schema {SCHEMA_VERSION} header {header_size}", f"size {size}"]
    lines += [
        f"dataset {name} {offset} {length} {known.get(name) or _hash_range(fh, offset, length)}"
        for name, offset, length in ranges
    ]
    body = ("\n".join(lines) + "\n").encode()
    digest = xxhash.xxh3_128(body)
    fh.seek(header_size)
    _hash_rest(fh, digest)
    header = body + f"{DIGEST_NAME} {digest.hexdigest()}\n".encode()
    if len(header) > header_size:
        raise ValueError(f"integrity header needs {len(header)} bytes, the user block has {header_size}")
    fh.seek(0)
    fh.write(header.ljust(header_size, b"\0"))
    return size


def reseal(path: Path) -> None:
    """Rewrite a file's integrity header in place: for tests that edit a golden on purpose, to reach
    the checks behind the header."""
    with open(path, "r+b") as fh:
        seal(fh)


#: errnos of ``posix_fallocate`` that mean "no room" (others: the file system cannot reserve, go on).
_NO_ROOM = {errno.ENOSPC, errno.EDQUOT, errno.EFBIG}


def _reserve(fh: IO[bytes], size: int) -> None:
    """Reserve ``size`` bytes for the file, so that a full disk fails here, before any data is written."""
    fallocate = getattr(os, "posix_fallocate", None)
    if fallocate is None:  # pragma: no cover - not on Linux
        return
    fh.flush()
    try:
        fallocate(fh.fileno(), 0, size)
    except OSError as exc:
        if exc.errno in _NO_ROOM:
            raise


#: The temp file is created, never opened: a name already taken (a planted symlink, FIFO or file) fails with
#: EEXIST instead of being followed or truncated.
_CREATE_FLAGS = os.O_RDWR | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)


def _create_temp(tmp: Path) -> IO[bytes]:
    """Create ``tmp`` exclusively and open it for reading and writing."""
    return os.fdopen(os.open(tmp, _CREATE_FLAGS, 0o644), "w+b")


def temp_path(path: Path) -> Path:
    """A fresh temp name next to ``path``: ``.<name>.<pid>.<random>.tmp`` (unguessable, unique per write)."""
    return path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(8)}.tmp")


def write_golden(golden: GoldenCase, path: Path, generator_version: str) -> int:
    """Write atomically (temp name, fsync, rename, fsync dir); returns the bytes written.

    The temp file is created exclusively (``O_CREAT | O_EXCL | O_NOFOLLOW``) under a fresh random name,
    and ``os.replace`` replaces whatever sits at ``path`` (a symlink included) without following it.

    The temp file is first reserved to the data's size (``posix_fallocate``), then HDF5 writes it
    through a Python file object and the integrity header is sealed in place: memory stays the
    arrays themselves, never a second copy of the file.  Every OS error (a full disk, a read-only
    store, ...) raises :class:`GoldenWriteError` naming the store and the case, after removing the
    temp file."""
    arrays = _datasets(golden)
    tmp = temp_path(path)
    reserve = sum(a.nbytes for a in arrays.values()) + _header_size(list(arrays)) + RESERVE_METADATA
    created = False
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fh = _create_temp(tmp)
        created = True
        with fh:
            checksums = _write_hdf5(fh, golden, arrays, generator_version, lambda: _reserve(fh, reserve))
            size = seal(fh, checksums)
            fh.truncate(size)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
        dir_fd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)
    except BaseException as exc:
        if created:  # never remove what someone else put at the name (O_EXCL refused it)
            with contextlib.suppress(OSError):
                tmp.unlink(missing_ok=True)
        if isinstance(exc, OSError):
            raise _write_error(path, golden.spec, exc) from exc
        raise
    return size


def _write_error(path: Path, spec: CaseSpec, exc: OSError) -> GoldenWriteError:
    return GoldenWriteError(path, f"cannot write case {spec.case_id!r} into store {path.parent}: {exc}")


@dataclass(frozen=True)
class FileMeta:
    """Root attributes of a golden file (covered by the whole-file digest, like everything in it)."""

    path: Path
    attrs: dict[str, Any]

    @property
    def content_hash(self) -> str:
        return str(self.attrs.get("content_hash", ""))

    @property
    def generator_version(self) -> str:
        return str(self.attrs.get("generator_version", ""))

    def spec(self) -> CaseSpec:
        return spec_from_json(str(self.attrs["spec_json"]))


def _check_whole_file(fh: IO[bytes], path: Path) -> dict[str, str] | None:
    """The integrity header and whole-file digest, read with plain Python I/O before HDF5 parses a byte.

    Returns the header's dataset digests when this call hashed the file (every byte HDF5 will read
    from ``fh`` was just covered), None when the process's cache vouched for it instead."""
    st = os.fstat(fh.fileno())
    settled = time.time_ns() - st.st_ctime_ns > CACHE_SETTLE_NS
    identity, state = (st.st_dev, st.st_ino), (st.st_size, st.st_mtime_ns, st.st_ctime_ns)
    if _VERIFIED.get(identity) == state:
        return None
    first = fh.read(64)
    if first.startswith(HDF5_SIGNATURE):
        raise GoldenStaleError(path, f"no integrity header: written before schema_version {SCHEMA_VERSION}")
    match = _FIRST_LINE.match(first)
    if match is None:
        raise GoldenCorruptError(path, "integrity header damaged or absent (not a golden file of this store)")
    header_size = int(match[2])
    if header_size < 512 or header_size & (header_size - 1) or header_size > MAX_HEADER:
        raise GoldenCorruptError(path, f"integrity header damaged: header size {header_size}")
    if header_size > st.st_size:
        raise GoldenCorruptError(path, f"truncated: {st.st_size} bytes, less than the {header_size}-byte header")
    fh.seek(0)
    sealed = _SEALED.fullmatch(fh.read(header_size))
    if sealed is None and int(match[1]) < SCHEMA_VERSION:  # an older schema's seal (SHA-256): not checkable here
        raise GoldenStaleError(path, f"schema_version {int(match[1])}, store reads {SCHEMA_VERSION}")
    if sealed is None:
        raise GoldenCorruptError(path, f"integrity header damaged: no well-formed {DIGEST_NAME} line")
    digest = xxhash.xxh3_128(sealed[1])
    _hash_rest(fh, digest)
    if digest.hexdigest() != sealed[2].decode():
        raise _locate_damage(fh, path, sealed[1], st.st_size)
    if int(match[1]) != SCHEMA_VERSION:
        raise GoldenStaleError(path, f"schema_version {int(match[1])}, store reads {SCHEMA_VERSION}")
    if settled:
        _VERIFIED[identity] = state
    return {m[1].decode(): m[4].decode() for line in sealed[1].split(b"\n") if (m := _DATASET_LINE.fullmatch(line))}


def _locate_damage(fh: IO[bytes], path: Path, body: bytes, size: int) -> GoldenCorruptError:
    """Name what a whole-file digest mismatch damaged, from the header's size and dataset lines."""
    lines = body.split(b"\n")
    recorded = [int(m[1]) for line in lines if (m := _SIZE_LINE.fullmatch(line))]
    if recorded and recorded[0] != size:
        return GoldenCorruptError(
            path, f"file is {size} bytes, its header records {recorded[0]} (truncated, extended or header damaged)"
        )
    for line in lines:
        m = _DATASET_LINE.fullmatch(line)
        if m and int(m[2]) + int(m[3]) <= size and _hash_range(fh, int(m[2]), int(m[3])) != m[4].decode():
            return GoldenCorruptError(path, "raw data changed (whole-file and dataset digest mismatch)", m[1].decode())
    return GoldenCorruptError(
        path, "whole-file digest mismatch: HDF5 metadata, attributes or the integrity header changed"
    )


@dataclass(frozen=True)
class _Opened:
    """An HDF5 file opened after the whole-file check, and the header's dataset digests when that
    check hashed the file in this open (None when the process's cache vouched for it)."""

    file: h5py.File
    hashed: dict[str, str] | None


def _file_kind(mode: int) -> str:
    kinds = {stat.S_IFIFO: "a FIFO", stat.S_IFDIR: "a directory", stat.S_IFSOCK: "a socket"}
    kinds.update({stat.S_IFCHR: "a character device", stat.S_IFBLK: "a block device"})
    return kinds.get(stat.S_IFMT(mode), "not a regular file")


@contextlib.contextmanager
def _open(path: Path) -> Iterator[_Opened]:
    """Open for reading after the whole-file check; HDF5 reads the same file object that was hashed."""
    try:
        # O_NONBLOCK: opening a FIFO (or a device) named like a golden must not wait for a writer
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError:
        raise GoldenMissingError(path, "no golden file") from None
    except OSError as exc:
        raise GoldenCorruptError(path, f"cannot open: {exc}") from exc
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):
        os.close(fd)
        raise GoldenCorruptError(path, f"not a regular file ({_file_kind(mode)}): not a golden")
    fh = os.fdopen(fd, "rb")
    with fh:
        try:
            hashed = _check_whole_file(fh, path)
        except OSError as exc:
            raise GoldenCorruptError(path, f"cannot read: {exc}") from exc
        fh.seek(0)
        try:
            f = h5py.File(fh, "r", locking=False)
        except OSError as exc:
            raise GoldenCorruptError(path, f"cannot open as HDF5: {exc}") from exc
        with f:
            yield _Opened(f, hashed)


def _meta(f: h5py.File, path: Path) -> FileMeta:
    try:
        attrs = {k: v.decode() if isinstance(v, bytes) else v for k, v in f.attrs.items()}
    except (OSError, RuntimeError, ValueError) as exc:
        raise GoldenCorruptError(path, f"root attributes unreadable: {exc}") from exc
    return FileMeta(path, attrs)


def read_meta(path: Path) -> FileMeta:
    with _open(path) as opened:
        return _meta(opened.file, path)


def _read_verified(f: h5py.File, path: Path, hashed: dict[str, str] | None) -> dict[str, np.ndarray]:
    """Every dataset as its device array, its two recorded checksums checked against its bytes: hashed
    again here, or, when this open's whole-file check just hashed every byte, compared with the
    integrity header's digest of the dataset's bytes (the same value, without a second pass)."""
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
            recorded, tag = str(ds.attrs[DIGEST_NAME]), str(ds.attrs["device_dtype"])
        except (KeyError, OSError, RuntimeError, ValueError) as exc:
            raise GoldenCorruptError(path, f"unreadable: {exc}", name) from exc
        actual = hashed[name] if hashed is not None and name in hashed else _digest(stored)  # empty: no line
        if actual != recorded or actual != listed[name]:
            message = f"digest mismatch: data {actual[:16]}…, recorded {recorded[:16]}…"
            raise GoldenCorruptError(path, message, name)
        arrays[name] = _decode(stored, tag, path, name)
    return arrays


def read_golden(path: Path, spec: CaseSpec | None = None) -> tuple[GoldenCase, FileMeta]:
    """Read and verify every checksum; ``spec`` (else the file's spec_json) labels the result."""
    with _open(path) as opened:
        f = opened.file
        meta = _meta(f, path)
        try:
            stored_spec = meta.spec()
        except (KeyError, ValueError, TypeError) as exc:
            raise GoldenCorruptError(path, f"root attribute 'spec_json' unusable: {exc}") from exc
        if stored_spec.content_hash != meta.content_hash:
            raise GoldenCorruptError(path, "spec_json does not hash to the recorded content_hash")
        arrays = _read_verified(f, path, opened.hashed)
        try:
            stats = {k: _scalar(v) for k, v in f["baseline"].attrs.items()}
            provenance = {str(k): str(v) for k, v in json.loads(meta.attrs["provenance_json"]).items()}
        except (KeyError, OSError, ValueError, TypeError) as exc:
            raise GoldenCorruptError(path, f"baseline/provenance attributes unusable: {exc}") from exc
    if stats_digest(stats) != meta.attrs.get("baseline_stats_xxh3_128"):
        raise GoldenCorruptError(
            path, "baseline statistics do not match baseline_stats_xxh3_128", "baseline (attributes)"
        )
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
            magnitudes={name: arrays[f"golden/{name}"] for name in magnitude_names(stored_spec)},
        )
    except (KeyError, TypeError) as exc:
        raise GoldenCorruptError(path, f"required dataset missing: {exc}") from exc
    for name, values in golden.magnitudes.items():
        try:
            _check_magnitude(values, name, stored_spec, "stored")
        except TypeError as exc:
            raise GoldenCorruptError(path, str(exc), f"golden/{name}") from exc
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
            raise GoldenStaleError(
                meta.path, f"schema_version {meta.attrs.get('schema_version')!r}, store reads {SCHEMA_VERSION}"
            )
        if meta.content_hash != spec.content_hash:
            raise GoldenStaleError(
                meta.path, f"content_hash {meta.content_hash[:12]}… is not the spec's {spec.content_hash[:12]}…"
            )
        if meta.generator_version != self.generator_version:
            raise GoldenStaleError(
                meta.path, f"generator_version {meta.generator_version!r}, current is {self.generator_version!r}"
            )

    def load(self, spec: CaseSpec) -> GoldenCase:
        """Load and verify; raises a :class:`GoldenStoreError` subclass rather than return bad data."""
        path = self.path_for(spec)
        meta = read_meta(path)
        self.check_stale(meta, spec)
        return read_golden(path, spec)[0]

    @contextlib.contextmanager
    def _locked(self, spec: CaseSpec) -> Iterator[None]:
        """Hold the case lock; failing to create or take it is a :class:`GoldenWriteError`."""
        try:
            lock = self.lock_for(spec)
            lock.acquire()
        except OSError as exc:
            raise _write_error(self.path_for(spec), spec, exc) from exc
        try:
            yield
        finally:
            lock.release()

    def save(self, golden: GoldenCase) -> Path:
        """Write under the case lock, so concurrent savers never interleave."""
        with self._locked(golden.spec):
            self._write(golden)
        return self.path_for(golden.spec)

    def ensure(self, spec: CaseSpec, builder: Builder | None = None, *, force: bool = False) -> GoldenCase:
        """A valid golden for ``spec``: loaded, or built once under the case lock and saved."""
        return self.ensure_result(spec, builder, force=force).golden

    def ensure_result(self, spec: CaseSpec, builder: Builder | None = None, *, force: bool = False) -> EnsureResult:
        path = self.path_for(spec)
        if not force and path.exists():
            with contextlib.suppress(GoldenStoreError):
                return EnsureResult(self.load(spec), path, "up-to-date")
        with self._locked(spec):
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
            with contextlib.suppress(OSError):
                leftover.unlink(missing_ok=True)
        return write_golden(golden, path, self.generator_version)
