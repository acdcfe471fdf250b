"""msprobe dumps become cases: find the MLA prefill calls in an msprobe PyTorch dump and write a suite file
whose cases carry those calls' exact input tensors (golden/store/bundles.py), so the golden is built from a
real model's activations instead of seeded draws.

An msprobe dump (``task: tensor``; docs/usage.md) is ``step<N>/{rank<R>,proc<pid>}/dump.json`` with a
``data`` table of ``<Prefix>.<api>.<n>.forward`` entries (``input_args``, ``input_kwargs``, ``output``) and
the tensors as ``dump_tensor_data/<data_name>`` files (``torch.save``).  Arguments appear as the caller
passed them, positionally or by keyword; defaults the caller did not pass are absent, so every call is
bound against the op's public signature (:data:`SCHEMAS`) and each default it relies on is said.

Recognised calls (the ``atb.`` of an ATB op is dropped in msprobe's names):

* ``NPU.npu_ring_mla``: q_nope/q_rope/k_nope/k_rope/value ``[T, N, D]``, ``seqlen`` ``[B]`` or ``[2, B]``
  (q lengths, kv lengths), ``mask_type`` ``no_mask`` or ``mask_type_triu`` (causal, equal lengths), a first
  ring only (``calc_type_first_ring``: a ``calc_type_default`` call merges a previous ring's output);
* ``NPU.npu_fused_infer_attention_score``: ``input_layout`` TND, query/key/value with ``query_rope`` and
  ``key_rope`` (or 192-wide query and key), cumulative ``actual_seq_lengths(_kv)``, ``sparse_mode`` 0
  without a mask or 3 (bottom-right causal);
* ``NPU.npu_fusion_attention``: TND (cumulative ``actual_seq_qlen``/``actual_seq_kvlen``), BSND or BNSD,
  192-wide query and key, 128-wide value, ``keep_prob`` 1, ``sparse_mode`` 0 without a mask, 2 or 3 (causal);
* ``Functional.scaled_dot_product_attention``: ``[B, N, S, 192]`` query and key, ``[B, N, S, 128]`` value,
  no ``attn_mask``, no dropout (``is_causal`` with equal lengths);
* ``NPU.npu_multi_head_latent_attention`` is MLA decode (paged): listed, skipped.

A recovered call becomes an ATB MLA prefill case (docs/operator.md): no mask with equal lengths is
UNDEFINED (0); causal with equal lengths and heads is MASK_FREE (2, packed kv); causal otherwise is CAUSAL
(3, padded kv).  The dumped output, where there is one, is kept beside the bundle as evidence
(golden/store/bundles.py), to be judged like a backend's output (``mlaconf import-dump --judge``,
tools/import_dump.py).
"""

from __future__ import annotations

import math
import re
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from mlaconf.facts.operator import CAUSAL, MASK_FREE, NOPE_DIM, SCORE_DIM, V_DIM
from mlaconf.tools.msprobe_read import DumpedCall, Unrecoverable, check_fields, is_tensor, read_dump, value_of

if TYPE_CHECKING:
    from mlaconf.golden.specs.spec import CaseSpec

_INT_MAX = 2147483647
#: What a malformed value raises where the op's signature wants another kind (an int given as a string, a
#: list where a tensor goes): the call is refused in one line.
MALFORMED = (TypeError, ValueError, KeyError, IndexError, AttributeError, OverflowError)


@dataclass(frozen=True)
class Schema:
    """An op's public signature: its parameters in order (``positional`` of them may come by position)
    and the defaults of the optional ones (a parameter without a default is required)."""

    params: tuple[str, ...]
    positional: int
    defaults: dict[str, Any]


