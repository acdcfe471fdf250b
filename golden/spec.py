"""Declarative case specs: TOML suites, matrix expansion, validation and case ids.

A suite file holds ``[suite]`` (name, description), optional ``[defaults]``, any number of
``[[case]]`` tables and ``[[matrix]]`` tables.  A matrix expands the product of its list-valued
fields; an axis whose alternatives are tables sets several fields at once (e.g. a batch's q and kv
lengths together).  Validation follows the operator contract (docs/operator.md §2-3); a case
flagged ``expect_error`` skips value validation because it exists to be rejected.
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib.resources
import itertools
import json
import math
import re
import sys
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeGuard

from mlaconf.facts.operator import (
    CACHE_CODES,
    CACHE_NAMES,
    DEFAULT_QK_SCALE,
    DTYPES,
    INT32_MAX,
    INT32_MIN,
    KV_LAYOUTS,
    MASK_CODES,
    MASK_NAMES,
    MAX_BATCH,
    MAX_HEADS,
    Q_LAYOUTS,
    SUPPORTED_MASKS,
    as_c_float,
    useful_flops,
)
from mlaconf.facts.releases import in_range, parse_range
from mlaconf.facts.status import STAGES

if sys.version_info >= (3, 11):
    import tomllib
else:  # Python 3.10: the same parser, from PyPI
    import tomli as tomllib

#: Seeds are in [0, SEED_LIMIT): stored as an int64 attribute; numpy's SeedSequence needs them >= 0.
SEED_LIMIT = 2**63
#: Most entries of a length list in any case: error cases may exceed B <= MAX_BATCH to test it.
MAX_LIST = 2 * MAX_BATCH
#: Most cases one suite file may define (matrix products are counted before they are expanded) and
#: most sequence-length entries in all its cases together.
MAX_CASES = 10_000
MAX_FILE_ENTRIES = 1 << 21
MAX_SUITE_BYTES = 16 << 20
#: Names (case, suite) and perturbation names: no path separators, no leading dot, bounded length.
SAFE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+-]{0,127}")
SAFE_PERTURB = re.compile(r"[a-z0-9_]{1,64}")
SAFE_STATUS = re.compile(r"ERROR_[A-Z0-9_]{1,64}")

DISTRIBUTIONS = ("uniform", "normal", "large_logits", "near_tie", "v_outliers")
#: Trends of the logits along the key position (:class:`Structure`; docs/conformance.md "Structured inputs").
LOGIT_TRENDS = ("recency", "sinks", "late_max")
#: Bounds of the structure's parameters: wide enough for every documented use, narrow enough that the
#: fp16 score path (raw Q.K stored in fp16) stays far from overflow (:data:`FP16_RAW_SCORE_LIMIT`).
MAX_RISE = 128.0
MAX_TEMPERATURE = 16.0
MAX_V_SCALE = 64.0
#: Largest |qkScale^-1 * rise| allowed in an fp16 case: the trend's raw Q.K product, which the fp16
#: maskType 0/2 kernels store as fp16 (max 65504), stays 8x below overflow with the random part on top.
FP16_RAW_SCORE_LIMIT = 8192.0

#: The package whose ``*.toml`` files are the shipped suites (package data, so installs carry them).
SUITES_PACKAGE = "mlaconf.cases"


def suites_dir() -> Path:
    """Where the shipped suite files live, in a checkout or an installed package alike."""
    return Path(str(importlib.resources.files(SUITES_PACKAGE)))


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
    only after several key blocks).  ``head_temperature`` multiplies the random part of q of head 0
    by the first value and of the last head by the second (geometric in between).  ``v_scale``
    multiplies V at the first and the last key of a sequence (geometric in between); ``v_mean``
    adds ``+-v_mean`` (one sign per kv head and column) to V.  golden/inputs.py draws them.
    """

    logits: str | None = None
    rise: float | None = None
    sink_keys: int | None = None
    late_from: int | None = None
    head_temperature: tuple[float, float] | None = None
    v_scale: tuple[float, float] | None = None
    v_mean: float | None = None

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
        return "-".join(p for p in parts if p)

    def toml(self) -> str:
        """An inline TOML table."""
        return "{ " + ", ".join(f"{k} = {json.dumps(v)}" for k, v in self.content().items()) + " }"


