"""The real native extension against the CPU test double of libatb.

Host CPU tensors stand in for device memory and an arbitrary integer for the stream; the double
records what reached "ATB" and counts the handles still alive.
"""

from __future__ import annotations

import gc
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import torch

import mlaconf.native.harness as pyside
from mlaconf.facts.status import STATUS_NAMES, status_name
from mlaconf.harness.atb import describe_host_tensors, describe_tensors, launch
from mlaconf.harness.backend import BackendError, MlaPrefillCall
from mlaconf.native import _atb_harness as ext

FAKE_STREAM = 0x5EED_0000_1230
TENSOR_ORDER = ("q", "q_rope", "k", "k_rope", "v", "mask", "out")


def make_call(dtype: torch.dtype = torch.float16, *, q_rank: int = 3, mask: bool = False) -> MlaPrefillCall:
    """B=2 (q 2+3 rows), H=4, Hkv=2, padded kv [B, S=3, Hkv*D]: k and v have the same shape."""
    total, heads, kv_heads = 5, 4, 2
    q_shape = (total, heads, 128) if q_rank == 3 else (total, heads * 128)
    rope_shape = (total, heads, 64) if q_rank == 3 else (total, heads * 64)
    return MlaPrefillCall(
        q=torch.zeros(q_shape, dtype=dtype),
        q_rope=torch.zeros(rope_shape, dtype=dtype),
        k=torch.zeros(2, 3, kv_heads * 128, dtype=dtype),
        k_rope=torch.zeros(2, 3, kv_heads * 64, dtype=dtype),
        v=torch.zeros(2, 3, kv_heads * 128, dtype=dtype),
        q_seqlen=torch.tensor([2, 3], dtype=torch.int32),
        kv_seqlen=torch.tensor([3, 1], dtype=torch.int32),
        mask=torch.zeros(512, 512, dtype=dtype) if mask else None,
        head_num=heads,
        qk_scale=0.125,
        kv_head_num=kv_heads,
        mask_type=2 if mask else 0,
        cache_mode=1,
    )


class Launch:
    """One launch through harness.atb.launch with CPU workspace and a recording synchronize."""

    def __init__(self, double: Any, context: ext.Context, call: MlaPrefillCall, workspace: int = 0) -> None:
        double.set_workspace_size(workspace)
        self.call = call
        self.out = torch.empty(call.atten_out_shape, dtype=call.atten_out_dtype)
        self.workspaces: list[torch.Tensor] = []
        self.at_sync: list[dict[str, Any]] = []
        self._double = double
        self._context = context

    def alloc(self, size: int) -> int:
        self.workspaces.append(torch.empty(size, dtype=torch.uint8))
        return self.workspaces[-1].data_ptr()

    def sync(self) -> None:
        self.at_sync.append(self._double.record())

    def __call__(self, alloc: Callable[[int], int] | None = None) -> int:
        return launch(
            self._context,
            self.call,
            self.out,
            stream=FAKE_STREAM,
            alloc_workspace=alloc or self.alloc,
            synchronize=self.sync,
        )


@pytest.fixture
def context(atb_double: Any) -> ext.Context:
    return ext.Context(ext.Library(atb_double.path))


def assert_released(record: dict[str, Any]) -> None:
    """Every aclTensor and operation created was destroyed, each exactly once."""
    assert record["live"]["tensors"] == 0
    assert record["live"]["operations"] == 0
    assert record["tensors_created"] == record["tensors_destroyed"]
    assert len(record["destroyed_operations"]) == record["operations_created"]
    assert record["bad_destroys"] == 0


def test_native_tables_match_the_python_ones() -> None:
    assert len(STATUS_NAMES) == ext.STATUS_COUNT
    for code in range(-2, len(STATUS_NAMES) + 2):
        assert ext.status_name(code) == status_name(code)
    assert (ext.ACL_FLOAT, ext.ACL_FLOAT16, ext.ACL_INT32, ext.ACL_INT64, ext.ACL_BOOL, ext.ACL_BF16) == (
        pyside.ACL_FLOAT,
        pyside.ACL_FLOAT16,
        pyside.ACL_INT32,
        pyside.ACL_INT64,
        pyside.ACL_BOOL,
        pyside.ACL_BF16,
    )
    assert (ext.ACL_FORMAT_NCHW, ext.ACL_FORMAT_NHWC, ext.ACL_FORMAT_ND, ext.ACL_FORMAT_FRACTAL_NZ) == (
        pyside.ACL_FORMAT_NCHW,
        pyside.ACL_FORMAT_NHWC,
        pyside.ACL_FORMAT_ND,
        pyside.ACL_FORMAT_FRACTAL_NZ,
    )


