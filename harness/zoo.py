"""The correct zoo: MLA prefill implementations on other legitimate rounding paths.

A suite must never fail one of them (a false alarm); ``mlaconf power --zoo`` measures how close a suite's
cases come to it (the largest slack of each member), and ``tests/nocover/test_zoo.py`` runs the shipped
suites on every member.  Each is a zero-argument factory usable as
``--mla-backend mlaconf.harness.zoo:<name>`` and implements the Backend protocol through
:class:`mlaconf.harness.torch_backend.TorchSdpaBackend`'s batching and layouts, replacing only the
per-sequence attention.  Every path rounds the output once to the case dtype and keeps every
accumulation in fp32; they differ where docs/operator.md §4 allows a correct kernel to differ
(:data:`ZOO` holds each member's path in one line):

* ``fp32_p``       fp32 scores, softmax and P (P never rounded), one fp32 P.V GEMM.
* ``p_rounded``    fp32 scores; unnormalised P = exp(s - m) rounded to the input dtype before an
                   fp32 P.V; divided by the fp32 row sum (ATB's bf16 and fp16 CAUSAL path).
* ``atb_fp16``     ATB's fp16 maskType 0/2 path: Q.K accumulated in fp32 and stored as fp16, qkScale
                   cast to fp16 and applied in fp16, the fp16 mask added, row max and s - m in fp16,
                   exp and row sum in fp32, P cast to fp16, fp32 P.V.  Other cases: ``p_rounded``.
* ``flash_<B>``    blockwise online softmax over key blocks of B (16, 64, 128): running max and sum,
                   the fp32 accumulator rescaled by exp(m_old - m_new) per block, P of each block
                   rounded to the input dtype before its P.V (FlashAttention-2 style).
* ``split_reverse`` another accumulation order: keys split into 3 parts processed last part first,
                   each with its own max, sum and fp32 accumulator over blocks of 48 keys (P
                   rounded), the parts merged by their log-sum-exp in fp32 (split-KV / flash-decoding).
* ``p_normalised`` the softmax normalised in fp32, then P/sum rounded to the input dtype before an
                   fp32 P.V (JAX ``dot_product_attention``, flex_attention eager, SDPA's math path).
* ``split_rounded`` split-KV as FlashInfer and vLLM store it: 4 kv parts, each part's normalised
                   output rounded to the input dtype and its log-sum-exp kept in fp32, merged in fp32.
* ``exp2``         fp32 scores scaled by qkScale * log2 e folded into one fp32 constant, exp2(s - m),
                   P rounded to the input dtype, fp32 P.V, / fp32 row sum (the usual GPU softmax).
* ``atb_fp16_512`` ``atb_fp16`` over key stacks of 512: the fp16 scores, max and s - m per stack, the
                   running max and the fp32 accumulator and sum rescaled between stacks.
* ``ftz_fp16``     ``atb_fp16`` on a device that flushes fp16 subnormals to zero: P below 2^-14 becomes 0
                   before P.V and outputs below 2^-14 become 0 (docs/conformance.md "Flush-to-zero").
"""

from __future__ import annotations

import itertools
import math

import torch

from mlaconf.facts.operator import causal_offset
from mlaconf.harness.torch_backend import TorchSdpaBackend, query_heads


def visible_keys(q_len: int, kv_len: int, mask_type: int) -> torch.Tensor | None:
    """``[q, kv]`` boolean mask of visible keys, None when every key is visible."""
    offset = causal_offset(mask_type, q_len, kv_len)
    if offset is None:
        return None
    rows = torch.arange(q_len)[:, None]
    return torch.arange(kv_len)[None, :] <= rows + offset


def fp32_heads(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, group: int) -> tuple[torch.Tensor, ...]:
    """q ``[H, q, 192]``, k ``[H, kv, 192]``, v ``[H, kv, 128]`` in fp32 (GQA heads repeated)."""
    return (
        q.transpose(0, 1).float(),
        query_heads(k.transpose(0, 1).float(), group),
        query_heads(v.transpose(0, 1).float(), group),
    )


def _scores32(qh: torch.Tensor, kh: torch.Tensor, scale: float, allowed: torch.Tensor | None) -> torch.Tensor:
    s = (qh @ kh.transpose(1, 2)) * torch.tensor(scale, dtype=torch.float32)
    return s if allowed is None else s.masked_fill(~allowed, float("-inf"))


