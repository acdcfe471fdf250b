"""What a case costs before it is generated: useful FLOPs, bytes on disk, peak memory.

``mlaconf list`` prints these per case and in total, so a suite announces its cost up front.  A sampled
case (``rows`` set) costs its sample: the FLOPs of its rows over the keys each sees, its outputs' bytes for
those rows; its inputs are drawn by blocks (golden/building/blocks.py), never stored, and its build holds the
sampled q rows and, per thread, one kv head's keys, or a few steps of the digest pass over the whole tensors;
:func:`full_case` is the same case with every row, for comparison.

- bytes: exactly the datasets the store writes (inputs in the device dtype, 2 bytes a value; the
  float64 golden; the error-model magnitudes, bf16 per element and float32 per row; the baseline in
  the device dtype; row_valid; the mask) plus a fixed allowance for the integrity header, HDF5
  metadata and attributes;
- peak memory: the resident arrays of ``build_golden`` at its largest point (inputs, the float64
  golden, the magnitudes, the baseline's float32 result and its device-dtype copy), the per-thread
  tile buffers and the interpreter with numpy and torch loaded; the store writes the arrays
  themselves, never an image of the file (golden.store.directory).  Calibrated against ``/usr/bin/time -v``
  on ``mlaconf regen --jobs 1`` (docs/benchmarks.md); meant to be within ~20 %.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import shutil
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from mlaconf.facts.operator import NOPE_DIM, ROPE_DIM, SCORE_DIM, V_DIM
from mlaconf.golden.building.blocks import STEP_ELEMENTS
from mlaconf.golden.building.reference import FUSED_TILE
from mlaconf.golden.building.rows import ROW_CHUNK
from mlaconf.golden.specs.layout import visible_keys
from mlaconf.golden.specs.sample import choose_rows
from mlaconf.golden.specs.spec import CaseSpec
from mlaconf.golden.specs.types import ROW_MAGNITUDES, RowSample, element_magnitudes

#: HDF5 superblock, object headers and the root attributes (JSON spec, provenance, checksums).
FILE_OVERHEAD = 64 * 1024
#: The same for a sampled golden, without the five input tensors' datasets (measured: 23 kB on a small case).
SAMPLED_FILE_OVERHEAD = 24 * 1024
#: The interpreter with numpy, h5py, ml_dtypes and torch imported (VmRSS, measured).
PROCESS_BASE = 300 * 1024 * 1024
MASK_BYTES = 512 * 512 * 2
#: cgroup v1/v2 memory limits (a container's memory is its cgroup's, not the host's).
CGROUP_LIMITS = ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes")


@functools.lru_cache(maxsize=256)
def sample_of(spec: CaseSpec) -> RowSample:
    """A sampled case's rows (computed once per spec; callers only read it)."""
    return choose_rows(spec)


def sampled_flops(spec: CaseSpec, rows: np.ndarray) -> int:
    """Useful FLOPs of the attention of token rows ``rows`` over every head (the keys each row sees)."""
    return 2 * (SCORE_DIM + V_DIM) * spec.head_num * int(visible_keys(spec)[rows].sum())


def golden_flops(spec: CaseSpec) -> int:
    """The useful FLOPs the case's golden computes: every row's, or its sample's."""
    return sampled_flops(spec, sample_of(spec).rows) if spec.sampled else spec.useful_flops


def golden_rows(spec: CaseSpec) -> int:
    """Token rows the case's golden holds: every row, or its sample's."""
    return sample_of(spec).rows.size if spec.sampled else spec.total_q


def full_case(spec: CaseSpec) -> CaseSpec:
    """The same case with a golden of every row (what sampling saves is measured against it)."""
    return dataclasses.replace(spec, rows=None)


def input_elements(spec: CaseSpec) -> int:
    """Values in q, qRope, k, kRope and v as stored (padded and strided kv include their padding)."""
    q = spec.total_q * spec.head_num * (NOPE_DIM + ROPE_DIM)
    return q + spec.kv_rows * spec.kv_head_num * (NOPE_DIM + ROPE_DIM + V_DIM)


def stored_input_elements(spec: CaseSpec) -> int:
    """Input values the golden file holds: every one, or none for a sampled case (it records their digests)."""
    return 0 if spec.sampled else input_elements(spec)


def output_elements(spec: CaseSpec) -> int:
    """Elements of the golden's attenOut: of every row, or of the sample's (every head of each)."""
    return golden_rows(spec) * spec.head_num * V_DIM


def magnitude_bytes(spec: CaseSpec) -> int:
    """The error model's magnitudes: bf16 per output element, float32 per golden row and head."""
    per_row_head = len(ROW_MAGNITUDES) * golden_rows(spec) * spec.head_num
    return 2 * len(element_magnitudes(spec)) * output_elements(spec) + 4 * per_row_head


