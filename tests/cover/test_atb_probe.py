"""AtbBackend: the availability probe's reasons and order, and run() over the libatb double on CPU."""

from __future__ import annotations

import math
import sys
from dataclasses import replace
from pathlib import Path
from types import ModuleType, SimpleNamespace
from typing import Any

import pytest
import torch

import mlaconf.harness.atb
import mlaconf.native
from mlaconf.facts.operator import as_c_float
from mlaconf.facts.status import STATUS_CODES
from mlaconf.golden.specs.spec import CaseSpec
from mlaconf.golden.specs.suites import load_suites
from mlaconf.harness.atb import AtbBackend
from mlaconf.harness.backend import TENSOR_ARGS, Backend, BackendError, MlaPrefillCall
from mlaconf.judge.deviations import DeviationSet
from mlaconf.runner.perturb import error_call, judge_error_case

FAKE_STREAM = 0x7E57_0000_4560


class FakeNpu:
    """The slice of ``torch_npu.npu`` the backend uses; counts synchronizes."""

    def __init__(self, available: bool = True, count: int = 1, soc: str = "Ascend910B3") -> None:
        self.available, self.count, self.syncs, self.soc = available, count, 0, soc
        self.on_sync: list[Any] = []
        self.pinned: int | None = None

    def is_available(self) -> bool:
        return self.available

    def device_count(self) -> int:
        return self.count

    def set_device(self, index: int) -> None:
        self.pinned = index

    def current_device(self) -> int:
        return self.pinned or 0

    def get_device_name(self, index: int) -> str:
        assert index == (self.pinned or 0), "the SoC is read for the device this worker pinned"
        return self.soc

    def current_stream(self) -> SimpleNamespace:
        return SimpleNamespace(npu_stream=FAKE_STREAM)

    def synchronize(self) -> None:
        self.syncs += 1
        for hook in self.on_sync:
            hook()


def install_torch_npu(monkeypatch: pytest.MonkeyPatch, npu: FakeNpu) -> ModuleType:
    module = ModuleType("torch_npu")
    module.npu = npu  # type: ignore[attr-defined]
    module.__version__ = "0.0-fake"  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "torch_npu", module)
    return module


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("MLA_ATB_LIB", raising=False)
    monkeypatch.delenv("ATB_HOME_PATH", raising=False)
    monkeypatch.setattr(mlaconf.harness.atb, "_CONTEXTS", {})


def reason() -> str:
    availability = AtbBackend().available()
    assert not availability
    return availability.reason


def test_torch_npu_missing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "torch_npu", None)
    monkeypatch.setenv("MLA_ATB_LIB", "/nonexistent/libatb.so")
    assert reason().startswith("torch_npu is missing or fails to import (ModuleNotFoundError: ")


