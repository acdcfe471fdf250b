"""Golden store: one verified, atomically written HDF5 file per case, under a directory, built at
most once at a time per case (a file lock per case).

One file per case, ``<root>/<case_id>.h5`` (the case id ends in a short content hash, so the name
addresses the spec's content); what it holds is :mod:`mlaconf.golden.store.h5file`, how it is sealed and
checked :mod:`mlaconf.golden.store.integrity`.

Writes go to ``.<name>.<pid>.<random>.tmp`` in the same directory, created exclusively (a symlink, FIFO or
file planted at that name is refused, never followed; ``os.replace`` replaces a symlink planted at the
final name instead of writing through it): the file is first reserved to the data's
size (``posix_fallocate``, so a full disk fails before HDF5 writes a byte), HDF5 writes it through a
Python file object (h5py re-raises the ``OSError`` of a failed write), the header is sealed in place,
and the file is fsynced and renamed with ``os.replace``.  A killed writer never leaves a partial
file under a final name (and the store opens only regular files: a FIFO or directory named ``*.h5``
is one corrupt file, never a hang), memory holds the arrays but never a copy of the file, and a full
disk or any other OS error surfaces as :class:`GoldenWriteError` naming the store and the case
(the temp file is removed)."""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import secrets
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from filelock import FileLock

from mlaconf.golden.specs.spec import CaseSpec
from mlaconf.golden.specs.types import GoldenCase
from mlaconf.golden.store.bundles import inputs_from
from mlaconf.golden.store.h5file import FileMeta, ReadBlock, dataset_arrays, read_golden, read_meta, write_hdf5
from mlaconf.golden.store.integrity import (
    BLOCK_GENERATOR,
    GENERATOR_VERSION,
    SCHEMA_VERSION,
    GoldenMissingError,
    GoldenStaleError,
    GoldenStoreError,
    GoldenWriteError,
    seal,
    user_block_size,
)
from mlaconf.golden.store.locations import chosen_root

#: Bytes reserved for HDF5's metadata and attributes beyond the datasets and the header.
RESERVE_METADATA = 1 << 20

Builder = Callable[[CaseSpec], GoldenCase]
log = logging.getLogger(__name__)


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


def create_temp(tmp: Path) -> IO[bytes]:
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
    arrays = dataset_arrays(golden)
    tmp = temp_path(path)
    reserve = sum(a.nbytes for a in arrays.values()) + user_block_size(list(arrays)) + RESERVE_METADATA
    created = False
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fh = create_temp(tmp)
        created = True
        with fh:
            checksums = write_hdf5(fh, golden, arrays, generator_version, lambda: _reserve(fh, reserve))
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

    def __init__(
        self, root: Path | str | None = None, *, generator_version: str | None = None, builder: Builder | None = None
    ) -> None:
        self.root = chosen_root(root).expanduser().resolve()
        self.generator_version = generator_version or GENERATOR_VERSION
        #: Builds a missing, stale or damaged golden in :meth:`ensure` (``golden.building`` hands it over).
        self.builder = builder
        self._read_block = ReadBlock()  # loads one after another reuse one golden's memory

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
        inputs = meta.inputs_generator()
        if spec.sampled and inputs != BLOCK_GENERATOR:
            raise GoldenStaleError(meta.path, f"inputs generator {inputs!r}, a sampled case's is {BLOCK_GENERATOR!r}")

    def looks_fresh(self, spec: CaseSpec) -> bool:
        """Whether the store holds a sealed, current golden for ``spec`` by its header alone (cheap: no array is
        read); :meth:`ensure` still verifies the whole file."""
        try:
            self.check_stale(read_meta(self.path_for(spec)), spec)
        except GoldenStoreError:
            return False
        return True

    def load(self, spec: CaseSpec) -> GoldenCase:
        """Load and verify; raises a :class:`GoldenStoreError` subclass rather than return bad data."""
        path = self.path_for(spec)
        meta = read_meta(path)
        self.check_stale(meta, spec)
        return read_golden(path, spec, self._read_block)[0]

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
            with inputs_from(self.root):  # a case with explicit inputs reads them from this store
                golden = self._builder(builder, spec)(spec)
            size = self._write(golden)
        return EnsureResult(golden, path, "generated", why, size)

    def _builder(self, builder: Builder | None, spec: CaseSpec) -> Builder:
        chosen = builder or self.builder
        if chosen is None:
            raise TypeError(f"golden store {self.root}: opened without a builder, cannot build {spec.case_id}")
        return chosen

    def _write(self, golden: GoldenCase) -> int:
        """Caller holds the case lock: any temp file for this case is a dead writer's leftover."""
        path = self.path_for(golden.spec)
        for leftover in self.root.glob(f".{path.name}.*.tmp"):
            with contextlib.suppress(OSError):
                leftover.unlink(missing_ok=True)
        return write_golden(golden, path, self.generator_version)