_STRUCTURE_FIELDS = {f.name for f in dataclasses.fields(Structure)}


def _positive(value: Any, limit: float) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and 0.0 < value <= limit


def _pair(value: Any, low: float, high: float) -> bool:
    return isinstance(value, (list, tuple)) and len(value) == 2 and all(_positive(v, high) and v >= low for v in value)


def build_structure(raw: Any, fail: Fail) -> Structure:
    """Parse a ``structure = { ... }`` table; any problem names the field ``structure.<key>``."""
    if isinstance(raw, Structure):
        return raw
    if not isinstance(raw, Mapping):
        raise fail("structure", f"must be a table such as {{ logits = 'sinks', rise = 8.0 }}, got {_show(raw)}")
    unknown = set(raw) - _STRUCTURE_FIELDS
    if unknown:
        raise fail(f"structure.{sorted(unknown)[0]}", f"unknown key; known keys: {sorted(_STRUCTURE_FIELDS)}")
    if not raw:
        raise fail("structure", "an empty structure table; leave it out instead")
    logits = raw.get("logits")
    if logits is not None and logits not in LOGIT_TRENDS:
        raise fail("structure.logits", f"must be one of {list(LOGIT_TRENDS)}, got {_show(logits)}")
    needs = {"rise": logits is not None, "sink_keys": logits == "sinks", "late_from": logits == "late_max"}
    for key, needed in needs.items():
        if needed and key not in raw:
            raise fail(f"structure.{key}", f"is required with logits = {logits!r}")
        if not needed and key in raw:
            what = "a logits trend" if key == "rise" else f"logits = {'sinks' if key == 'sink_keys' else 'late_max'}"
            raise fail(f"structure.{key}", f"only allowed with {what}")
    if "rise" in raw and not _positive(raw["rise"], MAX_RISE):
        raise fail("structure.rise", f"must be a number in (0, {MAX_RISE:g}], got {_show(raw['rise'])}")
    for key in ("sink_keys", "late_from"):
        if key in raw and not (_is_int(raw[key]) and 1 <= raw[key] <= INT32_MAX):
            raise fail(f"structure.{key}", f"must be a positive integer, got {_show(raw[key])}")
    pairs = {"head_temperature": MAX_TEMPERATURE, "v_scale": MAX_V_SCALE}
    for key, limit in pairs.items():
        if key in raw and not _pair(raw[key], 1.0 / limit, limit):
            raise fail(f"structure.{key}", f"must be two numbers in [{1 / limit:g}, {limit:g}], got {_show(raw[key])}")
    if "v_mean" in raw and not _positive(raw["v_mean"], MAX_V_SCALE):
        raise fail("structure.v_mean", f"must be a number in (0, {MAX_V_SCALE:g}], got {_show(raw['v_mean'])}")
    return Structure(
        logits=logits,
        rise=float(raw["rise"]) if "rise" in raw else None,
        sink_keys=raw.get("sink_keys"),
        late_from=raw.get("late_from"),
        head_temperature=tuple(float(v) for v in raw["head_temperature"]) if "head_temperature" in raw else None,  # type: ignore[arg-type]
        v_scale=tuple(float(v) for v in raw["v_scale"]) if "v_scale" in raw else None,  # type: ignore[arg-type]
        v_mean=float(raw["v_mean"]) if "v_mean" in raw else None,
    )


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
    kv_layout: str = "packed"
    #: Padded layout only: rows per batch S of ``[B, S, Hkv*D]`` (None: max kvSeqLen).
    kv_capacity: int | None = None
    distribution: str = "uniform"
    #: Structured inputs (None: i.i.d. draws only); absent from the content when None, so the hashes of
    #: unstructured cases did not change when it was added.
    structure: Structure | None = None
    seed: int = 0
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
    def useful_flops(self) -> int:
        """FLOPs of the attention itself (facts.operator.useful_flops)."""
        return useful_flops(self.mask_type, self.q_seqlen, self.kv_seqlen, self.head_num)

    @property
    def mask_name(self) -> str:
        return MASK_NAMES.get(self.mask_type, f"mask{self.mask_type}")

    @property
    def cache_name(self) -> str:
        return CACHE_NAMES.get(self.cache_mode, f"cache{self.cache_mode}")

    def content(self) -> dict[str, Any]:
        """The fields that determine inputs and outputs (what the hash covers).

        ``expect_by_release`` and ``structure`` count only when given, so the cases without them keep
        their hashes."""
        skip = {"name", "suite", "source", "source_commit", "expect_by_release", "unconfirmed_at"}
        if self.structure is None:
            skip.add("structure")
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
            text = self.structure.toml() if key == "structure" and self.structure else json.dumps(value)
            lines.append(f"{key} = {text}")
        return "\n".join(lines) + "\n"

    @classmethod
    def from_json(cls, text: str) -> CaseSpec:
        try:
            data = json.loads(text)
        except (ValueError, RecursionError) as exc:
            raise SpecError("<json>", "<spec>", "<json>", f"not valid JSON: {exc}") from exc
        if not isinstance(data, dict):
            raise SpecError("<json>", "<spec>", "<json>", f"must be a JSON object, got {_show(data)}")
        source = data.get("source", "<json>")
        return build_case(data, source=source if isinstance(source, str) else "<json>", validate=False)


