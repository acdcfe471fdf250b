"""The case spec: one MLA prefill invocation, fully determined, and what derives from it (sizes,
names, the content hash and case id that address its golden file, the expected rejection of an
error case at a release).

Only the model lives here; a table of fields becomes a validated :class:`CaseSpec` in
:mod:`mlaconf.golden.specs.spec_build`, and suite files are read in :mod:`mlaconf.golden.specs.suites`, so
whatever holds a spec (the store, the judge, the runner) needs neither the TOML reader nor the
validation rules."""

from __future__ import annotations

import dataclasses
import hashlib
import json
from dataclasses import dataclass, field
from typing import Any

from mlaconf.facts.operator import CACHE_NAMES, DEFAULT_QK_SCALE, DOCUMENTED_FILL, FP16_MAX, MASK_NAMES, useful_flops
from mlaconf.facts.releases import in_range, parse_range

DISTRIBUTIONS = ("uniform", "normal", "large_logits", "near_tie", "v_outliers", "large_raw_scores")
#: ``large_raw_scores``: the scaled logits span +-RAW_SCORE_LOGIT, so the raw products q.k reach
#: RAW_SCORE_LOGIT / qkScale (70,000 at qkScale 1e-4: past fp16's 65504 while the answer stays moderate).
RAW_SCORE_LOGIT = 7.0
#: How far that aim must stay from fp16's largest value (relative), so the drawn products, within a few tenths of a
#: percent of it, fall on one side: past it (every one of the first keys overflows fp16) or below it.
RAW_PEAK_CLEARANCE = 0.05
#: What the kv rows no batch reads hold (``padding``; None: the generator's finite garbage).
PADDINGS = ("garbage", "nan")
#: ``rows = "sample"``: the seeded random rows a sampled golden adds to its chosen ones (golden/specs/sample.py).
DEFAULT_RANDOM_ROWS = 64
#: Trends of the logits along the key position (:class:`Structure`; docs/conformance.md "Structured inputs").
LOGIT_TRENDS = ("recency", "sinks", "late_max")


class SpecError(ValueError):
    """A case spec is malformed or violates the operator contract; names file, case and field."""

    def __init__(self, source: str, case: str, field_name: str, message: str) -> None:
        self.source, self.case, self.field_name = source, case, field_name
        super().__init__(f"{source}: case {case!r}: field {field_name!r}: {message}")


@dataclass(frozen=True)
class Structure:
    """Inputs with structure along the key position and across heads (what i.i.d. draws never have).

    ``logits`` adds a trend to every row's scaled logits through one reserved score dimension (the
    first rope column: q carries a constant, k a function of the key's position in its sequence):
    ``recency`` rises linearly by ``rise`` from the first to the last key (ALiBi-like: for a softmax,
    a bias on j equals one on j - i), ``sinks`` lifts the first ``sink_keys`` keys by ``rise``,
    ``late_max`` lifts every key from position ``late_from`` on by ``rise`` (a maximum that appears
    only after several key blocks).  ``logit_shift`` adds one constant to every scaled logit through the
    same dimension (no trend beside it): the logits' level, which softmax ignores and an exp without the
    right running maximum does not.  ``head_temperature`` multiplies the random part of q of head 0
    by the first value and of the last head by the second (geometric in between).  ``v_scale``
    multiplies V at the first and the last key of a sequence (geometric in between); ``v_mean``
    adds ``+-v_mean`` (one sign per kv head and column) to V.  golden/building/inputs.py draws them.
    """

    logits: str | None = None
    rise: float | None = None
    sink_keys: int | None = None
    late_from: int | None = None
    head_temperature: tuple[float, float] | None = None
    v_scale: tuple[float, float] | None = None
    v_mean: float | None = None
    logit_shift: float | None = None

    def content(self) -> dict[str, Any]:
        """The fields that are set (what the case hash covers)."""
        return {
            f.name: _jsonable(getattr(self, f.name))
            for f in dataclasses.fields(self)
            if getattr(self, f.name) is not None
        }

    @property
    def label(self) -> str:
        """A short name for case ids, e.g. ``late_max-temp-vpos``."""
        parts = [self.logits] if self.logits else []
        parts += [
            tag
            for tag, value in (("temp", self.head_temperature), ("vpos", self.v_scale), ("vmean", self.v_mean))
            if value is not None
        ]
        if self.logit_shift is not None:
            parts.append(f"shift{self.logit_shift:+g}")
        return "-".join(p for p in parts if p)

    def toml(self) -> str:
        """An inline TOML table."""
        return "{ " + ", ".join(f"{k} = {json.dumps(v)}" for k, v in self.content().items()) + " }"


