"""Error-contract cases: build the invalid call a case describes, run it, judge the rejection.

An error case (``cases/errors.toml``) is a spec whose scalars may be invalid plus an optional
``perturb`` naming a transformation of the call's tensors.  Inputs come from the *nearest valid*
spec (head count clamped, scale and mask type made legal), so every tensor is well formed except
for what the case is about; the call then carries the case's own scalars and the perturbation.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from dataclasses import dataclass

import torch

from mlaconf.facts.operator import DEFAULT_QK_SCALE, MAX_HEADS, NOPE_DIM, SUPPORTED_MASKS
from mlaconf.facts.versions import RELEASE_UNKNOWN
from mlaconf.golden.building.inputs import generate_inputs
from mlaconf.golden.specs.spec import CaseSpec
from mlaconf.harness.backend import Backend, BackendError, MlaPrefillCall
from mlaconf.judge.deviations import Deviation, DeviationSet, explaining, release_note
from mlaconf.judge.verdict import Outcome, outcome_message, outcome_of
from mlaconf.native.harness import ACL_FORMAT_FRACTAL_NZ, ACL_FORMAT_NCHW, ACL_FORMAT_NHWC
from mlaconf.reports.records import ErrorEvidence
from mlaconf.runner.ending import Ending
from mlaconf.runner.execution import make_call

Perturbation = Callable[[MlaPrefillCall], MlaPrefillCall]

_OTHER_DTYPE = {torch.float16: torch.bfloat16, torch.bfloat16: torch.float16}


def _other_dtype(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.to(_OTHER_DTYPE[tensor.dtype])


def _need_mask(call: MlaPrefillCall) -> torch.Tensor:
    if call.mask is None:
        raise ValueError("this perturbation needs a MASK_FREE case (a mask to change)")
    return call.mask


def _all_fp32(call: MlaPrefillCall) -> MlaPrefillCall:
    mask = None if call.mask is None else call.mask.float()
    return dataclasses.replace(
        call,
        q=call.q.float(),
        q_rope=call.q_rope.float(),
        k=call.k.float(),
        k_rope=call.k_rope.float(),
        v=call.v.float(),
        mask=mask,
    )


def _q_rope_flat(call: MlaPrefillCall) -> MlaPrefillCall:
    if call.q_rope.dim() != 3:
        raise ValueError("q_rope_flat needs a 3-D q layout")
    return dataclasses.replace(call, q_rope=call.q_rope.reshape(call.q_rope.shape[0], -1))


def _k_rank2(call: MlaPrefillCall) -> MlaPrefillCall:
    return dataclasses.replace(call, k=call.k.reshape(call.k.shape[0], -1))


def _q_rank4(call: MlaPrefillCall) -> MlaPrefillCall:
    t = call.q.shape[0]
    return dataclasses.replace(call, q=call.q.reshape(t, call.head_num, 2, -1))


def _out_flat(call: MlaPrefillCall) -> MlaPrefillCall:
    if call.q.dim() != 3:
        raise ValueError("out_flat needs a 3-D q layout")
    return dataclasses.replace(call, out_shape=(call.q.shape[0], call.q.shape[1] * call.q.shape[2]))


def _out_rows_short(call: MlaPrefillCall) -> MlaPrefillCall:
    rows, *rest = call.q.shape
    return dataclasses.replace(call, out_shape=(rows - 1, *rest))


def _packed_kv(call: MlaPrefillCall, what: str) -> None:
    if call.k.dim() != 3 or tuple(call.k.shape[1:]) != (call.kv_head_num, NOPE_DIM):
        raise ValueError(f"{what} needs the packed kv layout [Tk, Hkv, 128]")


def _padded_kv(call: MlaPrefillCall, what: str) -> None:
    if call.k.dim() != 3 or call.k.shape[0] != call.q_seqlen.shape[0] or call.k.shape[2] != call.kv_head_num * NOPE_DIM:
        raise ValueError(f"{what} needs the padded kv layout [B, S, Hkv*128]")


def _k_rows_long(call: MlaPrefillCall) -> MlaPrefillCall:
    _packed_kv(call, "k_rows_long")
    return dataclasses.replace(call, k=torch.cat([call.k, call.k[-1:]]).contiguous())


def _k_heads_extra(call: MlaPrefillCall) -> MlaPrefillCall:
    _packed_kv(call, "k_heads_extra")
    return dataclasses.replace(call, k=torch.cat([call.k, call.k[:, -1:]], dim=1).contiguous())


def _k_last_dim_long(call: MlaPrefillCall) -> MlaPrefillCall:
    return dataclasses.replace(call, k=torch.cat([call.k, call.k[..., -1:]], dim=-1).contiguous())


def _k_batch_extra(call: MlaPrefillCall) -> MlaPrefillCall:
    _padded_kv(call, "k_batch_extra")
    return dataclasses.replace(call, k=torch.cat([call.k, call.k[-1:]]).contiguous())


def _k_capacity_long(call: MlaPrefillCall) -> MlaPrefillCall:
    _padded_kv(call, "k_capacity_long")
    return dataclasses.replace(call, k=torch.cat([call.k, call.k[:, -1:]], dim=1).contiguous())


def _one_more(seqlen: torch.Tensor) -> torch.Tensor:
    return torch.cat([seqlen, seqlen[-1:]]).contiguous()


def _last_kv_length(keys: Callable[[int], int], what: str) -> Perturbation:
    """kvSeqLen's last entry set from its qSeqLen, after the inputs were built from the valid lengths
    (the loader refuses kv_b < q_b under CAUSAL, so only a perturbation can ask the operator)."""

    def perturb(call: MlaPrefillCall) -> MlaPrefillCall:
        q_last = int(call.q_seqlen[-1])
        if q_last < 1:
            raise ValueError(f"{what} needs a last batch with query rows")
        kv_seqlen = call.kv_seqlen.clone()
        kv_seqlen[-1] = keys(q_last)
        return dataclasses.replace(call, kv_seqlen=kv_seqlen)

    return perturb


def _formatted(name: str, code: int) -> Perturbation:
    def perturb(call: MlaPrefillCall) -> MlaPrefillCall:
        if name == "mask":
            _need_mask(call)
        return dataclasses.replace(call, formats={**call.formats, name: code})

    return perturb


def _null(name: str) -> Perturbation:
    def perturb(call: MlaPrefillCall) -> MlaPrefillCall:
        return dataclasses.replace(call, null_args=call.null_args | {name})

    return perturb


#: name -> (what it does, the transformation).  Names appear in case ids (``err-<name>``).
PERTURBATIONS: dict[str, tuple[str, Perturbation]] = {
    "nan_qk_scale": ("qkScale = NaN", lambda c: dataclasses.replace(c, qk_scale=math.nan)),
    "drop_mask": ("MASK_FREE with a null mask", lambda c: dataclasses.replace(c, mask=None)),
    "mask_256": (
        "a 256x256 mask instead of 512x512",
        lambda c: dataclasses.replace(c, mask=_need_mask(c)[:256, :256].contiguous()),
    ),
    "mask_rank3": ("a [1, 512, 512] mask", lambda c: dataclasses.replace(c, mask=_need_mask(c)[None])),
    "kv_seqlen_short": (
        "kvSeqLen with one entry fewer than qSeqLen",
        lambda c: dataclasses.replace(c, kv_seqlen=c.kv_seqlen[:-1].contiguous()),
    ),
    "q_seqlen_long": (
        "qSeqLen with one entry more than kvSeqLen",
        lambda c: dataclasses.replace(c, q_seqlen=_one_more(c.q_seqlen)),
    ),
    "kv_below_q_one": (
        "the last batch's kvSeqLen one below its qSeqLen",
        _last_kv_length(lambda q: q - 1, "kv_below_q_one"),
    ),
    "kv_below_q_zero": (
        "the last batch's kvSeqLen 0 while it has query rows",
        _last_kv_length(lambda q: 0, "kv_below_q_zero"),
    ),
    "mask_bool": ("the MASK_FREE mask as bool", lambda c: dataclasses.replace(c, mask=_need_mask(c) != 0)),
    "q_rope_other_dtype": (
        "qRope in the other 16-bit float type",
        lambda c: dataclasses.replace(c, q_rope=_other_dtype(c.q_rope)),
    ),
    "v_other_dtype": ("v in the other 16-bit float type", lambda c: dataclasses.replace(c, v=_other_dtype(c.v))),
    "all_fp32": ("every float tensor in fp32", _all_fp32),
    "q_rank4": ("q as [T, H, 2, 64]", _q_rank4),
    "q_rope_flat": ("qRope 2-D while q is 3-D", _q_rope_flat),
    "k_rank2": ("k flattened to 2-D", _k_rank2),
    "q_head_dim_64": ("q's head dim 64 instead of 128", lambda c: dataclasses.replace(c, q=c.q[..., :64].contiguous())),
    "q_rope_short": (
        "qRope with one token row fewer than q",
        lambda c: dataclasses.replace(c, q_rope=c.q_rope[:-1].contiguous()),
    ),
    "k_rope_half": (
        "kRope's last dim halved again",
        lambda c: dataclasses.replace(c, k_rope=c.k_rope[..., : c.k_rope.shape[-1] // 2].contiguous()),
    ),
    "v_short": ("v with one row fewer than k", lambda c: dataclasses.replace(c, v=c.v[:-1].contiguous())),
    # k's own dims (kRope and v keep theirs)
    "k_rows_long": ("packed k with one row more than kRope and v", _k_rows_long),
    "k_heads_extra": ("packed k with kvHeadNum + 1 heads", _k_heads_extra),
    "k_last_dim_long": ("k's last dim one longer", _k_last_dim_long),
    "k_batch_extra": ("padded k with one batch more than qSeqLen", _k_batch_extra),
    "k_capacity_long": ("padded k with one row per batch more than kRope and v", _k_capacity_long),
    # ranks of kRope and v
    "k_rope_rank4": (
        "kRope with a trailing unit dim (4-D)",
        lambda c: dataclasses.replace(c, k_rope=c.k_rope[..., None]),
    ),
    "v_rank4": ("v with a trailing unit dim (4-D)", lambda c: dataclasses.replace(c, v=c.v[..., None])),
    # attenOut as the caller allocates it
    "out_other_dtype": (
        "attenOut in the other 16-bit float type",
        lambda c: dataclasses.replace(c, out_dtype=_OTHER_DTYPE[c.q_rope.dtype]),
    ),
    "out_fp32": ("attenOut in fp32", lambda c: dataclasses.replace(c, out_dtype=torch.float32)),
    "out_flat": ("attenOut 2-D [T, H*128] while q is 3-D", _out_flat),
    "out_rows_short": ("attenOut with one token row fewer than q", _out_rows_short),
    # aclFormat other than ND
    "q_format_nz": ("q passed as FRACTAL_NZ", _formatted("q", ACL_FORMAT_FRACTAL_NZ)),
    "v_format_nchw": ("v passed as NCHW", _formatted("v", ACL_FORMAT_NCHW)),
    "mask_format_nz": ("the mask passed as FRACTAL_NZ", _formatted("mask", ACL_FORMAT_FRACTAL_NZ)),
    "kv_seqlen_format_nchw": ("kvSeqLen passed as NCHW", _formatted("kv_seqlen", ACL_FORMAT_NCHW)),
    "q_rope_format_nhwc": ("qRope passed as NHWC", _formatted("q_rope", ACL_FORMAT_NHWC)),
    "k_format_nhwc": ("k passed as NHWC", _formatted("k", ACL_FORMAT_NHWC)),
    "k_rope_format_nhwc": ("kRope passed as NHWC", _formatted("k_rope", ACL_FORMAT_NHWC)),
    "q_seqlen_format_nhwc": ("qSeqLen passed as NHWC", _formatted("q_seqlen", ACL_FORMAT_NHWC)),
    "out_format_nz": ("attenOut passed as FRACTAL_NZ", _formatted("out", ACL_FORMAT_FRACTAL_NZ)),
    # qSeqLen / kvSeqLen dtype and rank
    "q_seqlen_int64": ("qSeqLen as int64", lambda c: dataclasses.replace(c, q_seqlen=c.q_seqlen.long())),
    "kv_seqlen_fp32": ("kvSeqLen as fp32", lambda c: dataclasses.replace(c, kv_seqlen=c.kv_seqlen.float())),
    "kv_seqlen_rank2": ("kvSeqLen as [B, 1]", lambda c: dataclasses.replace(c, kv_seqlen=c.kv_seqlen[:, None])),
    "q_seqlen_scalar": (
        "qSeqLen as a 0-dim tensor (its first length)",
        lambda c: dataclasses.replace(c, q_seqlen=c.q_seqlen[0].clone()),
    ),
    # null aclTensor* arguments
    "null_q": ("q passed as a null aclTensor*", _null("q")),
    "null_k_rope": ("kRope passed as a null aclTensor*", _null("k_rope")),
    "null_kv_seqlen": ("kvSeqLen passed as a null aclTensor*", _null("kv_seqlen")),
    "null_out": ("attenOut passed as a null aclTensor*", _null("out")),
}


def nearest_valid(spec: CaseSpec) -> CaseSpec:
    """The spec whose inputs an error case perturbs: scalars made legal, shapes otherwise kept."""
    scale_ok = math.isfinite(spec.qk_scale) and 0.0 < spec.qk_scale <= 1.0
    return dataclasses.replace(
        spec,
        head_num=min(max(spec.head_num, 1), MAX_HEADS),
        kv_head_num=min(max(spec.kv_head_num, 1), MAX_HEADS),
        qk_scale=spec.qk_scale if scale_ok else DEFAULT_QK_SCALE,
        mask_type=spec.mask_type if spec.mask_type in SUPPORTED_MASKS else 0,
        cache_mode=1,
        expect_error=None,
        expect_stage=None,
        perturb=None,
    )


def error_call(spec: CaseSpec) -> MlaPrefillCall:
    """The invalid call of an error case: nearest-valid inputs, the case's scalars, its perturbation."""
    if spec.perturb is not None and spec.perturb not in PERTURBATIONS:
        raise ValueError(f"{spec.name}: unknown perturb {spec.perturb!r}; known: {sorted(PERTURBATIONS)}")
    valid = nearest_valid(spec)
    call = dataclasses.replace(
        make_call(generate_inputs(valid), valid),
        head_num=spec.head_num,
        qk_scale=spec.qk_scale,
        kv_head_num=spec.kv_head_num,
        mask_type=spec.mask_type,
        cache_mode=spec.cache_mode,
    )
    return call if spec.perturb is None else PERTURBATIONS[spec.perturb][1](call)