def _jsonable(value: Any) -> Any:
    if isinstance(value, tuple):
        return list(value)
    if isinstance(value, Structure):
        return value.content()
    return value


# -- construction and validation ---------------------------------------------------------

_FIELD_NAMES = {f.name for f in dataclasses.fields(CaseSpec)}


def _show(value: Any) -> str:
    """A value for an error message: one line, bounded."""
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _is_int(value: Any) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)


Fail = Callable[[str, str], SpecError]


def _expand_lengths(value: Any, limit: int, fail: Fail, name: str) -> tuple[int, ...]:
    """Accept ``[1, 2, 3]`` or the compact ``{pattern = [1, 2], times = 4096}``; the length is checked
    against ``limit`` before anything is expanded, every entry against int32."""

    def too_long(count: int) -> SpecError:
        if limit == MAX_BATCH:
            return fail(name, f"batch size must be in [1, {MAX_BATCH}], got {count}")
        return fail(name, f"at most {limit} entries (error cases may exceed B <= {MAX_BATCH}), got {count}")

    if isinstance(value, Mapping):
        unknown = set(value) - {"pattern", "times"}
        if unknown or "pattern" not in value:
            raise fail(name, "a compact length table needs 'pattern' (list) and 'times'")
        pattern, times = value["pattern"], value.get("times", 1)
        if not isinstance(pattern, (list, tuple)):
            raise fail(name, f"'pattern' must be a list of integers, got {_show(pattern)}")
        if not _is_int(times) or times < 1:
            raise fail(name, f"'times' must be a positive integer, got {_show(times)}")
        if len(pattern) * times > limit:
            raise too_long(len(pattern) * times)
        value = list(pattern) * times
    if not isinstance(value, (list, tuple)):
        raise fail(name, f"must be a list of integers, got {_show(value)}")
    if len(value) > limit:
        raise too_long(len(value))
    for item in value:
        if not _is_int(item):
            raise fail(name, f"must hold integers, got {_show(item)}")
        if not INT32_MIN <= item <= INT32_MAX:
            raise fail(name, f"lengths must fit int32, got {item}")
    return tuple(int(item) for item in value)


def _coerce_enum(value: Any, codes: Mapping[str, int], fail: Fail, name: str) -> int:
    if isinstance(value, str):
        key = value.lower()
        if key not in codes:
            raise fail(name, f"unknown name {_show(value)}; expected one of {sorted(codes)}")
        return codes[key]
    if _is_int(value) and INT32_MIN <= value <= INT32_MAX:
        return int(value)
    raise fail(name, f"must be an int32 or a name, got {_show(value)}")


