"""What a golden file holds and how it is read: the datasets (inputs, the float64 reference, the
error-model magnitudes, the emulated baseline), their encoding, the root attributes
(:class:`FileMeta`), and a verified read of all of it.

Its datasets and attributes are documented in docs/golden-files.md (that table's one home).

Every dataset carries ``xxh3_128`` (of its raw stored bytes, C order, little-endian) and
``device_dtype``.  Datasets are contiguous and uncompressed so ``h5dump`` shows them and a byte's
file offset is known.

After the header, every dataset's two recorded checksums (its attribute and ``checksums_json``) must
equal its bytes' xxh3-128: the integrity header's digest when this open has just hashed the whole
file, else hashed again from the data read (a load the digest cache vouched for); problems raise
:class:`GoldenCorruptError` or :class:`GoldenStaleError` naming the file and dataset.

A read first passes the whole-file check of :mod:`mlaconf.golden.store.integrity`; the atomic write is
:func:`mlaconf.golden.store.directory.write_golden`.  A read may go into a :class:`ReadBlock`'s memory, reused
from the previous read once none of that golden's arrays is alive."""

from __future__ import annotations

import contextlib
import functools
import json
import os
import socket
import stat
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import h5py
import ml_dtypes
import numpy as np

from mlaconf.golden.specs.layout import out_shape
from mlaconf.golden.specs.spec import CaseSpec
from mlaconf.golden.specs.spec_build import spec_from_json
from mlaconf.golden.specs.types import (
    INPUT_NAMES,
    ROW_MAGNITUDES,
    TENSOR_NAMES,
    GoldenCase,
    InputsRecord,
    OpInputs,
    RowSample,
    magnitude_names,
)
from mlaconf.golden.store.integrity import (
    BLOCK_GENERATOR,
    DIGEST_NAME,
    SCHEMA_VERSION,
    GoldenCorruptError,
    GoldenMissingError,
    GoldenStaleError,
    check_whole_file,
    dataset_checksum,
    stats_digest,
    user_block_size,
)


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


#: A sampled golden's datasets: its token rows (int64, sorted) and the bits of why each was chosen (uint8,
#: golden/specs/sample.py REASONS); the golden's arrays then hold one row per sampled row.
SAMPLE_ROWS, SAMPLE_REASONS = "golden/sample_rows", "golden/sample_reasons"
#: A sampled golden's root attribute in place of its input tensors: JSON of its :class:`InputsRecord` (generator,
#: seed, each tensor's digest).
INPUTS_RECORD = "inputs_record_json"
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


def record_json(record: InputsRecord) -> str:
    """The :data:`INPUTS_RECORD` attribute of ``record`` (its origin is where it is read from, not stored)."""
    return json.dumps({"generator": record.generator, "seed": record.seed, "digests": record.digests}, sort_keys=True)


def _record(meta: FileMeta, spec: CaseSpec) -> InputsRecord | None:
    """The file's record of its inputs (a sampled golden's), None for a golden that stores them; checked
    against the spec: a sampled golden must have one and its seed, a golden of every row none."""
    path, text = meta.path, meta.attrs.get(INPUTS_RECORD)
    if text is None:
        if spec.sampled:
            raise GoldenStaleError(path, "a sampled golden without an inputs record (built before inputs by blocks)")
        return None
    try:
        data = json.loads(str(text))
        record = InputsRecord(
            str(data["generator"]), int(data["seed"]), {str(k): str(v) for k, v in data["digests"].items()}, str(path)
        )
    except (KeyError, ValueError, TypeError, AttributeError) as exc:
        raise GoldenCorruptError(path, f"root attribute {INPUTS_RECORD!r} unusable: {exc}") from exc
    if not spec.sampled or record.seed != spec.seed or sorted(record.digests) != sorted(TENSOR_NAMES):
        raise GoldenCorruptError(
            path, f"root attribute {INPUTS_RECORD!r} does not fit the spec (sampled, seed, tensors)"
        )
    if record.generator != BLOCK_GENERATOR:
        raise GoldenStaleError(
            path, f"inputs drawn by {record.generator!r}, the block generator is {BLOCK_GENERATOR!r}"
        )
    return record


def _scalar(value: Any) -> float | int | bool | str:
    """An HDF5 attribute back to the Python type the builder gave it."""
    if isinstance(value, (str, bytes)):
        return value.decode() if isinstance(value, bytes) else value
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    if isinstance(value, (int, np.integer)):
        return int(value)
    return float(value)


