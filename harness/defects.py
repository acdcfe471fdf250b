"""The defect catalogue: the torch CPU backend with one bug each, to measure whether a suite can fail.

:data:`ENTRIES` holds every planted defect with its one-line description, its trigger in the factor
model's terms (the cases that can reach it), the probe it needs if judging one output cannot show it, and
for a reproduced upstream bug its public source and the releases that carried it (docs/real-bugs.md).
Each name is a zero-argument factory usable as ``--mla-backend mlaconf.harness.defects:<name>``;
``mlaconf power`` runs :data:`CATALOGUE` over a suite, the defects the settled factor model reaches
(:data:`PENDING` ones need a pending level: named only).  Adding a defect: a :class:`Defect` subclass
whose ``description`` says what is wrong, and one :class:`DefectEntry` line in ``_ENTRIES``.  A mistake
the likely-cause diagnosis also knows (:mod:`mlaconf.judge.causes`) is catalogued once, in
:mod:`mlaconf.facts.mistakes`: its name, its words and its rule come from there.

What every defect is built from (:class:`Defect`, the float32 path, :class:`DefectEntry`) is
:mod:`mlaconf.harness.defect_kit`; the defects of ATB's own branches are
:mod:`mlaconf.harness.branch_defects`, whose entries join :data:`ENTRIES`.

``control_math`` is the defects' own float32 attention path without a bug: it must pass, so failures of
``p_fp8`` and ``padding_nan_unsafe`` come from their bug, not from the path.  Zero-length batches' rows
are "don't care", so writing garbage there would not be a defect and none of these does only that.
``strict_forgets_seqlen_values`` plants a defect in the error-contract model instead
(``torch-cpu-strict`` minus one check; not catalogued: no conformance case can show it).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from mlaconf.facts.mistakes import (
    CAUSAL_TOP_LEFT,
    GQA_MODULO,
    OUT_OFFSET_WRAP,
    PADDED_AS_PACKED,
    ROPE_DROPPED,
    SCALE_IGNORED,
    SCALE_IN_INPUT_DTYPE,
    SCALE_TWICE,
    STRIDED_AS_PACKED,
    TILE_ROWS_UNWRITTEN,
    ignored_scale,
    modulo_kv_heads,
    scale_in_input_dtype,
    squared_scale,
    tile_rows_skipped,
    top_left_mask,
    wrapped_offset,
)
from mlaconf.facts.operator import MASK_NAMES, SUPPORTED_MASKS, kv_layout_of, scores_in_fp16
from mlaconf.harness.atb import output_buffer
from mlaconf.harness.backend import MlaPrefillCall
from mlaconf.harness.branch_defects import BRANCH_ENTRIES
from mlaconf.harness.contract import ContractBackend
from mlaconf.harness.defect_kit import PROBES as PROBES
from mlaconf.harness.defect_kit import ControlMath as ControlMath
from mlaconf.harness.defect_kit import Defect as Defect
from mlaconf.harness.defect_kit import DefectEntry as DefectEntry
from mlaconf.harness.defect_kit import RealBug
from mlaconf.harness.defect_kit import replace_call as _replace
from mlaconf.harness.defect_math import (
    FLASH_BLOCK,
    HEALTHY_BLOCKS,
    allowed_keys,
    causal_attend,
    flash_attend,
    math_attend,
    round_significand,
)
from mlaconf.harness.torch_backend import NOPE, ROPE, VDIM, TorchSdpaBackend, head_chunk
from mlaconf.harness.zoo import blockwise, fp32_heads, visible_keys

TILE_ROWS = 128  # one_row_tile_p_reuse, tile_rows_unwritten: query rows per tile (ATB mla_prefill's split_m)
LONG_ROW_KEYS = 128  # nan_long_rows: rows that may see more keys than this get NaN
ACC_FLUSH_KEYS = 64  # bf16_acc_64: the accumulator is rounded to bf16 after every block of this many keys
LONG_SEQUENCE = 1000  # last_key_long: sequences with more keys than this never read their last key
PREFIX_BLOCK = 128  # prefix_tail_dropped: the prefix is read in whole blocks of this many keys


class ScaleIgnored(Defect):
    description = SCALE_IGNORED.planted

    def before(self, call: MlaPrefillCall) -> MlaPrefillCall:
        return _replace(call, qk_scale=ignored_scale(call.qk_scale))


class ScaleTwice(Defect):
    description = SCALE_TWICE.planted

    def before(self, call: MlaPrefillCall) -> MlaPrefillCall:
        return _replace(call, qk_scale=squared_scale(call.qk_scale))


class RopeDropped(Defect):
    description = ROPE_DROPPED.planted

    def before(self, call: MlaPrefillCall) -> MlaPrefillCall:
        return _replace(call, q_rope=torch.zeros_like(call.q_rope))


class MaskFreeIgnored(Defect):
    description = "MASK_FREE computed without its causal mask"

    def before(self, call: MlaPrefillCall) -> MlaPrefillCall:
        return _replace(call, mask_type=0, mask=None) if call.mask_type == 2 else call


class CausalTopLeft(Defect):
    description = CAUSAL_TOP_LEFT.planted

    def _attend(  # type: ignore[override]  # an instance method (the base's is static)
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, group: int, scale: float, mask_type: int
    ) -> torch.Tensor:
        return super()._attend(q, k, v, group, scale, top_left_mask(mask_type))


class GqaModulo(Defect):
    description = GQA_MODULO.planted

    def _attend(  # type: ignore[override]  # an instance method (the base's is static)
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, group: int, scale: float, mask_type: int
    ) -> torch.Tensor:
        order = torch.tensor(modulo_kv_heads(k.shape[1] * group, k.shape[1]))  # query head h reads kv head h % Hkv
        return super()._attend(q, k[:, order], v[:, order], 1, scale, mask_type)


class OneKeyShort(Defect):
    description = "the last key of every sequence is dropped"

    def _attend(  # type: ignore[override]  # an instance method (the base's is static)
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, group: int, scale: float, mask_type: int
    ) -> torch.Tensor:
        if k.shape[0] > 1:
            k, v = k[:-1], v[:-1]
        return super()._attend(q, k, v, group, scale, mask_type)


class PaddedAsPacked(Defect):
    description = PADDED_AS_PACKED.planted
    layout = "padded"  # the layout read at packed offsets (facts/mistakes.py packed_rows); others as they are

    def before(self, call: MlaPrefillCall) -> MlaPrefillCall:
        if _kv_layout(call) != self.layout:
            return call
        total, hkv = int(call.kv_seqlen.sum()), call.kv_head_num
        flat = [t.reshape(-1, hkv, d)[:total] for t, d in ((call.k, NOPE), (call.k_rope, ROPE), (call.v, VDIM))]
        return _replace(call, k=flat[0], k_rope=flat[1], v=flat[2])


class StridedAsPacked(PaddedAsPacked):
    description = STRIDED_AS_PACKED.planted
    layout = "strided"


def _padded_s(call: MlaPrefillCall) -> int | None:
    """S of a padded kv layout, None for the 3-D ones."""
    return int(call.k.shape[1]) if _kv_layout(call) == "padded" else None


class PaddingRowsRead(Defect):
    description = "padded kv: all S rows read, kvSeqLen ignored"

    def before(self, call: MlaPrefillCall) -> MlaPrefillCall:
        s = _padded_s(call)
        return call if s is None else _replace(call, kv_seqlen=torch.full_like(call.kv_seqlen, s))


class PaddingNanUnsafe(Defect):
    description = "padded kv: padding masked with -inf after Q.K and multiplied by P = 0 (NaN leaks)"

    def before(self, call: MlaPrefillCall) -> MlaPrefillCall:
        s = _padded_s(call)  # the keys every batch's call sees once kvSeqLen is widened (packed: its own)
        heads, group = call.head_num, call.head_num // call.kv_head_num
        # one entry per _attend call: batches in order, those with query rows only, once per head chunk
        self._true_kv = [
            int(kv)
            for q, kv in zip(call.q_seqlen.tolist(), call.kv_seqlen.tolist(), strict=True)
            if q > 0 and (s or kv) > 0
            for _ in range(-(-heads // head_chunk(q, s or kv, heads, group)))
        ]
        return call if s is None else _replace(call, kv_seqlen=torch.full_like(call.kv_seqlen, s))

    def _attend(  # type: ignore[override]  # an instance method (the base's is static)
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, group: int, scale: float, mask_type: int
    ) -> torch.Tensor:
        kv_len = self._true_kv.pop(0)
        return math_attend(q, k, v, group, scale, mask_type, kv_len=kv_len)


class PFp8(Defect):
    description = "P rounded to 4 significant bits (fp8 e4m3) before P.V"

    def _attend(  # type: ignore[override]  # an instance method (the base's is static)
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, group: int, scale: float, mask_type: int
    ) -> torch.Tensor:
        return math_attend(q, k, v, group, scale, mask_type, p_round=lambda p: round_significand(p, 4))


class BatchSwap(Defect):
    description = "outputs of batches 0 and 1 swapped (their first min(q0, q1) rows)"

    def after(self, call: MlaPrefillCall, out: torch.Tensor) -> torch.Tensor:
        lengths = [int(n) for n in call.q_seqlen]
        if len(lengths) < 2 or min(lengths[:2]) == 0:
            return out
        n, start = min(lengths[:2]), lengths[0]
        first = out[:n].clone()
        out[:n] = out[start : start + n]
        out[start : start + n] = first
        return out


class Nondeterministic(Defect):
    description = "one element nudged by one ulp, a different one on every call (reruns differ)"

    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.calls = 0

    def after(self, call: MlaPrefillCall, out: torch.Tensor) -> torch.Tensor:
        bits = out.reshape(-1).view(torch.int16)
        bits[self.calls % min(64, bits.numel())] += 1
        self.calls += 1
        return out


class NanLongRows(Defect):
    description = f"rows that may see more than {LONG_ROW_KEYS} keys come out NaN"

    def after(self, call: MlaPrefillCall, out: torch.Tensor) -> torch.Tensor:
        start = 0
        for q_len, kv_len in zip(call.q_seqlen.tolist(), call.kv_seqlen.tolist(), strict=True):
            visible = allowed_keys(q_len, kv_len, kv_len, call.mask_type).sum(dim=1)
            out[start : start + q_len][visible > LONG_ROW_KEYS] = float("nan")
            start += q_len
        return out


class Bf16Acc64(Defect):
    description = (
        f"blockwise softmax whose P.V accumulator is rounded to bf16 every {ACC_FLUSH_KEYS} keys "
        "(instead of staying fp32)"
    )

    def _attend(  # type: ignore[override]  # an instance method (the base's is static)
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        group: int,
        scale: float,
        mask_type: int,
    ) -> torch.Tensor:
        qh, kh, vh = fp32_heads(q, k, v, group)
        allowed = visible_keys(q.shape[0], k.shape[0], mask_type)
        acc, _, total = blockwise(
            qh,
            kh,
            vh,
            scale,
            allowed,
            q.dtype,
            ACC_FLUSH_KEYS,
            range(0, kh.shape[1], ACC_FLUSH_KEYS),
            acc_dtype=torch.bfloat16,
        )
        return (acc / total).transpose(0, 1).to(q.dtype)


class LastKeyLong(Defect):
    description = f"sequences of more than {LONG_SEQUENCE} keys never read their last key (an off-by-one tail loop)"

    def _attend(  # type: ignore[override]  # an instance method (the base's is static)
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        group: int,
        scale: float,
        mask_type: int,
    ) -> torch.Tensor:
        kv_len = k.shape[0]
        if kv_len <= LONG_SEQUENCE:
            return math_attend(q, k, v, group, scale, mask_type)
        qh, kh, vh = fp32_heads(q, k, v, group)
        allowed = allowed_keys(q.shape[0], kv_len, kv_len, mask_type).clone()
        allowed[:, kv_len - 1] = False
        allowed[allowed.sum(dim=1) == 0, 0] = True  # a row left without keys still reads key 0 (not NaN)
        scores = ((qh @ kh.transpose(1, 2)) * scale).masked_fill(~allowed, float("-inf"))
        return (torch.softmax(scores, dim=-1) @ vh).transpose(0, 1).to(q.dtype)


class FrozenMax(Defect):
    description = (
        f"online softmax whose running max stops being updated after {HEALTHY_BLOCKS} blocks of {FLASH_BLOCK} keys"
    )

    def _attend(  # type: ignore[override]  # an instance method (the base's is static)
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, group: int, scale: float, mask_type: int
    ) -> torch.Tensor:
        return flash_attend(q, k, v, group, scale, mask_type, frozen_max=True)


class LateRescaleMissing(Defect):
    description = (
        f"online softmax that stops rescaling its accumulator when the max moves after {HEALTHY_BLOCKS} blocks "
        f"of {FLASH_BLOCK} keys (the running sum is still rescaled)"
    )

    def _attend(  # type: ignore[override]  # an instance method (the base's is static)
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, group: int, scale: float, mask_type: int
    ) -> torch.Tensor:
        return flash_attend(q, k, v, group, scale, mask_type, skip_rescale=True)


class CausalOffsetBatch0(ControlMath):
    description = "CAUSAL: every batch aligned with batch 0's kv - q offset instead of its own"

    def before(self, call: MlaPrefillCall) -> MlaPrefillCall:
        self._offset = int(call.kv_seqlen[0]) - int(call.q_seqlen[0])
        return call

    def _attend(  # type: ignore[override]  # an instance method (the base's is static)
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, group: int, scale: float, mask_type: int
    ) -> torch.Tensor:
        if mask_type != 3:
            return super()._attend(q, k, v, group, scale, mask_type)
        rows, cols = torch.arange(q.shape[0])[:, None], torch.arange(k.shape[0])[None, :]
        return causal_attend(q, k, v, group, scale, cols <= rows + self._offset)


class PrefixTailDropped(ControlMath):
    description = f"CAUSAL: the prefix is read in whole blocks of {PREFIX_BLOCK} keys, its partial last block skipped"

    def _attend(  # type: ignore[override]  # an instance method (the base's is static)
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, group: int, scale: float, mask_type: int
    ) -> torch.Tensor:
        prefix = k.shape[0] - q.shape[0]
        if mask_type != 3 or prefix % PREFIX_BLOCK == 0:
            return super()._attend(q, k, v, group, scale, mask_type)
        rows, cols = torch.arange(q.shape[0])[:, None], torch.arange(k.shape[0])[None, :]
        skipped = (cols >= prefix - prefix % PREFIX_BLOCK) & (cols < prefix)
        return causal_attend(q, k, v, group, scale, (cols <= rows + prefix) & ~skipped)


def control_math() -> Defect:
    """The defects' own float32 attention path without a bug: it must pass wherever they are judged."""
    return ControlMath("control_math")