def _check_fields(raw: Mapping[str, Any], fail: Fail) -> None:
    """Type and range of every field but the lengths and enums (whatever the case, valid or not)."""
    ints = {
        "head_num": (INT32_MIN, INT32_MAX),
        "kv_head_num": (INT32_MIN, INT32_MAX),
        "kv_capacity": (INT32_MIN, INT32_MAX),
        "seed": (0, SEED_LIMIT - 1),
    }
    for name, (low, high) in ints.items():
        value = raw.get(name)
        if name not in raw or (value is None and name == "kv_capacity"):
            continue
        if not _is_int(value) or not low <= value <= high:
            raise fail(name, f"must be an integer in [{low}, {high}], got {_show(value)}")
    choices = {
        "dtype": DTYPES,
        "q_layout": Q_LAYOUTS,
        "kv_layout": KV_LAYOUTS,
        "distribution": DISTRIBUTIONS,
        "expect_stage": STAGES,
    }
    for name, allowed in choices.items():
        if name in raw and not (raw[name] is None and name == "expect_stage") and raw[name] not in allowed:
            raise fail(name, f"must be one of {list(allowed)}, got {_show(raw[name])}")
    patterns = {"name": SAFE_NAME, "suite": SAFE_NAME, "perturb": SAFE_PERTURB, "expect_error": SAFE_STATUS}
    for name, pattern in patterns.items():
        value = raw.get(name)
        if value is None or (value == "" and name in ("name", "suite")):
            continue
        if not isinstance(value, str) or not pattern.fullmatch(value):
            what = (
                "an ATB status such as 'ERROR_INVALID_PARAM'"
                if name == "expect_error"
                else (f"a string matching {pattern.pattern} (no path separators, at most 128 characters)")
            )
            raise fail(name, f"must be {what}, got {_show(value)}")
    if not isinstance(raw.get("source", ""), str):
        raise fail("source", f"must be a string, got {_show(raw['source'])}")
    scale = raw.get("qk_scale", DEFAULT_QK_SCALE)
    if not isinstance(scale, (int, float)) or isinstance(scale, bool) or (_is_int(scale) and abs(scale) > 2**1023):
        raise fail("qk_scale", f"must be a number within float64 range, got {_show(scale)}")


def _by_release(value: Any, expect_error: Any, fail: Fail) -> tuple[tuple[str, str, str | None], ...]:
    """``expect_by_release``: a list of ``{versions, expect_error, expect_stage}`` tables (error cases only)."""
    if not isinstance(value, (list, tuple)):
        raise fail("expect_by_release", f"must be a list of tables, got {_show(value)}")
    if value and expect_error is None:
        raise fail("expect_by_release", "only allowed with expect_error")
    entries = []
    for index, entry in enumerate(value):
        where = f"expect_by_release[{index}]"
        if not isinstance(entry, Mapping) or set(entry) - {"versions", "expect_error", "expect_stage"}:
            raise fail(where, f"must be a table of versions, expect_error, expect_stage, got {_show(entry)}")
        versions, error, stage = entry.get("versions"), entry.get("expect_error"), entry.get("expect_stage")
        try:
            parse_range(versions if isinstance(versions, str) else "")
        except ValueError as exc:
            raise fail(f"{where}.versions", f"must be a version range such as '<8.3.RC1': {exc}") from exc
        if not isinstance(error, str) or not SAFE_STATUS.fullmatch(error):
            raise fail(
                f"{where}.expect_error", f"must be an ATB status such as 'ERROR_INVALID_PARAM', got {_show(error)}"
            )
        if stage is not None and stage not in STAGES:
            raise fail(f"{where}.expect_stage", f"must be one of {list(STAGES)}, got {_show(stage)}")
        entries.append((str(versions), error, stage))
    return tuple(entries)


def _is_commit(text: str) -> bool:
    return len(text) == 40 and all(c in "0123456789abcdef" for c in text)