SCHEMAS: dict[str, Schema] = {
    # op-plugin RingMlaAtb.cpp (TORCH_LIBRARY_FRAGMENT atb): keyword-only after kv_head_num
    "npu_ring_mla": Schema(
        (
            "q_nope",
            "q_rope",
            "k_nope",
            "k_rope",
            "value",
            "mask",
            "seqlen",
            "head_num",
            "kv_head_num",
            "pre_out",
            "prev_lse",
            "qk_scale",
            "kernel_type",
            "mask_type",
            "input_layout",
            "calc_type",
        ),
        9,
        dict(
            pre_out=None,
            prev_lse=None,
            qk_scale=1.0,
            kernel_type="kernel_type_default",
            mask_type="no_mask",
            input_layout="type_bsnd",
            calc_type="calc_type_default",
        ),
    ),
    # op-plugin op_plugin_functions.yaml: keyword-only after value (the MLA prefill's subset; any other
    # keyword the dump carries must be None to be recovered)
    "npu_fused_infer_attention_score": Schema(
        (
            "query",
            "key",
            "value",
            "atten_mask",
            "actual_seq_lengths",
            "actual_seq_lengths_kv",
            "query_rope",
            "key_rope",
            "num_heads",
            "scale",
            "pre_tokens",
            "next_tokens",
            "input_layout",
            "num_key_value_heads",
            "sparse_mode",
            "inner_precise",
            "softmax_lse_flag",
        ),
        3,
        dict(
            atten_mask=None,
            actual_seq_lengths=None,
            actual_seq_lengths_kv=None,
            query_rope=None,
            key_rope=None,
            num_heads=1,
            scale=1.0,
            pre_tokens=_INT_MAX,
            next_tokens=_INT_MAX,
            input_layout="BSH",
            num_key_value_heads=0,
            sparse_mode=0,
            inner_precise=0,
            softmax_lse_flag=False,
        ),
    ),
    "npu_fusion_attention": Schema(
        (
            "query",
            "key",
            "value",
            "head_num",
            "input_layout",
            "pse",
            "padding_mask",
            "atten_mask",
            "scale",
            "keep_prob",
            "pre_tockens",
            "next_tockens",
            "inner_precise",
            "prefix",
            "actual_seq_qlen",
            "actual_seq_kvlen",
            "sparse_mode",
            "gen_mask_parallel",
            "sync",
        ),
        19,
        dict(
            pse=None,
            padding_mask=None,
            atten_mask=None,
            scale=1.0,
            keep_prob=1.0,
            pre_tockens=_INT_MAX,
            next_tockens=_INT_MAX,
            inner_precise=0,
            prefix=None,
            actual_seq_qlen=None,
            actual_seq_kvlen=None,
            sparse_mode=0,
            gen_mask_parallel=True,
            sync=False,
        ),
    ),
    "scaled_dot_product_attention": Schema(
        ("query", "key", "value", "attn_mask", "dropout_p", "is_causal", "scale", "enable_gqa"),
        8,
        dict(attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False),
    ),
}
#: Attention calls that are not MLA prefill: listed, skipped.
NOT_PREFILL = {"npu_multi_head_latent_attention": "MLA decode (paged KV cache), not prefill"}


@dataclass
class Mapped:
    """A call on the operator's inputs: packed ``[T, N, D]`` numpy tensors and the call's parameters."""

    tensors: dict[str, np.ndarray]
    q_lens: list[int]
    kv_lens: list[int]
    head_num: int
    kv_head_num: int
    scale: float
    causal: bool
    out: np.ndarray | None
    defaults: list[str] = field(default_factory=list)


@dataclass
class ImportedCase:
    """A case and the calls it stands for: the first call of its content, then every later one of equal content."""

    spec: CaseSpec
    call: str
    kept: str
    defaults: list[str]
    also: list[str] = field(default_factory=list)

    def note(self) -> str:
        said = f"; defaults not passed: {', '.join(self.defaults)}" if self.defaults else ""
        same = f"; the same content as {', '.join(self.also)}" if self.also else ""
        return f"{self.call} -> {self.spec.name}: {self.spec.case_id} ({self.kept}{said}{same})"


@dataclass
class ImportResult:
    """What an import found: the cases, one line per call that could not be recovered, the skipped ones."""

    imported: list[ImportedCase] = field(default_factory=list)
    unrecoverable: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    other_apis: Counter[str] = field(default_factory=Counter)

    @property
    def cases(self) -> list[CaseSpec]:
        return [entry.spec for entry in self.imported]

    @property
    def notes(self) -> list[str]:
        return [entry.note() for entry in self.imported]