def strict_forgets_seqlen_values() -> ContractBackend:
    """``torch-cpu-strict`` whose validator forgets the qSeqLen == kvSeqLen check (error-contract defect)."""
    return ContractBackend(
        TorchSdpaBackend("cpu"), "torch-cpu-strict-forgets-seqlen_values", frozenset({"seqlen_values"})
    )


def _kv_layout(call: MlaPrefillCall) -> str | None:
    return kv_layout_of(call.k.shape, call.kv_seqlen.tolist(), call.kv_head_num)


# -- systematic errors that stay inside the element bound (judge/systematic.py catches them) --------


class ScaleInInputDtype(Defect):
    description = SCALE_IN_INPUT_DTYPE.planted

    def before(self, call: MlaPrefillCall) -> MlaPrefillCall:
        dtype = "fp16" if call.q.dtype == torch.float16 else "bf16"
        if scores_in_fp16(dtype, call.mask_type):
            return call  # ATB's fp16 score path casts qkScale to fp16 itself: legitimate there
        return _replace(call, qk_scale=scale_in_input_dtype(call.qk_scale, dtype))


class HalfHeadsBf16(Defect):
    description = "fp16 output only bf16-precise (rounded through bf16) on the first half of the heads"

    def after(self, call: MlaPrefillCall, out: torch.Tensor) -> torch.Tensor:
        if out.dtype != torch.float16:
            return out
        heads = out.reshape(out.shape[0], call.head_num, -1)
        half = (call.head_num + 1) // 2
        heads[:, :half] = heads[:, :half].to(torch.bfloat16).to(torch.float16)
        return out