class ZooMember(TorchSdpaBackend):
    """A correct implementation: the torch CPU plumbing with its own attention arithmetic."""

    description = ""

    def __init__(self, name: str) -> None:
        super().__init__("cpu")
        self.name = f"zoo-{name}"

    def _attend(  # type: ignore[override]  # an instance method: the member's own arithmetic
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        group: int,
        scale: float,
        mask_type: int,
    ) -> torch.Tensor:
        dtype = q.dtype
        qh, kh, vh = fp32_heads(q, k, v, group)
        out = self.attend32(qh, kh, vh, scale, visible_keys(q.shape[0], k.shape[0], mask_type), dtype, mask_type)
        return self.round_out(out.transpose(0, 1), dtype)

    def round_p(self, p: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        """P rounded to the input dtype, back in fp32 (the one rounding of P on the documented paths)."""
        return p.to(dtype).float()

    def round_out(self, out: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        """The fp32 output rounded once to the case dtype."""
        return out.to(dtype)

    def attend32(
        self,
        qh: torch.Tensor,
        kh: torch.Tensor,
        vh: torch.Tensor,
        scale: float,
        allowed: torch.Tensor | None,
        dtype: torch.dtype,
        mask_type: int,
    ) -> torch.Tensor:
        """``[H, q, 128]`` fp32 output before the final rounding."""
        raise NotImplementedError


class Fp32P(ZooMember):
    description = "fp32 scores, softmax and P; fp32 P.V"

    def attend32(
        self,
        qh: torch.Tensor,
        kh: torch.Tensor,
        vh: torch.Tensor,
        scale: float,
        allowed: torch.Tensor | None,
        dtype: torch.dtype,
        mask_type: int,
    ) -> torch.Tensor:
        return torch.softmax(_scores32(qh, kh, scale, allowed), dim=-1) @ vh


class PRounded(ZooMember):
    description = "fp32 scores; exp(s - m) rounded to the input dtype; fp32 P.V; / fp32 row sum"

    def attend32(
        self,
        qh: torch.Tensor,
        kh: torch.Tensor,
        vh: torch.Tensor,
        scale: float,
        allowed: torch.Tensor | None,
        dtype: torch.dtype,
        mask_type: int,
    ) -> torch.Tensor:
        s = _scores32(qh, kh, scale, allowed)
        e = torch.exp(s - s.amax(dim=-1, keepdim=True))
        return (self.round_p(e, dtype) @ vh) / e.sum(dim=-1, keepdim=True)


class AtbFp16(PRounded):
    description = "ATB's fp16 maskType 0/2 path (fp16 scores, scale, mask, max, s - m); else p_rounded"

    def attend32(
        self,
        qh: torch.Tensor,
        kh: torch.Tensor,
        vh: torch.Tensor,
        scale: float,
        allowed: torch.Tensor | None,
        dtype: torch.dtype,
        mask_type: int,
    ) -> torch.Tensor:
        if dtype != torch.float16 or mask_type not in (0, 2):
            return super().attend32(qh, kh, vh, scale, allowed, dtype, mask_type)
        s = (qh @ kh.transpose(1, 2)).half() * torch.tensor(scale, dtype=torch.float16)  # fp16 x fp16 -> fp16
        if allowed is not None:  # the compressed mask is added in fp16: -10000 above the diagonal
            s = s + torch.where(allowed, 0.0, -10000.0).half()
        m = s.amax(dim=-1, keepdim=True)
        e = torch.exp((s - m).float())  # s - m in fp16, exp in fp32
        return (self.round_p(e, dtype) @ vh) / e.sum(dim=-1, keepdim=True)


class Flash(ZooMember):
    description = "online softmax over key blocks, fp32 rescaling, P rounded per block"

    def __init__(self, name: str, block: int) -> None:
        super().__init__(name)
        self.block = block

    def attend32(
        self,
        qh: torch.Tensor,
        kh: torch.Tensor,
        vh: torch.Tensor,
        scale: float,
        allowed: torch.Tensor | None,
        dtype: torch.dtype,
        mask_type: int,
    ) -> torch.Tensor:
        acc, _, total = blockwise(qh, kh, vh, scale, allowed, dtype, self.block, range(0, kh.shape[1], self.block))
        return acc / total


class PNormalised(ZooMember):
    description = "fp32 softmax normalised, then P rounded to the input dtype; fp32 P.V"

    def attend32(
        self,
        qh: torch.Tensor,
        kh: torch.Tensor,
        vh: torch.Tensor,
        scale: float,
        allowed: torch.Tensor | None,
        dtype: torch.dtype,
        mask_type: int,
    ) -> torch.Tensor:
        return self.round_p(torch.softmax(_scores32(qh, kh, scale, allowed), dim=-1), dtype) @ vh


class SplitRounded(ZooMember):
    description = "4 kv parts, each part's normalised output rounded to the input dtype, merged by fp32 log-sum-exp"

    PARTS = 4
    BLOCK = 64

    def attend32(
        self,
        qh: torch.Tensor,
        kh: torch.Tensor,
        vh: torch.Tensor,
        scale: float,
        allowed: torch.Tensor | None,
        dtype: torch.dtype,
        mask_type: int,
    ) -> torch.Tensor:
        kv = kh.shape[1]
        cuts = [round(kv * i / self.PARTS) for i in range(self.PARTS + 1)]
        outs, lses = [], []
        for lo, hi in itertools.pairwise(cuts):
            if hi <= lo:
                continue
            acc, m, total = _part(
                qh, kh[:, :hi], vh[:, :hi], scale, allowed, dtype, self.BLOCK, list(range(lo, hi, self.BLOCK))
            )
            seen = total > 0  # a causal row may see no key of this part: its partial is empty
            partial = torch.where(seen, acc / torch.where(seen, total, torch.ones_like(total)), torch.zeros_like(acc))
            outs.append(partial.to(dtype).float())  # the partial output is stored in the input dtype
            lses.append(torch.where(seen, m + torch.log(torch.where(seen, total, torch.ones_like(total))), m))
        lse = torch.stack(lses)
        top = lse.amax(dim=0)
        weights = torch.exp(lse - top)  # parts without keys: exp(-inf) = 0
        return (torch.stack(outs) * weights).sum(dim=0) / weights.sum(dim=0)


class Exp2(ZooMember):
    description = "fp32 scores times fp32(qkScale log2 e); exp2(s - m); P rounded; fp32 P.V; / fp32 row sum"

    def attend32(
        self,
        qh: torch.Tensor,
        kh: torch.Tensor,
        vh: torch.Tensor,
        scale: float,
        allowed: torch.Tensor | None,
        dtype: torch.dtype,
        mask_type: int,
    ) -> torch.Tensor:
        s = _scores32(qh, kh, float(torch.tensor(scale * math.log2(math.e), dtype=torch.float32)), allowed)
        e = torch.exp2(s - s.amax(dim=-1, keepdim=True))
        return (self.round_p(e, dtype) @ vh) / e.sum(dim=-1, keepdim=True)


class AtbFp16Stacks(AtbFp16):
    description = "atb_fp16 over key stacks of 512 with fp32 online rescaling between stacks"

    STACK = 512

    def attend32(
        self,
        qh: torch.Tensor,
        kh: torch.Tensor,
        vh: torch.Tensor,
        scale: float,
        allowed: torch.Tensor | None,
        dtype: torch.dtype,
        mask_type: int,
    ) -> torch.Tensor:
        if dtype != torch.float16 or mask_type not in (0, 2):
            return super().attend32(qh, kh, vh, scale, allowed, dtype, mask_type)
        h, q_len, _ = qh.shape
        acc = torch.zeros(h, q_len, vh.shape[2])
        m = torch.full((h, q_len, 1), float("-inf"))
        total = torch.zeros(h, q_len, 1)
        fp16_scale = torch.tensor(scale, dtype=torch.float16)
        for j0 in range(0, kh.shape[1], self.STACK):
            j1 = min(j0 + self.STACK, kh.shape[1])
            s = (qh @ kh[:, j0:j1].transpose(1, 2)).half() * fp16_scale
            if allowed is not None:
                s = s + torch.where(allowed[:, j0:j1], 0.0, -10000.0).half()
            m_new = torch.maximum(m, s.amax(dim=-1, keepdim=True).float())
            e = torch.exp((s - m_new.half()).float())  # s - m in fp16 (m is an fp16 score)
            alpha = torch.exp(m - m_new)
            total = total * alpha + e.sum(dim=-1, keepdim=True)
            acc = acc * alpha + self.round_p(e, dtype) @ vh[:, j0:j1]
            m = m_new
        return acc / total


#: Smallest normal fp16 value: below it a flush-to-zero device stores 0.
FP16_MIN_NORMAL = 2.0**-14


class FtzFp16(AtbFp16):
    description = "atb_fp16 on a flush-to-zero device: fp16 P and outputs below 2^-14 become 0"

    def round_p(self, p: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        rounded = super().round_p(p, dtype)
        return (
            torch.where(rounded.abs() < FP16_MIN_NORMAL, torch.zeros_like(rounded), rounded)
            if dtype == torch.float16
            else rounded
        )

    def round_out(self, out: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        rounded = out.to(dtype)
        if dtype != torch.float16:
            return rounded
        return torch.where(rounded.abs() < FP16_MIN_NORMAL, torch.zeros_like(rounded), rounded)


def blockwise(
    qh: torch.Tensor,
    kh: torch.Tensor,
    vh: torch.Tensor,
    scale: float,
    allowed: torch.Tensor | None,
    dtype: torch.dtype,
    block: int,
    starts: range | list[int],
    acc_dtype: torch.dtype = torch.float32,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Unnormalised accumulator, running max and running sum over the key blocks at ``starts``.

    ``acc_dtype`` other than fp32 rounds the accumulator after every block (a planted defect uses it).
    """
    h, q_len, _ = qh.shape
    acc = torch.zeros(h, q_len, vh.shape[2])
    m = torch.full((h, q_len, 1), float("-inf"))
    total = torch.zeros(h, q_len, 1)
    for j0 in starts:
        j1 = min(j0 + block, kh.shape[1])
        s = (qh @ kh[:, j0:j1].transpose(1, 2)) * torch.tensor(scale, dtype=torch.float32)
        if allowed is not None:
            s = s.masked_fill(~allowed[:, j0:j1], float("-inf"))
        m_new = torch.maximum(m, s.amax(dim=-1, keepdim=True))
        safe = torch.where(torch.isinf(m_new), torch.zeros_like(m_new), m_new)  # rows with no key yet
        p = torch.exp(s - safe)
        alpha = torch.exp(m - safe)
        total = total * alpha + p.sum(dim=-1, keepdim=True)
        acc = acc * alpha + p.to(dtype).float() @ vh[:, j0:j1]
        if acc_dtype != torch.float32:
            acc = acc.to(acc_dtype).float()
        m = m_new
    return acc, m, total


class SplitReverse(ZooMember):
    description = "3 kv parts, last first, blocks of 48, merged by log-sum-exp in fp32"

    PARTS = 3
    BLOCK = 48

    def attend32(
        self,
        qh: torch.Tensor,
        kh: torch.Tensor,
        vh: torch.Tensor,
        scale: float,
        allowed: torch.Tensor | None,
        dtype: torch.dtype,
        mask_type: int,
    ) -> torch.Tensor:
        kv = kh.shape[1]
        cuts = [round(kv * i / self.PARTS) for i in range(self.PARTS + 1)]
        parts = []
        for p in reversed(range(self.PARTS)):
            lo, hi = cuts[p], cuts[p + 1]
            if hi > lo:
                starts = list(reversed(range(lo, hi, self.BLOCK)))  # the last block first
                parts.append(_part(qh, kh[:, :hi], vh[:, :hi], scale, allowed, dtype, self.BLOCK, starts))
        m = torch.stack([pm for _, pm, _ in parts]).amax(dim=0)
        safe = torch.where(torch.isinf(m), torch.zeros_like(m), m)
        acc = torch.zeros_like(parts[0][0])
        total = torch.zeros_like(parts[0][2])
        for part_acc, part_m, part_total in parts:
            w = torch.exp(part_m - safe)
            acc = acc + part_acc * w
            total = total + part_total * w
        return acc / total


def _part(
    qh: torch.Tensor,
    kh: torch.Tensor,
    vh: torch.Tensor,
    scale: float,
    allowed: torch.Tensor | None,
    dtype: torch.dtype,
    block: int,
    starts: list[int],
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One kv part (keys up to kh's length) over blocks at ``starts``; blocks clipped at the part's end."""
    return blockwise(qh, kh, vh, scale, None if allowed is None else allowed[:, : kh.shape[1]], dtype, block, starts)


def fp32_p() -> ZooMember:
    return Fp32P("fp32_p")


def p_rounded() -> ZooMember:
    return PRounded("p_rounded")


def atb_fp16() -> ZooMember:
    return AtbFp16("atb_fp16")


def flash_16() -> ZooMember:
    return Flash("flash_16", 16)


def flash_64() -> ZooMember:
    return Flash("flash_64", 64)


def flash_128() -> ZooMember:
    return Flash("flash_128", 128)


def split_reverse() -> ZooMember:
    return SplitReverse("split_reverse")


def p_normalised() -> ZooMember:
    return PNormalised("p_normalised")


def split_rounded() -> ZooMember:
    return SplitRounded("split_rounded")


def exp2() -> ZooMember:
    return Exp2("exp2")


def atb_fp16_512() -> ZooMember:
    return AtbFp16Stacks("atb_fp16_512")


def ftz_fp16() -> ZooMember:
    return FtzFp16("ftz_fp16")


#: Member name (its factory in this module) -> the rounding path it stands for.
ZOO: dict[str, str] = {
    "fp32_p": Fp32P.description,
    "p_rounded": PRounded.description,
    "atb_fp16": AtbFp16.description,
    "flash_16": Flash.description + " (blocks of 16)",
    "flash_64": Flash.description + " (blocks of 64)",
    "flash_128": Flash.description + " (blocks of 128)",
    "split_reverse": SplitReverse.description,
    "p_normalised": PNormalised.description,
    "split_rounded": SplitRounded.description,
    "exp2": Exp2.description,
    "atb_fp16_512": AtbFp16Stacks.description,
    "ftz_fp16": FtzFp16.description,
}