def build_case(
    raw: Mapping[str, Any], *, source: str, suite: str = "", index: int = 0, validate: bool = True
) -> CaseSpec:
    """Turn one table of fields into a :class:`CaseSpec`; any problem is a :class:`SpecError`.

    Types, ranges and names are always checked (so a case id, which names a file, is always safe);
    ``validate`` adds the operator contract (:func:`validate_case`)."""
    if not isinstance(raw, Mapping):
        raise SpecError(source, f"#{index}", "<case>", f"must be a table of fields, got {_show(raw)}")
    name = raw.get("name")
    label = name if isinstance(name, str) and SAFE_NAME.fullmatch(name) else f"#{index}"

    def fail(field_name: str, message: str) -> SpecError:
        return SpecError(source, label, field_name, message)

    unknown = set(raw) - _FIELD_NAMES
    if unknown:
        raise fail(sorted(unknown)[0], f"unknown field; known fields: {sorted(_FIELD_NAMES)}")
    for required in ("q_seqlen", "head_num"):
        if required not in raw:
            raise fail(required, "is required")
    limit = MAX_BATCH if validate and raw.get("expect_error") is None else MAX_LIST
    q = _expand_lengths(raw["q_seqlen"], limit, fail, "q_seqlen")
    kv = _expand_lengths(raw.get("kv_seqlen", raw["q_seqlen"]), limit, fail, "kv_seqlen")
    _check_fields(raw, fail)
    if suite and not SAFE_NAME.fullmatch(suite):
        raise fail("suite", f"must match {SAFE_NAME.pattern}, got {_show(suite)}")
    kwargs: dict[str, Any] = dict(raw)
    kwargs.update(q_seqlen=q, kv_seqlen=kv, source=source, suite=suite or raw.get("suite") or "")
    kwargs.setdefault("kv_head_num", raw["head_num"])
    kwargs["mask_type"] = _coerce_enum(raw.get("mask_type", 0), MASK_CODES, fail, "mask_type")
    kwargs["cache_mode"] = _coerce_enum(raw.get("cache_mode", 1), CACHE_CODES, fail, "cache_mode")
    if kwargs.get("structure") is not None:
        kwargs["structure"] = build_structure(kwargs["structure"], fail)
    scale = float(kwargs.get("qk_scale", DEFAULT_QK_SCALE))
    commit = kwargs.get("source_commit", "")
    if not isinstance(commit, str) or (commit and not _is_commit(commit)):
        raise fail("source_commit", f"must be a full 40-hex-digit commit, got {commit!r}")
    kwargs["expect_by_release"] = _by_release(raw.get("expect_by_release", ()), raw.get("expect_error"), fail)
    bounds = raw.get("unconfirmed_at", ())
    if not isinstance(bounds, (list, tuple)) or not all(isinstance(b, str) and b for b in bounds):
        raise fail("unconfirmed_at", f"must be a list of releases such as ['8.3.RC1'], got {_show(bounds)}")
    if bounds and not kwargs["expect_by_release"]:
        raise fail("unconfirmed_at", "only allowed with expect_by_release (the rejections it may give)")
    kwargs["unconfirmed_at"] = tuple(bounds)
    try:  # the spec holds the fp32 value the operator receives, so every reference agrees on it
        kwargs["qk_scale"] = as_c_float(scale)
    except OverflowError:  # beyond fp32's range: only meaningful for error cases
        kwargs["qk_scale"] = scale
    spec = CaseSpec(**kwargs)
    if not spec.name:
        spec = dataclasses.replace(spec, name=spec.case_id)
    if validate:
        validate_case(spec)
    return spec