# -- thin kills raised to margin 2 (issue 27 item 5) ------------------------------------------------


class TailRowUnwritten(Defect):
    description = "the output's last query row never written (a tail loop one row short; the buffer stays 0)"

    def after(self, call: MlaPrefillCall, out: torch.Tensor) -> torch.Tensor:
        if out.shape[0]:
            out.reshape(out.shape[0], -1)[-1] = 0
        return out


# -- rows of attenOut never written or written elsewhere (the harness's attenOut is NaN until written) --

WRAP_BITS = 12  # out_offset_wrap: attenOut's element offsets wrap modulo 2^12
SKIPPED_FIRST, SKIPPED_ROWS = 64, 16  # tile_rows_unwritten: rows 64-79 of every query tile


class OutOffsetWrap(Defect):
    description = OUT_OFFSET_WRAP.planted

    def after(self, call: MlaPrefillCall, out: torch.Tensor) -> torch.Tensor:
        blocks = out.reshape(-1, VDIM)  # one (row, head) block of 128 elements each, in memory order
        written = output_buffer(call).reshape(-1, VDIM)
        landed: set[int] = set()
        for block in range(blocks.shape[0] - 1, -1, -1):  # where offsets wrap, the last block written stays
            target = wrapped_offset(block * VDIM, WRAP_BITS) // VDIM
            if target not in landed:
                landed.add(target)
                written[target] = blocks[block]
            if len(landed) == (1 << WRAP_BITS) // VDIM:
                break
        return written.reshape(out.shape)


