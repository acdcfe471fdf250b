"""Defects of ATB's own branches (facts/branches.toml) that the grown factor model's levels reach: a last stack
of 256 keys, raw scores past fp16's range, MASK_FREE fills read the other kernel's way, logits far below zero,
NaN in the kv rows no batch reads.

Each is a :class:`~mlaconf.harness.defect_kit.ControlMath` (the defects' float32 path) with one bug, computing
exactly that path off its trigger; :data:`BRANCH_ENTRIES` joins the catalogue (:mod:`mlaconf.harness.defects`
``ENTRIES``, so ``--mla-backend mlaconf.harness.defects:<name>`` builds them).  Their levels are settled and
smoke's covering set holds them, so smoke's power is judged on them like any defect; ``cases/branches.toml``
holds each branch's cases (``mlaconf power --suite branches``)."""

from __future__ import annotations

import torch

from mlaconf.facts.operator import FP16_MAX, kv_layout_of, kv_row_starts
from mlaconf.harness.backend import MlaPrefillCall
from mlaconf.harness.defect_kit import ControlMath, DefectEntry, replace_call
from mlaconf.harness.defect_math import allowed_keys, math_attend
from mlaconf.harness.torch_backend import head_chunk
from mlaconf.harness.zoo import fp32_heads

STACK_KEYS = 512  # ATB's key stack: four 128-key blocks (facts/branches.toml stack-of-four-blocks)
VECTOR_KEYS = 128  # stack256_sum_doubled: the 256 path sums two vectors of this many keys
HP_MASK_SCALE = -3e38  # mask_multiplied: the high-precision kernel's factor on the MASK_FREE mask
#: safe_max_zero: the row maxima below which exp(s - 0) underflows P's dtype (fp16 P; bf16 P's fp32 exp).
UNDERFLOW = {torch.float16: 14.0, torch.bfloat16: 87.0}


def _scores(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, group: int) -> tuple[torch.Tensor, ...]:
    """Raw fp32 Q.K ``[H, q, kv]`` and V ``[H, kv, 128]`` (GQA heads repeated), as math_attend forms them."""
    qh, kh, vh = fp32_heads(q, k, v, group)
    return qh @ kh.transpose(1, 2), vh


class Stack256SumDoubled(ControlMath):
    description = (
        f"a last key stack of exactly {STACK_KEYS // 2} keys: the row sum adds its first {VECTOR_KEYS}-key vector "
        "twice and never its second (the 256 path of mla_prefill.cce:959-965 reading one vector)"
    )

    def _attend(  # type: ignore[override]  # an instance method (the base's is static)
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, group: int, scale: float, mask_type: int
    ) -> torch.Tensor:
        kv = k.shape[0]
        if kv % STACK_KEYS != STACK_KEYS // 2:
            return math_attend(q, k, v, group, scale, mask_type)
        raw, vh = _scores(q, k, v, group)
        scores = (raw * scale).masked_fill(~allowed_keys(q.shape[0], kv, kv, mask_type), float("-inf"))
        e = torch.exp(scores - scores.amax(dim=-1, keepdim=True))
        first, second = e[..., kv - 2 * VECTOR_KEYS : kv - VECTOR_KEYS], e[..., kv - VECTOR_KEYS :]
        total = e.sum(dim=-1, keepdim=True) - second.sum(dim=-1, keepdim=True) + first.sum(dim=-1, keepdim=True)
        return ((e @ vh) / total).transpose(0, 1).to(q.dtype)


class RawScoresFp16Range(ControlMath):
    description = (
        "raw Q.K held in fp16's range on every path: products beyond 65504 become +-inf before qkScale (the fp16 "
        "kernel's score store, mla_prefill.cce:420-427, on the fp32 score paths too: bf16, fp16 CAUSAL)"
    )

    def _attend(  # type: ignore[override]  # an instance method (the base's is static)
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, group: int, scale: float, mask_type: int
    ) -> torch.Tensor:
        raw, vh = _scores(q, k, v, group)
        if not bool((raw.abs() > FP16_MAX).any()):
            return math_attend(q, k, v, group, scale, mask_type)
        raw = torch.where(raw.abs() > FP16_MAX, raw.sign() * float("inf"), raw)
        scores = (raw * scale).masked_fill(~allowed_keys(q.shape[0], k.shape[0], k.shape[0], mask_type), float("-inf"))
        return (torch.softmax(scores, dim=-1) @ vh).transpose(0, 1).to(q.dtype)