def validate_case(spec: CaseSpec) -> None:
    """Check a spec against the operator contract; raise :class:`SpecError` naming the field."""

    def fail(name: str, message: str) -> None:
        raise SpecError(spec.source or "<spec>", spec.name, name, message)

    for name, allowed in (
        ("dtype", DTYPES),
        ("q_layout", Q_LAYOUTS),
        ("kv_layout", KV_LAYOUTS),
        ("distribution", DISTRIBUTIONS),
    ):
        if getattr(spec, name) not in allowed:
            fail(name, f"must be one of {list(allowed)}, got {getattr(spec, name)!r}")
    if spec.expect_error is not None:
        if not isinstance(spec.expect_error, str) or not spec.expect_error.startswith("ERROR_"):
            fail("expect_error", f"must name an ATB status such as 'ERROR_INVALID_PARAM', got {spec.expect_error!r}")
        if spec.expect_stage not in (None, "create", "setup", "execute"):
            fail("expect_stage", f"must be 'create', 'setup' or 'execute', got {spec.expect_stage!r}")
        return  # error cases exist to be rejected: no value validation
    if spec.perturb is not None or spec.expect_stage is not None:
        fail("perturb" if spec.perturb is not None else "expect_stage", "only allowed with expect_error")
    if not 1 <= spec.batch <= MAX_BATCH:
        fail("q_seqlen", f"batch size must be in [1, {MAX_BATCH}], got {spec.batch}")
    if len(spec.kv_seqlen) != spec.batch:
        fail("kv_seqlen", f"length {len(spec.kv_seqlen)} differs from q_seqlen's {spec.batch}")
    if any(n < 0 for n in spec.q_seqlen):
        fail("q_seqlen", "lengths must be >= 0")
    if any(n < 0 for n in spec.kv_seqlen):
        fail("kv_seqlen", "lengths must be >= 0")
    if not any(qn > 0 and kn > 0 for qn, kn in zip(spec.q_seqlen, spec.kv_seqlen, strict=True)):
        fail("q_seqlen", "at least one batch needs q_seqlen > 0 and kv_seqlen > 0 (nothing would be checked)")
    if spec.kv_capacity is not None:
        if spec.kv_layout != "padded":
            fail("kv_capacity", "only the padded kv layout has a capacity")
        if spec.kv_capacity < spec.max_kv:
            fail("kv_capacity", f"must be >= max kv_seqlen ({spec.max_kv}), got {spec.kv_capacity}")
    if not 1 <= spec.head_num <= MAX_HEADS:
        fail("head_num", f"must be in [1, {MAX_HEADS}], got {spec.head_num}")
    if spec.kv_head_num < 1:
        fail("kv_head_num", f"must be >= 1, got {spec.kv_head_num}")
    if spec.mask_type not in SUPPORTED_MASKS:
        fail(
            "mask_type",
            f"must be one of {list(SUPPORTED_MASKS)} (0 undefined, 2 mask_free, 3 causal), got {spec.mask_type}",
        )
    if spec.cache_mode != 1:
        fail("cache_mode", f"prefill accepts only KROPE_CTKV (1), got {spec.cache_mode}")
    if not (math.isfinite(spec.qk_scale) and 0.0 < spec.qk_scale <= 1.0):
        fail("qk_scale", f"must be in (0, 1], got {spec.qk_scale}")
    if spec.structure is not None:
        _validate_structure(spec, fail)
    if spec.mask_type == 3:
        if spec.head_num % spec.kv_head_num:
            fail("kv_head_num", f"headNum {spec.head_num} must be a multiple of kvHeadNum {spec.kv_head_num}")
        if any(kn < qn for qn, kn in zip(spec.q_seqlen, spec.kv_seqlen, strict=True)):
            fail("kv_seqlen", "causal (mask_type 3) needs kv_seqlen >= q_seqlen in every batch")
        if spec.kv_layout != "padded":
            fail("kv_layout", "causal (mask_type 3) accepts only the padded kv layout")
    else:
        if spec.kv_head_num != spec.head_num:
            fail("kv_head_num", f"must equal headNum ({spec.head_num}) unless mask_type is 3 (causal)")
        if spec.q_seqlen != spec.kv_seqlen:
            fail("kv_seqlen", f"must equal q_seqlen element-wise for mask_type {spec.mask_type}")