class TileRowsUnwritten(Defect):
    description = TILE_ROWS_UNWRITTEN.planted

    def after(self, call: MlaPrefillCall, out: torch.Tensor) -> torch.Tensor:
        written, start = output_buffer(call), 0
        for q_len in call.q_seqlen.tolist():
            skipped = set(tile_rows_skipped(q_len, TILE_ROWS, SKIPPED_FIRST, SKIPPED_ROWS))
            rows = [start + row for row in range(q_len) if row not in skipped]
            written[rows] = out[rows]
            start += q_len
        return written


# -- real bugs of the public record (docs/real-bugs.md) ------------------------------------------

STACK_KEYS = 512  # one_row_tile_p_reuse: keys per stacked block (pp_n_scalar 128 x S_BLOCK_STACK 4)
SLICE_KEYS = 256  # one_row_tile_p_reuse: keys per L1 slice of a block's P.V (n_slice)


class OneRowTilePReuse(ControlMath):
    description = (
        f"a batch's last {TILE_ROWS}-row query tile with exactly one row: inside every {STACK_KEYS}-key block, "
        f"the P.V of each {SLICE_KEYS}-key slice after the first reads the first slice's P "
        "(ATB mla_prefill before 27d134563, RingMLA before 936db453c)"
    )

    def _attend(  # type: ignore[override]  # an instance method (the base's is static)
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, group: int, scale: float, mask_type: int
    ) -> torch.Tensor:
        q_len, kv_len = q.shape[0], k.shape[0]
        out = math_attend(q, k, v, group, scale, mask_type)
        keys = int(allowed_keys(q_len, kv_len, kv_len, mask_type)[-1].sum()) if q_len else 0
        if q_len % TILE_ROWS != 1 or keys <= SLICE_KEYS:
            return out
        qh, kh, vh = fp32_heads(q[-1:], k[:keys], v[:keys], group)
        p = torch.softmax((qh @ kh.transpose(1, 2)) * scale, dim=-1)  # the row sum stays right: only P.V is wrong
        wrong = p.clone()
        for block in range(0, keys, STACK_KEYS):
            for start in range(block + SLICE_KEYS, min(block + STACK_KEYS, keys), SLICE_KEYS):
                width = min(SLICE_KEYS, keys - start)
                wrong[..., start : start + width] = p[..., block : block + width]
        out[-1:] = (wrong @ vh).transpose(0, 1).to(q.dtype)
        return out


