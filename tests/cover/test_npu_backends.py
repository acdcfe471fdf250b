"""ring-mla and npu-fia (harness/npu_ops.py) on the CPU against a fake torch_npu (tests/fake_torch_npu.py).

The fake checks every argument the op receives as op-plugin documents it and computes the answer with
a float32 torch reference; the backends must map each MLA prefill call onto it (layouts, masks, GQA, a
cached prefix through the LSE merge), pass the smoke suite through it, and skip with a reason without it.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import torch

from mlaconf.golden.generate import build_golden
from mlaconf.golden.inputs import generate_inputs
from mlaconf.golden.spec import CaseSpec, build_case
from mlaconf.golden.types import GoldenCase
from mlaconf.harness import registry
from mlaconf.harness.backend import Backend, MlaPrefillCall, Unsupported
from mlaconf.harness.npu_ops import FusedInferAttentionBackend, RingMlaBackend, compressed_causal_mask
from mlaconf.judge.deviations import load_deviations
from mlaconf.judge.policy import load_policies
from mlaconf.runner.conformance import run_case
from mlaconf.runner.execution import execute, make_call
from tests import fake_torch_npu
from tests.fake_torch_npu import CpuFusedInferAttention, CpuRingMla, FakeOpError, FakeTorchNpu

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
    "causal-gqa-prefix": dict(
        q_seqlen=[6, 10], kv_seqlen=[20, 13], head_num=4, kv_head_num=2, mask_type=3, kv_layout="padded"
    ),
    "causal-zero-batch-capacity": dict(
        q_seqlen=[0, 5, 4], kv_seqlen=[3, 5, 9], head_num=2, mask_type=3, kv_layout="padded", kv_capacity=12
    ),
}


def run(backend: Backend, golden: GoldenCase) -> str:
    result = run_case(golden, backend, policy_set=POLICIES, policy="default", deviations=load_deviations())
    assert result.outcome == "passed", result.message
    return result.outcome


@pytest.mark.parametrize("name", BACKENDS)
@pytest.mark.parametrize("path", PATHS)
def test_each_mapping_path_matches_the_golden(monkeypatch: pytest.MonkeyPatch, name: str, path: str) -> None:
    fake_torch_npu.install(monkeypatch)
    run(BACKENDS[name](), path_golden(path))


def test_ring_mla_arguments_one_call_per_mask(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = fake_torch_npu.install(monkeypatch)
    golden = path_golden("mask_free-bf16-packed")
    call = make_call(golden.inputs, golden.spec)
    CpuRingMla().run(call)
    (only,) = fake.ring_calls
    assert (only["mask_type"], only["calc_type"], only["kernel_type"], only["input_layout"]) == (
        "mask_type_triu",
        "calc_type_first_ring",
        "kernel_type_high_precision",
        "type_bsnd",
    )
    assert only["mask"] is not call.mask and torch.equal(only["mask"], call.mask)  # the case's own mask
    assert only["seqlen"].tolist() == [[12, 7], [12, 7]] and only["seqlen"].dtype == torch.int32
    assert (only["head_num"], only["kv_head_num"], only["qk_scale"]) == (2, 2, golden.spec.qk_scale)
    assert only["pre_out"] is None and only["prev_lse"] is None
    fake.ring_calls.clear()
    undefined = path_golden("undefined-2d-padded")
    CpuRingMla().run(make_call(undefined.inputs, undefined.spec))
    assert [c["mask_type"] for c in fake.ring_calls] == ["no_mask"]


def test_ring_mla_merges_a_cached_prefix_by_lse(monkeypatch: pytest.MonkeyPatch) -> None:
    """q [6, 10] against kv [20, 13]: the new tokens causal, then prefixes 14 and 3 with no mask; the
    10 query rows of the second batch meet a 3-key prefix in chunks of at most 3 rows."""
    fake = fake_torch_npu.install(monkeypatch)
    golden = path_golden("causal-gqa-prefix")
    CpuRingMla().run(make_call(golden.inputs, golden.spec))
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
    for path in ("causal-zero-batch-capacity", "undefined-2d-padded"):
        golden = path_golden(path)
        CpuFusedInferAttention().run(make_call(golden.inputs, golden.spec))
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
        return args[3]


class UnmaskedFia(CpuFusedInferAttention):
    """A mapping that passes no causal mask at all for CAUSAL (sparse_mode 0)."""

    @staticmethod
    def _sparse(call: MlaPrefillCall) -> tuple[int, torch.Tensor | None]:
        return 0, None


def test_a_wrong_mapping_fails_the_case(monkeypatch: pytest.MonkeyPatch) -> None:
    fake_torch_npu.install(monkeypatch)
    golden = path_golden("causal-gqa-prefix")
    for wrong in (NoPrefixMerge(), UnmaskedFia()):
        result = run_case(golden, wrong, policy_set=POLICIES, policy="default", deviations=load_deviations())
        assert result.outcome == "failed", type(wrong).__name__


def test_the_fake_refuses_what_the_op_would(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = fake_torch_npu.install(monkeypatch)
    golden = path_golden("causal-gqa-prefix")
    call = make_call(golden.inputs, golden.spec)

    class WrongEncoding(CpuRingMla):
        def run(self, call: MlaPrefillCall) -> torch.Tensor:  # a bf16-encoded mask with fp16 inputs
            return super().run(dataclasses.replace(call, mask_type=2, mask=torch.zeros(512, 512).half()))

    uniform = golden_of(q_seqlen=[8, 8], head_num=2, mask_type=2)
    with pytest.raises(FakeOpError, match=r"triu mask is not the torch\.float16 encoding"):
        WrongEncoding().run(make_call(uniform.inputs, uniform.spec))
    ring = fake.module().atb.npu_ring_mla  # type: ignore[attr-defined]
    q = call.q[:6].reshape(6, 4, 128).contiguous()
    qr = call.q_rope[:6].reshape(6, 4, 64).contiguous()
    kv = torch.zeros(6, 2, 128, dtype=torch.float16)
    kr = torch.zeros(6, 2, 64, dtype=torch.float16)
    mask = compressed_causal_mask(torch.float16)
    seqlen = torch.tensor([[6], [6]], dtype=torch.int32)
    args = (q, qr, kv, kr, kv, mask, seqlen, 4, 2)
    common = dict(qk_scale=0.1, kernel_type="kernel_type_high_precision", input_layout="type_bsnd")
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
    tnd = dict(query_rope=qr, key_rope=kr, num_heads=4, num_key_value_heads=2, scale=0.1)
    with pytest.raises(FakeOpError, match="input_layout 'BSND'"):
        fia(q, kv, kv, actual_seq_lengths=[6], actual_seq_lengths_kv=[6], input_layout="BSND", **tnd)
    with pytest.raises(FakeOpError, match="actual_seq_lengths_kv ends at 5"):
        fia(q, kv, kv, actual_seq_lengths=[6], actual_seq_lengths_kv=[5], input_layout="TND", **tnd)
    with pytest.raises(FakeOpError, match="sparse_mode 2"):
        fia(q, kv, kv, actual_seq_lengths=[6], actual_seq_lengths_kv=[6], input_layout="TND", sparse_mode=2, **tnd)


def test_what_an_op_cannot_express_is_skipped_with_the_reason(monkeypatch: pytest.MonkeyPatch) -> None:
    fake_torch_npu.install(monkeypatch)
    many = build_case({"q_seqlen": {"pattern": [1], "times": 4097}, "head_num": 1}, source="test")
    call = make_call(generate_inputs(many), many)
    with pytest.raises(Unsupported, match="4097 batches: the TND layout takes at most 4096"):
        CpuFusedInferAttention().run(call)
    with pytest.raises(pytest.skip.Exception, match=f"backend npu-fia cannot express case {many.case_id}: 4097"):
        execute(CpuFusedInferAttention(), call, many)
    for backend in (CpuRingMla(), CpuFusedInferAttention()):
        with pytest.raises(Unsupported, match="maskType 4"):
            backend.run(dataclasses.replace(call, mask_type=4))
    fits = build_case({"q_seqlen": {"pattern": [1], "times": 4096}, "head_num": 1}, source="test")
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
    assert FusedInferAttentionBackend().available()  # the other op is still there
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
    env = {**os.environ, "PYTHONPATH": str(ROOT), "MLA_GOLDEN_DIR": str(tmp_path / "golden")}
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-p",
            "no:cacheprovider",
            "-q",
            "-n",
            "0",
            "-rs",
            str(ROOT / "cases"),
            "--mla-backend",
            "ring-mla",
            "--mla-suite",
            "smoke",
            "--mla-report-dir",
            str(tmp_path / "report"),
            "-k",
            "test_conformance",
        ],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=env,
        timeout=600,
        check=False,
    )
    text = done.stdout + done.stderr
    assert "backend ring-mla unavailable: torch_npu is missing or fails to import" in text, text[-3000:]
    assert " passed" not in text.splitlines()[-1], text[-2000:]
    assert done.returncode != 0, "a run whose backend is missing is never green"


def test_spec_helper_cases_are_valid() -> None:
    for fields in PATHS.values():
        assert isinstance(build_case(fields, source="test"), CaseSpec)
