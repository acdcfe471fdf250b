"""A golden file's integrity: its schema version, the digests, the sealed header that covers every
byte, and the errors that say what is wrong with a file.

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

Apart from the file's contents (:mod:`mlaconf.golden.store.h5file`) and the store's writes
(:mod:`mlaconf.golden.store.directory`) because it is the one part that must run before HDF5 parses a byte."""

from __future__ import annotations

import json
import os
import re
import time
from pathlib import Path
from typing import IO, Any

import h5py
import numpy as np
import xxhash

#: 4: whole-file integrity header, error-model magnitudes, bf16 as uint16 bit patterns (2: none of them);
#: 5: element magnitudes as bf16 rounded up, S and T only on the fp16 score path; 6: T on every case;
#: 7: xxh3-128 digests instead of SHA-256 (header, datasets, statistics).
SCHEMA_VERSION = 7
#: Bump when a change to inputs, reference or baseline alters stored values: every golden written
#: by another version is stale and gets regenerated.
#: 2.1: per-role input streams in chunks, magnitudes; 2.2: magnitudes rounded up to bf16;
#: 2.3: baseline statistics are golden.building.stats.ErrorStats (the baseline-relative rules' denominators only);
#: 2.4: pv_sub (fp16 flush-to-zero magnitude), structured inputs, a flushing baseline;
#: 2.5: fused tile kernel (its exp and summation order), pv_abs/pv_rss from float32 GEMMs lifted to bounds.
#: 2.6: P V and (P s) V as transposed GEMMs (their summation order); the baseline's fp32 score path in the
#: compiled kernel (its exp and row sum).
GENERATOR_VERSION = "2.6"
#: The generator of a sampled case's inputs by blocks of rows (golden/building/blocks.py), which a sampled golden
#: records instead of storing its inputs; a sampled golden recording another is stale.  Bump when a change
#: alters the values it draws.  blocks-1: Philox streams per (role, kv head, block).
BLOCK_GENERATOR = "blocks-1"
#: The digest of every integrity check (header lines, datasets, statistics): 128-bit XXH3.
DIGEST_NAME = "xxh3_128"
HDF5_SIGNATURE = b"\x89HDF\r\n\x1a\n"
#: Largest integrity header (HDF5 user block) a reader accepts.
MAX_HEADER = 1 << 20
#: A verified file enters the process's digest cache only once its ctime is this old, so that a
#: change within the same clock tick as the check (ctime unchanged) cannot hide behind the cache.
CACHE_SETTLE_NS = 1_000_000_000
_CHUNK = 8 << 20
_FIRST_LINE = re.compile(rb"MLA-GOLDEN-HDF5 schema ([0-9]{1,6}) header ([0-9]{3,8})\n")
_SEALED = re.compile(rb"((?:[^\n\x00]*\n)*?)xxh3_128 ([0-9a-f]{32})\n\x00*")
_SIZE_LINE = re.compile(rb"size ([0-9]{1,20})")
_DATASET_LINE = re.compile(rb"dataset ([A-Za-z0-9_/]{1,200}) ([0-9]{1,20}) ([0-9]{1,20}) ([0-9a-f]{32})")
#: (st_dev, st_ino) -> (size, mtime_ns, ctime_ns) of files whose whole-file digest matched.
_VERIFIED: dict[tuple[int, int], tuple[int, int, int]] = {}


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


def dataset_checksum(arr: np.ndarray) -> str:
    """xxh3-128 of the array's raw bytes (C order), hashed in place: no copy of the data."""
    flat = np.ascontiguousarray(arr).reshape(-1).view(np.uint8)
    return xxhash.xxh3_128_hexdigest(flat.data)


def stats_digest(stats: dict[str, Any]) -> str:
    """Checksum of the baseline statistics (sorted JSON of plain Python scalars)."""
    return xxhash.xxh3_128_hexdigest(json.dumps(stats, sort_keys=True).encode())


def user_block_size(names: list[str]) -> int:
    """User block size (a power of two >= 512, as HDF5 requires) that fits the header for ``names``."""
    need = 160 + sum(len(name) + 130 for name in names)  # first, size and seal lines; one line per dataset
    return max(512, 1 << (need - 1).bit_length())


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


def check_whole_file(fh: IO[bytes], path: Path) -> dict[str, str] | None:
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