# -- the catalogue --------------------------------------------------------------------------------

#: The masks the operator's goldens cover, by name.
OPERATOR_MASKS = tuple(MASK_NAMES[code] for code in SUPPORTED_MASKS)
#: Trigger levels (the factor model's names, docs/conformance.md "Coverage"): a prefix kv - q > 0.
NONZERO_PREFIX = ("lt128", "mult128", "mid", "long")
#: More than one batch.
SEVERAL_BATCHES = ("two", "many")
#: Grouped-query heads over more than one kv head (group 128 is 128 heads over one kv head: every mapping agrees).
GQA_OVER_KV_HEADS = ("2", "3", "4", "5", "6", "7", "8", "16")


# -- conditions the factor model names (facts/factors.toml): a GQA group that is not a power of two, long rows

DENOMINATOR_BLOCK = 16  # fp16_running_denominator: keys summed in fp32 before each fp16 addition


class GqaShiftGroup(ControlMath):
    description = (
        "GQA kv head taken as h >> log2(group) (a shift, right only when the group is a power of two), "
        "clamped to the last kv head (apache/tvm PR 17466, mlc-llm PR 2543)"
    )

    def _attend(  # type: ignore[override]  # an instance method (the base's is static)
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, group: int, scale: float, mask_type: int
    ) -> torch.Tensor:
        shift = group.bit_length() - 1
        order = (torch.arange(k.shape[1] * group) >> shift).clamp(max=k.shape[1] - 1)
        return super()._attend(q, k[:, order], v[:, order], 1, scale, mask_type)


