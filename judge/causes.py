"""The likely cause of a failure: goldens recomputed under a catalogue of known kernel mistakes.

Each :class:`Mistake` rewrites a case's inputs and spec so that the float64 reference
(:func:`mlaconf.golden.building.reference.reference_attention`, the golden's own code) computes what a
kernel with that mistake computes.  A mistake *explains* an output when the output's error against
the mistake's golden falls by orders of magnitude from its error against the true golden, to within
the precision model (a few times the emulated same-dtype baseline's own error).  Each mistake costs
one float64 reference pass, so the runner tries the catalogue only for small cases unless asked.
A mistake also planted as a defect (:mod:`mlaconf.harness.defects`) is catalogued once, in
:mod:`mlaconf.facts.mistakes`: its name, its words and its rule come from there.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Literal, Protocol

import numpy as np

from mlaconf.facts.mistakes import (
    CAUSAL_TOP_LEFT,
    GQA_MODULO,
    PADDED_AS_PACKED,
    ROPE_DROPPED,
    SCALE_IGNORED,
    SCALE_IN_INPUT_DTYPE,
    SCALE_TWICE,
    STRIDED_AS_PACKED,
    ignored_scale,
    modulo_kv_heads,
    packed_rows,
    scale_in_input_dtype,
    squared_scale,
    top_left_mask,
)
from mlaconf.facts.operator import NOPE_DIM, ROPE_DIM, V_DIM, as_c_float
from mlaconf.golden.building.reference import reference_attention
from mlaconf.golden.specs.layout import kv_views
from mlaconf.golden.specs.spec import CaseSpec
from mlaconf.golden.specs.types import GoldenCase, OpInputs

#: An explaining mistake's error must be at least this many times smaller than the true golden's.
REDUCTION = 30.0
#: ... and at most this many times the emulated baseline's error (the precision model), or FLOOR.
WITHIN_BASELINE = 8.0
#: Relative error below which an output is "exact" whatever the baseline (a bit-exact baseline has 0).
FLOOR = 1e-3
#: Keys per tile of the "prefix rounded to a tile" mistake (ATB's prefill block).
PREFIX_TILE = 128
#: On by default in the conformance suite for cases of at most this many useful FLOPs (beyond, the
#: catalogue costs more than the case's golden; ``--mla-likely-cause`` forces it).
DEFAULT_FLOPS_LIMIT = 2e9

KV = tuple[np.ndarray, np.ndarray, np.ndarray]  # one batch's k [n, Hkv, 512], kRope [n, Hkv, 64], v [n, Hkv, 128]


class Mistake(Protocol):
    """A known mistake: its name, the sentence the failure line carries, and its golden's case."""

    @property
    def name(self) -> str: ...

    @property
    def text(self) -> str:
        """Completes "output matches the golden with ..."."""
        ...

    def rewrite(self, inputs: OpInputs, spec: CaseSpec) -> tuple[OpInputs, CaseSpec] | None:
        """Inputs and spec whose true golden is this mistake's output; None where it cannot apply."""
        ...


def _packed(inputs: OpInputs, spec: CaseSpec, batches: Sequence[KV], **changes: object) -> tuple[OpInputs, CaseSpec]:
    """A packed-kv case with the same queries and each batch's keys replaced by ``batches``."""
    lengths = tuple(kv[0].shape[0] for kv in batches)
    hkv = batches[0][0].shape[1] if batches else spec.kv_head_num
    stacked = [np.concatenate([kv[i] for kv in batches], axis=0) for i in range(3)]
    new_inputs = dataclasses.replace(
        inputs,
        k=stacked[0],
        k_rope=stacked[1],
        v=stacked[2],
        kv_seqlen=np.asarray(lengths, dtype=np.int32),
    )
    fields: dict[str, object] = {"kv_seqlen": lengths, "kv_layout": "packed", "kv_capacity": None, "kv_head_num": hkv}
    fields.update(changes)
    return new_inputs, dataclasses.replace(spec, **fields)  # type: ignore[arg-type]


def _batches(inputs: OpInputs, spec: CaseSpec) -> list[KV]:
    return [kv_views(inputs, spec, b) for b in range(spec.batch)]


@dataclass(frozen=True)
class CausalTopLeft:
    name: str = CAUSAL_TOP_LEFT.name
    text: str = CAUSAL_TOP_LEFT.explains

    def rewrite(self, inputs: OpInputs, spec: CaseSpec) -> tuple[OpInputs, CaseSpec] | None:
        if top_left_mask(spec.mask_type) == spec.mask_type or spec.q_seqlen == spec.kv_seqlen:
            return None
        return inputs, dataclasses.replace(spec, mask_type=top_left_mask(spec.mask_type))