def _check_finite(mapped: Mapped) -> None:
    """A case's golden of non-finite inputs judges nothing: such a call is said, never imported."""
    holding = [role for role, array in mapped.tensors.items() if not np.isfinite(array.astype(np.float32)).all()]
    if holding:
        raise Unrecoverable(
            f"inputs {', '.join(holding)} hold NaN or Inf: a golden of non-finite inputs judges nothing"
        )


def bind(call: DumpedCall, schema: Schema) -> tuple[dict[str, Any], list[str]]:
    """The call's arguments by name (positional ones by the schema's order), defaults filled in, and the
    ``name=default`` of each default the caller did not pass."""
    if len(call.args) > schema.positional:
        raise Unrecoverable(f"{len(call.args)} positional arguments; {call.api} takes at most {schema.positional}")
    bound: dict[str, Any] = {}
    for name, entry in zip(schema.params, call.args, strict=False):
        bound[name] = value_of(call, name, entry)
    for name, entry in call.kwargs.items():
        if name in bound:
            raise Unrecoverable(f"argument {name} passed twice (by position and by keyword)")
        value = value_of(call, name, entry)
        if name not in schema.params:
            if value is not None:
                raise Unrecoverable(f"argument {name} = {_show(value)} is set: not an MLA prefill a case expresses")
            continue
        bound[name] = value
    defaults = []
    for name in schema.params:
        if name in bound:
            continue
        if name not in schema.defaults:
            raise Unrecoverable(f"required argument {name} is not in the dump")
        bound[name] = schema.defaults[name]
        defaults.append(f"{name}={schema.defaults[name]!r}")
    return bound, defaults


def _show(value: Any) -> str:
    if isinstance(value, np.ndarray):
        return f"tensor{list(value.shape)}"
    return repr(value)


# -- mapping -------------------------------------------------------------------------------------


def _need(condition: bool, message: str) -> None:
    if not condition:
        raise Unrecoverable(message)


def _shape(name: str, array: Any, dims: int) -> np.ndarray:
    _need(isinstance(array, np.ndarray), f"{name} is not a tensor")
    _need(array.ndim == dims, f"{name} has shape {list(array.shape)}, expected {dims} dimensions")
    return np.asarray(array)


def _lengths(value: Any, name: str) -> list[int]:
    if isinstance(value, np.ndarray):
        value = value.tolist()
    _need(isinstance(value, list) and all(isinstance(v, int) for v in value), f"{name} is not a list of ints")
    return list(value)


def _from_cumulative(value: Any, name: str) -> list[int]:
    ends = _lengths(value, name)
    _need(all(b >= a for a, b in zip([0, *ends], ends, strict=False)), f"{name} {ends} is not cumulative")
    return [b - a for a, b in zip([0, *ends], ends, strict=False)]


def _split(q: np.ndarray, k: np.ndarray, v: np.ndarray) -> dict[str, np.ndarray]:
    """Packed 192-wide q and k and 128-wide v as the operator's five inputs."""
    _need(
        q.shape[-1] == SCORE_DIM and k.shape[-1] == SCORE_DIM, f"q/k head dim {q.shape[-1]}/{k.shape[-1]}, MLA's is 192"
    )
    _need(v.shape[-1] == V_DIM, f"v head dim {v.shape[-1]}, MLA's is {V_DIM}")
    return {
        "q": np.ascontiguousarray(q[..., :NOPE_DIM]),
        "q_rope": np.ascontiguousarray(q[..., NOPE_DIM:]),
        "k": np.ascontiguousarray(k[..., :NOPE_DIM]),
        "k_rope": np.ascontiguousarray(k[..., NOPE_DIM:]),
        "v": np.ascontiguousarray(v),
    }


def _output(call: DumpedCall) -> np.ndarray | None:
    if not call.output or not is_tensor(call.output[0]):
        return None
    value = value_of(call, "output.0", call.output[0])
    return value if isinstance(value, np.ndarray) else None


