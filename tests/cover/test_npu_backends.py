"""ring-mla and npu-fia (harness/npu_ops.py) on the CPU against a fake torch_npu (tests/fake_torch_npu.py).

The fake checks every argument the op receives as op-plugin documents it and computes the answer with
a float32 torch reference; the backends must map each MLA prefill call onto it (layouts, masks, GQA, a
cached prefix through the LSE merge), pass the smoke suite through it, and skip with a reason without it.
"""

from __future__ import annotations

import dataclasses
import functools
import re
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import torch

from mlaconf.facts.evidence import CONFIRMED, UNCONFIRMED
from mlaconf.facts.torch_npu_ops import FIA_TND_MAX_TOKENS, RULES, OpRule
from mlaconf.golden.building.generate import build_golden
from mlaconf.golden.building.inputs import generate_inputs
from mlaconf.golden.specs.spec import CaseSpec
from mlaconf.golden.specs.spec_build import build_case
from mlaconf.golden.specs.types import GoldenCase
from mlaconf.harness import registry
from mlaconf.harness.backend import Backend, MlaPrefillCall, Unsupported
from mlaconf.harness.npu_ops import FusedInferAttentionBackend, RingMlaBackend, compressed_causal_mask
from mlaconf.judge.deviations import load_deviations
from mlaconf.judge.policy import load_policies
from mlaconf.runner.conformance import run_case
from mlaconf.runner.execution import execute, make_call
from tests import fake_torch_npu
from tests.fake_torch_npu import CpuFusedInferAttention, CpuRingMla, FakeOpError, FakeTorchNpu
from tests.pytest_runs import run_pytest

ROOT = Path(__file__).resolve().parents[2]
POLICIES = load_policies()
BACKENDS = {"ring-mla": CpuRingMla, "npu-fia": CpuFusedInferAttention}


def golden_of(**fields: Any) -> GoldenCase:
    return build_golden(build_case(fields, source="test"))


@functools.cache
def path_golden(path: str) -> GoldenCase:
    return golden_of(**PATHS[path])


#: Small cases that together take every path: each mask, both q and kv layouts, GQA, a prefix longer
#: and one shorter than the new tokens (RingMLA's chunks), a zero-length batch, a padded capacity.
PATHS = {
    "undefined-2d-padded": dict(q_seqlen=[9, 5], head_num=2, q_layout="2d", kv_layout="padded"),
    "mask_free-bf16-packed": dict(q_seqlen=[12, 7], head_num=2, mask_type=2, dtype="bf16"),
    "mask_free-fp16-fill-inf": dict(q_seqlen=[12, 7], head_num=2, mask_type=2, mask_fill="neg_inf"),
    "causal-gqa-prefix": dict(
        q_seqlen=[6, 10], kv_seqlen=[20, 13], head_num=4, kv_head_num=2, mask_type=3, kv_layout="padded"
    ),
    "causal-zero-batch-capacity": dict(
        q_seqlen=[0, 5, 4], kv_seqlen=[3, 5, 9], head_num=2, mask_type=3, kv_layout="padded", kv_capacity=12
    ),
}


def ready(backend: Backend, fake: FakeTorchNpu) -> Backend:
    """``backend`` probed (its one tiny call made) and the fake's call log emptied again."""
    assert backend.available(), backend.available().reason
    fake.ring_calls.clear()
    fake.fia_calls.clear()
    return backend


def for_backend(name: str, fields: dict[str, Any]) -> dict[str, Any]:
    """npu-fia takes bf16 only in TND (facts/torch_npu_ops.py fia-tnd-bf16): its paths run in bf16."""
    return {**fields, "dtype": "bf16"} if name == "npu-fia" else fields


def run(backend: Backend, golden: GoldenCase) -> str:
    result = run_case(golden, backend, policy_set=POLICIES, policy="default", deviations=load_deviations())
    assert result.outcome == "passed", result.message
    return result.outcome


@pytest.mark.parametrize("name", BACKENDS)
@pytest.mark.parametrize("path", PATHS)
def test_each_mapping_path_matches_the_golden(monkeypatch: pytest.MonkeyPatch, name: str, path: str) -> None:
    fake_torch_npu.install(monkeypatch)
    run(BACKENDS[name](), golden_of(**for_backend(name, PATHS[path])))