class MaskFillRead(ControlMath):
    """MASK_FREE with the mask's fill (its value above the diagonal) applied to the masked scores as ``apply``
    says, instead of masking them; the other masks and a fill that masks come out as the float32 path."""

    def before(self, call: MlaPrefillCall) -> MlaPrefillCall:
        self._fill = float(call.mask[0, 1]) if call.mask_type == 2 and call.mask is not None else None
        return call

    def apply(self, fill: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def _attend(  # type: ignore[override]  # an instance method (the base's is static)
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, group: int, scale: float, mask_type: int
    ) -> torch.Tensor:
        if mask_type != 2 or self._fill is None:
            return math_attend(q, k, v, group, scale, mask_type)
        raw, vh = _scores(q, k, v, group)
        scores = raw * scale
        added = self.apply(torch.tensor(self._fill, dtype=torch.float32))
        masked = ~allowed_keys(q.shape[0], k.shape[0], k.shape[0], mask_type)
        scores = torch.where(masked, scores + added, scores)
        return (torch.softmax(scores, dim=-1) @ vh).transpose(0, 1).to(q.dtype)


class MaskMultiplied(MaskFillRead):
    description = (
        "MASK_FREE's mask read as the high-precision kernel reads it, on every path: multiplied by -3e38 and added "
        "(mla_prefill_high_precision.cce:687-712): a -10000 or -inf fill makes masked scores +inf, rows NaN"
    )

    def apply(self, fill: torch.Tensor) -> torch.Tensor:
        return fill * torch.tensor(HP_MASK_SCALE, dtype=torch.float32)


class MaskAdded(MaskFillRead):
    description = (
        "MASK_FREE's mask read as the fp16 kernel reads it, on every path: added to the scores as it is "
        "(mla_prefill.cce:751-768): a 0/1 fill masks nothing"
    )

    def apply(self, fill: torch.Tensor) -> torch.Tensor:
        return fill


class SafeMaxZero(ControlMath):
    description = (
        "the running max starts at 0 instead of -inf (a 'safe' max, kept for a row whose first block is fully "
        "masked): a row whose logits all lie far below 0 is exponentiated against 0, P underflowing its dtype "
        "(fp16 P below about -14, fp32's exp below -87); other rows differ from the float32 path only by rounding, "
        "not planted"
    )

    def _attend(  # type: ignore[override]  # an instance method (the base's is static)
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, group: int, scale: float, mask_type: int
    ) -> torch.Tensor:
        out = math_attend(q, k, v, group, scale, mask_type)
        raw, vh = _scores(q, k, v, group)
        scores = (raw * scale).masked_fill(~allowed_keys(q.shape[0], k.shape[0], k.shape[0], mask_type), float("-inf"))
        low = scores.amax(dim=-1) < -UNDERFLOW[q.dtype]  # [H, q]
        if not bool(low.any()):
            return out
        e = torch.exp(scores)  # against a max of 0
        wrong = ((e.to(q.dtype).float() @ vh) / e.sum(dim=-1, keepdim=True)).transpose(0, 1).to(q.dtype)
        return torch.where(low.transpose(0, 1)[..., None], wrong, out)


class UnusedRowsNanUnsafe(ControlMath):
    description = (
        "the 3-D kv forms: each batch reads its whole slot up to the next batch's first row (strided: max kv rows; "
        "packed with spare rows: the last batch to k's end), masked with -inf after Q.K and weighted by P = 0, so "
        "NaN there leaks (padded kv: padding_nan_unsafe)"
    )

    def before(self, call: MlaPrefillCall) -> MlaPrefillCall:
        self._true_kv: list[int] | None = None
        lengths = [int(n) for n in call.kv_seqlen.tolist()]
        hkv, rows = call.kv_head_num, int(call.k.shape[0])
        if kv_layout_of(call.k.shape, lengths, hkv) not in ("strided", "packed"):
            return call
        starts = kv_row_starts(tuple(call.k.shape), lengths, hkv)
        assert starts is not None
        slots = [end - start for start, end in zip(starts, [*starts[1:], rows], strict=True)]
        unread = [r for s, n, slot in zip(starts, lengths, slots, strict=True) for r in range(s + n, s + slot)]
        tensors = (call.k, call.k_rope, call.v)
        if not unread or all(bool(torch.isfinite(t.reshape(rows, -1)[unread]).all()) for t in tensors):
            return call  # finite rows weighted by 0 add nothing: the float32 path
        heads, group = call.head_num, call.head_num // hkv
        # one entry per _attend call: batches with query rows in order, once per head chunk
        self._true_kv = [
            n
            for q, n, slot in zip(call.q_seqlen.tolist(), lengths, slots, strict=True)
            if q > 0 and slot > 0
            for _ in range(-(-heads // head_chunk(q, slot, heads, group)))
        ]
        widened = torch.tensor(slots, dtype=call.kv_seqlen.dtype)
        return replace_call(call, kv_seqlen=widened)

    def _attend(  # type: ignore[override]  # an instance method (the base's is static)
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, group: int, scale: float, mask_type: int
    ) -> torch.Tensor:
        kv_len = None if self._true_kv is None else self._true_kv.pop(0)
        return math_attend(q, k, v, group, scale, mask_type, kv_len=kv_len)


BRANCH_ENTRIES = (
    DefectEntry("stack256_sum_doubled", Stack256SumDoubled, {"kv_len": ("stack256",)}),
    DefectEntry("raw_scores_fp16_range", RawScoresFp16Range, {"inputs": ("raw_overflow",)}),
    DefectEntry("mask_multiplied", MaskMultiplied, {"mask_fill": ("neg10000", "neg_inf")}),
    DefectEntry("mask_added", MaskAdded, {"mask_fill": ("one",)}),
    DefectEntry("safe_max_zero", SafeMaxZero, {"logits": ("negative",)}),
    DefectEntry(
        "unused_rows_nan_unsafe",
        UnusedRowsNanUnsafe,
        {"kv_layout": ("strided", "packed_spare"), "padding": ("nan",)},
    ),
)