def map_ring_mla(call: DumpedCall, a: dict[str, Any]) -> Mapped:
    _need(
        a["calc_type"] == "calc_type_first_ring",
        f"calc_type {a['calc_type']!r} merges a previous ring's output "
        "(pre_out/prev_lse): not a self-contained prefill",
    )
    _need(a["input_layout"] in (None, "type_bsnd"), f"input_layout {a['input_layout']!r}: type_bsnd only")
    _need(a["mask_type"] in (None, "no_mask", "mask_type_triu"), f"mask_type {a['mask_type']!r}")
    names = ("q_nope", "q_rope", "k_nope", "k_rope", "value")
    q, q_rope, k, k_rope, v = (_shape(n, a[n], 3) for n in names)
    seqlen = _shape("seqlen", a["seqlen"], a["seqlen"].ndim if isinstance(a["seqlen"], np.ndarray) else 1)
    _need(seqlen.ndim in (1, 2) and (seqlen.ndim == 1 or seqlen.shape[0] == 2), f"seqlen shape {list(seqlen.shape)}")
    q_lens = [int(x) for x in (seqlen if seqlen.ndim == 1 else seqlen[0])]
    kv_lens = [int(x) for x in (seqlen if seqlen.ndim == 1 else seqlen[1])]
    causal = a["mask_type"] == "mask_type_triu"
    _need(not causal or q_lens == kv_lens, "mask_type_triu with kvSeqLen != qSeqLen: the alignment is not documented")
    tensors = {"q": q, "q_rope": q_rope, "k": k, "k_rope": k_rope, "v": v}
    return Mapped(
        tensors, q_lens, kv_lens, int(a["head_num"]), int(a["kv_head_num"]), a["qk_scale"], causal, _output(call)
    )


def map_fia(call: DumpedCall, a: dict[str, Any]) -> Mapped:
    _need(a["input_layout"] == "TND", f"input_layout {a['input_layout']!r}: TND only")
    sparse, mask = a["sparse_mode"], a["atten_mask"]
    _need(
        (sparse == 0 and mask is None) or sparse == 3,
        f"sparse_mode {sparse} with atten_mask {_show(mask)}: 0 without a mask or 3 (bottom-right causal)",
    )
    q, k, v = (_shape(n, a[n], 3) for n in ("query", "key", "value"))
    if a["query_rope"] is not None or a["key_rope"] is not None:
        q_rope, k_rope = _shape("query_rope", a["query_rope"], 3), _shape("key_rope", a["key_rope"], 3)
        tensors = _split(np.concatenate([q, q_rope], -1), np.concatenate([k, k_rope], -1), v)
    else:
        tensors = _split(q, k, v)
    heads = int(a["num_heads"])
    kv_heads = int(a["num_key_value_heads"]) or heads
    q_lens = _from_cumulative(a["actual_seq_lengths"], "actual_seq_lengths")
    kv_lens = _from_cumulative(a["actual_seq_lengths_kv"], "actual_seq_lengths_kv")
    return Mapped(tensors, q_lens, kv_lens, heads, kv_heads, a["scale"], sparse == 3, _output(call))


def _to_packed(name: str, array: np.ndarray, layout: str, heads: int) -> np.ndarray:
    """``[T, N, D]`` rows in batch order from a fusion-attention layout."""
    if layout == "TND":
        return _shape(name, array, 3)
    x = _shape(name, array, 4)
    if layout == "BNSD":
        x = x.transpose(0, 2, 1, 3)
    return np.ascontiguousarray(x.reshape(-1, x.shape[2], x.shape[3]))


