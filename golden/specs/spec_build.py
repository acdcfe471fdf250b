"""From a table of fields to a validated :class:`~mlaconf.golden.specs.spec.CaseSpec`: types, ranges and
names always (a case id names a file, so it must be safe whatever the input), the operator contract
(docs/operator.md §2-3) unless the case is flagged ``expect_error``, which exists to be rejected.

Every problem is a :class:`~mlaconf.golden.specs.spec.SpecError` naming source, case and field; the
suite reader (:mod:`mlaconf.golden.specs.suites`) and a golden file's ``spec_json``
(:func:`spec_from_json`) build their cases here."""

from __future__ import annotations

import dataclasses
import json
import math
import re
from collections.abc import Callable, Mapping
from typing import Any, TypeGuard

from mlaconf.facts.near_miss import did_you_mean
from mlaconf.facts.operator import (
    CACHE_CODES,
    DEFAULT_QK_SCALE,
    DTYPES,
    FP16_MAX,
    INT32_MAX,
    INT32_MIN,
    KV_LAYOUTS,
    MASK_CODES,
    MASK_FILLS,
    MAX_BATCH,
    MAX_HEADS,
    Q_LAYOUTS,
    SUPPORTED_MASKS,
    as_c_float,
)
from mlaconf.facts.releases import parse_range
from mlaconf.facts.status import STAGES
from mlaconf.golden.specs.spec import (
    DEFAULT_RANDOM_ROWS,
    DISTRIBUTIONS,
    LOGIT_TRENDS,
    PADDINGS,
    RAW_PEAK_CLEARANCE,
    CaseSpec,
    SpecError,
    Structure,
)

#: Seeds are in [0, SEED_LIMIT): stored as an int64 attribute; numpy's SeedSequence needs them >= 0.
SEED_LIMIT = 2**63
#: Most entries of a length list in any case: error cases may exceed B <= MAX_BATCH to test it.
MAX_LIST = 2 * MAX_BATCH
#: Most seeded random rows a sampled golden may add (``rows = N``).
MAX_RANDOM_ROWS = 1 << 20
#: Names (case, suite) and perturbation names: no path separators, no leading dot, bounded length.
#: ``inputs``: the sha256 of an explicit input bundle (golden/store/bundles.py).
INPUTS_HASH = re.compile(r"[0-9a-f]{64}")
SAFE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+-]{0,127}")
SAFE_PERTURB = re.compile(r"[a-z0-9_]{1,64}")
SAFE_STATUS = re.compile(r"ERROR_[A-Z0-9_]{1,64}")
#: Bounds of the structure's parameters: wide enough for every documented use, narrow enough that the
#: fp16 score path (raw Q.K stored in fp16) stays far from overflow (:data:`FP16_RAW_SCORE_LIMIT`).
MAX_RISE = 128.0
MAX_TEMPERATURE = 16.0
MAX_V_SCALE = 64.0
#: Largest |qkScale^-1 * rise| allowed in an fp16 case: the trend's raw Q.K product, which the fp16
#: maskType 0/2 kernels store as fp16 (max 65504), stays 8x below overflow with the random part on top.
FP16_RAW_SCORE_LIMIT = 8192.0

_STRUCTURE_FIELDS = {f.name for f in dataclasses.fields(Structure)}


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _positive(value: Any, limit: float) -> bool:
    return _number(value) and 0.0 < value <= limit


def _pair(value: Any, low: float, high: float) -> bool:
    return isinstance(value, (list, tuple)) and len(value) == 2 and all(_positive(v, high) and v >= low for v in value)