@pytest.mark.parametrize(("dtype", "code"), [(torch.float16, 1), (torch.bfloat16, 27)])
@pytest.mark.parametrize("mask", [False, True])
def test_describe_tensors_is_ordered_and_typed(dtype: torch.dtype, code: int, mask: bool) -> None:
    call = make_call(dtype, mask=mask)
    out = torch.empty(call.q.shape, dtype=dtype)
    descs = describe_tensors(call, out)
    tensors = {
        "q": call.q,
        "q_rope": call.q_rope,
        "k": call.k,
        "k_rope": call.k_rope,
        "v": call.v,
        "mask": call.mask,
        "out": out,
    }
    assert [d.name for d in descs] == [n for n in TENSOR_ORDER if mask or n != "mask"]
    for desc in descs:
        tensor = tensors[desc.name]
        assert tensor is not None
        assert (desc.ptr, desc.shape, desc.dtype) == (tensor.data_ptr(), tuple(tensor.shape), code)


def test_describe_tensors_rejects_what_atb_cannot_read() -> None:
    call = make_call()
    out = torch.empty(call.q.shape, dtype=torch.float16)
    with pytest.raises(ValueError, match="k must be contiguous"):
        describe_tensors(replace(call, k=call.k.transpose(0, 1)), out)
    with pytest.raises(ValueError, match=r"v has dtype torch\.float64"):
        describe_tensors(replace(call, v=call.v.double()), out)
    with pytest.raises(ValueError, match="q_seqlen must be a host tensor"):
        describe_host_tensors(replace(call, q_seqlen=call.q_seqlen.to("meta")))
    with pytest.raises(ValueError, match=r"kv_seqlen has dtype torch\.int16"):
        describe_host_tensors(replace(call, kv_seqlen=call.kv_seqlen.short()))


def test_null_arguments_get_no_descriptor() -> None:
    call = replace(make_call(mask=True), null_args=frozenset({"q", "mask", "out", "kv_seqlen"}))
    out = torch.empty(call.q.shape, dtype=torch.float16)
    assert [d.name for d in describe_tensors(call, out)] == ["q_rope", "k", "k_rope", "v"]
    assert [d.name for d in describe_host_tensors(call)] == ["q_seqlen"]
    with pytest.raises(ValueError, match=r"unknown tensor arguments \['query'\]"):
        replace(call, null_args=frozenset({"query"}))


def test_arguments_reach_atb_in_declared_order(atb_double: Any, context: ext.Context) -> None:
    run = Launch(atb_double, context, make_call(mask=True), workspace=4096)
    assert run() == 4096
    record = atb_double.record()
    (setup,) = record["workspace_calls"]
    (execute,) = record["execute_calls"]
    call = run.call
    expected = {
        "q": call.q,
        "q_rope": call.q_rope,
        "k": call.k,
        "k_rope": call.k_rope,
        "v": call.v,
        "mask": call.mask,
        "atten_out": run.out,
    }
    assert call.k.shape == call.v.shape
    for name, tensor in expected.items():
        assert tensor is not None
        assert setup[name]["data"] == tensor.data_ptr(), name
        assert setup[name]["dims"] == list(tensor.shape), name
    assert (setup["head_num"], setup["qk_scale"], setup["kv_head_num"]) == (4, 0.125, 2)
    assert (setup["mask_type"], setup["cache_mode"]) == (2, 1)
    assert setup["stream"] == execute["stream"] == FAKE_STREAM
    assert setup["context"] == execute["context"] != 0
    assert execute["workspace"] == run.workspaces[0].data_ptr()
    assert execute["workspace_size"] == 4096 == run.workspaces[0].numel()
    assert record["events"] == [
        "create_context",
        *["create_tensor"] * 9,
        "set_stream",
        "get_workspace_size",
        "prefill",
        "destroy_operation",
        *["destroy_tensor"] * 9,
    ]