def _validate_structure(spec: CaseSpec, fail: Callable[[str, str], None]) -> None:
    """What a structure asks of its case: keys for the trend to act on, and an fp16 score path that a
    correct kernel can still compute (raw Q.K far below fp16's 65504)."""
    structure = spec.structure
    assert structure is not None
    if structure.logits is not None and structure.rise is not None:
        if spec.distribution == "near_tie":
            fail("structure", "a logits trend would undo near_tie's nearly equal logits")
        if spec.dtype == "fp16" and structure.rise / spec.qk_scale > FP16_RAW_SCORE_LIMIT:
            fail(
                "structure.rise",
                f"rise / qk_scale = {structure.rise / spec.qk_scale:.0f} > {FP16_RAW_SCORE_LIMIT:g}: fp16 "
                "kernels store raw Q.K in fp16 (max 65504), keep it far from overflow",
            )
        marker = structure.sink_keys or structure.late_from or 1
        if marker >= spec.max_kv:
            name = "structure.sink_keys" if structure.sink_keys else "structure.late_from"
            fail(name, f"must be below the longest kv sequence ({spec.max_kv}), got {marker}")


# -- suites ----------------------------------------------------------------------------------


def read_toml(path: Path, fail: Callable[[str, str], Exception]) -> dict[str, Any]:
    """Parse a TOML file; ``fail(field, message)`` builds the caller's error (which names the file)."""
    try:
        size = path.stat().st_size
        if size > MAX_SUITE_BYTES:
            raise fail("<file>", f"{size} bytes; at most {MAX_SUITE_BYTES} are read")
        document: dict[str, Any] = tomllib.loads(path.read_bytes().decode("utf-8"))
        return document
    except UnicodeDecodeError as exc:
        raise fail("<file>", f"not UTF-8 text: {exc}") from exc
    except tomllib.TOMLDecodeError as exc:
        raise fail("<toml>", f"not valid TOML: {exc}") from exc
    except RecursionError as exc:
        raise fail("<toml>", "nested too deeply") from exc
    except OSError as exc:
        raise fail("<file>", f"cannot read: {exc}") from exc


def _matrix_axes(matrix: Mapping[str, Any], fail: Fail) -> list[list[dict[str, Any]]]:
    """A matrix table's axes: each a list of alternatives (field dictionaries), none empty."""
    axes: list[list[dict[str, Any]]] = []
    for key, value in matrix.items():
        if key in ("q_seqlen", "kv_seqlen"):
            is_axis = isinstance(value, list) and value and all(isinstance(v, (list, dict)) for v in value)
            axes.append([{key: alt} for alt in (value if is_axis else [value])])
        elif key in _FIELD_NAMES:
            axes.append([{key: alt} for alt in (value if isinstance(value, list) else [value])])
        elif isinstance(value, list) and all(isinstance(v, dict) for v in value):
            axes.append([dict(v) for v in value])  # a zipped axis: each table sets several fields
        else:
            raise fail(key, "unknown field (a zipped axis needs a list of tables)")
        if not axes[-1]:
            raise fail(key, "an axis needs at least one value")
    return axes


def _matrix_rows(axes: list[list[dict[str, Any]]]) -> Iterator[dict[str, Any]]:
    """Expand the product of a matrix's axes into field dictionaries."""
    for combo in itertools.product(*axes):
        row: dict[str, Any] = {}
        for part in combo:
            row.update(part)
        yield row


def _tables(value: Any, fail: Fail, what: str) -> list[Mapping[str, Any]]:
    """``[[case]]`` / ``[[matrix]]``: an array of tables."""
    if not isinstance(value, list) or not all(isinstance(item, Mapping) for item in value):
        raise fail(what, f"must be an array of tables ([[{what}]]), got {_show(value)}")
    return value