@dataclass(frozen=True)
class CaseSpec:
    """One MLA prefill invocation, fully determined (inputs derive from it and its seed)."""

    q_seqlen: tuple[int, ...]
    kv_seqlen: tuple[int, ...]
    head_num: int
    kv_head_num: int
    dtype: str = "fp16"
    mask_type: int = 0
    cache_mode: int = 1
    qk_scale: float = DEFAULT_QK_SCALE
    q_layout: str = "3d"
    #: ``packed`` ``[sum kv, Hkv, D]``, ``padded`` ``[B, S, Hkv*D]`` or ``strided`` ``[B * max kv, Hkv, D]``
    #: (facts/operator.py KV_LAYOUTS).
    kv_layout: str = "packed"
    #: The kv buffer's capacity (None: no more than the layout needs): padded, the rows per batch S of
    #: ``[B, S, Hkv*D]`` (default max kvSeqLen); packed, k's first dim (spare rows after the last batch).
    kv_capacity: int | None = None
    distribution: str = "uniform"
    #: Structured inputs (None: i.i.d. draws only); absent from the content when None, so the hashes of
    #: unstructured cases did not change when it was added.
    structure: Structure | None = None
    #: MASK_FREE only: the value above the mask's diagonal by name (facts/operator.py MASK_FILLS; None: the
    #: documented one for the dtype); absent from the content when None, like the two fields below.
    mask_fill: str | None = None
    #: What the kv rows no batch reads hold (:data:`PADDINGS`; None: finite garbage).
    padding: str | None = None
    seed: int = 0
    #: Explicit inputs (an imported dump's call): the content hash of the tensor bundle in the golden
    #: store's ``inputs/`` folder (golden/store/bundles.py) that replaces the seeded draws; absent from the
    #: content when None, so the hashes of generated cases did not change when it was added.
    inputs: str | None = None
    #: Which rows the golden holds: None every row; an int, a row sample (golden/specs/sample.py: the chosen
    #: rows plus that many seeded random ones).  Absent from the content when None, so the hashes of full
    #: cases did not change when it was added; never part of the inputs' seed (:attr:`inputs_key`).
    rows: int | None = None
    expect_error: str | None = None
    expect_stage: str | None = None
    perturb: str | None = None
    #: Error cases only: ``(versions, status, stage)`` for releases whose rejection differs from
    #: ``expect_error``/``expect_stage`` (the documented, newest behaviour); the first matching range wins.
    expect_by_release: tuple[tuple[str, str, str | None], ...] = ()
    name: str = field(default="", compare=False)
    suite: str = field(default="", compare=False)
    source: str = field(default="", compare=False)
    #: The upstream (ATB) commit an error case's expectation was read at; provenance, not content.
    source_commit: str = field(default="", compare=False)
    #: Error cases only: releases whose rejection is unconfirmed (e.g. a fix that reached the branch as a
    #: late cherry-pick): there every rejection the case names is accepted and the record says which one
    #: was seen.  Provenance, not content.
    unconfirmed_at: tuple[str, ...] = field(default=(), compare=False)

    # -- derived properties -------------------------------------------------------------
    @property
    def batch(self) -> int:
        return len(self.q_seqlen)

    @property
    def total_q(self) -> int:
        return sum(self.q_seqlen)

    @property
    def total_kv(self) -> int:
        return sum(self.kv_seqlen)

    @property
    def max_q(self) -> int:
        return max(self.q_seqlen, default=0)

    @property
    def max_kv(self) -> int:
        return max(self.kv_seqlen, default=0)

    @property
    def padded_rows(self) -> int:
        """S of the padded kv layout ``[B, S, Hkv*D]``."""
        return self.kv_capacity if self.kv_capacity is not None else self.max_kv

    @property
    def kv_rows(self) -> int:
        """Rows of k, kRope and v viewed as ``[rows, Hkv, D]``: ``B * S`` padded, ``B * max kv`` strided, the
        sum of the kv lengths packed (or its capacity, with spare rows)."""
        if self.kv_layout == "padded":
            return self.batch * self.padded_rows
        if self.kv_layout == "strided":
            return self.batch * self.max_kv
        return self.total_kv if self.kv_capacity is None else self.kv_capacity

    @property
    def useful_flops(self) -> int:
        """FLOPs of the attention itself (facts.operator.useful_flops)."""
        return useful_flops(self.mask_type, self.q_seqlen, self.kv_seqlen, self.head_num)

    @property
    def sampled(self) -> bool:
        """Whether the golden holds a row sample rather than every row."""
        return self.rows is not None

    @property
    def mask_fill_name(self) -> str | None:
        """The MASK_FREE mask's fill by name (the dtype's documented one unless ``mask_fill`` says); None without
        a mask."""
        if self.mask_type != 2:
            return None
        return self.mask_fill or DOCUMENTED_FILL.get(self.dtype)

    @property
    def raw_score_peak(self) -> float | None:
        """The largest |q.k| (unscaled) the draws aim at: ``large_raw_scores`` only (None: far below fp16's range)."""
        return RAW_SCORE_LOGIT / self.qk_scale if self.distribution == "large_raw_scores" else None

    @property
    def raw_scores_past_fp16(self) -> bool:
        """Whether the raw products aimed at lie beyond fp16's largest value (an fp16 score store overflows)."""
        peak = self.raw_score_peak
        return peak is not None and peak > FP16_MAX

    @property
    def mask_name(self) -> str:
        return MASK_NAMES.get(self.mask_type, f"mask{self.mask_type}")

    @property
    def cache_name(self) -> str:
        return CACHE_NAMES.get(self.cache_mode, f"cache{self.cache_mode}")

    def content(self) -> dict[str, Any]:
        """The fields that determine inputs and outputs (what the hash covers).

        ``expect_by_release``, ``structure``, ``inputs``, ``mask_fill``, ``padding`` and ``rows`` count only when
        given, so the cases without them keep their hashes."""
        skip = {"name", "suite", "source", "source_commit", "expect_by_release", "unconfirmed_at"}
        skip |= {
            name for name in ("structure", "inputs", "mask_fill", "padding", "rows") if getattr(self, name) is None
        }
        data = {f.name: _jsonable(getattr(self, f.name)) for f in dataclasses.fields(self) if f.name not in skip}
        if self.expect_by_release:
            data["expect_by_release"] = [
                {"versions": v, "expect_error": e, "expect_stage": st} for v, e, st in self.expect_by_release
            ]
        return data

    def expected_rejection(self, release: str | None) -> tuple[str | None, str | None]:
        """``(status, stage)`` this error case expects from ``release`` (None: the documented one)."""
        if release is not None:
            for versions, error, stage in self.expect_by_release:
                try:
                    if in_range(release, parse_range(versions)):
                        return error, stage
                except ValueError:
                    break  # an unparsable release cannot be placed: the documented expectation
        return self.expect_error, self.expect_stage

    def accepted_rejections(self, release: str | None) -> tuple[tuple[str | None, str | None], ...]:
        """Every ``(status, stage)`` that meets this case's contract at ``release``: the one its release
        gives, or, with the release unknown or at an unconfirmed boundary (``unconfirmed_at``), each
        rejection it names (documented first): the device decides, the record says which."""
        uncertain = release is None or any(release.startswith(bound) for bound in self.unconfirmed_at)
        if not uncertain or not self.expect_by_release:
            return (self.expected_rejection(release),)
        named = [(self.expect_error, self.expect_stage), *((e, st) for _, e, st in self.expect_by_release)]
        return tuple(dict.fromkeys(named))

    @property
    def content_hash(self) -> str:
        blob = json.dumps(self.content(), sort_keys=True, separators=(",", ":")).encode()
        return hashlib.sha256(blob).hexdigest()

    @property
    def inputs_key(self) -> str:
        """What seeds the inputs: the content hash without ``rows``, so a case and its sampled twin draw the
        same tensors (and a full case's key is its content hash, as before)."""
        content = {key: value for key, value in self.content().items() if key != "rows"}
        return hashlib.sha256(json.dumps(content, sort_keys=True, separators=(",", ":")).encode()).hexdigest()

    @property
    def short_hash(self) -> str:
        return self.content_hash[:8]

    @property
    def readable_id(self) -> str:
        parts = [self.dtype, self.mask_name, self.cache_name, f"b{self.batch}", f"s{self.max_q}"]
        if self.max_kv != self.max_q:
            parts.append(f"kv{self.max_kv}")
        parts.append(f"h{self.head_num}")
        if self.kv_head_num != self.head_num:
            parts.append(f"g{self.kv_head_num}")
        parts += [f"q{self.q_layout}", self.kv_layout]
        if self.kv_capacity is not None:
            parts.append(f"cap{self.kv_capacity}")
        if self.distribution != "uniform":
            parts.append(self.distribution)
        if self.structure is not None:
            parts.append(self.structure.label)
        if self.mask_fill is not None:
            parts.append(f"fill_{self.mask_fill}")
        if self.padding is not None:
            parts.append(f"pad_{self.padding}")
        if self.inputs is not None:
            parts.append("dump")
        if self.rows is not None:
            parts.append("sampled")
        if self.expect_error:
            parts.append(f"err-{self.perturb or 'param'}")
        return "-".join(parts)

    @property
    def case_id(self) -> str:
        """Readable name plus a short content hash, e.g. ``bf16-causal-krope_ctkv-b4-s1024-h16-...``."""
        return f"{self.readable_id}-{self.short_hash}"

    def to_json(self) -> str:
        data = self.content()
        data.update(name=self.name, suite=self.suite, source=self.source)
        if self.source_commit:
            data["source_commit"] = self.source_commit
        if self.unconfirmed_at:
            data["unconfirmed_at"] = list(self.unconfirmed_at)
        return json.dumps(data, sort_keys=True)

    def to_toml(self) -> str:
        """A ``[[case]]`` snippet that can be pasted into a suite file."""
        lines = ["[[case]]"]
        for key, value in self.content().items():
            if value is None or (key == "qk_scale" and value == DEFAULT_QK_SCALE):
                continue
            if key in CODE_NAMES:  # the names a suite file writes (mask_type = "causal"), not the C enum's codes
                value = CODE_NAMES[key].get(value, value)
            text = self.structure.toml() if key == "structure" and self.structure else json.dumps(value)
            lines.append(f"{key} = {text}")
        return "\n".join(lines) + "\n"


#: Fields written by name in a suite file, code -> name.
CODE_NAMES: dict[str, dict[int, str]] = {"mask_type": MASK_NAMES, "cache_mode": CACHE_NAMES}


def _jsonable(value: Any) -> Any:
    if isinstance(value, tuple):
        return list(value)
    if isinstance(value, Structure):
        return value.content()
    return value
