"""Kernel mistakes: the known ways an MLA prefill kernel gets the operator wrong, catalogued once.

Each is planted as a defect (:mod:`mlaconf.harness.defects`: the torch backend made to compute it, so a
power run measures whether a suite fails it) and, where a float64 rewrite of the inputs reproduces it,
recognised as a likely cause (:mod:`mlaconf.judge.causes`: the float64 golden recomputed with it, so a
failing output is named by it; :data:`KERNEL_MISTAKES`).
Both sides key on this catalogue: the name, what the planted kernel does wrong (the defect's description,
the power tables' "what is wrong"), the words that complete a failure's "output matches the golden with
...", and the mistake's rule itself where it is a rule on the operator's scalars or indices (the scale a
kernel uses, the mask it aligns, the kv head a query head reads, where batch b's keys start).  How each
side applies a rule to its arrays (torch tensors before a correct kernel, numpy arrays before the float64
reference) stays with that side; ``tests/cover/test_kernel_mistakes.py`` holds both sides to every entry.
"""

from __future__ import annotations

import itertools
import struct
from collections.abc import Sequence
from dataclasses import dataclass

from mlaconf.facts.operator import CAUSAL, MASK_FREE, as_c_float


@dataclass(frozen=True)
class KernelMistake:
    """One mistake: its name (the defect's and the cause's), the planted defect's description and the
    diagnosis's words (completing "output matches the golden with ...")."""

    name: str
    planted: str
    explains: str


SCALE_IGNORED = KernelMistake("scale_ignored", "qkScale ignored (1.0 used)", "qkScale ignored (1.0 used)")
SCALE_TWICE = KernelMistake("scale_twice", "qkScale applied twice", "qkScale applied twice")
SCALE_IN_INPUT_DTYPE = KernelMistake(
    "scale_in_input_dtype",
    "qkScale rounded to the input dtype where ATB keeps it fp32 (bf16, fp16 causal): "
    "a temperature error of ~1e-3 in bf16",
    "qkScale rounded to the input dtype",
)
ROPE_DROPPED = KernelMistake(
    "rope_dropped", "the rope term qRope.kRope dropped from the scores", "the rope term qRope.kRope dropped"
)
CAUSAL_TOP_LEFT = KernelMistake(
    "causal_top_left",
    "CAUSAL aligned top-left (j <= i) instead of bottom-right (j <= i + kv - q)",
    "a top-left causal mask (j <= i) instead of the bottom-right one (j <= i + kv - q)",
)
GQA_MODULO = KernelMistake(
    "gqa_modulo",
    "GQA head mapping h % Hkv instead of h // (H / Hkv)",
    "GQA heads mapped by modulo (h % Hkv instead of h // (H / Hkv))",
)
PADDED_AS_PACKED = KernelMistake(
    "padded_as_packed",
    "padded kv read at packed offsets sum(kvSeqLen[:b]) (ATB's [derived] addressing)",
    "padded kv read as packed (batch b's keys from row sum(kvSeqLen[:b]) of the flat buffer)",
)
STRIDED_AS_PACKED = KernelMistake(
    "strided_as_packed",
    "the 3-D ragged kv form [B*max kv, Hkv, 128] read at packed offsets sum(kvSeqLen[:b]) instead of b * max kv",
    "the strided kv form read as packed (batch b's keys from row sum(kvSeqLen[:b]), not b * max kv)",
)
#: Mistakes planted only: they leave rows of attenOut unwritten or written at another row, which no float64
#: rewrite of the inputs reproduces; the judge's whole-output checks (judge/whole_output.py) and a sampled
#: golden's chosen rows catch them, so their ``explains`` words what those checks see.
OUT_OFFSET_WRAP = KernelMistake(
    "out_offset_wrap",
    "attenOut's element offset of each (row, head) computed modulo 2^12 (a 32-bit offset wrapping, at a size a CPU "
    "reaches): blocks past the first 4096 elements overwrite the first rows, the rest stay unwritten",
    "attenOut written at offsets wrapped modulo a power of two",
)
TILE_ROWS_UNWRITTEN = KernelMistake(
    "tile_rows_unwritten",
    "rows 64-79 of every 128-row query tile never written (one 16-row fractal in the middle of the tile skipped)",
    "rows in the middle of each query tile never written",
)

#: Every mistake both planted and diagnosed, by name.
KERNEL_MISTAKES: dict[str, KernelMistake] = {
    m.name: m
    for m in (
        SCALE_IGNORED,
        SCALE_TWICE,
        SCALE_IN_INPUT_DTYPE,
        ROPE_DROPPED,
        CAUSAL_TOP_LEFT,
        GQA_MODULO,
        PADDED_AS_PACKED,
        STRIDED_AS_PACKED,
    )
}


# -- the rules: what the mistaken kernel uses instead of the operator's value ------------------------


def ignored_scale(qk_scale: float) -> float:
    """scale_ignored: the scores are not scaled."""
    return 1.0


def squared_scale(qk_scale: float) -> float:
    """scale_twice: qkScale multiplies the scores twice."""
    return qk_scale**2


def scale_in_input_dtype(qk_scale: float, dtype: str) -> float:
    """scale_in_input_dtype: qkScale as the fp32 the operator receives, rounded to nearest even in the
    input dtype (``fp16`` or ``bf16``), the way torch and ml_dtypes round a float32."""
    single = as_c_float(qk_scale)
    if dtype == "fp16":
        return float(struct.unpack("e", struct.pack("e", single))[0])
    bits = struct.unpack("<I", struct.pack("<f", single))[0]
    bits = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16) << 16
    return float(struct.unpack("<f", struct.pack("<I", bits))[0])


def top_left_mask(mask_type: int) -> int:
    """causal_top_left: CAUSAL read as the top-left mask MASK_FREE means (j <= i); other masks unchanged."""
    return MASK_FREE if mask_type == CAUSAL else mask_type


def modulo_kv_heads(head_num: int, kv_head_num: int) -> list[int]:
    """gqa_modulo: the kv head each query head reads (h % Hkv, where the operator reads h // (H / Hkv))."""
    return [h % kv_head_num for h in range(head_num)]


def packed_rows(kv_seqlen: Sequence[int]) -> list[tuple[int, int]]:
    """padded_as_packed, strided_as_packed: each batch's rows ``[start, end)`` of the flat kv buffer when
    batch b is read from row ``sum(kvSeqLen[:b])``, as if the padded or strided buffer were packed."""
    starts = [0, *itertools.accumulate(int(n) for n in kv_seqlen)]
    return list(itertools.pairwise(starts))


def wrapped_offset(offset: int, bits: int) -> int:
    """out_offset_wrap: where an element offset lands when it is computed modulo ``2**bits``."""
    return offset % (1 << bits)


def tile_rows_skipped(q_len: int, tile: int, first: int, count: int) -> list[int]:
    """tile_rows_unwritten: the rows of a batch of ``q_len`` query rows that a kernel skipping rows
    ``[first, first + count)`` of every ``tile``-row query tile never writes."""
    return [row for row in range(q_len) if first <= row % tile < first + count]