def map_fusion_attention(call: DumpedCall, a: dict[str, Any]) -> Mapped:
    layout, sparse, mask = a["input_layout"], a["sparse_mode"], a["atten_mask"]
    _need(layout in ("TND", "BSND", "BNSD"), f"input_layout {layout!r}: TND, BSND or BNSD")
    _need(a["keep_prob"] == 1.0, f"keep_prob {a['keep_prob']}: dropout is not MLA prefill")
    _need(a["pse"] is None and a["padding_mask"] is None and a["prefix"] is None, "pse/padding_mask/prefix are set")
    _need(
        (sparse == 0 and mask is None) or sparse in (2, 3),
        f"sparse_mode {sparse} with atten_mask {_show(mask)}: 0 without a mask, 2 or 3 (causal)",
    )
    heads = int(a["head_num"])
    q, k, v = (_to_packed(n, a[n], layout, heads) for n in ("query", "key", "value"))
    if layout == "TND":
        q_lens = _from_cumulative(a["actual_seq_qlen"], "actual_seq_qlen")
        kv_lens = _from_cumulative(a["actual_seq_kvlen"], "actual_seq_kvlen")
    else:
        batch = a["query"].shape[0]
        q_lens, kv_lens = [q.shape[0] // batch] * batch, [k.shape[0] // batch] * batch
    _need(sparse != 2 or q_lens == kv_lens, "sparse_mode 2 (top-left causal) with kv != q lengths")
    out = _output(call)
    if out is not None and layout != "TND":
        out = _to_packed("output.0", out, layout, heads)
    return Mapped(_split(q, k, v), q_lens, kv_lens, heads, k.shape[1], a["scale"], sparse in (2, 3), out)


def map_sdpa(call: DumpedCall, a: dict[str, Any]) -> Mapped:
    _need(a["attn_mask"] is None, "attn_mask is set: a case expresses no mask or causal only")
    _need(not a["dropout_p"], f"dropout_p {a['dropout_p']}: dropout is not MLA prefill")
    q, k, v = (_shape(n, a[n], 4) for n in ("query", "key", "value"))
    batch, heads, s_q, _ = q.shape
    kv_heads, s_kv = k.shape[1], k.shape[2]
    _need(kv_heads == heads or bool(a["enable_gqa"]), f"{heads} query heads, {kv_heads} kv heads without enable_gqa")
    _need(not a["is_causal"] or s_q == s_kv, "is_causal with kv length != q length (SDPA aligns top-left)")

    def packed(x: np.ndarray) -> np.ndarray:
        return np.ascontiguousarray(x.transpose(0, 2, 1, 3).reshape(-1, x.shape[1], x.shape[3]))

    tensors = _split(packed(q), packed(k), packed(v))
    scale = a["scale"] if a["scale"] is not None else 1.0 / math.sqrt(q.shape[-1])
    out = _output(call)
    return Mapped(
        tensors,
        [s_q] * batch,
        [s_kv] * batch,
        heads,
        kv_heads,
        scale,
        bool(a["is_causal"]),
        packed(out) if out is not None and out.ndim == 4 else None,
    )


MAPPERS = {
    "npu_ring_mla": map_ring_mla,
    "npu_fused_infer_attention_score": map_fia,
    "npu_fusion_attention": map_fusion_attention,
    "scaled_dot_product_attention": map_sdpa,
}


# -- cases ---------------------------------------------------------------------------------------


def case_of(call: DumpedCall, mapped: Mapped, store: Path | None) -> CaseSpec:
    """The ATB MLA prefill case of a mapped call, its tensors saved as a bundle in ``store``."""
    from mlaconf.golden.specs.spec import SpecError
    from mlaconf.golden.specs.spec_build import build_case
    from mlaconf.golden.store.bundles import dtype_name, save_bundle, save_dumped_output

    t = mapped.tensors
    dtypes = {role: str(x.dtype) for role, x in t.items()}
    _need(len(set(dtypes.values())) == 1, f"inputs of mixed dtypes {dtypes}")
    try:
        dtype = dtype_name(t["q"])
    except ValueError as err:
        raise Unrecoverable(f"q dtype {t['q'].dtype}: the operator takes fp16 or bf16") from err
    _need(sum(mapped.q_lens) == t["q"].shape[0], f"q lengths {mapped.q_lens} vs {t['q'].shape[0]} query rows")
    _need(sum(mapped.kv_lens) == t["k"].shape[0], f"kv lengths {mapped.kv_lens} vs {t['k'].shape[0]} key rows")
    _need(t["q"].shape[1] == mapped.head_num, f"head_num {mapped.head_num} vs q's {t['q'].shape[1]} heads")
    _need(t["k"].shape[1] == mapped.kv_head_num, f"kv_head_num {mapped.kv_head_num} vs k's {t['k'].shape[1]} heads")
    equal = mapped.q_lens == mapped.kv_lens and mapped.head_num == mapped.kv_head_num
    if not mapped.causal:
        _need(equal, "no mask with kv != q lengths or grouped kv heads: the operator's UNDEFINED mask needs both equal")
        mask, layout = 0, "packed"
    else:
        mask, layout = (MASK_FREE, "packed") if equal else (CAUSAL, "padded")
    bundle = save_bundle(t, store)
    name = re.sub(r"[^A-Za-z0-9._+-]", "-", f"{call.where}-{call.name}".lstrip("./-"))[:128]
    raw = dict(
        name=name,
        q_seqlen=mapped.q_lens,
        kv_seqlen=mapped.kv_lens,
        head_num=mapped.head_num,
        kv_head_num=mapped.kv_head_num,
        dtype=dtype,
        mask_type=mask,
        kv_layout=layout,
        qk_scale=float(mapped.scale),
        inputs=bundle.stem,
    )
    try:
        spec = build_case(raw, source=f"{call.where}/dump.json")
    except SpecError as err:
        raise Unrecoverable(f"not an ATB MLA prefill case: {err.field_name}: {str(err).rsplit(': ', 1)[-1]}") from err
    out = mapped.out
    if out is not None and out.shape == (t["q"].shape[0], mapped.head_num, V_DIM) and out.dtype == t["q"].dtype:
        save_dumped_output(spec.case_id, out, store)
    else:
        mapped.out = None  # no output of the case's shape and dtype: nothing to keep
    return spec


def import_dump(root: Path, store: Path | None = None) -> ImportResult:
    """Every MLA prefill call of the dump under ``root`` as a case (bundles written to ``store``); calls of
    equal content (the same op called twice, positionally and by keyword, or in two steps) are one case."""
    result = ImportResult()
    first_of: dict[str, ImportedCase] = {}
    for call in read_dump(root):
        label = f"{call.where}/{call.name}"
        if call.api in NOT_PREFILL:
            result.skipped.append(f"{label}: {NOT_PREFILL[call.api]}")
            continue
        if call.api not in SCHEMAS:
            result.other_apis[call.api] += 1
            continue
        try:
            check_fields(call)
            bound, defaults = bind(call, SCHEMAS[call.api])
            mapped = MAPPERS[call.api](call, bound)
        except Unrecoverable as err:
            if call.api == "scaled_dot_product_attention" and "MLA's is" in str(err):
                result.skipped.append(f"{label}: not MLA-shaped ({err})")
            else:
                result.unrecoverable.append(f"{label}: {err}")
            continue
        except MALFORMED as err:  # a value of the wrong kind where the op's signature wants another
            result.unrecoverable.append(f"{label}: malformed entry ({type(err).__name__}: {err})")
            continue
        try:
            _check_finite(mapped)
            spec = case_of(call, mapped, store)
        except Unrecoverable as err:
            result.unrecoverable.append(f"{label}: {err}")
            continue
        same = first_of.get(spec.content_hash)
        if same is not None:
            same.also.append(label)
            continue
        kept = "dumped output kept" if mapped.out is not None else "no dumped output"
        entry = ImportedCase(spec, label, kept, defaults)
        first_of[spec.content_hash] = entry
        result.imported.append(entry)
    return result


def suite_text(result: ImportResult, root: Path, suite: str) -> str:
    """The cases as a suite file, each with the call it came from."""
    lines = [
        f"# Imported from the msprobe dump {root} by `mlaconf import-dump`: each case's inputs are the dumped",
        "# tensors (inputs = the bundle's hash in the golden store's inputs/ folder), not seeded draws.",
        "",
        "[suite]",
        f'name = "{suite}"',
        f'description = "MLA prefill calls of the msprobe dump {root.name}"',
        "",
    ]
    for entry in result.imported:
        spec = entry.spec
        lines.append(f"# {entry.note()}")
        lines.append(spec.to_toml().replace("[[case]]\n", f'[[case]]\nname = "{spec.name}"\n', 1))
    return "\n".join(lines)