@pytest.mark.parametrize(("dtype", "code"), [(torch.float16, 1), (torch.bfloat16, 27)])
@pytest.mark.parametrize("q_rank", [2, 3])
def test_dtype_format_and_contiguous_strides(
    atb_double: Any, context: ext.Context, dtype: torch.dtype, code: int, q_rank: int
) -> None:
    run = Launch(atb_double, context, make_call(dtype, q_rank=q_rank, mask=True))
    run()
    (setup,) = atb_double.record()["workspace_calls"]
    shapes = {
        "q": run.call.q,
        "q_rope": run.call.q_rope,
        "k": run.call.k,
        "k_rope": run.call.k_rope,
        "v": run.call.v,
        "mask": run.call.mask,
        "atten_out": run.out,
        "q_seqlen": run.call.q_seqlen,
        "kv_seqlen": run.call.kv_seqlen,
    }
    for name, tensor in shapes.items():
        assert tensor is not None
        recorded = setup[name]
        assert recorded["dtype"] == (3 if "seqlen" in name else code), name
        assert recorded["format"] == 2, name
        assert recorded["strides"] == list(tensor.contiguous().stride()), name
        assert recorded["storage_dims"] == recorded["dims"] == list(tensor.shape), name
        assert recorded["offset"] == 0, name


def test_mask_none_is_passed_as_null(atb_double: Any, context: ext.Context) -> None:
    Launch(atb_double, context, make_call(mask=False))()
    record = atb_double.record()
    assert record["workspace_calls"][0]["mask"] is None
    assert record["tensors_created"] == 8


def test_null_arguments_are_passed_as_null(atb_double: Any, context: ext.Context) -> None:
    nulls = frozenset({"q", "k_rope", "q_seqlen", "out"})
    Launch(atb_double, context, replace(make_call(mask=True), null_args=nulls))()
    record = atb_double.record()
    (setup,) = record["workspace_calls"]
    assert [name for name in ("q", "k_rope", "q_seqlen", "atten_out") if setup[name] is None] == [
        "q",
        "k_rope",
        "q_seqlen",
        "atten_out",
    ]
    assert all(setup[name] is not None for name in ("q_rope", "k", "v", "mask", "kv_seqlen"))
    assert record["tensors_created"] == 9 - len(nulls)
    assert_released(record)


def test_formats_out_and_seqlen_dtype_and_rank_arrive_as_given(atb_double: Any, context: ext.Context) -> None:
    call = replace(
        make_call(mask=True),
        formats={"q": pyside.ACL_FORMAT_FRACTAL_NZ, "kv_seqlen": 0, "out": 29},
        q_seqlen=torch.tensor([2, 3], dtype=torch.int64),
        kv_seqlen=torch.tensor([[3], [1]], dtype=torch.int32),
        out_shape=(5, 512),
        out_dtype=torch.bfloat16,
    )
    run = Launch(atb_double, context, call)
    run()
    (setup,) = atb_double.record()["workspace_calls"]
    assert (setup["q"]["format"], setup["kv_seqlen"]["format"], setup["atten_out"]["format"]) == (29, 0, 29)
    assert all(setup[name]["format"] == 2 for name in ("q_rope", "k", "k_rope", "v", "mask", "q_seqlen"))
    assert (setup["q_seqlen"]["dtype"], setup["q_seqlen"]["dims"]) == (9, [2])
    kv = setup["kv_seqlen"]
    assert (kv["dtype"], kv["dims"], kv["strides"]) == (3, [2, 1], [1, 1])
    assert setup["kv_seqlen_read"] == [3, 1]  # the int32 bytes, copied whatever the rank
    assert setup["q_seqlen_read"] == []  # the double reads int32 only
    assert (setup["atten_out"]["dims"], setup["atten_out"]["dtype"]) == ([5, 512], 27)
    assert setup["atten_out"]["data"] == run.out.data_ptr()


def test_host_tensor_bytes_are_copied_exactly(atb_double: Any, context: ext.Context) -> None:
    """A 0-dim and an int64 seqlen keep their bytes: the harness copies what it is given."""
    call = make_call()
    descs = describe_host_tensors(replace(call, q_seqlen=call.q_seqlen[0].clone(), kv_seqlen=call.kv_seqlen.long()))
    assert [(d.shape, d.dtype) for d in descs] == [((), 3), ((2,), 9)]
    assert descs[0].data == (2).to_bytes(4, "little") and descs[1].data == b"".join(
        n.to_bytes(8, "little") for n in (3, 1)
    )


