"""Whole-file integrity of golden files (checked before HDF5 parses a byte) and write failures
(a full disk, an unusable store): a clear GoldenStoreError, no partial file, never a crash."""

from __future__ import annotations

import errno
import io
import os
import re
import time
from pathlib import Path
from typing import Any

import h5py
import numpy as np
import pytest
import xxhash

import mlaconf.golden.store.directory as gs
import mlaconf.golden.store.h5file as h5file
import mlaconf.golden.store.integrity as integrity
from mlaconf.golden.building.generate import build_golden
from mlaconf.golden.specs.spec import CaseSpec
from mlaconf.golden.specs.spec_build import build_case
from mlaconf.golden.specs.types import GoldenCase
from mlaconf.golden.store.directory import GoldenStore
from mlaconf.golden.store.integrity import GoldenCorruptError, GoldenStaleError, GoldenWriteError

SMALL = build_case({"q_seqlen": [3, 0, 5], "head_num": 2, "dtype": "fp16"}, source="test")
BIG = build_case({"q_seqlen": [1024], "head_num": 2, "dtype": "fp16", "name": "big"}, source="test")  # 4.5 MB


class Builds:
    def __init__(self) -> None:
        self.calls = 0

    def __call__(self, spec: CaseSpec) -> GoldenCase:
        self.calls += 1
        return build_golden(spec)


@pytest.fixture
def store(tmp_path: Path) -> GoldenStore:
    return GoldenStore(tmp_path / "store")


def header_of(path: Path) -> tuple[int, bytes]:
    data = path.read_bytes()
    size = int(re.match(rb"MLA-GOLDEN-HDF5 schema \d+ header (\d+)\n", data)[1])  # type: ignore[index]
    return size, data[:size]


def flip(path: Path, offset: int, mask: int = 0x20) -> None:
    with open(path, "r+b") as fh:
        fh.seek(offset)
        byte = fh.read(1)[0]
        fh.seek(offset)
        fh.write(bytes([byte ^ mask]))


def test_header_sits_in_the_hdf5_user_block_and_lists_every_dataset(store: GoldenStore) -> None:
    path = store.save(build_golden(SMALL))
    size, header = header_of(path)
    assert size >= 512 and size & (size - 1) == 0
    lines = header.rstrip(b"\0").decode().splitlines()
    assert lines[1] == f"size {path.stat().st_size}" and re.fullmatch(r"xxh3_128 [0-9a-f]{32}", lines[-1])
    listed = {line.split()[1]: line.split() for line in lines if line.startswith("dataset ")}
    data = path.read_bytes()
    with h5py.File(path, "r", locking=False) as f:  # plain HDF5 readers skip the user block
        assert f.userblock_size == size
        for name, (_, _, offset, count, sha) in listed.items():
            assert int(offset) == f[name].id.get_offset() and sha == f[name].attrs["xxh3_128"], name
            assert xxhash.xxh3_128_hexdigest(data[int(offset) : int(offset) + int(count)]) == sha
        stored: list[str] = []
        f.visititems(lambda n, o: stored.append(n) if isinstance(o, h5py.Dataset) else None)
    assert sorted(listed) == sorted(stored)
    body = header[: header.index(b"xxh3_128 ")]
    assert xxhash.xxh3_128_hexdigest(body + data[size:]) == lines[-1].split()[1]


def test_every_header_byte_is_protected(store: GoldenStore) -> None:
    path = store.save(build_golden(SMALL))
    pristine = path.read_bytes()
    size, header = header_of(path)
    text_end = len(header.rstrip(b"\0"))
    offsets = [*range(text_end + 1), *range(text_end + 1, size, 61)]
    for offset in offsets:
        path.write_bytes(pristine)
        flip(path, offset, 0x01)
        with pytest.raises(GoldenCorruptError, match=re.escape(str(path))):
            store.load(SMALL)
    path.write_bytes(pristine)
    store.load(SMALL)