def load_suite(path: str | Path, *, validate: bool = True) -> list[CaseSpec]:
    """Load one suite file; duplicate cases (same content hash) are an error naming both.

    Any problem with the file, whatever its content, is a :class:`SpecError` naming file, case and
    field; sizes are checked before anything is expanded (at most MAX_CASES cases, MAX_FILE_ENTRIES
    sequence lengths in all)."""
    path = Path(path)
    source = str(path)

    def file_fail(field_name: str, message: str) -> SpecError:
        return SpecError(source, "<file>", field_name, message)

    data = read_toml(path, file_fail)
    unknown = set(data) - {"suite", "defaults", "case", "matrix"}
    if unknown:
        raise file_fail(sorted(unknown)[0], "unknown top-level table")
    meta, defaults = data.get("suite", {}), data.get("defaults", {})
    for what, table in (("suite", meta), ("defaults", defaults)):
        if not isinstance(table, Mapping):
            raise file_fail(what, f"must be a table ([{what}]), got {_show(table)}")
    for what, table, known in (("suite", meta, {"name", "description"}), ("defaults", defaults, _FIELD_NAMES)):
        extra = set(table) - known
        if extra:
            raise file_fail(f"{what}.{sorted(extra)[0]}", f"unknown key in table [{what}]; known keys: {sorted(known)}")
    suite = meta.get("name", path.stem)
    if not isinstance(suite, str) or not SAFE_NAME.fullmatch(suite):
        raise file_fail("suite.name", f"must match {SAFE_NAME.pattern} (default: the file name), got {_show(suite)}")
    if not isinstance(meta.get("description", ""), str):
        raise file_fail("suite.description", f"must be a string, got {_show(meta['description'])}")
    tables = _tables(data.get("case", []), file_fail, "case")
    if len(tables) > MAX_CASES:
        raise file_fail("case", f"the file defines {len(tables)} cases; at most {MAX_CASES}")
    raws: list[dict[str, Any]] = [{**defaults, **case} for case in tables]
    planned = len(raws)
    matrices = []
    for m_index, matrix in enumerate(_tables(data.get("matrix", []), file_fail, "matrix")):

        def matrix_fail(field_name: str, message: str, label: str = f"matrix #{m_index}") -> SpecError:
            return SpecError(source, label, field_name, message)

        axes = _matrix_axes(matrix, matrix_fail)
        planned += math.prod(len(axis) for axis in axes)
        if planned > MAX_CASES:
            raise matrix_fail("<matrix>", f"the file would define {planned}+ cases; at most {MAX_CASES}")
        matrices.append(axes)
    for axes in matrices:
        raws.extend({**defaults, **row} for row in _matrix_rows(axes))
    cases: list[CaseSpec] = []
    seen: dict[str, str] = {}
    entries = 0
    for index, raw in enumerate(raws):
        spec = build_case(raw, source=source, suite=suite, index=index, validate=validate)
        entries += spec.batch + len(spec.kv_seqlen)
        if entries > MAX_FILE_ENTRIES:
            raise SpecError(
                source,
                spec.name,
                "q_seqlen",
                f"the file's cases hold more than {MAX_FILE_ENTRIES} sequence lengths in all",
            )
        if spec.content_hash in seen:
            raise SpecError(source, spec.name, "<case>", f"duplicates case {seen[spec.content_hash]!r}")
        seen[spec.content_hash] = spec.name
        cases.append(spec)
    return cases


def suite_path(name: str) -> Path:
    return suites_dir() / f"{name}.toml"


def available_suites() -> list[str]:
    """Suites shipped in ``cases/`` (every TOML file that has a ``[suite]`` table)."""
    names = []
    for path in sorted(suites_dir().glob("*.toml")):
        try:
            is_suite = "suite" in tomllib.loads(path.read_text())
        except (tomllib.TOMLDecodeError, OSError, UnicodeDecodeError):
            is_suite = True  # listed all the same: only what selects it fails, with file and line (load_suite)
        if is_suite:
            names.append(path.stem)
    return names


def load_suites(names: Iterable[str]) -> list[CaseSpec]:
    """Load suites by name (``all`` expands to every shipped suite except ``errors``)."""
    wanted: list[str] = []
    for name in names:
        if name == "all":
            wanted.extend(n for n in available_suites() if n != "errors")
        else:
            wanted.append(name)
    cases: list[CaseSpec] = []
    for name in dict.fromkeys(wanted):
        path = suite_path(name)
        if not SAFE_NAME.fullmatch(name) or not path.exists():
            raise SpecError(str(path), "<file>", "<suite>", f"no suite named {name!r}; have {available_suites()}")
        cases.extend(load_suite(path))
    return cases