def stored_bytes(spec: CaseSpec) -> int:
    """Bytes of the case's golden file (16-bit inputs, baseline and element magnitudes, float64 golden; a
    sample's rows, int64, and their reasons, a byte each)."""
    if spec.expect_error is not None:
        return 0
    rows = golden_rows(spec)
    data = 2 * stored_input_elements(spec) + (8 + 2) * output_elements(spec) + rows + magnitude_bytes(spec)
    data += 9 * rows if spec.sampled else 0
    overhead = SAMPLED_FILE_OVERHEAD if spec.sampled else FILE_OVERHEAD
    return data + 8 * spec.batch + (MASK_BYTES if spec.mask_type == 2 else 0) + overhead


def peak_bytes(spec: CaseSpec, threads: int = 1) -> int:
    """Estimated peak RSS of ``build_golden(spec, threads=threads)`` in its own process."""
    if spec.expect_error is not None:
        return 0
    out = output_elements(spec)
    resident = 8 * out + (4 + 2) * out + magnitude_bytes(spec)  # golden, baseline f32 + f16, magnitudes
    max_kv, workers = max(spec.max_kv, 1), max(threads, 1)
    if spec.sampled:  # the sampled q rows; per thread a kv head's keys in the dtype (their float64 draws are gone
        # before the operands exist), its operands (K^T, V, |V|, V^2, running maxima) and a row chunk's buffers; or
        # the digest pass: a window of steps in flight, each float64 draws, their concatenation and the rounding
        queries = 2 * golden_rows(spec) * spec.head_num * SCORE_DIM
        keys = 2 * max_kv * (SCORE_DIM + V_DIM)
        operands = 8 * max_kv * (NOPE_DIM + ROPE_DIM + 4 * V_DIM + 9)
        build = workers * (keys + operands + 8 * 6 * ROW_CHUNK * max_kv)
        digest = (workers + 1) * STEP_ELEMENTS * (8 + 8 + 2)
        return resident + queries + max(build, digest) + PROCESS_BASE
    resident += 2 * input_elements(spec)
    # per thread: the fused tile's workspace (float64 scores, float32 P and P^2; raw scores on the fp16 path) and
    # the window of 4 tasks in flight, each with its float64 k and v
    workspace = FUSED_TILE * max_kv * (8 + 4 + 4 + 8)
    tasks = 4 * 8 * max_kv * (NOPE_DIM + ROPE_DIM + V_DIM) * 2
    return resident + workers * (workspace + tasks) + PROCESS_BASE


def human_bytes(count: float) -> str:
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if count >= scale:
            return f"{count / scale:.{2 if scale == 1e9 else 1}f} {unit}"
    return f"{count:.0f} B"


# -- does it fit here? -----------------------------------------------------------------------------


def host_memory_bytes() -> int:
    """Physical memory this process may use: the host's, or its cgroup limit when lower."""
    total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    for limit_file in CGROUP_LIMITS:
        try:
            text = Path(limit_file).read_text().strip()
        except OSError:
            continue
        if text.isdigit():
            total = min(total, int(text))
    return total


def free_disk_bytes(root: Path) -> int:
    """Free bytes on the filesystem that holds (or will hold) ``root``."""
    probe = root
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    return shutil.disk_usage(probe).free


@dataclass(frozen=True)
class Fit:
    """Which cases cannot be generated here (``refused``: case id -> why) and what only the
    requested parallelism or the whole selection would overrun (``warnings``)."""

    refused: dict[str, str] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)


def check_fit(specs: Sequence[CaseSpec], *, memory: int, disk: int, jobs: int = 1, threads: int = 1) -> Fit:
    """Judge the cases to be built against ``memory`` bytes of RAM and ``disk`` free bytes.

    A case whose estimated peak (with ``threads`` builder threads) exceeds the memory, or whose file
    exceeds the free disk, is refused; ``jobs`` cases that fit one by one but whose largest ``jobs``
    peaks together exceed the memory, or files that fit one by one but not all together, are warned of.
    """
    refused: dict[str, str] = {}
    peaks: list[int] = []
    total_disk = 0
    for spec in specs:
        if spec.expect_error is not None:
            continue
        peak, size = peak_bytes(spec, threads), stored_bytes(spec)
        why = []
        if peak > memory:
            why.append(f"estimated peak memory ~{human_bytes(peak)} exceeds this host's {human_bytes(memory)}")
        if size > disk:
            why.append(f"its file ~{human_bytes(size)} exceeds the store's free disk {human_bytes(disk)}")
        if why:
            refused[spec.case_id] = "; ".join(why)
        else:
            peaks.append(peak)
            total_disk += size
    warnings = []
    together = sum(sorted(peaks, reverse=True)[: max(jobs, 1)])
    if jobs > 1 and len(peaks) > 1 and together > memory:
        warnings.append(
            f"with {jobs} jobs the largest cases running together peak at ~{human_bytes(together)}, more than "
            f"this host's {human_bytes(memory)}: they may fail with MemoryError (use fewer --jobs)"
        )
    if total_disk > disk:
        warnings.append(
            f"the cases' files together (~{human_bytes(total_disk)}) exceed the store's free disk "
            f"{human_bytes(disk)}: the last ones will fail to write"
        )
    return Fit(refused, warnings)