def dataset_arrays(golden: GoldenCase) -> dict[str, np.ndarray]:
    if golden.out.dtype != np.float64:
        raise TypeError(f"{golden.spec.case_id}: golden out must be float64, got {golden.out.dtype}")
    if golden.row_valid.dtype != np.bool_:
        raise TypeError(f"{golden.spec.case_id}: row_valid must be bool, got {golden.row_valid.dtype}")
    if (golden.sample is None) == golden.spec.sampled:
        raise TypeError(f"{golden.spec.case_id}: a sampled spec needs a row sample, and only it has one")
    if (golden.inputs_record is not None) != golden.spec.sampled:
        raise TypeError(f"{golden.spec.case_id}: a sampled spec records its inputs, and only it does")
    kept = golden.inputs.arrays()
    if golden.inputs_record is not None:  # the tensors are drawn again from the record, never stored
        kept = {name: arr for name, arr in kept.items() if name not in TENSOR_NAMES}
    out = {f"inputs/{name}": arr for name, arr in kept.items()}
    out["golden/out"], out["golden/row_valid"] = golden.out, golden.row_valid
    if golden.sample is not None:
        out[SAMPLE_ROWS], out[SAMPLE_REASONS] = golden.sample.rows, golden.sample.reasons
    needed = magnitude_names(golden.spec)
    missing = [name for name in needed if name not in golden.magnitudes]
    if missing:
        raise TypeError(f"{golden.spec.case_id}: golden lacks the magnitudes {missing}")
    rows = golden.out.shape[0]
    for name in needed:
        _check_magnitude(golden.magnitudes[name], name, golden.spec, golden.spec.case_id, rows)
    out.update({f"golden/{name}": golden.magnitudes[name] for name in needed})
    out["baseline/out"] = golden.baseline_out
    return out


def _check_magnitude(arr: np.ndarray, name: str, spec: CaseSpec, where: str, rows: int) -> None:
    """Element magnitudes are bf16 in attenOut's shape, row magnitudes float32 ``[T, H]`` (``rows`` rows: T, or
    a sample's)."""
    row = name in ROW_MAGNITUDES
    dtype = np.dtype(np.float32 if row else ml_dtypes.bfloat16)
    shape = (rows, spec.head_num) if row else (rows, *out_shape(spec)[1:])
    if arr.dtype != dtype or arr.shape != shape:
        raise TypeError(f"{where}: magnitude {name} is {arr.dtype}{list(arr.shape)}, must be {dtype}{list(shape)}")