def test_host_seqlens_are_correct_at_setup_and_alive_through_execute(atb_double: Any, context: ext.Context) -> None:
    run = Launch(atb_double, context, make_call())
    run()
    record = atb_double.record()
    setup, execute = record["workspace_calls"][0], record["execute_calls"][0]
    assert setup["q_seqlen_read"] == [2, 3]
    assert setup["kv_seqlen_read"] == [3, 1]
    assert execute["q_seqlen_read"] == [2, 3]
    assert execute["kv_seqlen_read"] == [3, 1]
    assert setup["q_seqlen"]["data"] != run.call.q_seqlen.data_ptr()  # a buffer the harness owns
    assert execute["live_tensors"] == 8


def test_every_call_gets_a_fresh_operation_destroyed_after_the_final_sync(
    atb_double: Any, context: ext.Context
) -> None:
    first, second = Launch(atb_double, context, make_call()), Launch(atb_double, context, make_call())
    first()
    second()
    record = atb_double.record()
    assert [c["op_in"] for c in record["workspace_calls"]] == [0, 0]
    ops = [int(c["op_out"]) for c in record["workspace_calls"]]
    assert all(ops)
    assert [c["op"] for c in record["execute_calls"]] == ops
    assert all(c["op_live"] for c in record["execute_calls"])
    assert [int(op) for op in record["destroyed_operations"]] == ops
    for run in (first, second):  # the op and tensors outlive the synchronize after AtbMLAPreFill
        (snapshot,) = run.at_sync
        assert snapshot["live"]["operations"] == 1
        assert snapshot["live"]["tensors"] == 8
        assert snapshot["events"][-1] == "prefill"
    assert_released(record)
    assert record["operations_created"] == 2


@pytest.mark.parametrize(("stage", "status"), [("create", 1), ("setup", 5), ("execute", 4)])
def test_failure_at_each_stage_raises_and_releases(
    atb_double: Any, context: ext.Context, stage: str, status: int
) -> None:
    atb_double.inject(stage, status)
    run = Launch(atb_double, context, make_call(), workspace=64)
    with pytest.raises(BackendError) as caught:
        run()
    err = caught.value
    assert (err.status, err.status_name, err.stage) == (status, STATUS_NAMES[status], stage)
    assert isinstance(err.__cause__, ext.AtbStatusError)
    assert (err.__cause__.status, err.__cause__.stage) == (status, stage)
    record = atb_double.record()
    assert_released(record)
    assert record["operations_created"] == (0 if stage == "create" else 1)
    assert len(record["execute_calls"]) == (1 if stage == "execute" else 0)
    assert len(run.workspaces) == len(run.at_sync) == (1 if stage == "execute" else 0)


@pytest.mark.parametrize("status", [*range(1, len(STATUS_NAMES)), 77])
def test_every_status_code_is_named(atb_double: Any, context: ext.Context, status: int) -> None:
    atb_double.inject("setup", status)
    with pytest.raises(BackendError) as caught:
        Launch(atb_double, context, make_call())()
    name = STATUS_NAMES.get(status, f"UNKNOWN_STATUS_{status}")
    assert (caught.value.status, caught.value.status_name, caught.value.stage) == (status, name, "setup")
    assert f"{name} ({status}) at setup" in str(caught.value)


def test_stream_failure_is_reported_before_any_operation(atb_double: Any, context: ext.Context) -> None:
    atb_double.inject("stream", 21)
    with pytest.raises(BackendError, match="ERROR_INVALID_STREAM") as caught:
        Launch(atb_double, context, make_call())()
    assert caught.value.stage == "setup"
    record = atb_double.record()
    assert record["workspace_calls"] == []
    assert_released(record)


def test_workspace_allocation_failure_releases_everything(atb_double: Any, context: ext.Context) -> None:
    def refuse(size: int) -> int:
        raise MemoryError(f"no {size} bytes")

    with pytest.raises(MemoryError, match="no 128 bytes"):
        Launch(atb_double, context, make_call(), workspace=128)(alloc=refuse)
    record = atb_double.record()
    assert record["execute_calls"] == []
    assert record["operations_created"] == 1
    assert_released(record)


@pytest.mark.parametrize(("index", "name"), [(0, "q"), (3, "k_rope"), (6, "q_seqlen"), (7, "kv_seqlen")])
def test_acl_create_tensor_failure_releases_the_tensors_made_so_far(
    atb_double: Any, context: ext.Context, index: int, name: str
) -> None:
    atb_double.fail_create_tensor(index)
    with pytest.raises(RuntimeError, match=f"aclCreateTensor returned null for {name}$"):
        Launch(atb_double, context, make_call())()
    record = atb_double.record()
    assert record["tensors_created"] == index
    assert record["workspace_calls"] == []
    assert_released(record)