@pytest.mark.parametrize(
    "attribute", ["hostname", "created_utc", "provenance_json", "blas", "checksums_json", "spec_json"]
)
def test_provenance_attributes_are_protected_like_the_data(store: GoldenStore, attribute: str) -> None:
    path = store.save(build_golden(SMALL))
    with h5py.File(path, "r", locking=False) as f:
        value = str(f.attrs[attribute]).encode()
    offset = path.read_bytes().index(value, header_of(path)[0]) + len(value) - 2  # same length, new value
    flip(path, offset, 0x01)
    with h5py.File(path, "r", locking=False) as f:
        assert str(f.attrs[attribute]).encode() != value  # HDF5 alone would read the altered value
    with pytest.raises(GoldenCorruptError, match="whole-file digest mismatch") as info:
        store.load(SMALL)
    assert info.value.path == path


def test_a_file_without_the_header_is_stale_never_parsed_and_rebuilt(store: GoldenStore) -> None:
    path = store.path_for(SMALL)
    path.parent.mkdir(parents=True)
    with h5py.File(path, "w") as f:  # a schema-2 file: plain HDF5
        f.attrs["schema_version"] = 2
    with pytest.raises(GoldenStaleError, match="no integrity header"):
        store.load(SMALL)
    builds = Builds()
    result = store.ensure_result(SMALL, builds)
    assert builds.calls == 1 and "GoldenStaleError" in result.why
    store.load(SMALL)


def test_truncated_and_extended_files_are_named_as_such(store: GoldenStore) -> None:
    path = store.save(build_golden(SMALL))
    pristine = path.read_bytes()
    path.write_bytes(pristine + b"\0")
    with pytest.raises(GoldenCorruptError, match=f"file is {len(pristine) + 1} bytes, its header records"):
        store.load(SMALL)
    path.write_bytes(pristine[:-1])
    with pytest.raises(GoldenCorruptError, match="truncated"):
        store.load(SMALL)
    path.write_bytes(b"")
    with pytest.raises(GoldenCorruptError, match="integrity header damaged or absent"):
        store.load(SMALL)


class CountingPattern:
    """Stands in for the header's first-line pattern: counts whole-file checks that were not cached."""

    def __init__(self, pattern: re.Pattern[bytes]) -> None:
        self.pattern, self.calls = pattern, 0

    def match(self, data: bytes) -> re.Match[bytes] | None:
        self.calls += 1
        return self.pattern.match(data)


def test_digest_cache_skips_rehashing_settled_files_only(store: GoldenStore, monkeypatch: pytest.MonkeyPatch) -> None:
    path = store.save(build_golden(SMALL))
    counter = CountingPattern(integrity._FIRST_LINE)
    monkeypatch.setattr(integrity, "_FIRST_LINE", counter)
    store.load(SMALL)
    store.load(SMALL)
    assert counter.calls == 4, "a file changed within the last second is re-hashed on every open"
    monkeypatch.setattr(integrity, "CACHE_SETTLE_NS", -1)  # as if the file were old
    counter.calls = 0
    store.load(SMALL)
    store.load(SMALL)
    assert counter.calls == 1, "a settled, verified file is hashed once per process"
    stat = path.stat()
    time.sleep(0.05)
    flip(path, path.stat().st_size - 100)  # in place: same inode and size, mtime restored below
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    assert path.stat().st_mtime_ns == stat.st_mtime_ns and path.stat().st_ctime_ns != stat.st_ctime_ns
    with pytest.raises(GoldenCorruptError):
        store.load(SMALL)