class Fp16RunningDenominator(ControlMath):
    description = (
        f"the softmax denominator accumulated across the row in fp16 (one fp16 addition per {DENOMINATOR_BLOCK}-key "
        "block; llama.cpp PR 24389): the sum stalls once a block adds less than half an fp16 ulp of it"
    )

    def _attend(  # type: ignore[override]  # an instance method (the base's is static)
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, group: int, scale: float, mask_type: int
    ) -> torch.Tensor:
        qh, kh, vh = fp32_heads(q, k, v, group)
        scores = (qh @ kh.transpose(1, 2)) * scale
        scores = scores.masked_fill(~allowed_keys(q.shape[0], k.shape[0], k.shape[0], mask_type), float("-inf"))
        p = torch.exp(scores - scores.amax(dim=-1, keepdim=True))
        total = torch.zeros((*p.shape[:-1], 1), dtype=torch.float16)
        for j0 in range(0, p.shape[-1], DENOMINATOR_BLOCK):
            block = p[..., j0 : j0 + DENOMINATOR_BLOCK].sum(dim=-1, keepdim=True)
            total = (total.float() + block).to(torch.float16)
        return ((p @ vh) / total.float()).transpose(0, 1).to(q.dtype)


_ENTRIES = (
    DefectEntry(SCALE_IGNORED.name, ScaleIgnored),
    DefectEntry(SCALE_TWICE.name, ScaleTwice),
    DefectEntry(ROPE_DROPPED.name, RopeDropped),
    DefectEntry("mask_free_ignored", MaskFreeIgnored, {"mask": ("mask_free",)}),
    DefectEntry(CAUSAL_TOP_LEFT.name, CausalTopLeft, {"mask": ("causal",), "prefix": NONZERO_PREFIX}),
    DefectEntry(GQA_MODULO.name, GqaModulo, {"group": GQA_OVER_KV_HEADS}),
    DefectEntry("one_key_short", OneKeyShort),
    DefectEntry(PADDED_AS_PACKED.name, PaddedAsPacked, {"kv_layout": ("padded",), "batch": SEVERAL_BATCHES}),
    DefectEntry(STRIDED_AS_PACKED.name, StridedAsPacked, {"kv_layout": ("strided",)}),
    DefectEntry("padding_rows_read", PaddingRowsRead, {"kv_layout": ("padded",)}),
    DefectEntry("padding_nan_unsafe", PaddingNanUnsafe, {"kv_layout": ("padded",)}, probe="nan_padding"),
    DefectEntry("p_fp8", PFp8),
    DefectEntry("batch_swap", BatchSwap, {"batch": SEVERAL_BATCHES}),
    DefectEntry("nondeterministic", Nondeterministic, probe="rerun"),
    DefectEntry("nan_long_rows", NanLongRows),
    DefectEntry("bf16_acc_64", Bf16Acc64),
    DefectEntry("last_key_long", LastKeyLong),
    DefectEntry("frozen_max", FrozenMax),
    DefectEntry("late_rescale_missing", LateRescaleMissing),
    DefectEntry("causal_offset_batch0", CausalOffsetBatch0, {"mask": ("causal",), "batch": SEVERAL_BATCHES}),
    DefectEntry("prefix_tail_dropped", PrefixTailDropped, {"mask": ("causal",), "prefix": ("lt128", "mid", "long")}),
    DefectEntry(SCALE_IN_INPUT_DTYPE.name, ScaleInInputDtype),
    DefectEntry("half_heads_bf16", HalfHeadsBf16, {"dtype": ("fp16",)}),
    DefectEntry("tail_row_unwritten", TailRowUnwritten),
    DefectEntry(OUT_OFFSET_WRAP.name, OutOffsetWrap),
    DefectEntry(
        TILE_ROWS_UNWRITTEN.name, TileRowsUnwritten, {"q_len": ("mod128_1", "mod128_0", "mod128_mid", "gt512")}
    ),
    DefectEntry(
        "gqa_shift_group",
        GqaShiftGroup,
        {"mask": ("causal",), "group": ("3", "5", "6", "7")},  # groups above 1 exist only under CAUSAL
        real_bug=RealBug(
            source="apache/tvm PR 17466 (28 query heads over 4 kv heads), mlc-llm PR 2543 (group 6)",
            releases="not in ATB's public record: a schedule bug other GQA kernels shipped",
        ),
    ),
    DefectEntry("fp16_running_denominator", Fp16RunningDenominator),
    DefectEntry(
        "one_row_tile_p_reuse",
        OneRowTilePReuse,
        {"q_len": ("one", "mod128_1", "gt512")},
        real_bug=RealBug(
            source="hicann/ascend-transformer-boost 27d134563 and d5ee027c0 (mla_prefill), 936db453c (RingMLA)",
            releases="mla_prefill: CANN releases before 8.2.RC1; RingMLA: before 8.5.0 (8.2.RC1 and 8.3.RC1 carry it)",
        ),
    ),
)
#: Every planted defect by name (its factory in this module: ``--mla-backend mlaconf.harness.defects:<name>``).
ENTRIES: dict[str, DefectEntry] = {entry.name: entry for entry in (*_ENTRIES, *BRANCH_ENTRIES)}
#: The defects a suite's power is judged on (``mlaconf power``): those the settled factor model can reach.
CATALOGUE: dict[str, DefectEntry] = {name: entry for name, entry in ENTRIES.items() if not entry.pending}
#: Defects whose trigger needs a pending level (no shipped covering set holds it yet): run by name only.
PENDING: dict[str, DefectEntry] = {name: entry for name, entry in ENTRIES.items() if entry.pending}
#: Reproduced upstream bugs (docs/real-bugs.md) -> the masks in which smoke must kill them in both dtypes.
REAL_BUGS: dict[str, tuple[str, ...]] = {
    entry.name: entry.trigger.get("mask", OPERATOR_MASKS) for entry in _ENTRIES if entry.real_bug is not None
}


def __getattr__(name: str) -> Callable[[], Defect]:
    """``<name>()`` builds the catalogued defect of that name (what ``--mla-backend module:<name>`` calls)."""
    if name in ENTRIES:
        return ENTRIES[name].make
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