def build_structure(raw: Any, fail: Fail) -> Structure:
    """Parse a ``structure = { ... }`` table; any problem names the field ``structure.<key>``."""
    if isinstance(raw, Structure):
        return raw
    if not isinstance(raw, Mapping):
        raise fail("structure", f"must be a table such as {{ logits = 'sinks', rise = 8.0 }}, got {show_value(raw)}")
    unknown = set(raw) - _STRUCTURE_FIELDS
    if unknown:
        raise fail(f"structure.{sorted(unknown)[0]}", f"unknown key; known keys: {sorted(_STRUCTURE_FIELDS)}")
    if not raw:
        raise fail("structure", "an empty structure table; leave it out instead")
    logits = raw.get("logits")
    if logits is not None and logits not in LOGIT_TRENDS:
        raise fail("structure.logits", f"must be one of {list(LOGIT_TRENDS)}, got {show_value(logits)}")
    needs = {"rise": logits is not None, "sink_keys": logits == "sinks", "late_from": logits == "late_max"}
    for key, needed in needs.items():
        if needed and key not in raw:
            raise fail(f"structure.{key}", f"is required with logits = {logits!r}")
        if not needed and key in raw:
            what = "a logits trend" if key == "rise" else f"logits = {'sinks' if key == 'sink_keys' else 'late_max'}"
            raise fail(f"structure.{key}", f"only allowed with {what}")
    if "rise" in raw and not _positive(raw["rise"], MAX_RISE):
        raise fail("structure.rise", f"must be a number in (0, {MAX_RISE:g}], got {show_value(raw['rise'])}")
    shift = raw.get("logit_shift")
    if shift is not None:
        if logits is not None:
            raise fail("structure.logit_shift", "not with a logits trend: both ride the one reserved score dimension")
        if not (_number(shift) and 0.0 < abs(shift) <= MAX_RISE):
            raise fail(
                "structure.logit_shift",
                f"must be a nonzero number in [-{MAX_RISE:g}, {MAX_RISE:g}], got {show_value(shift)}",
            )
    for key in ("sink_keys", "late_from"):
        if key in raw and not (_is_int(raw[key]) and 1 <= raw[key] <= INT32_MAX):
            raise fail(f"structure.{key}", f"must be a positive integer, got {show_value(raw[key])}")
    pairs = {"head_temperature": MAX_TEMPERATURE, "v_scale": MAX_V_SCALE}
    for key, limit in pairs.items():
        if key in raw and not _pair(raw[key], 1.0 / limit, limit):
            raise fail(
                f"structure.{key}", f"must be two numbers in [{1 / limit:g}, {limit:g}], got {show_value(raw[key])}"
            )
    if "v_mean" in raw and not _positive(raw["v_mean"], MAX_V_SCALE):
        raise fail("structure.v_mean", f"must be a number in (0, {MAX_V_SCALE:g}], got {show_value(raw['v_mean'])}")
    return Structure(
        logits=logits,
        rise=float(raw["rise"]) if "rise" in raw else None,
        sink_keys=raw.get("sink_keys"),
        late_from=raw.get("late_from"),
        head_temperature=tuple(float(v) for v in raw["head_temperature"]) if "head_temperature" in raw else None,  # type: ignore[arg-type]
        v_scale=tuple(float(v) for v in raw["v_scale"]) if "v_scale" in raw else None,  # type: ignore[arg-type]
        v_mean=float(raw["v_mean"]) if "v_mean" in raw else None,
        logit_shift=float(shift) if shift is not None else None,
    )


FIELD_NAMES = {f.name for f in dataclasses.fields(CaseSpec)}


def show_value(value: Any) -> str:
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
            raise fail(name, f"'pattern' must be a list of integers, got {show_value(pattern)}")
        if not _is_int(times) or times < 1:
            raise fail(name, f"'times' must be a positive integer, got {show_value(times)}")
        if len(pattern) * times > limit:
            raise too_long(len(pattern) * times)
        value = list(pattern) * times
    if not isinstance(value, (list, tuple)):
        raise fail(name, f"must be a list of integers, got {show_value(value)}")
    if len(value) > limit:
        raise too_long(len(value))
    for item in value:
        if not _is_int(item):
            raise fail(name, f"must hold integers, got {show_value(item)}")
        if not INT32_MIN <= item <= INT32_MAX:
            raise fail(name, f"lengths must fit int32, got {item}")
    return tuple(int(item) for item in value)


def _coerce_enum(value: Any, codes: Mapping[str, int], fail: Fail, name: str) -> int:
    if isinstance(value, str):
        key = value.lower()
        if key not in codes:
            raise fail(name, f"unknown name {show_value(value)}; expected one of {sorted(codes)}")
        return codes[key]
    if _is_int(value) and INT32_MIN <= value <= INT32_MAX:
        return int(value)
    raise fail(name, f"must be an int32 or a name, got {show_value(value)}")


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
            raise fail(name, f"must be an integer in [{low}, {high}], got {show_value(value)}")
    choices = {
        "dtype": DTYPES,
        "q_layout": Q_LAYOUTS,
        "kv_layout": KV_LAYOUTS,
        "distribution": DISTRIBUTIONS,
        "expect_stage": STAGES,
        "mask_fill": tuple(MASK_FILLS),
        "padding": PADDINGS,
    }
    optional = ("expect_stage", "mask_fill", "padding")
    for name, allowed in choices.items():
        if name in raw and not (raw[name] is None and name in optional) and raw[name] not in allowed:
            raise fail(name, f"must be one of {list(allowed)}, got {show_value(raw[name])}")
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
            raise fail(name, f"must be {what}, got {show_value(value)}")
    inputs = raw.get("inputs")
    if inputs is not None and not (isinstance(inputs, str) and INPUTS_HASH.fullmatch(inputs)):
        raise fail("inputs", f"must be the 64-hex-digit content hash of an input bundle, got {show_value(inputs)}")
    if not isinstance(raw.get("source", ""), str):
        raise fail("source", f"must be a string, got {show_value(raw['source'])}")
    scale = raw.get("qk_scale", DEFAULT_QK_SCALE)
    if not isinstance(scale, (int, float)) or isinstance(scale, bool) or (_is_int(scale) and abs(scale) > 2**1023):
        raise fail("qk_scale", f"must be a number within float64 range, got {show_value(scale)}")