@dataclass(frozen=True)
class ErrorVerdict:
    """How a backend treated an error case."""

    outcome: Outcome
    message: str
    got: tuple[str, str] | None  # (status name, stage) raised, None when the call was accepted
    #: (status name, stage) the case expects from this backend's release (CaseSpec.expected_rejection).
    expected: tuple[str | None, str | None] = (None, None)
    #: The id of the known deviation that applied, for the record.
    deviation: str | None = None

    def ending(self, device: str) -> Ending:
        """How the error-contract test ends: this verdict, with what was expected of the backend's
        release and what it did as evidence, on ``device``."""
        observed, stage = self.got if self.got is not None else (None, None)
        evidence = ErrorEvidence(*self.expected, observed, stage)
        return Ending(self.outcome, self.message, {"error": evidence, "device": device, "deviation": self.deviation})


def _deviation(
    spec: CaseSpec,
    backend: Backend,
    version: str | None,
    deviations: DeviationSet,
    accepted_rejections: tuple[tuple[str | None, str | None], ...],
    got: tuple[str, str] | None,
) -> Deviation | None:
    """A known deviation that predicts something other than the contract for this case (with the release
    unknown, the candidate of every release that explains what was seen: DeviationSet.candidates)."""
    accepted = {error for error, _ in accepted_rejections}
    candidates = [
        d
        for d in deviations.candidates(backend.name, version, spec)
        if not (d.outcome == "error" and d.error_status in accepted)  # predicts the expected rejection
    ]
    met = got is not None and got[0] in accepted
    return explaining(candidates, met, None if got is None else got[0])