def test_malformed_descriptor_lists_are_rejected_without_leaks(atb_double: Any, context: ext.Context) -> None:
    call = make_call()
    descs = describe_tensors(call, torch.empty(call.q.shape, dtype=torch.float16))
    hosts = describe_host_tensors(call)
    args = (4, 0.125, 2, 0, 1, FAKE_STREAM, lambda n: 0, lambda: None)
    bad = {
        "tensor given twice: q": ([descs[0], *descs], hosts),
        "unknown tensor name: query": ([descs[0]._replace(name="query"), *descs[1:]], hosts),
        "unknown tensor name: q_seqlen": ([*descs, descs[0]._replace(name="q_seqlen")], hosts),
        "unknown host tensor name: q": (descs, [*hosts, hosts[0]._replace(name="q")]),
        "tensor given twice: kv_seqlen": (descs, [*hosts, hosts[1]]),
    }
    for message, (tensors, host_tensors) in bad.items():
        with pytest.raises(ValueError, match=message):
            ext.prefill(context, tensors, host_tensors, *args)
    with pytest.raises(ValueError, match="cacheMode must fit in uint8"):
        ext.prefill(context, descs, hosts, *args[:4], 256, *args[5:])
    record = atb_double.record()
    assert record["workspace_calls"] == []
    assert_released(record)


def test_context_lifecycle(atb_double: Any) -> None:
    library = ext.Library(atb_double.path)
    gc.collect()  # contexts of earlier tests that are only garbage now must not die mid-count
    before = atb_double.record()["live"]["contexts"]
    created = ext.Context(library)
    assert atb_double.record()["live"]["contexts"] == before + 1
    del created
    record = atb_double.record()
    assert record["live"]["contexts"] == before
    assert record["events"][-1] == "destroy_context"
    atb_double.inject("context", 27)
    with pytest.raises(ext.AtbStatusError) as caught:
        ext.Context(library)
    assert (caught.value.status, caught.value.status_name, caught.value.stage) == (
        27,
        "ERROR_OUT_OF_HOST_MEMORY",
        "create",
    )
    assert atb_double.record()["live"]["contexts"] == before


def test_library_search_order_and_messages(
    monkeypatch: pytest.MonkeyPatch, atb_double: Any, tmp_path: Path, symbolless_lib: Path
) -> None:
    monkeypatch.setenv("ATB_HOME_PATH", str(tmp_path))
    missing = tmp_path / "nowhere" / "libatb.so"
    monkeypatch.setenv("MLA_ATB_LIB", str(missing))
    with pytest.raises(ext.AtbLoadError, match="libatb not found") as caught:
        ext.Library()
    assert str(missing) in str(caught.value)
    assert f"{tmp_path}/lib/libatb.so" not in str(caught.value)  # an explicit choice is not second-guessed

    monkeypatch.setenv("MLA_ATB_LIB", atb_double.path)
    found = ext.Library()
    assert found.path == found.acl_source == atb_double.path

    monkeypatch.setenv("MLA_ATB_LIB", str(symbolless_lib))
    with pytest.raises(ext.AtbLoadError, match=r"AtbMLAPreFillGetWorkspaceSize.*needs CANN/NNAL >= 8\.2\.RC1"):
        ext.Library()

    monkeypatch.delenv("MLA_ATB_LIB")
    try:
        ext.Library("libatb.so")
    except ext.AtbLoadError:
        with pytest.raises(ext.AtbLoadError) as caught:
            ext.Library()
        assert f"tried {tmp_path}/lib/libatb.so (" in str(caught.value)
        assert "; libatb.so (" in str(caught.value)
    else:
        pytest.skip("a real libatb.so is on the loader path; the not-found message cannot be provoked")


class SyncFailure(RuntimeError):
    """What the synchronize callback raises in the tests below."""