def test_ring_mla_arguments_one_call_per_mask(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = fake_torch_npu.install(monkeypatch)
    golden = path_golden("mask_free-bf16-packed")
    call = make_call(golden.inputs, golden.spec)
    ready(CpuRingMla(), fake).run(call)
    (only,) = fake.ring_calls
    assert (only["mask_type"], only["calc_type"], only["kernel_type"], only["input_layout"]) == (
        "mask_type_triu",
        "calc_type_first_ring",
        "kernel_type_high_precision",
        "type_bsnd",
    )
    assert torch.equal(only["mask"], call.mask)  # the documented fill: the case's mask
    assert only["seqlen"].tolist() == [[12, 7], [12, 7]] and only["seqlen"].dtype == torch.int32
    assert (only["head_num"], only["kv_head_num"], only["qk_scale"]) == (2, 2, golden.spec.qk_scale)
    assert only["pre_out"] is None and only["prev_lse"] is None
    fake.ring_calls.clear()
    undefined = path_golden("undefined-2d-padded")
    ready(CpuRingMla(), fake).run(make_call(undefined.inputs, undefined.spec))
    assert [c["mask_type"] for c in fake.ring_calls] == ["no_mask"]


def test_ring_mla_takes_mask_free_in_its_own_encoding_whatever_the_fill(monkeypatch: pytest.MonkeyPatch) -> None:
    """A MASK_FREE fill other than the documented one is a question for ATB's MLA prefill kernels: RingMLA gets
    the causal mask in its own encoding (the fake refuses any other) and the case passes."""
    fake = fake_torch_npu.install(monkeypatch)
    golden = path_golden("mask_free-fp16-fill-inf")
    call = make_call(golden.inputs, golden.spec)
    assert call.mask is not None and torch.isinf(call.mask).any()
    run(ready(CpuRingMla(), fake), golden)
    (only,) = fake.ring_calls
    assert torch.equal(only["mask"], compressed_causal_mask(torch.float16))


def test_ring_mla_merges_a_cached_prefix_by_lse(monkeypatch: pytest.MonkeyPatch) -> None:
    """q [6, 10] against kv [20, 13]: the new tokens causal, then prefixes 14 and 3 with no mask; the
    10 query rows of the second batch meet a 3-key prefix in chunks of at most 3 rows."""
    fake = fake_torch_npu.install(monkeypatch)
    golden = path_golden("causal-gqa-prefix")
    ready(CpuRingMla(), fake).run(make_call(golden.inputs, golden.spec))
    first, second = fake.ring_calls
    assert (first["mask_type"], first["calc_type"]) == ("mask_type_triu", "calc_type_first_ring")
    assert first["seqlen"].tolist() == [[6, 10], [6, 10]]
    assert torch.equal(first["mask"], compressed_causal_mask(torch.float16))
    assert (second["mask_type"], second["calc_type"]) == ("no_mask", "calc_type_default")
    assert second["seqlen"].tolist() == [[6, 3, 3, 3, 1], [14, 3, 3, 3, 3]]
    assert (first["kv_head_num"], second["kv_head_num"]) == (2, 2)
    assert second["pre_out"].shape == (16, 4, 128) and second["prev_lse"].shape == (4, 16)


def test_fia_arguments(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = fake_torch_npu.install(monkeypatch)
    backend = ready(CpuFusedInferAttention(), fake)
    for path in ("causal-zero-batch-capacity", "undefined-2d-padded"):
        golden = golden_of(**for_backend("npu-fia", PATHS[path]))
        backend.run(make_call(golden.inputs, golden.spec))
    causal, undefined = fake.fia_calls
    assert (causal["input_layout"], causal["sparse_mode"], causal["num_heads"]) == ("TND", 3, 2)
    assert causal["actual_seq_lengths"] == [5, 9] and causal["actual_seq_lengths_kv"] == [5, 14]  # batch 0 left out
    assert causal["atten_mask"].shape == (2048, 2048) and causal["atten_mask"].dtype == torch.bool
    assert causal["query_rope"].shape == (9, 2, 64) and causal["key_rope"].shape == (14, 2, 64)
    assert (undefined["sparse_mode"], undefined["atten_mask"]) == (0, None)
    assert undefined["actual_seq_lengths"] == undefined["actual_seq_lengths_kv"] == [9, 14]


class NoPrefixMerge(CpuRingMla):
    """A mapping that forgets the prefix: each batch sees only its newest q_b keys."""

    def _merge_prefix(self, ring: Any, call: MlaPrefillCall, packed: Any, *args: Any) -> torch.Tensor:
        return args[1]  # (mask, out, lse, device): step 1 alone


class UnmaskedFia(CpuFusedInferAttention):
    """A mapping that passes no causal mask at all for CAUSAL (sparse_mode 0)."""

    @staticmethod
    def _sparse(call: MlaPrefillCall) -> tuple[int, torch.Tensor | None]:
        return 0, None


def test_a_wrong_mapping_fails_the_case(monkeypatch: pytest.MonkeyPatch) -> None:
    fake_torch_npu.install(monkeypatch)
    for wrong in (NoPrefixMerge(), UnmaskedFia()):
        golden = golden_of(**for_backend(wrong.name, PATHS["causal-gqa-prefix"]))
        result = run_case(golden, wrong, policy_set=POLICIES, policy="default", deviations=load_deviations())
        assert result.outcome == "failed", type(wrong).__name__


def test_the_fake_refuses_what_the_op_would(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = fake_torch_npu.install(monkeypatch)
    golden = path_golden("causal-gqa-prefix")
    call = make_call(golden.inputs, golden.spec)

    ring = fake.module().atb.npu_ring_mla  # type: ignore[attr-defined]
    q = call.q[:6].reshape(6, 4, 128).contiguous()
    qr = call.q_rope[:6].reshape(6, 4, 64).contiguous()
    kv = torch.zeros(6, 2, 128, dtype=torch.float16)
    kr = torch.zeros(6, 2, 64, dtype=torch.float16)
    mask = compressed_causal_mask(torch.float16)
    seqlen = torch.tensor([[6], [6]], dtype=torch.int32)
    args = (q, qr, kv, kr, kv, mask, seqlen, 4, 2)
    common = dict(qk_scale=0.1, kernel_type="kernel_type_high_precision", input_layout="type_bsnd")
    wrong = (*args[:5], torch.ones(512, 512).triu(1).half(), *args[6:])  # the bf16 encoding with fp16 inputs
    with pytest.raises(FakeOpError, match=r"triu mask is not the torch\.float16 encoding"):
        ring(*wrong, mask_type="mask_type_triu", calc_type="calc_type_first_ring", **common)
    with pytest.raises(FakeOpError, match="seqlen must be a host"):
        ring(*args[:6], seqlen.to("meta"), 4, 2, mask_type="no_mask", calc_type="calc_type_first_ring", **common)
    with pytest.raises(FakeOpError, match="mask_type 'causal'"):
        ring(*args, mask_type="causal", calc_type="calc_type_first_ring", **common)
    with pytest.raises(FakeOpError, match="calc_type_default merges pre_out and prev_lse"):
        ring(*args, mask_type="no_mask", calc_type="calc_type_default", **common)
    with pytest.raises(FakeOpError, match="k_nope has shape"):
        ring(
            q,
            qr,
            kv[:, :1],
            kr,
            kv,
            mask,
            seqlen,
            4,
            2,
            mask_type="no_mask",
            calc_type="calc_type_first_ring",
            **common,
        )
    with pytest.raises(TypeError, match="unexpected keyword argument 'layout'"):
        ring(*args, layout="TND")  # type: ignore[call-arg]
    fia = fake.module().npu_fused_infer_attention_score  # type: ignore[attr-defined]
    q, qr, kv, kr = q.bfloat16(), qr.bfloat16(), kv.bfloat16(), kr.bfloat16()  # TND takes bf16 only
    tnd = dict(query_rope=qr, key_rope=kr, num_heads=4, num_key_value_heads=2, scale=0.1)
    with pytest.raises(FakeOpError, match="input_layout 'BSND'"):
        fia(q, kv, kv, actual_seq_lengths=[6], actual_seq_lengths_kv=[6], input_layout="BSND", **tnd)
    with pytest.raises(FakeOpError, match="actual_seq_lengths_kv ends at 5"):
        fia(q, kv, kv, actual_seq_lengths=[6], actual_seq_lengths_kv=[5], input_layout="TND", **tnd)
    with pytest.raises(FakeOpError, match="sparse_mode 2"):
        fia(q, kv, kv, actual_seq_lengths=[6], actual_seq_lengths_kv=[6], input_layout="TND", sparse_mode=2, **tnd)


def _ring_args(q_len: int, kv_len: int, dtype: torch.dtype = torch.bfloat16) -> tuple[Any, ...]:
    """npu_ring_mla's positional arguments for one batch, one head."""
    q, qr = torch.zeros(q_len, 1, 128, dtype=dtype), torch.zeros(q_len, 1, 64, dtype=dtype)
    k, kr = torch.zeros(kv_len, 1, 128, dtype=dtype), torch.zeros(kv_len, 1, 64, dtype=dtype)
    seqlen = torch.tensor([[q_len], [kv_len]], dtype=torch.int32)
    return (q, qr, k, kr, k.clone(), compressed_causal_mask(dtype), seqlen, 1, 1)


RING_OK: dict[str, Any] = dict(
    qk_scale=0.1,
    kernel_type="kernel_type_high_precision",
    mask_type="no_mask",
    input_layout="type_bsnd",
    calc_type="calc_type_first_ring",
)


def _rows(n: int, dim: int, dtype: torch.dtype) -> torch.Tensor:
    """``[n, 1, dim]`` zeros; a view without memory past TND's token limit (refused before any layout check)."""
    big = n > FIA_TND_MAX_TOKENS
    return torch.zeros(1 if big else n, 1, dim, dtype=dtype).expand(n, 1, dim)


def _fia_args(q_len: int, kv_len: int, dtype: torch.dtype = torch.bfloat16) -> dict[str, Any]:
    """npu_fused_infer_attention_score's arguments for one TND batch, one head, no mask."""
    return dict(
        query=_rows(q_len, 128, dtype),
        key=torch.zeros(kv_len, 1, 128, dtype=dtype),
        value=torch.zeros(kv_len, 1, 128, dtype=dtype),
        query_rope=_rows(q_len, 64, dtype),
        key_rope=torch.zeros(kv_len, 1, 64, dtype=dtype),
        actual_seq_lengths=[q_len],
        actual_seq_lengths_kv=[kv_len],
        num_heads=1,
        scale=0.1,
        input_layout="TND",
        num_key_value_heads=1,
    )


def _breaks(fake: FakeTorchNpu, rule_id: str) -> None:
    """One call that breaks exactly the rule ``rule_id`` (its only reason to be refused)."""
    ring = fake.npu_ring_mla
    fia = fake.npu_fused_infer_attention_score
    if rule_id == "fia-tnd-bf16":
        fia(**_fia_args(4, 4, torch.float16))
    elif rule_id == "fia-tnd-max-tokens":
        fia(**_fia_args(FIA_TND_MAX_TOKENS + 1, 4))
    elif rule_id == "fia-tnd-max-batch":
        fia(**{**_fia_args(4, 4), "actual_seq_lengths": [], "actual_seq_lengths_kv": []})
    elif rule_id == "fia-gqa-ratio":
        fia(**{**_fia_args(4, 4), "num_heads": 3, "num_key_value_heads": 2})
    elif rule_id == "fia-mla-keywords":
        FakeTorchNpu(fia_without_rope=True).module().npu_fused_infer_attention_score(**_fia_args(4, 4))  # type: ignore[attr-defined]
    elif rule_id == "ring-kernel-high-precision":
        ring(*_ring_args(4, 4), **{**RING_OK, "kernel_type": "kernel_type_default"})
    elif rule_id == "ring-mode-strings":
        ring(*_ring_args(4, 4), **{**RING_OK, "input_layout": "type_tnd"})
    elif rule_id == "ring-seqlen-host":
        args = _ring_args(4, 4)
        ring(*args[:6], args[6].to("meta"), 1, 1, **RING_OK)
    elif rule_id == "ring-kv-ge-q-with-mask":
        ring(*_ring_args(4, 2), **{**RING_OK, "mask_type": "mask_type_triu"})
    elif rule_id == "ring-q-nonzero":
        ring(*_ring_args(0, 4), **RING_OK)
    else:
        raise AssertionError(f"no test breaks rule {rule_id}: add one here")


@pytest.mark.parametrize("rule", RULES, ids=lambda rule: rule.id)
def test_the_fake_enforces_every_documented_rule(rule: OpRule) -> None:
    """Each rule of facts/torch_npu_ops.py, broken once, is refused by the fake naming the rule."""
    assert rule.source and rule.cite and rule.confidence in (CONFIRMED, UNCONFIRMED)
    # the keywords op-plugin 6.0.0 lacks fail as Python does: a TypeError naming the first one
    refusal = "unexpected keyword argument 'query_rope'" if rule.id == "fia-mla-keywords" else f"[{rule.id}]"
    with pytest.raises((FakeOpError, TypeError), match=re.escape(refusal)):
        _breaks(FakeTorchNpu(), rule.id)


def test_the_fake_is_as_loose_as_the_ops() -> None:
    """What the rules allow, the fake takes: fewer keys than queries without a mask, one TND batch."""
    fake = FakeTorchNpu()
    out, lse = fake.npu_ring_mla(*_ring_args(4, 2), **RING_OK)
    assert out.shape == (4, 1, 128) and torch.isfinite(lse).all()
    out, _ = fake.npu_fused_infer_attention_score(**_fia_args(4, 4))
    assert out.shape == (4, 1, 128)


def test_npu_fia_skips_fp16_and_too_many_tokens_citing_the_rule(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = fake_torch_npu.install(monkeypatch)
    backend = ready(CpuFusedInferAttention(), fake)
    golden = path_golden("undefined-2d-padded")  # fp16
    with pytest.raises(Unsupported, match=r"^fp16: input_layout TND takes bf16 only .*fia-tnd-bf16\)$"):
        backend.run(make_call(golden.inputs, golden.spec))
    assert not fake.fia_calls, "never cast: nothing reaches the op"


def test_a_probe_proves_the_op_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    """The op exists but its library cannot load (the lazy libatb.so), or op-plugin 6.0.0's FIA has no
    query_rope: unavailable, with the exception, the library and the versions in the reason."""
    monkeypatch.setenv("ATB_HOME_PATH", "/opt/atb/cxx_abi_1")
    broken = FakeTorchNpu(load_error=OSError("libatb.so: cannot open shared object file"))
    fake_torch_npu.install(monkeypatch, broken)
    assert CpuRingMla().available().reason == (
        "torch_npu.atb.npu_ring_mla failed its probe call (OSError: libatb.so: cannot open shared object file); "
        "torch_npu 2.5.1-fake, /opt/atb/cxx_abi_1/lib/libatb.so"
    )
    assert len(broken.ring_calls) == 1
    assert (
        CpuFusedInferAttention()
        .available()
        .reason.startswith("torch_npu.npu_fused_infer_attention_score failed its probe call (OSError")
    )
    fake_torch_npu.install(monkeypatch, FakeTorchNpu(fia_without_rope=True))
    assert CpuFusedInferAttention().available().reason == (
        "torch_npu.npu_fused_infer_attention_score in torch_npu 2.5.1-fake has no keyword ['query_rope', 'key_rope']"
    )
    fine = fake_torch_npu.install(monkeypatch)
    assert CpuRingMla().available() and CpuFusedInferAttention().available()
    assert len(fine.ring_calls) == len(fine.fia_calls) == 1  # one tiny real call each


def test_what_an_op_cannot_express_is_skipped_with_the_reason(monkeypatch: pytest.MonkeyPatch) -> None:
    fake_torch_npu.install(monkeypatch)
    many = build_case({"q_seqlen": {"pattern": [1], "times": 4097}, "head_num": 1, "dtype": "bf16"}, source="test")
    call = make_call(generate_inputs(many), many)
    with pytest.raises(Unsupported, match="4097 batches: the TND layout takes at most 4096"):
        CpuFusedInferAttention().run(call)
    with pytest.raises(pytest.skip.Exception, match=f"backend npu-fia cannot express case {many.case_id}: 4097"):
        execute(CpuFusedInferAttention(), call, many)
    for backend in (CpuRingMla(), CpuFusedInferAttention()):
        with pytest.raises(Unsupported, match="maskType 4"):
            backend.run(dataclasses.replace(call, mask_type=4))
    fits = build_case({"q_seqlen": {"pattern": [1], "times": 4096}, "head_num": 1, "dtype": "bf16"}, source="test")
    out = CpuFusedInferAttention().run(make_call(generate_inputs(fits), fits))  # the limit itself fits
    assert out.shape == (4096, 1, 128)


def install_module(monkeypatch: pytest.MonkeyPatch, module: ModuleType | None) -> None:
    monkeypatch.setitem(sys.modules, "torch_npu", module)


@pytest.mark.parametrize("factory", [RingMlaBackend, FusedInferAttentionBackend])
def test_without_torch_npu_each_backend_is_unavailable_with_the_reason(
    monkeypatch: pytest.MonkeyPatch, factory: type[RingMlaBackend]
) -> None:
    install_module(monkeypatch, None)
    backend = factory()
    assert isinstance(backend, Backend)
    availability = backend.available()
    assert not availability
    assert availability.reason.startswith("torch_npu is missing or fails to import (ModuleNotFoundError")
    assert backend.info().device == "unavailable"
    with pytest.raises(RuntimeError, match=f"the {backend.name} backend is unavailable: torch_npu is missing"):
        backend.run(make_call(path_golden("undefined-2d-padded").inputs, path_golden("undefined-2d-padded").spec))


def test_an_old_torch_npu_a_missing_device_and_another_chip_are_reasons(monkeypatch: pytest.MonkeyPatch) -> None:
    old = FakeTorchNpu().module()
    del old.atb  # type: ignore[attr-defined]
    install_module(monkeypatch, old)
    assert RingMlaBackend().available().reason == (
        "torch_npu 2.5.1-fake has no torch_npu.atb.npu_ring_mla (a newer torch_npu/op-plugin ships it)"
    )
    assert CpuFusedInferAttention().available()  # the other op is still there
    fake_torch_npu.install(monkeypatch, FakeTorchNpu(devices=0))
    assert RingMlaBackend().available().reason == "no NPU device visible to torch_npu"
    fake_torch_npu.install(monkeypatch, FakeTorchNpu(soc="Ascend310P3"))
    assert (
        FusedInferAttentionBackend()
        .available()
        .reason.startswith("SoC 'Ascend310P3': torch_npu.npu_fused_infer_attention_score runs on Atlas 800I A2/A3 only")
    )


def test_both_are_registered_by_name(monkeypatch: pytest.MonkeyPatch) -> None:
    install_module(monkeypatch, None)
    assert isinstance(registry.create("ring-mla"), RingMlaBackend)
    assert isinstance(registry.create("npu-fia"), FusedInferAttentionBackend)
    assert "ring-mla" in registry.choices_text() and "npu-fia" in registry.choices_text()
    assert set(registry.NPU_BACKENDS) == {"atb", "ring-mla", "npu-fia"} <= set(registry.BUILTIN)


def test_a_smoke_run_without_torch_npu_skips_every_case_with_the_reason(tmp_path: Path) -> None:
    done = run_pytest(
        "-q",
        "-n",
        "0",
        "-rs",
        str(ROOT / "cases"),
        "--mla-backend",
        "ring-mla",
        "--mla-suite",
        "smoke",
        "-k",
        "test_conformance",
        report=tmp_path / "report",
        cwd=tmp_path,
        inherit=True,
        env={"MLA_GOLDEN_DIR": str(tmp_path / "golden")},
    )
    text = done.stdout + done.stderr
    assert "backend ring-mla unavailable: torch_npu is missing or fails to import" in text, text[-3000:]
    assert " passed" not in text.splitlines()[-1], text[-2000:]
    assert done.returncode != 0, "a run whose backend is missing is never green"


def test_spec_helper_cases_are_valid() -> None:
    for fields in PATHS.values():
        assert isinstance(build_case(fields, source="test"), CaseSpec)