def test_data_the_cache_vouched_for_is_still_hashed_per_dataset(
    store: GoldenStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A load that skips the whole-file hash (the cache) hashes every dataset it reads; one that just
    hashed the whole file compares the header's digests instead of hashing again."""
    path = store.save(build_golden(SMALL))
    hashed: list[int] = []
    plain = h5file.dataset_checksum
    monkeypatch.setattr(h5file, "dataset_checksum", lambda arr: hashed.append(arr.size) or plain(arr))
    store.load(SMALL)
    assert hashed == [], "the whole-file check just covered these bytes"
    with h5py.File(path, "r", locking=False) as f:
        offset = int(f["golden/out"].id.get_offset())
    flip(path, offset + 8)  # raw data changed ...
    st = path.stat()
    vouched = (st.st_size, st.st_mtime_ns, st.st_ctime_ns)
    monkeypatch.setitem(integrity._VERIFIED, (st.st_dev, st.st_ino), vouched)
    with pytest.raises(GoldenCorruptError, match=r"golden/out.*digest mismatch"):
        store.load(SMALL)
    assert hashed, "the per-dataset checksums were computed"


# -- write failures -----------------------------------------------------------------------------------


def test_an_os_error_while_writing_names_store_and_case_and_leaves_the_old_file(
    store: GoldenStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    golden = build_golden(SMALL)
    path = store.save(golden)
    before = path.read_bytes()

    def full(fd: int) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(gs.os, "fsync", full)
    with pytest.raises(GoldenWriteError) as info:
        store.ensure(SMALL, Builds(), force=True)
    message = str(info.value)
    assert f"case {SMALL.case_id!r}" in message and f"store {store.root}" in message and "No space left" in message
    assert path.read_bytes() == before
    assert sorted(p.name for p in store.root.iterdir() if p.is_file()) == [path.name]


class FillingFile(io.FileIO):
    """A temp file on a disk that fills after 200 kB: every later write fails with ENOSPC."""

    def write(self, data: Any) -> int:
        if self.tell() + len(memoryview(data)) > 200_000:
            raise OSError(errno.ENOSPC, "No space left on device")
        return super().write(data)


def test_a_write_that_fails_inside_hdf5_names_the_os_error(store: GoldenStore, monkeypatch: pytest.MonkeyPatch) -> None:
    """No reservation (a file system that cannot reserve) and the disk fills while HDF5 writes: the
    message is the OS error, and nothing is left behind."""
    path = store.save(build_golden(SMALL))
    before = path.read_bytes()
    big = build_golden(BIG)
    monkeypatch.setattr(gs, "_reserve", lambda fh, size: None)
    monkeypatch.setattr(gs, "create_temp", lambda name: FillingFile(name, "x+"))
    with pytest.raises(GoldenWriteError, match=f"case {BIG.case_id!r} into store .*No space left on device"):
        store.save(big)
    monkeypatch.undo()
    assert path.read_bytes() == before
    assert sorted(p.name for p in store.root.iterdir() if p.is_file()) == [path.name]


def test_a_store_that_cannot_be_created_is_a_write_error(tmp_path: Path) -> None:
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("")
    with pytest.raises(GoldenWriteError, match=re.escape(f"case {SMALL.case_id!r} into store {blocker}")):
        GoldenStore(blocker).ensure(SMALL, Builds())


@pytest.mark.parametrize("reserved", [True, False], ids=["reserved", "hdf5-hits-the-full-disk"])
def test_a_full_disk_is_a_clear_error_with_no_partial_file(
    tiny_tmpfs: Path, reserved: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """In process (a crash would end the run); the CLI's exit status: tests/nocover/test_store_faults.py.
    Without the reservation (a file system that cannot reserve), HDF5's own write meets the full disk."""
    if not reserved:
        monkeypatch.setattr(gs, "_reserve", lambda fh, size: None)
    store = GoldenStore(tiny_tmpfs)
    small = store.save(build_golden(SMALL))
    with pytest.raises(GoldenWriteError) as info:
        store.save(build_golden(BIG))
    assert f"case {BIG.case_id!r} into store {tiny_tmpfs}" in str(info.value)
    assert "No space left on device" in str(info.value)
    files = [p for p in tiny_tmpfs.rglob("*") if p.is_file() and ".locks" not in p.parts]
    assert files == [small] and not store.path_for(BIG).exists()
    np.testing.assert_array_equal(store.load(SMALL).out, build_golden(SMALL).out)