def test_a_raising_synchronize_is_retried_before_anything_is_released(atb_double: Any, context: ext.Context) -> None:
    """The first synchronize raises: the harness synchronizes again, then releases, then re-raises."""
    run = Launch(atb_double, context, make_call(), workspace=64)
    calls: list[dict[str, Any]] = []

    def sync_failing_once() -> None:
        calls.append(atb_double.record())
        if len(calls) == 1:
            raise SyncFailure("aclrtSynchronizeStream failed")

    with pytest.raises(SyncFailure, match="aclrtSynchronizeStream failed"):
        launch(context, run.call, run.out, stream=FAKE_STREAM, alloc_workspace=run.alloc, synchronize=sync_failing_once)
    assert len(calls) == 2
    for snapshot in calls:  # both synchronizes saw the op and every tensor still alive
        assert (snapshot["live"]["operations"], snapshot["live"]["tensors"]) == (1, 8)
        assert snapshot["events"][-1] == "prefill"
    record = atb_double.record()
    assert record["events"][-9:] == ["destroy_operation", *["destroy_tensor"] * 8]
    assert_released(record)


def test_a_synchronize_that_keeps_failing_leaks_instead_of_freeing(atb_double: Any, context: ext.Context) -> None:
    """Both synchronizes raise: device work may still be queued, so nothing is released; the first error wins."""
    run = Launch(atb_double, context, make_call(), workspace=64)
    raised: list[str] = []

    def sync_always_failing() -> None:
        raised.append(f"failure {len(raised) + 1}")
        raise SyncFailure(raised[-1])

    try:
        with pytest.raises(SyncFailure, match=r"^failure 1$"):
            launch(
                context,
                run.call,
                run.out,
                stream=FAKE_STREAM,
                alloc_workspace=run.alloc,
                synchronize=sync_always_failing,
            )
        assert raised == ["failure 1", "failure 2"]
        record = atb_double.record()
        assert (record["live"]["operations"], record["live"]["tensors"]) == (1, 8)
        assert record["events"][-1] == "prefill"  # no destroy after the launch
        assert record["bad_destroys"] == 0
    finally:
        atb_double.abandon_live()


def test_a_null_workspace_of_nonzero_size_is_refused_like_atb(atb_double: Any, context: ext.Context) -> None:
    """ATB's OperationBase::ExecuteCheck: workspaceSize > 0 with a null workspace -> ERROR_INVALID_PARAM."""
    run = Launch(atb_double, context, make_call(), workspace=512)
    with pytest.raises(BackendError) as caught:
        run(alloc=lambda size: 0)
    assert (caught.value.status_name, caught.value.stage) == ("ERROR_INVALID_PARAM", "execute")
    assert "null workspace for 512 bytes" in str(caught.value)
    record = atb_double.record()
    assert record["execute_calls"] == []  # refused before AtbMLAPreFill: no device work, no synchronize
    assert run.at_sync == []
    assert_released(record)


def test_a_zero_size_workspace_may_be_null(atb_double: Any, context: ext.Context) -> None:
    run = Launch(atb_double, context, make_call(), workspace=0)
    assert run(alloc=lambda size: pytest.fail(f"alloc_workspace called for {size} bytes")) == 0
    (execute,) = atb_double.record()["execute_calls"]
    assert (execute["workspace"], execute["workspace_size"]) == (0, 0)


def test_an_unwritten_row_fails_every_check(atb_double: Any, context: ext.Context) -> None:
    """The harness poisons attenOut with NaN: the double writes nothing, so the poison survives the
    launch, and a kernel that leaves one row unwritten fails where torch.empty's stale bytes might pass."""
    from mlaconf.golden.building.generate import build_golden
    from mlaconf.golden.specs.spec_build import build_case
    from mlaconf.harness.atb import output_buffer
    from mlaconf.judge.policy import load_policies
    from mlaconf.judge.verdict import judge_output
    from mlaconf.runner.execution import make_call as call_of

    spec = build_case(dict(dtype="fp16", mask_type="undefined", q_seqlen=[5, 3], head_num=2, seed=1), source="t")
    golden = build_golden(spec)
    run = Launch(atb_double, context, call_of(golden.inputs, spec))
    run.out = output_buffer(run.call)
    assert run() == 0
    assert torch.isnan(run.out).all()
    answer = torch.from_numpy(golden.out.astype("float64")).reshape(run.out.shape).to(run.out.dtype)
    policies = load_policies()
    run.out[:-1] = answer[:-1]  # every row but the last written
    _, verdict = judge_output(golden, run.out.numpy(), policies, "default", "atb-double")
    assert not verdict.passed
    assert any(c.metric == "nan_count" and not c.passed for c in verdict.checks)
    run.out[-1] = answer[-1]
    _, verdict = judge_output(golden, run.out.numpy(), policies, "default", "atb-double")
    assert verdict.passed