def write_hdf5(
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
    with h5py.File(fh, "w", userblock_size=user_block_size(list(arrays))) as f:
        reserve()
        for name, arr in arrays.items():
            stored, tag = _encode(np.ascontiguousarray(arr))
            ds = f.create_dataset(name, data=stored)
            ds.attrs["device_dtype"] = tag
            ds.attrs[DIGEST_NAME] = checksums[name] = dataset_checksum(stored)
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
        if golden.inputs_record is not None:
            f.attrs[INPUTS_RECORD] = record_json(golden.inputs_record)
    return checksums


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

    def inputs_generator(self) -> str | None:
        """The generator a sampled golden's inputs record names (None: the file stores its inputs)."""
        text = self.attrs.get(INPUTS_RECORD)
        try:
            return None if text is None else str(json.loads(str(text))["generator"])
        except (ValueError, KeyError, TypeError):
            return "unreadable"

    def spec(self) -> CaseSpec:
        return spec_from_json(str(self.attrs["spec_json"]))


#: Each dataset starts at a multiple of this many bytes of a read block (a cache line).
BLOCK_ALIGN = 64
#: Goldens smaller than this are read into arrays of their own: malloc serves arrays below glibc's
#: largest mmap threshold (32 MiB) from memory it reuses anyway, so a block would only hold memory.
BLOCK_MIN_BYTES = 32 << 20


class ReadBlock:
    """One block of memory that a store's reads go into, reused once no array of the last golden read
    into it is alive.

    A freshly allocated array costs a page fault per page on first touch: on the reference VM a
    deepseek-sized golden's read takes 1.0 s into fresh memory and 0.13 s into reused memory
    (docs/benchmarks.md, "Judging overhead: chunks and reused memory").  Every array read into the
    block is a view whose ``base`` is the block, so the block's reference count says whether any is
    alive; while one is, the next read gets a new block and the old one is freed with its last view."""

    def __init__(self) -> None:
        self._block: np.ndarray | None = None
        self._lock = threading.Lock()

    def __reduce__(self) -> tuple[type[ReadBlock], tuple[()]]:
        return ReadBlock, ()  # a copy in another process starts empty

    def take(self, nbytes: int) -> np.ndarray:
        """At least ``nbytes`` bytes that no live array uses (a new block when the last one is in use)."""
        with self._lock:
            # references: self._block and getrefcount's argument; each live view adds one
            if self._block is None or self._block.nbytes < nbytes or sys.getrefcount(self._block) > 2:
                self._block = np.empty(nbytes, dtype=np.uint8)
            return self._block


def _block_views(datasets: dict[str, Any], block: ReadBlock | None, file_bytes: int) -> dict[str, np.ndarray]:
    """An empty array per dataset, all views of one block of ``block``, when every dataset is a plain
    numeric array and together they fit in the file (contiguous and uncompressed, as written) and
    reach BLOCK_MIN_BYTES; else nothing, and each is read into an array of its own."""
    if block is None or file_bytes < BLOCK_MIN_BYTES:  # before asking HDF5 about every dataset
        return {}
    spans: dict[str, tuple[int, int]] = {}
    total = 0
    for name, ds in datasets.items():
        if not isinstance(ds, h5py.Dataset) or ds.dtype.kind not in "biuf" or ds.shape is None:
            return {}
        nbytes = int(ds.size) * ds.dtype.itemsize
        spans[name] = (total, nbytes)
        total += -(-nbytes // BLOCK_ALIGN) * BLOCK_ALIGN
    if total > file_bytes or total < BLOCK_MIN_BYTES:
        return {}
    memory = block.take(total)
    return {
        name: memory[start : start + nbytes].view(datasets[name].dtype).reshape(datasets[name].shape)
        for name, (start, nbytes) in spans.items()
    }


@dataclass(frozen=True)
class _Opened:
    """An HDF5 file opened after the whole-file check, and the header's dataset digests when that
    check hashed the file in this open (None when the process's cache vouched for it)."""

    file: h5py.File
    hashed: dict[str, str] | None
    size: int


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
    info = os.fstat(fd)
    mode = info.st_mode
    if not stat.S_ISREG(mode):
        os.close(fd)
        raise GoldenCorruptError(path, f"not a regular file ({_file_kind(mode)}): not a golden")
    fh = os.fdopen(fd, "rb")
    with fh:
        try:
            hashed = check_whole_file(fh, path)
        except OSError as exc:
            raise GoldenCorruptError(path, f"cannot read: {exc}") from exc
        fh.seek(0)
        try:
            f = h5py.File(fh, "r", locking=False)
        except OSError as exc:
            raise GoldenCorruptError(path, f"cannot open as HDF5: {exc}") from exc
        with f:
            yield _Opened(f, hashed, info.st_size)


def _meta(f: h5py.File, path: Path) -> FileMeta:
    try:
        attrs = {k: v.decode() if isinstance(v, bytes) else v for k, v in f.attrs.items()}
    except (OSError, RuntimeError, ValueError) as exc:
        raise GoldenCorruptError(path, f"root attributes unreadable: {exc}") from exc
    return FileMeta(path, attrs)


def read_meta(path: Path) -> FileMeta:
    with _open(path) as opened:
        return _meta(opened.file, path)


def _read_verified(opened: _Opened, path: Path, block: ReadBlock | None) -> dict[str, np.ndarray]:
    """Every dataset as its device array, its two recorded checksums checked against its bytes: hashed
    again here, or, when this open's whole-file check just hashed every byte, compared with the
    integrity header's digest of the dataset's bytes (the same value, without a second pass).
    ``block``: where to read them (see :class:`ReadBlock`)."""
    f, hashed = opened.file, opened.hashed
    try:
        listed: dict[str, str] = json.loads(f.attrs["checksums_json"])
    except (KeyError, OSError, ValueError, TypeError) as exc:
        raise GoldenCorruptError(path, f"root attribute 'checksums_json' unusable: {exc}") from exc
    found: list[str] = []  # every dataset, one group deep (a deeper object is listed by its group's name)
    for top, obj in f.items():
        found.extend(f"{top}/{name}" for name in obj) if isinstance(obj, h5py.Group) else found.append(top)
    if sorted(found) != sorted(listed):
        raise GoldenCorruptError(path, f"datasets {sorted(found)} but checksums_json lists {sorted(listed)}")
    try:
        datasets = {name: f[name] for name in sorted(listed)}
    except (KeyError, OSError, RuntimeError, ValueError) as exc:
        raise GoldenCorruptError(path, f"unreadable: {exc}") from exc
    into = _block_views(datasets, block, opened.size)
    arrays: dict[str, np.ndarray] = {}
    for name, ds in datasets.items():
        try:
            if name in into:
                stored = into[name]
                if stored.size:
                    ds.read_direct(stored)
            else:
                stored = np.asarray(ds[()])
            recorded, tag = str(ds.attrs[DIGEST_NAME]), str(ds.attrs["device_dtype"])
        except (KeyError, OSError, RuntimeError, ValueError) as exc:
            raise GoldenCorruptError(path, f"unreadable: {exc}", name) from exc
        actual = hashed[name] if hashed is not None and name in hashed else dataset_checksum(stored)  # empty: no line
        if actual != recorded or actual != listed[name]:
            message = f"digest mismatch: data {actual[:16]}…, recorded {recorded[:16]}…"
            raise GoldenCorruptError(path, message, name)
        arrays[name] = _decode(stored, tag, path, name)
    return arrays


def _sample(arrays: dict[str, np.ndarray], spec: CaseSpec, path: Path) -> RowSample | None:
    """A sampled golden's rows and reasons, checked against its spec (sorted, distinct, within the tokens, one
    per golden row); None for a golden of every row."""
    if not spec.sampled:
        if SAMPLE_ROWS in arrays or SAMPLE_REASONS in arrays:
            raise GoldenCorruptError(path, "a golden of every row holds a row sample", SAMPLE_ROWS)
        return None
    rows, reasons = arrays.get(SAMPLE_ROWS), arrays.get(SAMPLE_REASONS)
    if rows is None or reasons is None:
        raise GoldenCorruptError(path, "a sampled spec's golden lacks its rows or their reasons", SAMPLE_ROWS)
    out = arrays.get("golden/out")
    fits = rows.dtype == np.int64 and reasons.dtype == np.uint8 and rows.ndim == 1 and reasons.shape == rows.shape
    if not fits or (out is not None and out.shape[0] != rows.size):
        raise GoldenCorruptError(path, "sample rows, their reasons and the golden's rows disagree", SAMPLE_ROWS)
    if rows.size and (rows[0] < 0 or rows[-1] >= spec.total_q or (np.diff(rows) <= 0).any()):
        raise GoldenCorruptError(path, "sample rows are not sorted distinct token rows of the case", SAMPLE_ROWS)
    return RowSample(rows, reasons)


def read_golden(
    path: Path, spec: CaseSpec | None = None, block: ReadBlock | None = None
) -> tuple[GoldenCase, FileMeta]:
    """Read and verify every checksum; ``spec`` (else the file's spec_json) labels the result;
    ``block``: reuse its memory (see :class:`ReadBlock`)."""
    with _open(path) as opened:
        f = opened.file
        meta = _meta(f, path)
        try:
            stored_spec = meta.spec()
        except (KeyError, ValueError, TypeError) as exc:
            raise GoldenCorruptError(path, f"root attribute 'spec_json' unusable: {exc}") from exc
        if stored_spec.content_hash != meta.content_hash:
            raise GoldenCorruptError(path, "spec_json does not hash to the recorded content_hash")
        arrays = _read_verified(opened, path, block)
        try:
            stats = {k: _scalar(v) for k, v in f["baseline"].attrs.items()}
            provenance = {str(k): str(v) for k, v in json.loads(meta.attrs["provenance_json"]).items()}
        except (KeyError, OSError, ValueError, TypeError) as exc:
            raise GoldenCorruptError(path, f"baseline/provenance attributes unusable: {exc}") from exc
    if stats_digest(stats) != meta.attrs.get("baseline_stats_xxh3_128"):
        raise GoldenCorruptError(
            path, "baseline statistics do not match baseline_stats_xxh3_128", "baseline (attributes)"
        )
    sample = _sample(arrays, stored_spec, path)
    record = _record(meta, stored_spec)
    rows = stored_spec.total_q if sample is None else sample.rows.size
    try:
        if record is not None:  # the tensors' placeholders, empty: drawn again by golden/building/blocks.py
            stored = np.empty((0,), dtype=STORED_AS[stored_spec.dtype])
            arrays.update({f"inputs/{n}": _decode(stored, stored_spec.dtype, path, n) for n in TENSOR_NAMES})
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
            sample=sample,
            inputs_record=record,
        )
    except (KeyError, TypeError) as exc:
        raise GoldenCorruptError(path, f"required dataset missing: {exc}") from exc
    for name, values in golden.magnitudes.items():
        try:
            _check_magnitude(values, name, stored_spec, "stored", rows)
        except TypeError as exc:
            raise GoldenCorruptError(path, str(exc), f"golden/{name}") from exc
    return golden, meta