def judge_error_case(spec: CaseSpec, backend: Backend, deviations: DeviationSet) -> ErrorVerdict:
    """Run an error case; the contract is met when the backend raises the status its release gives at the stage."""
    if spec.expect_error is None:
        raise ValueError(f"{spec.name}: an error case needs expect_error")
    info = backend.info()
    version = info.version
    # no release and none unknown (a CPU backend, the contract model): the documented answer alone
    accepted = (
        spec.accepted_rejections(version)
        if version is not None or info.release_unknown
        else (spec.expected_rejection(None),)
    )
    call = error_call(spec)
    try:
        backend.run(call)
        backend.synchronize()
        got: tuple[str, str] | None = None
    except BackendError as exc:
        got = (exc.status_name, exc.stage)
    matching = [
        (error, stage) for error, stage in accepted if got is not None and got[0] == error and stage in (None, got[1])
    ]
    met = bool(matching)
    want_error, want_stage = matching[0] if matching else accepted[0]  # the record: which one the device gave
    expected = " or ".join(f"{error} at {stage or 'any stage'}" for error, stage in accepted)
    if len(accepted) > 1:
        expected += (
            f" ({RELEASE_UNKNOWN}; each named release's rejection is accepted)"
            if version is None
            else (f" (release {version} is an unconfirmed boundary: either is accepted, the record keeps which)")
        )
    elif want_error != spec.expect_error or want_stage != spec.expect_stage:
        expected += f" (release {version})"
    seen = "the call was accepted" if got is None else f"got {got[0]} at {got[1]}"
    perturb = f", perturb {spec.perturb}: {PERTURBATIONS[spec.perturb][0]}" if spec.perturb else ""
    subject = (
        f"{spec.name} ({spec.case_id}) [backend {backend.name}, mask {spec.mask_name}, cache {spec.cache_name}, "
        f"headNum {spec.head_num}, kvHeadNum {spec.kv_head_num}, qkScale {spec.qk_scale}{perturb}]"
    )
    deviation = _deviation(spec, backend, version, deviations, accepted, got)
    outcome = outcome_of(met, None if got is None else got[0], deviation)
    detail = f"expected {expected}, {seen}{release_note(version, deviation)}"
    message = outcome_message(subject, outcome, detail, deviation)
    return ErrorVerdict(outcome, message, got, (want_error, want_stage), deviation.id if deviation else None)
