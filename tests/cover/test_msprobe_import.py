"""tools.msprobe_dump and golden.store.bundles: dumps written by msprobe itself (tests/data/msprobe, made by
make_dumps.py with mindstudio-probe 26.2.0) become cases whose inputs are the dumped tensors bit for bit;
their goldens build, torch-cpu passes them, and the dumped outputs are judged like a backend's."""

from __future__ import annotations

import json
import tarfile
from pathlib import Path

import numpy as np
import pytest
import torch

from mlaconf.__init__ import main
from mlaconf.golden.building.generate import build_golden
from mlaconf.golden.building.inputs import generate_inputs
from mlaconf.golden.specs.spec import SpecError
from mlaconf.golden.specs.spec_build import build_case
from mlaconf.golden.specs.suites import load_suite
from mlaconf.golden.store.bundles import (
    InputBundleError,
    bundle_hash,
    inputs_dir,
    inputs_from,
    load_bundle,
    load_dumped_output,
    save_bundle,
)
from mlaconf.golden.store.directory import GoldenStore
from mlaconf.harness import registry
from mlaconf.judge.policy import load_policies
from mlaconf.judge.verdict import judge_output
from mlaconf.runner.execution import make_call, to_numpy
from mlaconf.tools.msprobe_dump import SCHEMAS, bind, import_dump
from mlaconf.tools.msprobe_read import DumpedCall, Unrecoverable

DATA = Path(__file__).resolve().parents[1] / "data" / "msprobe"
POLICIES = load_policies()


def extract(name: str, into: Path) -> Path:
    with tarfile.open(DATA / f"{name}.tar.xz") as archive:
        archive.extractall(into, filter="data")
    return into / name


def dumped(dump: Path, data_name: str) -> torch.Tensor:
    path = next(dump.rglob(data_name))
    tensor: torch.Tensor = torch.load(path, weights_only=True)
    return tensor


def bits(array: np.ndarray | torch.Tensor) -> np.ndarray:
    if isinstance(array, torch.Tensor):
        return array.contiguous().view(torch.int16).numpy().view(np.uint16)
    return np.ascontiguousarray(array).view(np.uint16)


def _passes_on_torch_cpu(store: Path, spec_file: Path) -> None:
    """Every case of the file: the golden builds from the bundle, torch-cpu passes, and so does the dumped output."""
    backend = registry.create("torch-cpu")
    for spec in load_suite(spec_file):
        golden = GoldenStore(store, builder=build_golden).ensure(spec)
        out = to_numpy(backend.run(make_call(golden.inputs, spec)))
        _, verdict = judge_output(golden, out, POLICIES, "default", "torch-cpu")
        assert verdict.passed, (spec.name, verdict.summary())
        device = load_dumped_output(spec.case_id, store)
        assert device is not None, spec.name
        _, evidence = judge_output(golden, device, POLICIES, "default", "dumped")
        assert evidence.passed, (spec.name, evidence.summary())


