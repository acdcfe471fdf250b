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
import sys
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from facts.operator import (
    CACHE_CODES,
    CACHE_NAMES,
    DEFAULT_QK_SCALE,
    DTYPES,
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

if sys.version_info >= (3, 11):
    import tomllib
else:  # Python 3.10: the same parser, from PyPI
    import tomli as tomllib

DISTRIBUTIONS = ("uniform", "normal", "large_logits", "near_tie", "v_outliers")

#: The package whose ``*.toml`` files are the shipped suites (package data, so installs carry them).
SUITES_PACKAGE = "cases"


def suites_dir() -> Path:
    """Where the shipped suite files live, in a checkout or an installed package alike."""
    return Path(str(importlib.resources.files(SUITES_PACKAGE)))


class SpecError(ValueError):
    """A case spec is malformed or violates the operator contract; names file, case and field."""

    def __init__(self, source: str, case: str, field_name: str, message: str) -> None:
        self.source, self.case, self.field_name = source, case, field_name
        super().__init__(f"{source}: case {case!r}: field {field_name!r}: {message}")


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
    seed: int = 0
    expect_error: str | None = None
    expect_stage: str | None = None
    perturb: str | None = None
    name: str = field(default="", compare=False)
    suite: str = field(default="", compare=False)
    source: str = field(default="", compare=False)
    #: The upstream (ATB) commit an error case's expectation was read at; provenance, not content.
    source_commit: str = field(default="", compare=False)

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

    @property
    def group_size(self) -> int:
        """Query heads per kv head (GQA ratio)."""
        return self.head_num // self.kv_head_num if self.kv_head_num else 0

    def content(self) -> dict[str, Any]:
        """The fields that determine inputs and outputs (what the hash covers)."""
        skip = {"name", "suite", "source", "source_commit"}
        return {f.name: _jsonable(getattr(self, f.name)) for f in dataclasses.fields(self) if f.name not in skip}

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
        return json.dumps(data, sort_keys=True)

    def to_toml(self) -> str:
        """A ``[[case]]`` snippet that can be pasted into a suite file."""
        lines = ["[[case]]"]
        for key, value in self.content().items():
            if value is None or (key == "qk_scale" and value == DEFAULT_QK_SCALE):
                continue
            lines.append(f"{key} = {json.dumps(value)}")
        return "\n".join(lines) + "\n"

    @classmethod
    def from_json(cls, text: str) -> CaseSpec:
        data = json.loads(text)
        return build_case(data, source=data.get("source", "<json>"), validate=False)


def _jsonable(value: Any) -> Any:
    if isinstance(value, tuple):
        return list(value)
    return value


# -- construction and validation ---------------------------------------------------------

_FIELD_NAMES = {f.name for f in dataclasses.fields(CaseSpec)}


def _expand_lengths(value: Any, source: str, case: str, name: str) -> tuple[int, ...]:
    """Accept ``[1, 2, 3]`` or the compact ``{pattern = [1, 2], times = 4096}``."""
    if isinstance(value, Mapping):
        unknown = set(value) - {"pattern", "times"}
        if unknown or "pattern" not in value:
            raise SpecError(source, case, name, "a compact length table needs 'pattern' (list) and 'times'")
        pattern = value["pattern"]
        times = value.get("times", 1)
        if not isinstance(times, int) or isinstance(times, bool) or times < 1:
            raise SpecError(source, case, name, f"'times' must be a positive integer, got {times!r}")
        value = list(pattern) * times
    if not isinstance(value, Sequence) or isinstance(value, str):
        raise SpecError(source, case, name, f"must be a list of integers, got {value!r}")
    out = []
    for item in value:
        if not isinstance(item, int) or isinstance(item, bool):
            raise SpecError(source, case, name, f"must hold integers, got {item!r}")
        out.append(int(item))
    return tuple(out)


def _coerce_enum(value: Any, codes: Mapping[str, int], source: str, case: str, name: str) -> int:
    if isinstance(value, str):
        key = value.lower()
        if key not in codes:
            raise SpecError(source, case, name, f"unknown name {value!r}; expected one of {sorted(codes)}")
        return codes[key]
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    raise SpecError(source, case, name, f"must be an integer or a name, got {value!r}")


def _is_commit(text: str) -> bool:
    return len(text) == 40 and all(c in "0123456789abcdef" for c in text)


def build_case(
    raw: Mapping[str, Any], *, source: str, suite: str = "", index: int = 0, validate: bool = True
) -> CaseSpec:
    """Turn one table of fields into a validated :class:`CaseSpec`."""
    label = str(raw.get("name") or f"#{index}")
    unknown = set(raw) - _FIELD_NAMES
    if unknown:
        bad = sorted(unknown)[0]
        raise SpecError(source, label, bad, f"unknown field; known fields: {sorted(_FIELD_NAMES)}")
    for required in ("q_seqlen", "head_num"):
        if required not in raw:
            raise SpecError(source, label, required, "is required")
    q = _expand_lengths(raw["q_seqlen"], source, label, "q_seqlen")
    kv = _expand_lengths(raw.get("kv_seqlen", raw["q_seqlen"]), source, label, "kv_seqlen")
    kwargs: dict[str, Any] = dict(raw)
    kwargs.update(q_seqlen=q, kv_seqlen=kv, source=source, suite=suite or str(raw.get("suite", "")))
    kwargs.setdefault("kv_head_num", raw["head_num"])
    kwargs["mask_type"] = _coerce_enum(raw.get("mask_type", 0), MASK_CODES, source, label, "mask_type")
    kwargs["cache_mode"] = _coerce_enum(raw.get("cache_mode", 1), CACHE_CODES, source, label, "cache_mode")
    commit = kwargs.get("source_commit", "")
    if not isinstance(commit, str) or (commit and not _is_commit(commit)):
        raise SpecError(source, label, "source_commit", f"must be a full 40-hex-digit commit, got {commit!r}")
    capacity = kwargs.get("kv_capacity")
    if capacity is not None and (not isinstance(capacity, int) or isinstance(capacity, bool)):
        raise SpecError(source, label, "kv_capacity", f"must be an integer, got {capacity!r}")
    for int_field in ("head_num", "kv_head_num", "seed"):
        value = kwargs.get(int_field, 0)
        if not isinstance(value, int) or isinstance(value, bool):
            raise SpecError(source, label, int_field, f"must be an integer, got {value!r}")
    scale = kwargs.get("qk_scale", DEFAULT_QK_SCALE)
    if not isinstance(scale, (int, float)) or isinstance(scale, bool):
        raise SpecError(source, label, "qk_scale", f"must be a number, got {scale!r}")
    try:  # the spec holds the fp32 value the operator receives, so every reference agrees on it
        kwargs["qk_scale"] = as_c_float(float(scale))
    except OverflowError:  # beyond fp32's range: only meaningful for error cases
        kwargs["qk_scale"] = float(scale)
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
        fail("mask_type", f"must be one of {list(SUPPORTED_MASKS)} (0 undefined, 2 mask_free, 3 causal), "
             f"got {spec.mask_type}")
    if spec.cache_mode != 1:
        fail("cache_mode", f"prefill accepts only KROPE_CTKV (1), got {spec.cache_mode}")
    if not (math.isfinite(spec.qk_scale) and 0.0 < spec.qk_scale <= 1.0):
        fail("qk_scale", f"must be in (0, 1], got {spec.qk_scale}")
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


# -- suites ----------------------------------------------------------------------------------


def read_toml(path: Path, fail: Callable[[str, str], Exception]) -> dict[str, Any]:
    """Parse a TOML file; ``fail(field, message)`` builds the caller's error (which names the file)."""
    try:
        return tomllib.loads(path.read_text())
    except tomllib.TOMLDecodeError as exc:
        raise fail("<toml>", f"not valid TOML: {exc}") from exc
    except OSError as exc:
        raise fail("<file>", f"cannot read: {exc}") from exc


def _matrix_rows(matrix: Mapping[str, Any], source: str, index: int) -> Iterator[dict[str, Any]]:
    """Expand the product of a matrix table's axes into field dictionaries."""
    axes: list[list[dict[str, Any]]] = []
    for key, value in matrix.items():
        if key in ("q_seqlen", "kv_seqlen"):
            is_axis = isinstance(value, list) and value and all(isinstance(v, (list, dict)) for v in value)
            alternatives = value if is_axis else [value]
            axes.append([{key: alt} for alt in alternatives])
        elif key in _FIELD_NAMES:
            alternatives = value if isinstance(value, list) else [value]
            axes.append([{key: alt} for alt in alternatives])
        elif isinstance(value, list) and value and all(isinstance(v, dict) for v in value):
            axes.append([dict(v) for v in value])  # a zipped axis: each table sets several fields
        else:
            raise SpecError(source, f"matrix #{index}", key, "unknown field (a zipped axis needs a list of tables)")
    for combo in itertools.product(*axes):
        row: dict[str, Any] = {}
        for part in combo:
            row.update(part)
        yield row


def load_suite(path: str | Path, *, validate: bool = True) -> list[CaseSpec]:
    """Load one suite file; duplicate cases (same content hash) are an error naming both."""
    path = Path(path)
    source = str(path)
    data = read_toml(path, lambda name, message: SpecError(source, "<file>", name, message))
    unknown = set(data) - {"suite", "defaults", "case", "matrix"}
    if unknown:
        raise SpecError(source, "<file>", sorted(unknown)[0], "unknown top-level table")
    meta = data.get("suite", {})
    suite = str(meta.get("name", path.stem))
    defaults = dict(data.get("defaults", {}))
    raws: list[dict[str, Any]] = [{**defaults, **case} for case in data.get("case", [])]
    for m_index, matrix in enumerate(data.get("matrix", [])):
        raws.extend({**defaults, **row} for row in _matrix_rows(matrix, source, m_index))
    cases: list[CaseSpec] = []
    seen: dict[str, str] = {}
    for index, raw in enumerate(raws):
        spec = build_case(raw, source=source, suite=suite, index=index, validate=validate)
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
        if "suite" in tomllib.loads(path.read_text()):
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
        if not path.exists():
            raise SpecError(str(path), "<file>", "<suite>", f"no suite named {name!r}; have {available_suites()}")
        cases.extend(load_suite(path))
    return cases
