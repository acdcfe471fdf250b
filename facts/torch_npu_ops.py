"""What the two torch_npu ops accept, each rule with its source and how sure we are of it.

harness/npu_ops.py refuses (as ``Unsupported``) what a rule forbids, and the CPU fake of torch_npu
(tests/fake_torch_npu.py) raises on it, so the fake is exactly as strict and as loose as this list;
tests/cover/test_npu_backends.py breaks each rule once and watches the fake refuse it.

``confidence`` is ``confirmed-in-source`` when the rule was read in the cited file, ``unconfirmed``
when only documentation or a consumer says so (a device run settles it: ``mlaconf ascend`` writes what
the device did into its facts report).
"""

from __future__ import annotations

from dataclasses import dataclass

from mlaconf.facts.evidence import CONFIRMED, UNCONFIRMED


@dataclass(frozen=True)
class OpRule:
    """One documented rule of a torch_npu op: what it says, where it was read, how sure."""

    id: str
    op: str
    rule: str
    source: str
    confidence: str
    #: The source in a few words, for the one line a skip or refusal prints.
    cite: str


RING = "torch_npu.atb.npu_ring_mla"
FIA = "torch_npu.npu_fused_infer_attention_score"

#: npu_fused_infer_attention_score in TND: the only float dtype, and the most tokens per tensor.
FIA_TND_DTYPE = "bf16"
FIA_TND_MAX_TOKENS = 1_048_576
#: The keywords the MLA mapping needs (op-plugin 6.0.0 has the op without them).
FIA_MLA_KEYWORDS = ("query_rope", "key_rope")
#: npu_ring_mla's kernel_type values the operation runs (op-plugin maps both strings, ATB refuses default).
RING_KERNEL_TYPES = ("kernel_type_high_precision",)

RULES: tuple[OpRule, ...] = (
    OpRule(
        "fia-tnd-bf16",
        FIA,
        "input_layout TND takes bf16 only (never cast here: that would judge another computation)",
        'ops-transformer prompt_flash_attention tiling, CheckInputShapeWhenLayoutIsTND ("When layout is TND, '
        'inputDataType should be bf16"); Ascend/op-plugin 7.2.0 docs/zh/custom_APIs/torch_npu/'
        "torch_npu-npu_fused_infer_attention_score.md (TND constraints); vllm-ascend casts fp16 to bf16 for it. "
        "Newer docs hint fp16 MHA on the newest CANN",
        UNCONFIRMED,
        "ops-transformer CheckInputShapeWhenLayoutIsTND, op-plugin 7.2.0 FIA doc",
    ),
    OpRule(
        "fia-tnd-max-tokens",
        FIA,
        f"input_layout TND: query and key each hold at most {FIA_TND_MAX_TOKENS} tokens (T)",
        "Ascend/op-plugin docs/zh/custom_APIs/torch_npu/torch_npu-npu_fused_infer_attention_score.md (TND: T <= 1M)",
        UNCONFIRMED,
        "op-plugin FIA doc, TND",
    ),
    OpRule(
        "fia-tnd-max-batch",
        FIA,
        "input_layout TND: actual_seq_lengths and actual_seq_lengths_kv hold 1..4096 batches",
        "Ascend/op-plugin docs/zh/custom_APIs/torch_npu/torch_npu-npu_fused_infer_attention_score.md",
        UNCONFIRMED,
        "op-plugin FIA doc, TND",
    ),
    OpRule(
        "fia-gqa-ratio",
        FIA,
        "num_heads is a multiple of num_key_value_heads, at most 64 query heads per kv head",
        "Ascend/op-plugin docs/zh/custom_APIs/torch_npu/torch_npu-npu_fused_infer_attention_score.md",
        UNCONFIRMED,
        "op-plugin FIA doc",
    ),
    OpRule(
        "fia-mla-keywords",
        FIA,
        "the MLA split needs the query_rope/key_rope keywords (absent from op-plugin 6.0.0: a TypeError)",
        "Ascend/op-plugin op_plugin/config/op_plugin_functions.yaml, npu_fused_infer_attention_score "
        "(query_rope/key_rope added after 6.0.0)",
        UNCONFIRMED,
        "op-plugin op_plugin_functions.yaml",
    ),
    OpRule(
        "ring-kernel-high-precision",
        RING,
        "kernel_type must be kernel_type_high_precision: the operation refuses kernel_type_default",
        "Ascend/op-plugin op_plugin/ops/atb/RingMlaAtb.cpp kernel_type_map maps both strings; "
        "hicann/ascend-transformer-boost ring_mla_operation.cpp ParamCheck refuses kernelType != "
        "KERNELTYPE_HIGH_PRECISION (0 is KERNELTYPE_DEFAULT), CreateOperation returns ERROR_INVALID_PARAM: "
        "br_release_cann_8.2.RC1 src/ops_infer/ring_mla/ring_mla_operation.cpp:100, br_release_cann_8.3.RC1 "
        "same file :101, master (ddcc8b6225b8) src/ops/ops_infer/ring_mla/ring_mla_operation.cpp:101",
        CONFIRMED,
        "ATB ring_mla_operation.cpp ParamCheck",
    ),
    OpRule(
        "ring-mode-strings",
        RING,
        "mask_type in {no_mask, mask_type_triu}, input_layout type_bsnd, calc_type in "
        "{calc_type_default, calc_type_first_ring}",
        "Ascend/op-plugin op_plugin/ops/atb/RingMlaAtb.cpp mask_type_map, input_layout_map, calc_type_map",
        CONFIRMED,
        "op-plugin RingMlaAtb.cpp",
    ),
    OpRule(
        "ring-seqlen-host",
        RING,
        "seqlen is a host (CPU) tensor",
        "Ascend/op-plugin op_plugin/ops/atb/RingMlaAtb.cpp npu_ring_mla, TORCH_CHECK on seqlen's device",
        CONFIRMED,
        "op-plugin RingMlaAtb.cpp",
    ),
    OpRule(
        "ring-kv-ge-q-with-mask",
        RING,
        "with mask_type_triu every batch needs kvSeqLen >= qSeqLen (or 0); without a mask any lengths",
        "Ascend/op-plugin op_plugin/python/atb/_atb_api_docs.py npu_ring_mla (seqlen constraints)",
        UNCONFIRMED,
        "op-plugin _atb_api_docs.py",
    ),
    OpRule(
        "ring-q-nonzero",
        RING,
        "every batch has qSeqLen > 0",
        "Ascend/op-plugin op_plugin/python/atb/_atb_api_docs.py npu_ring_mla (seqlen constraints)",
        UNCONFIRMED,
        "op-plugin _atb_api_docs.py",
    ),
)

RULES_BY_ID = {rule.id: rule for rule in RULES}


def rule_text(rule_id: str) -> str:
    """The line an Unsupported carries: the rule, its source in short, its confidence and where it lives."""
    rule = RULES_BY_ID[rule_id]
    return f"{rule.rule} ({rule.cite}; {rule.confidence}: facts/torch_npu_ops.py {rule.id})"