def test_an_sdpa_dump_of_a_cpu_model(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    dump, store, suite = extract("sdpa", tmp_path), tmp_path / "store", tmp_path / "sdpa.toml"
    assert main(["import-dump", str(dump), "--golden-dir", str(store), "--out", str(suite)]) == 0
    err = capsys.readouterr().err
    assert "skipped step0/" in err and "scaled_dot_product_attention.2.forward: not MLA-shaped" in err
    assert "skipped 3 calls of other APIs: __add__ (2), sum (1)" in err
    assert "defaults not passed: attn_mask=None, dropout_p=0.0, scale=None" in err  # the causal call's scale
    causal, plain = load_suite(suite)
    assert (causal.dtype, causal.mask_name, causal.qk_scale) == ("bf16", "mask_free", np.float32(192**-0.5))
    assert (plain.dtype, plain.mask_name, plain.qk_scale) == ("fp16", "undefined", 0.0625)
    with inputs_from(store):
        inputs = generate_inputs(causal)
    q = dumped(dump, "Functional.scaled_dot_product_attention.0.forward.input.0.pt")  # [B, N, S, 192]
    packed = q.permute(0, 2, 1, 3).reshape(-1, 2, 192)
    assert np.array_equal(bits(inputs.q), bits(packed[..., :128])) and np.array_equal(
        bits(inputs.q_rope), bits(packed[..., 128:])
    )
    v = dumped(dump, "Functional.scaled_dot_product_attention.0.forward.input.2.pt")
    assert np.array_equal(bits(inputs.v), bits(v.permute(0, 2, 1, 3).reshape(-1, 2, 128)))
    _passes_on_torch_cpu(store, suite)


def test_a_stand_in_npu_dump_of_ring_mla_by_keyword(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    dump, store = extract("npu", tmp_path), tmp_path / "store"
    result = import_dump(dump, store)
    assert [spec.name.split("-", 2)[2] for spec in result.cases] == [
        "NPU.npu_ring_mla.0.forward",
        "NPU.npu_fused_infer_attention_score.0.forward",
    ]
    assert (
        len(result.unrecoverable) == 1
        and "npu_ring_mla.1.forward: calc_type 'calc_type_default'" in (result.unrecoverable[0])
    )
    ring, fia = result.cases
    assert (ring.mask_name, ring.q_seqlen, ring.kv_seqlen, ring.head_num) == ("mask_free", (2, 4), (2, 4), 2)
    assert (
        ring.qk_scale == np.float32(0.0721) and "defaults not passed: pre_out=None, prev_lse=None" in (result.notes[0])
    )
    assert fia.mask_name == "undefined" and fia.inputs == ring.inputs  # the same tensors: one bundle
    bundle = load_bundle(ring.inputs or "", store)
    for role, name in (("q", "q_nope"), ("q_rope", "q_rope"), ("k", "k_nope"), ("k_rope", "k_rope"), ("v", "value")):
        assert np.array_equal(bits(bundle[role]), bits(dumped(dump, f"NPU.npu_ring_mla.0.forward.kwargs.{name}.pt")))
    out = load_dumped_output(ring.case_id, store)
    assert out is not None and np.array_equal(bits(out), bits(dumped(dump, "NPU.npu_ring_mla.0.forward.output.0.pt")))
    suite = tmp_path / "npu.toml"
    from mlaconf.tools.msprobe_dump import suite_text

    suite.write_text(suite_text(result, dump, "npu"))
    _passes_on_torch_cpu(store, suite)
    monkeypatch.delenv("MLA_GOLDEN_DIR", raising=False)  # the bundles come from the store verify is given
    assert main(["verify", "--cases", str(suite), "--out", str(store), "--recompute"]) == 0


def _call(args: list[object], kwargs: dict[str, object]) -> DumpedCall:
    return DumpedCall("NPU.npu_ring_mla.0.forward", "npu_ring_mla", ".", Path("."), list(args), kwargs, [])


def test_binding_by_position_or_keyword_fills_and_says_defaults() -> None:
    scalar = {"type": "int", "value": 4}
    names = SCHEMAS["npu_ring_mla"].params[:9]
    by_position, said = bind(_call([scalar] * 9, {}), SCHEMAS["npu_ring_mla"])
    assert [by_position[n] for n in names] == [4] * 9 and by_position["qk_scale"] == 1.0
    assert "qk_scale=1.0" in said and "calc_type='calc_type_default'" in said
    by_keyword, said = bind(
        _call([], {n: scalar for n in names} | {"qk_scale": {"value": 0.5}}), SCHEMAS["npu_ring_mla"]
    )
    assert by_keyword["qk_scale"] == 0.5 and "qk_scale=1.0" not in said
    with pytest.raises(Unrecoverable, match="required argument kv_head_num is not in the dump"):
        bind(_call([scalar] * 8, {}), SCHEMAS["npu_ring_mla"])
    with pytest.raises(Unrecoverable, match="argument q_nope passed twice"):
        bind(_call([scalar], {"q_nope": scalar}), SCHEMAS["npu_ring_mla"])
    with pytest.raises(Unrecoverable, match="argument output_gate = 4 is set"):
        bind(_call([scalar] * 9, {"output_gate": scalar}), SCHEMAS["npu_ring_mla"])
    statistics = {"type": "torch.Tensor", "dtype": "torch.bfloat16", "shape": [2], "Max": 1.0}
    with pytest.raises(Unrecoverable, match="tensor q_nope has no data_name: the dump holds statistics only"):
        bind(_call([statistics], {}), SCHEMAS["npu_ring_mla"])


def test_a_dump_without_a_dump_json_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["import-dump", str(tmp_path)]) == 2
    assert (
        capsys.readouterr().err.strip()
        == f"mlaconf import-dump: {tmp_path}: no dump.json under it (an msprobe dump folder, task tensor)"
    )
    (tmp_path / "dump.json").write_text(json.dumps({"data": {"Functional.relu.0.forward": {"input_args": []}}}))
    assert main(["import-dump", str(tmp_path)]) == 1
    assert "no MLA prefill call could be imported" in capsys.readouterr().err


def test_bundles_are_checked_against_their_name(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    shapes = {"q": (3, 1, 128), "q_rope": (3, 1, 64), "k": (3, 1, 128), "k_rope": (3, 1, 64), "v": (3, 1, 128)}
    tensors = {role: rng.normal(size=shape).astype(np.float16) for role, shape in shapes.items()}
    path = save_bundle(tensors, tmp_path)
    assert path.parent == inputs_dir(tmp_path) and path.stem == bundle_hash(tensors)
    spec = build_case(dict(q_seqlen=[3], head_num=1, dtype="bf16", inputs=path.stem), source="t")
    with (
        inputs_from(tmp_path),
        pytest.raises(InputBundleError, match=r"q is float16\[3, 1, 128\], the case needs bf16"),
    ):
        generate_inputs(spec)
    tensors["v"][0, 0, 0] += 1
    edited = save_bundle(tensors, tmp_path)
    edited.replace(path)
    with pytest.raises(InputBundleError, match="does not hash to its name"):
        load_bundle(path.stem, tmp_path)
    with pytest.raises(SpecError, match="field 'inputs': must be the 64-hex-digit content hash"):
        build_case(dict(q_seqlen=[3], head_num=1, inputs="abc"), source="t")


def test_cases_without_inputs_keep_their_hashes() -> None:
    """The field counts only when given: a generated case keeps its id (the one main gave it before)."""
    spec = build_case(dict(q_seqlen=[128], head_num=4, dtype="bf16", mask_type=2, seed=1), source="t")
    assert "inputs" not in spec.content() and "-dump-" not in spec.case_id
    assert spec.case_id == "bf16-mask_free-krope_ctkv-b1-s128-h4-q3d-packed-ad9bbf06"


def test_judge_puts_msprobes_verdict_beside_ours(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``--judge`` judges each dumped output like a backend's: both pass the correct stand-in's outputs; an
    all-NaN dumped output fails ours while msprobe's standard alone passes it (its blind spot)."""
    dump, store = extract("npu", tmp_path), tmp_path / "store"
    assert main(["import-dump", str(dump), "--golden-dir", str(store), "--judge"]) == 0
    judged = [line for line in capsys.readouterr().err.splitlines() if line.startswith("judged ")]
    assert len(judged) == 2 and all("PASS under policy 'default'" in line for line in judged)
    assert all(line.endswith("msprobe's benchmark standard alone: PASS.") for line in judged)
    ring = import_dump(dump, store).cases[0]
    out = load_dumped_output(ring.case_id, store)
    assert out is not None
    path = next(inputs_dir(store).glob(f"{ring.case_id}.dumped_out.npz"))
    path.unlink()
    from mlaconf.golden.store.bundles import save_dumped_output

    save_dumped_output(ring.case_id, np.full_like(out, np.nan), store)
    assert main(["import-dump", str(dump), "--golden-dir", str(store), "--judge"]) == 1
    nan_line = next(line for line in capsys.readouterr().err.splitlines() if line.startswith(f"judged {ring.name}:"))
    assert "FAIL under policy 'default'" in nan_line and "finite: nan_count" in nan_line
    assert nan_line.endswith("msprobe's benchmark standard alone: PASS.")


def _write_dump(folder: Path, name: str, args: list[object], kwargs: dict[str, object], out: torch.Tensor) -> None:
    """A dump.json as msprobe writes it (tensors as data_name files), for an op the stand-in lacks."""
    tensors = folder / "dump_tensor_data"
    tensors.mkdir(parents=True)

    def entry(label: str, value: object) -> object:
        if isinstance(value, torch.Tensor):
            data_name = f"{name}.{label}.pt"
            torch.save(value, tensors / data_name)
            return {
                "type": "torch.Tensor",
                "dtype": str(value.dtype),
                "shape": list(value.shape),
                "data_name": data_name,
            }
        return {"type": type(value).__name__, "value": value}

    call = {
        "input_args": [entry(f"input.{i}", a) for i, a in enumerate(args)],
        "input_kwargs": {k: entry(f"kwargs.{k}", v) for k, v in kwargs.items()},
        "output": [entry("output.0", out)],
    }
    (folder / "dump.json").write_text(json.dumps({"task": "tensor", "level": "L1", "data": {name: call}}))


def test_fusion_attention_in_bnsd_by_position(tmp_path: Path) -> None:
    """npu_fusion_attention(query, key, value, head_num, input_layout, ..., sparse_mode=3): BNSD rows packed in
    batch order, the 192-wide q and k split at 128; causal with equal lengths and heads is MASK_FREE."""
    generator = torch.Generator().manual_seed(3)
    q, k = (torch.randn(2, 3, 4, 192, generator=generator).half() for _ in range(2))
    v, out = (torch.randn(2, 3, 4, 128, generator=generator).half() for _ in range(2))
    name = "NPU.npu_fusion_attention.0.forward"
    _write_dump(
        tmp_path / "dump" / "step0" / "rank0", name, [q, k, v, 3, "BNSD"], {"scale": 0.1, "sparse_mode": 3}, out
    )
    result = import_dump(tmp_path / "dump", tmp_path / "store")
    assert not result.unrecoverable and len(result.cases) == 1 and "keep_prob=1.0" in result.notes[0]
    spec = result.cases[0]
    assert (spec.mask_name, spec.q_seqlen, spec.head_num, spec.dtype) == ("mask_free", (4, 4), 3, "fp16")
    bundle = load_bundle(spec.inputs or "", tmp_path / "store")
    packed = q.permute(0, 2, 1, 3).reshape(8, 3, 192)
    assert np.array_equal(bits(bundle["q_rope"]), bits(packed[..., 128:]))
    assert np.array_equal(bits(bundle["v"]), bits(v.permute(0, 2, 1, 3).reshape(8, 3, 128)))
    dumped_out = load_dumped_output(spec.case_id, tmp_path / "store")
    assert dumped_out is not None and np.array_equal(bits(dumped_out), bits(out.permute(0, 2, 1, 3).reshape(8, 3, 128)))
    _write_dump(tmp_path / "drop", name, [q, k, v, 3, "BNSD"], {"keep_prob": 0.9}, out)
    assert import_dump(tmp_path / "drop", tmp_path / "store").unrecoverable == [
        "./NPU.npu_fusion_attention.0.forward: keep_prob 0.9: dropout is not MLA prefill"
    ]