def test_torch_npu_raising_runtime_error_is_caught(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    package = tmp_path / "torch_npu"
    package.mkdir()
    (package / "__init__.py").write_text("raise RuntimeError('libhccl.so: cannot open\\nsecond line')\n")
    monkeypatch.delitem(sys.modules, "torch_npu", raising=False)
    monkeypatch.syspath_prepend(str(tmp_path))
    text = reason()
    assert "(RuntimeError: libhccl.so: cannot open)" in text
    assert "second line" not in text


@pytest.mark.parametrize("npu", [FakeNpu(available=False), FakeNpu(count=0)])
def test_no_npu_device(monkeypatch: pytest.MonkeyPatch, npu: FakeNpu) -> None:
    install_torch_npu(monkeypatch, npu)
    monkeypatch.setenv("MLA_ATB_LIB", "/nonexistent/libatb.so")
    assert reason() == "no NPU device visible to torch_npu"


def test_device_query_that_raises(monkeypatch: pytest.MonkeyPatch) -> None:
    npu = FakeNpu()
    install_torch_npu(monkeypatch, npu)

    def broken() -> bool:
        raise RuntimeError("drvGetDevNum failed\ndetails")

    monkeypatch.setattr(npu, "is_available", broken)
    assert reason() == "no NPU device: the device query failed (RuntimeError: drvGetDevNum failed)"


def test_native_extension_import_failure(monkeypatch: pytest.MonkeyPatch) -> None:
    install_torch_npu(monkeypatch, FakeNpu())
    monkeypatch.delattr(mlaconf.native, "_atb_harness", raising=False)
    monkeypatch.setitem(sys.modules, "mlaconf.native._atb_harness", None)
    text = reason()
    assert text.startswith("the native extension mlaconf.native._atb_harness failed to import (")
    assert "pip install -e ." in text


def test_libatb_not_found_names_the_paths_tried(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    install_torch_npu(monkeypatch, FakeNpu())
    monkeypatch.setenv("MLA_ATB_LIB", str(tmp_path / "libatb.so"))
    assert reason().startswith(f"libatb not found; tried {tmp_path}/libatb.so (")


def test_missing_entry_symbol_needs_newer_cann(monkeypatch: pytest.MonkeyPatch, symbolless_lib: Path) -> None:
    install_torch_npu(monkeypatch, FakeNpu())
    monkeypatch.setenv("MLA_ATB_LIB", str(symbolless_lib))
    text = reason()
    assert text.startswith(f"{symbolless_lib} lacks AtbMLAPreFillGetWorkspaceSize")
    assert text.endswith("needs CANN/NNAL >= 8.2.RC1")


def test_available_with_everything_present_and_probed_once(monkeypatch: pytest.MonkeyPatch, atb_double: Any) -> None:
    npu = FakeNpu()
    install_torch_npu(monkeypatch, npu)
    monkeypatch.setenv("MLA_ATB_LIB", atb_double.path)
    backend = AtbBackend()
    assert backend.available().ok
    monkeypatch.setenv("MLA_ATB_LIB", "/nonexistent/libatb.so")
    assert backend.available().ok  # cached: the probe ran once
    info = backend.info()
    assert (info.name, info.device) == ("atb", "npu:0 (Ascend910B3)")
    assert info.versions["soc"] == "Ascend910B3"
    assert info.versions["libatb"] == atb_double.path
    assert info.versions["torch_npu"] == "0.0-fake"


@pytest.mark.parametrize("soc", ["Ascend310P3", "Ascend910A", "Ascend910B", "Ascend310B1"])
def test_an_unsupported_chip_skips_with_the_reason(monkeypatch: pytest.MonkeyPatch, atb_double: Any, soc: str) -> None:
    """ATB's MLA CreateOperation refuses every call off Atlas A2/A3: skip, never 'valid case rejected'."""
    install_torch_npu(monkeypatch, FakeNpu(soc=soc))
    monkeypatch.setenv("MLA_ATB_LIB", atb_double.path)
    text = reason()
    assert text.startswith(f"SoC '{soc}': ATB's MLA runs only on Atlas 800I A2/A3")
    assert "ERROR_INVALID_PARAM" in text and "Is910B" in text


@pytest.mark.parametrize("soc", ["Ascend910B1", "Ascend910B4", "Ascend910_9382"])
def test_atlas_a2_and_a3_chips_are_admitted(monkeypatch: pytest.MonkeyPatch, atb_double: Any, soc: str) -> None:
    install_torch_npu(monkeypatch, FakeNpu(soc=soc))
    monkeypatch.setenv("MLA_ATB_LIB", atb_double.path)
    assert AtbBackend().available().ok


def test_a_soc_query_that_raises(monkeypatch: pytest.MonkeyPatch) -> None:
    npu = FakeNpu()
    install_torch_npu(monkeypatch, npu)

    def broken(index: int) -> str:
        raise RuntimeError("aclrtGetSocName failed")

    monkeypatch.setattr(npu, "get_device_name", broken)
    assert reason() == "cannot read the NPU's SoC name: RuntimeError: aclrtGetSocName failed"


def test_the_release_is_read_and_chooses_the_expectations(
    monkeypatch: pytest.MonkeyPatch, atb_double: Any, tmp_path: Path
) -> None:
    """The NNAL version.info beside libatb is the backend's version: deviations and error cases use it."""
    install_torch_npu(monkeypatch, FakeNpu())
    home = tmp_path / "nnal" / "atb" / "8.2.RC1" / "atb" / "cxx_abi_1"
    (home / "lib").mkdir(parents=True)
    library = home / "lib" / "libatb.so"
    library.write_bytes(Path(atb_double.path).read_bytes())
    (tmp_path / "nnal" / "atb" / "8.2.RC1" / "version.info").write_text("Ascend-cann-atb Version : 8.2.RC1\n")
    monkeypatch.setenv("MLA_ATB_LIB", str(library))
    monkeypatch.delenv("MLA_ATB_VERSION", raising=False)
    backend = AtbBackend()
    assert backend.available().ok
    info = backend.info()
    assert (info.version, info.versions["atb"], info.release_unknown) == ("8.2.RC1", "8.2.RC1", False)
    rank3 = next(c for c in load_suites(["errors"]) if c.name == "mask-free-mask-rank3")
    assert rank3.expected_rejection(info.version) == ("ERROR_INVALID_TENSOR_DIM_NUM", "setup")
    # a source build: version.info without a version key is an unknown release, a state of its own
    (tmp_path / "nnal" / "atb" / "8.2.RC1" / "version.info").write_text("Ascend-cann-atb commit : ddcc8b6\n")
    unknown = AtbBackend().info()
    assert (unknown.version, unknown.release_unknown) == (None, True)


def test_unavailable_backend_keeps_the_protocol_and_refuses_to_run(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "torch_npu", None)
    backend = AtbBackend()
    assert isinstance(backend, Backend)
    assert (backend.name, backend.error_contract, backend.deterministic) == ("atb", True, True)
    assert backend.info().device == "unavailable"
    backend.synchronize()  # a no-op, not an error
    with pytest.raises(RuntimeError, match="the ATB backend is unavailable: torch_npu is missing"):
        backend.run(small_call(torch.float16))


def small_call(dtype: torch.dtype, rope_dtype: torch.dtype | None = None) -> MlaPrefillCall:
    return MlaPrefillCall(
        q=torch.zeros(3, 128, dtype=dtype),
        q_rope=torch.zeros(3, 64, dtype=rope_dtype or dtype),
        k=torch.zeros(1, 3, 128, dtype=dtype),
        k_rope=torch.zeros(1, 3, 64, dtype=dtype),
        v=torch.zeros(1, 3, 128, dtype=dtype),
        q_seqlen=torch.tensor([3], dtype=torch.int32),
        kv_seqlen=torch.tensor([3], dtype=torch.int32),
        mask=None,
        head_num=1,
        qk_scale=0.5,
        kv_head_num=1,
        mask_type=0,
        cache_mode=1,
    )


class CpuAtbBackend(AtbBackend):
    device_type = "cpu"


def test_run_drives_the_harness_on_the_current_stream(monkeypatch: pytest.MonkeyPatch, atb_double: Any) -> None:
    npu = FakeNpu()
    install_torch_npu(monkeypatch, npu)
    monkeypatch.setenv("MLA_ATB_LIB", atb_double.path)
    snapshots: list[dict[str, Any]] = []
    npu.on_sync.append(lambda: snapshots.append(atb_double.record()))
    atb_double.set_workspace_size(256)
    backend = CpuAtbBackend()
    call = small_call(torch.float16, rope_dtype=torch.bfloat16)
    out = backend.run(call)
    assert (out.shape, out.dtype) == (call.q.shape, torch.bfloat16)  # q's shape, qRope's dtype
    before, after = snapshots
    assert before["workspace_calls"] == []  # synchronized before the call
    assert after["live"]["operations"] == 1  # ... and after it, before the op is destroyed
    record = atb_double.record()
    (setup,) = record["workspace_calls"]
    (execute,) = record["execute_calls"]
    assert setup["atten_out"]["data"] == out.data_ptr()
    assert setup["atten_out"]["dtype"] == 27
    assert setup["q_seqlen_read"] == setup["kv_seqlen_read"] == [3]
    assert setup["stream"] == execute["stream"] == FAKE_STREAM
    assert execute["workspace_size"] == 256 and execute["workspace"] != 0
    backend.run(call)
    contexts = {c["context"] for c in atb_double.record()["workspace_calls"]}
    assert len(contexts) == 1  # one atb::Context per process and library


ACL_CODES = {torch.float16: 1, torch.bfloat16: 27, torch.float32: 0, torch.int32: 3, torch.int64: 9, torch.bool: 12}


def passed_as(call: MlaPrefillCall, name: str) -> dict[str, Any] | None:
    """What the double should record for argument ``name`` of ``call``: None for a null pointer."""
    if name in call.null_args:
        return None
    if name == "out":
        shape, dtype = call.atten_out_shape, call.atten_out_dtype
    else:
        tensor = getattr(call, name)
        if tensor is None:
            return None
        shape, dtype = tuple(tensor.shape), tensor.dtype
    return {"dims": list(shape), "dtype": ACL_CODES[dtype], "format": call.format_of(name)}


@pytest.mark.parametrize("case", load_suites(["errors"]), ids=lambda c: c.name)
def test_every_error_case_reaches_atb_as_built_and_its_status_comes_back(
    monkeypatch: pytest.MonkeyPatch, atb_double: Any, case: CaseSpec
) -> None:
    """Each invalid call of the error suite arrives at "libatb" exactly as the case builds it (wrong
    attenOut, formats, seqlen dtype/rank, null arguments included), and the status ATB's source says it
    returns comes back at its stage through the real extension and AtbBackend."""
    install_torch_npu(monkeypatch, FakeNpu())
    monkeypatch.setenv("MLA_ATB_LIB", atb_double.path)
    assert case.expect_error is not None and case.expect_stage is not None
    atb_double.inject(case.expect_stage, STATUS_CODES[case.expect_error])
    call = error_call(case)
    with pytest.raises(BackendError) as caught:
        CpuAtbBackend().run(call)
    assert (caught.value.status_name, caught.value.stage) == (case.expect_error, case.expect_stage)
    (setup,) = atb_double.record()["workspace_calls"]
    for name in TENSOR_ARGS:
        recorded = setup["atten_out" if name == "out" else name]
        got = None if recorded is None else {key: recorded[key] for key in ("dims", "dtype", "format")}
        assert got == passed_as(call, name), name
    assert (setup["head_num"], setup["kv_head_num"]) == (call.head_num, call.kv_head_num)
    assert (setup["mask_type"], setup["cache_mode"]) == (call.mask_type, call.cache_mode)
    if math.isnan(call.qk_scale):
        assert setup["qk_scale"] == "nan"
    else:  # recorded with 9 significant digits: exact once rounded to the float ATB receives
        assert as_c_float(setup["qk_scale"]) == as_c_float(call.qk_scale)


@pytest.mark.parametrize(
    ("release", "returned", "outcome"),
    [
        ("8.2.RC1", "ERROR_INVALID_TENSOR_DIM_NUM", "passed"),
        ("8.3.RC1", "ERROR_INVALID_TENSOR_DIM_NUM", "passed"),  # unconfirmed boundary: a package before the fix
        ("8.3.RC1", "ERROR_RT_FAIL", "passed"),
        ("8.5.0", "ERROR_INVALID_TENSOR_DIM_NUM", "failed"),
        ("8.5.0", "ERROR_RT_FAIL", "passed"),
        ("8.2.RC1", "ERROR_RT_FAIL", "failed"),
    ],
)
def test_the_installed_release_chooses_the_rank3_mask_expectation(
    monkeypatch: pytest.MonkeyPatch, atb_double: Any, release: str, returned: str, outcome: str
) -> None:
    """Through AtbBackend, the extension and the double: what "libatb" returns is judged against the
    rejection of the release it reports ($MLA_ATB_VERSION stands in for its version.info)."""
    install_torch_npu(monkeypatch, FakeNpu())
    monkeypatch.setenv("MLA_ATB_LIB", atb_double.path)
    monkeypatch.setenv("MLA_ATB_VERSION", release)
    atb_double.inject("setup", STATUS_CODES[returned])
    rank3 = next(c for c in load_suites(["errors"]) if c.name == "mask-free-mask-rank3")
    verdict = judge_error_case(rank3, CpuAtbBackend(), DeviationSet("<none>", []))
    assert (verdict.outcome, verdict.got) == (outcome, (returned, "setup")), verdict.message


def test_run_maps_atb_status_to_backend_error(monkeypatch: pytest.MonkeyPatch, atb_double: Any) -> None:
    install_torch_npu(monkeypatch, FakeNpu())
    monkeypatch.setenv("MLA_ATB_LIB", atb_double.path)
    atb_double.inject("create", 1)
    with pytest.raises(BackendError) as caught:
        CpuAtbBackend().run(small_call(torch.bfloat16))
    assert (caught.value.status, caught.value.status_name, caught.value.stage) == (1, "ERROR_INVALID_PARAM", "create")


@pytest.mark.npu
def test_atb_on_a_real_npu_matches_a_float32_reference() -> None:
    backend = AtbBackend()
    if not backend.available():
        pytest.skip(backend.available().reason)
    torch.manual_seed(0)
    seq, heads = 129, 2  # a tail block past 128 rows
    call = MlaPrefillCall(
        q=torch.randn(seq, heads, 128).half(),
        q_rope=torch.randn(seq, heads, 64).half(),
        k=torch.randn(1, seq, heads * 128).half(),
        k_rope=torch.randn(1, seq, heads * 64).half(),
        v=torch.randn(1, seq, heads * 128).half(),
        q_seqlen=torch.tensor([seq], dtype=torch.int32),
        kv_seqlen=torch.tensor([seq], dtype=torch.int32),
        mask=None,
        head_num=heads,
        qk_scale=192**-0.5,
        kv_head_num=heads,
        mask_type=0,
        cache_mode=1,
    )
    out = backend.run(call).cpu().float()
    q = torch.cat([call.q, call.q_rope], -1).float().transpose(0, 1)
    k = torch.cat([call.k.view(seq, heads, 128), call.k_rope.view(seq, heads, 64)], -1).float().transpose(0, 1)
    v = call.v.view(seq, heads, 128).float().transpose(0, 1)
    expected = torch.softmax(q @ k.transpose(1, 2) * call.qk_scale, -1) @ v
    golden = expected.transpose(0, 1)
    assert ((out - golden).abs() <= golden.abs().clamp(min=1) * 2**-8).all()  # ATB's own fp16 rule
    with pytest.raises(BackendError) as caught:  # Prefill accepts cacheMode 1 only
        backend.run(replace(call, cache_mode=0))
    assert caught.value.status_name == "ERROR_INVALID_PARAM"


def test_probe_pins_the_xdist_worker_to_its_npu(monkeypatch: pytest.MonkeyPatch) -> None:
    npu = FakeNpu(count=4)
    install_torch_npu(monkeypatch, npu)
    monkeypatch.setenv("PYTEST_XDIST_WORKER", "gw6")
    monkeypatch.setitem(sys.modules, "mlaconf.native._atb_harness", None)  # stop right after pinning
    AtbBackend().available()
    assert npu.pinned == 2