def parse_rows(value: Any, fail: Fail) -> int | None:
    """``rows``: ``"all"`` (None: every row), ``"sample"`` (the chosen rows and DEFAULT_RANDOM_ROWS random ones)
    or a number N of random rows beside the chosen ones (a sample too)."""
    if value is None or value == "all":
        return None
    if value == "sample":
        return DEFAULT_RANDOM_ROWS
    if _is_int(value) and 0 <= value <= MAX_RANDOM_ROWS:
        return int(value)
    raise fail(
        "rows",
        f"must be 'all', 'sample' or a number of random rows in [0, {MAX_RANDOM_ROWS}], got {show_value(value)}",
    )


def _by_release(value: Any, expect_error: Any, fail: Fail) -> tuple[tuple[str, str, str | None], ...]:
    """``expect_by_release``: a list of ``{versions, expect_error, expect_stage}`` tables (error cases only)."""
    if not isinstance(value, (list, tuple)):
        raise fail("expect_by_release", f"must be a list of tables, got {show_value(value)}")
    if value and expect_error is None:
        raise fail("expect_by_release", "only allowed with expect_error")
    entries = []
    for index, entry in enumerate(value):
        where = f"expect_by_release[{index}]"
        if not isinstance(entry, Mapping) or set(entry) - {"versions", "expect_error", "expect_stage"}:
            raise fail(where, f"must be a table of versions, expect_error, expect_stage, got {show_value(entry)}")
        versions, error, stage = entry.get("versions"), entry.get("expect_error"), entry.get("expect_stage")
        try:
            parse_range(versions if isinstance(versions, str) else "")
        except ValueError as exc:
            raise fail(f"{where}.versions", f"must be a version range such as '<8.3.RC1': {exc}") from exc
        if not isinstance(error, str) or not SAFE_STATUS.fullmatch(error):
            raise fail(
                f"{where}.expect_error", f"must be an ATB status such as 'ERROR_INVALID_PARAM', got {show_value(error)}"
            )
        if stage is not None and stage not in STAGES:
            raise fail(f"{where}.expect_stage", f"must be one of {list(STAGES)}, got {show_value(stage)}")
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
        raise SpecError(source, f"#{index}", "<case>", f"must be a table of fields, got {show_value(raw)}")
    name = raw.get("name")
    label = name if isinstance(name, str) and SAFE_NAME.fullmatch(name) else f"#{index}"

    def fail(field_name: str, message: str) -> SpecError:
        return SpecError(source, label, field_name, message)

    unknown = set(raw) - FIELD_NAMES
    if unknown:
        field = sorted(unknown)[0]
        raise fail(field, f"unknown field{did_you_mean(field, FIELD_NAMES)}; known fields: {sorted(FIELD_NAMES)}")
    for required in ("q_seqlen", "head_num"):
        if required not in raw:
            raise fail(required, "is required")
    limit = MAX_BATCH if validate and raw.get("expect_error") is None else MAX_LIST
    q = _expand_lengths(raw["q_seqlen"], limit, fail, "q_seqlen")
    kv = _expand_lengths(raw.get("kv_seqlen", raw["q_seqlen"]), limit, fail, "kv_seqlen")
    _check_fields(raw, fail)
    if suite and not SAFE_NAME.fullmatch(suite):
        raise fail("suite", f"must match {SAFE_NAME.pattern}, got {show_value(suite)}")
    kwargs: dict[str, Any] = dict(raw)
    kwargs.update(q_seqlen=q, kv_seqlen=kv, source=source, suite=suite or raw.get("suite") or "")
    kwargs.setdefault("kv_head_num", raw["head_num"])
    kwargs["mask_type"] = _coerce_enum(raw.get("mask_type", 0), MASK_CODES, fail, "mask_type")
    kwargs["cache_mode"] = _coerce_enum(raw.get("cache_mode", 1), CACHE_CODES, fail, "cache_mode")
    if kwargs.get("structure") is not None:
        kwargs["structure"] = build_structure(kwargs["structure"], fail)
    kwargs["rows"] = parse_rows(raw.get("rows"), fail)
    scale = float(kwargs.get("qk_scale", DEFAULT_QK_SCALE))
    commit = kwargs.get("source_commit", "")
    if not isinstance(commit, str) or (commit and not _is_commit(commit)):
        raise fail("source_commit", f"must be a full 40-hex-digit commit, got {commit!r}")
    kwargs["expect_by_release"] = _by_release(raw.get("expect_by_release", ()), raw.get("expect_error"), fail)
    bounds = raw.get("unconfirmed_at", ())
    if not isinstance(bounds, (list, tuple)) or not all(isinstance(b, str) and b for b in bounds):
        raise fail("unconfirmed_at", f"must be a list of releases such as ['8.3.RC1'], got {show_value(bounds)}")
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
        if spec.kv_layout == "strided":
            fail("kv_capacity", "the strided layout has no capacity: its rows are B * max kv_seqlen")
        if spec.kv_layout == "padded" and spec.kv_capacity < spec.max_kv:
            fail("kv_capacity", f"must be >= max kv_seqlen ({spec.max_kv}), got {spec.kv_capacity}")
        if spec.kv_layout == "packed" and spec.kv_capacity < spec.total_kv:
            fail(
                "kv_capacity",
                f"packed: k's rows, must be >= the sum of kv_seqlen ({spec.total_kv}), got {spec.kv_capacity}",
            )
        strided_rows = spec.batch * spec.max_kv
        if spec.kv_layout == "packed" and spec.kv_capacity == strided_rows != spec.total_kv:
            fail(
                "kv_capacity",
                f"packed with {strided_rows} = B * max kv_seqlen rows is read as the strided layout "
                "(batch b at row b * max kv): use kv_layout = 'strided', or another capacity",
            )
    peak = spec.raw_score_peak
    if peak is not None and abs(peak / FP16_MAX - 1.0) < RAW_PEAK_CLEARANCE:
        fail(
            "qk_scale",
            f"large_raw_scores aims its raw products at {peak:.0f}, within {RAW_PEAK_CLEARANCE:.0%} of fp16's 65504: "
            "the drawn ones would straddle it (pick a qk_scale whose 7 / qk_scale is clear of it)",
        )
    if spec.padding is not None and spec.kv_rows == spec.total_kv:
        fail("padding", f"{spec.kv_layout} kv with these lengths leaves no row unread: there is nothing to fill")
    if spec.mask_fill is not None and spec.mask_type != 2:
        fail("mask_fill", f"only with mask_type 2 (mask_free), the one mask that takes a tensor, got {spec.mask_type}")
    if spec.kv_layout == "strided" and spec.batch * spec.max_kv == spec.total_kv:
        fail(
            "kv_layout",
            f"strided [B * max kv, Hkv, D] needs ragged kv_seqlen: with {list(spec.kv_seqlen)} B * max kv equals "
            "their sum, which is the packed layout (use kv_layout = 'packed')",
        )
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
    if spec.rows is not None and spec.inputs is not None:
        fail(
            "inputs",
            "a sampled case (rows) draws its inputs by blocks from its seed, explicit ones cannot be (rows = 'all')",
        )
    if spec.structure is not None:
        if spec.inputs is not None:
            fail("structure", "the inputs are explicit (inputs = ...): there are no draws to shape")
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
    if spec.distribution == "large_raw_scores" and (structure.logits or structure.logit_shift):
        fail("structure", "large_raw_scores sets the logits through q and k themselves: no trend or shift beside it")
    shift = structure.logit_shift
    if shift is not None and spec.dtype == "fp16" and abs(shift) / spec.qk_scale > FP16_RAW_SCORE_LIMIT:
        fail(
            "structure.logit_shift",
            f"|logit_shift| / qk_scale = {abs(shift) / spec.qk_scale:.0f} > {FP16_RAW_SCORE_LIMIT:g}: fp16 "
            "kernels store raw Q.K in fp16 (max 65504), keep it far from overflow",
        )
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


def spec_from_json(text: str) -> CaseSpec:
    """The spec a golden file stores (``CaseSpec.to_json``), types and names checked, not the contract."""
    try:
        data = json.loads(text)
    except (ValueError, RecursionError) as exc:
        raise SpecError("<json>", "<spec>", "<json>", f"not valid JSON: {exc}") from exc
    if not isinstance(data, dict):
        raise SpecError("<json>", "<spec>", "<json>", f"must be a JSON object, got {show_value(data)}")
    source = data.get("source", "<json>")
    return build_case(data, source=source if isinstance(source, str) else "<json>", validate=False)