@dataclass(frozen=True)
class CausalMaskDropped:
    name: str = "causal_mask_dropped"
    text: str = "no causal mask (every key visible)"

    def rewrite(self, inputs: OpInputs, spec: CaseSpec) -> tuple[OpInputs, CaseSpec] | None:
        return None if spec.mask_type == 0 else (inputs, dataclasses.replace(spec, mask_type=0))


@dataclass(frozen=True)
class ScaleIgnored:
    name: str = SCALE_IGNORED.name
    text: str = SCALE_IGNORED.explains

    def rewrite(self, inputs: OpInputs, spec: CaseSpec) -> tuple[OpInputs, CaseSpec] | None:
        return (
            None if spec.qk_scale == 1.0 else (inputs, dataclasses.replace(spec, qk_scale=ignored_scale(spec.qk_scale)))
        )


@dataclass(frozen=True)
class ScaleTwice:
    name: str = SCALE_TWICE.name
    text: str = SCALE_TWICE.explains

    def rewrite(self, inputs: OpInputs, spec: CaseSpec) -> tuple[OpInputs, CaseSpec] | None:
        return (
            None if spec.qk_scale == 1.0 else (inputs, dataclasses.replace(spec, qk_scale=squared_scale(spec.qk_scale)))
        )


@dataclass(frozen=True)
class ScaleInInputDtype:
    name: str = SCALE_IN_INPUT_DTYPE.name
    text: str = SCALE_IN_INPUT_DTYPE.explains

    def rewrite(self, inputs: OpInputs, spec: CaseSpec) -> tuple[OpInputs, CaseSpec] | None:
        rounded = scale_in_input_dtype(spec.qk_scale, spec.dtype)
        if rounded == as_c_float(spec.qk_scale):
            return None
        return inputs, dataclasses.replace(spec, qk_scale=rounded)


@dataclass(frozen=True)
class RopeDropped:
    name: str = ROPE_DROPPED.name
    text: str = ROPE_DROPPED.explains

    def rewrite(self, inputs: OpInputs, spec: CaseSpec) -> tuple[OpInputs, CaseSpec] | None:
        return dataclasses.replace(inputs, q_rope=np.zeros_like(inputs.q_rope)), spec


@dataclass(frozen=True)
class GqaModulo:
    name: str = GQA_MODULO.name
    text: str = GQA_MODULO.explains

    def rewrite(self, inputs: OpInputs, spec: CaseSpec) -> tuple[OpInputs, CaseSpec] | None:
        if spec.kv_head_num in (1, spec.head_num):
            return None
        order = np.asarray(modulo_kv_heads(spec.head_num, spec.kv_head_num))
        batches = [(k[:, order], kr[:, order], v[:, order]) for k, kr, v in _batches(inputs, spec)]
        return _packed(inputs, spec, batches, kv_head_num=spec.head_num)


def _read_as_packed(inputs: OpInputs, spec: CaseSpec) -> tuple[OpInputs, CaseSpec]:
    """The case's kv buffer read at packed offsets (facts/mistakes.py packed_rows)."""
    hkv, total = spec.kv_head_num, spec.total_kv
    k, kr, v = (
        a.reshape(-1, hkv, d)[:total] for a, d in ((inputs.k, NOPE_DIM), (inputs.k_rope, ROPE_DIM), (inputs.v, V_DIM))
    )
    return _packed(inputs, spec, [(k[s:e], kr[s:e], v[s:e]) for s, e in packed_rows(spec.kv_seqlen)])


@dataclass(frozen=True)
class PaddedAsPacked:
    name: str = PADDED_AS_PACKED.name
    text: str = PADDED_AS_PACKED.explains

    def rewrite(self, inputs: OpInputs, spec: CaseSpec) -> tuple[OpInputs, CaseSpec] | None:
        if spec.kv_layout != "padded" or all(n == spec.padded_rows for n in spec.kv_seqlen[:-1]):
            return None
        return _read_as_packed(inputs, spec)


@dataclass(frozen=True)
class StridedAsPacked:
    name: str = STRIDED_AS_PACKED.name
    text: str = STRIDED_AS_PACKED.explains

    def rewrite(self, inputs: OpInputs, spec: CaseSpec) -> tuple[OpInputs, CaseSpec] | None:
        return _read_as_packed(inputs, spec) if spec.kv_layout == "strided" else None


@dataclass(frozen=True)
class LastKeyDropped:
    name: str = "last_key_dropped"
    text: str = "the last key of every sequence dropped"

    def rewrite(self, inputs: OpInputs, spec: CaseSpec) -> tuple[OpInputs, CaseSpec] | None:
        batches = _batches(inputs, spec)
        if not any(kv[0].shape[0] > 1 for kv in batches):
            return None
        return _packed(inputs, spec, [tuple(a[:-1] if a.shape[0] > 1 else a for a in kv) for kv in batches])  # type: ignore[misc]


@dataclass(frozen=True)
class PrefixRoundedToTile:
    name: str = "prefix_rounded_to_tile"
    text: str = f"the prefix rounded down to a tile of {PREFIX_TILE} keys (its partial last tile skipped)"

    def rewrite(self, inputs: OpInputs, spec: CaseSpec) -> tuple[OpInputs, CaseSpec] | None:
        if spec.mask_type != 3:
            return None
        batches: list[KV] = []
        changed = False
        for (k, kr, v), q_len in zip(_batches(inputs, spec), spec.q_seqlen, strict=True):
            prefix = k.shape[0] - q_len
            cut = prefix % PREFIX_TILE if prefix > 0 else 0
            keep = np.r_[0 : prefix - cut, prefix : k.shape[0]]
            batches.append((k[keep], kr[keep], v[keep]))
            changed |= cut > 0
        return _packed(inputs, spec, batches) if changed else None


#: The catalogue, most specific first (a tie keeps the earlier one).
CATALOGUE: tuple[Mistake, ...] = (
    CausalTopLeft(),
    PrefixRoundedToTile(),
    LastKeyDropped(),
    PaddedAsPacked(),
    StridedAsPacked(),
    GqaModulo(),
    ScaleInInputDtype(),
    ScaleIgnored(),
    ScaleTwice(),
    RopeDropped(),
    CausalMaskDropped(),
)


@dataclass(frozen=True)
class Cause:
    """A mistake that explains an output, with the errors that show it."""

    name: str
    text: str
    error: float  # the output's relative error against the mistake's golden
    true_error: float  # ... against the true golden
    baseline_error: float  # the emulated same-dtype baseline's against the true golden

    def sentence(self) -> str:
        return f"output matches the golden with {self.text}"

    def to_dict(self) -> dict[str, object]:
        return {
            "name": self.name,
            "text": self.sentence(),
            "error": float(f"{self.error:.3g}"),
            "true_error": float(f"{self.true_error:.3g}"),
            "baseline_error": float(f"{self.baseline_error:.3g}"),
        }


def relative_error(out: np.ndarray, golden: np.ndarray, valid: np.ndarray) -> float:
    """``||out - g|| / ||g||`` over the valid token rows (inf when out holds NaN/Inf)."""
    rows = valid.shape[0]
    got = np.asarray(out, dtype=np.float64).reshape(rows, -1)[valid]
    want = np.asarray(golden, dtype=np.float64).reshape(rows, -1)[valid]
    if not np.all(np.isfinite(got)):
        return float("inf")
    norm = float(np.linalg.norm(want))
    return float(np.linalg.norm(got - want)) / max(norm, 1e-300)


def mistake_goldens(
    golden: GoldenCase, catalogue: Sequence[Mistake] = CATALOGUE
) -> Iterator[tuple[Mistake, np.ndarray]]:
    """Each applicable mistake with its float64 golden in attenOut's layout."""
    for mistake in catalogue:
        rewritten = mistake.rewrite(golden.inputs, golden.spec)
        if rewritten is not None:
            # A rewrite may leave a causal row no key (last_key_dropped on a one-key row): its 0/0 is NaN, which no
            # output matches (relative_error is then NaN, never an explanation); not a warning in the user's run.
            with np.errstate(invalid="ignore", divide="ignore"):
                out, _ = reference_attention(*rewritten)
            yield mistake, out


def likely_cause(golden: GoldenCase, out: np.ndarray, catalogue: Sequence[Mistake] = CATALOGUE) -> Cause | None:
    """The catalogued mistake that explains ``out``, or None (the best explaining one when several do)."""
    valid = golden.row_valid
    true_error = relative_error(out, golden.out, valid)
    if not np.isfinite(true_error):
        return None
    baseline_error = relative_error(golden.baseline_out, golden.out, valid)
    limit = max(WITHIN_BASELINE * baseline_error, FLOOR)
    if true_error <= limit:  # nothing to explain: the output is within the precision model already
        return None
    best: Cause | None = None
    for mistake, mistaken in mistake_goldens(golden, catalogue):
        error = relative_error(out, mistaken, valid)
        if error * REDUCTION <= true_error and error <= limit and (best is None or error < best.error):
            best = Cause(mistake.name, mistake.text, error, true_error, baseline_error)
    return best


#: Which failing cases the runner tries the catalogue on: every one, only those whose diagnosis costs less than
#: their golden (the default), or none (a power run wants verdicts only: a diagnosis recomputes the reference
#: once per catalogued mistake).
CauseScope = Literal["all", "small", "none"]


def worth_trying(spec: CaseSpec, scope: CauseScope) -> bool:
    """Whether the runner tries the catalogue on a failing case of ``spec`` under ``scope`` (never on a sampled
    golden, whose rows a mistake's full golden would have to be computed for first)."""
    return not spec.sampled and (scope == "all" or (scope == "small" and spec.useful_flops <= DEFAULT_FLOPS_LIMIT))
