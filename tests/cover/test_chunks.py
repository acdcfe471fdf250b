"""Row chunks (mlaconf.golden.building.chunks) and the process's one pool (mlaconf.facts.processes): the judge's and the
reference's results the same on any number of threads."""

from __future__ import annotations

import multiprocessing
import threading
import time
from collections.abc import Callable
from typing import TypeVar

import ml_dtypes
import numpy as np
import pytest

from mlaconf.facts import processes
from mlaconf.golden.building import chunks
from mlaconf.golden.building.chunks import RowChunk, row_chunks
from mlaconf.golden.building.generate import build_golden
from mlaconf.golden.building.inputs import generate_inputs
from mlaconf.golden.building.reference import for_each_tile, reference_attention
from mlaconf.golden.specs.spec_build import build_case
from mlaconf.golden.specs.types import GoldenCase
from mlaconf.judge.error_model import ModelBound, ModelResult
from mlaconf.judge.metrics import Metrics, compute_metrics
from mlaconf.judge.systematic import Significance, format_check, temperature_check

R = TypeVar("R")
CASE = build_case(
    {"q_seqlen": [40, 0, 24], "head_num": 2, "dtype": "bf16", "mask_type": 3, "kv_layout": "padded"}, source="test"
)


def map_chunks(fn: Callable[[RowChunk], R], rows: list[RowChunk]) -> list[R]:
    """How every pass maps its chunks."""
    return list(processes.map_for(len(rows))(fn, rows))


def test_row_chunks_cover_the_valid_rows_once_in_order(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(chunks, "CHUNK_ELEMENTS", 10)
    valid = np.array([True, False, True, True, True, False, True])
    found = row_chunks(valid, 4)  # two rows per chunk
    assert [c.tokens.tolist() for c in found] == [[0, 2], [3, 4], [6]]
    assert [c.start for c in found] == [0, 2, 4]
    assert all(isinstance(c.pick, np.ndarray) for c in found)  # gathered: some rows are invalid
    whole = row_chunks(np.ones(5, bool), 4)
    assert [c.pick for c in whole] == [slice(0, 2), slice(2, 4), slice(4, 5)]
    assert row_chunks(np.zeros(3, bool), 4) == []


def test_results_come_back_in_chunk_order(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    monkeypatch.setattr(chunks, "CHUNK_ELEMENTS", 1)
    names: set[str] = set()

    def first(chunk: RowChunk) -> int:
        names.add(threading.current_thread().name)
        return int(chunk.tokens[0])

    assert map_chunks(first, row_chunks(np.ones(50, bool), 1)) == list(range(50))
    assert any(name.startswith("mlaconf-pool") for name in names)  # it did use the pool
    names.clear()
    assert map_chunks(first, row_chunks(np.ones(2, bool), 1)) == [0, 1]
    assert names == {threading.current_thread().name}  # two chunks: not worth a hand-off


def test_never_more_threads_than_the_share(monkeypatch: pytest.MonkeyPatch) -> None:
    """A smaller share after a larger one (another worker count, say) is honoured, not the old pool's size."""
    monkeypatch.setattr(chunks, "CHUNK_ELEMENTS", 1)
    rows = row_chunks(np.ones(40, bool), 1)
    lock, running, most = threading.Lock(), [0], [0]

    def busy(chunk: RowChunk) -> int:
        with lock:
            running[0] += 1
            most[0] = max(most[0], running[0])
        time.sleep(0.002)
        with lock:
            running[0] -= 1
        return chunk.start

    for share, allowed in (("5", 5), ("2", 2)):
        monkeypatch.setenv("OMP_NUM_THREADS", share)
        most[0] = 0
        assert map_chunks(busy, rows) == list(range(40))
        assert 1 < most[0] <= allowed, share


def _judge(golden: GoldenCase, out: np.ndarray) -> tuple[Metrics, ModelResult, np.ndarray, Significance, Significance]:
    spec = golden.spec
    shape = (spec.total_q, spec.head_num, 128)
    metrics = compute_metrics(out.reshape(shape), golden.out.reshape(shape), golden.row_valid, "bf16", spec.q_seqlen)
    cells = np.full((spec.total_q, spec.head_num), np.nan)
    model = ModelBound(golden.out, golden.row_valid, golden.magnitudes, spec, false_alarm=1e-3, safety=2.0).ratio(
        out, cells
    )
    temperature = temperature_check(
        out, golden.out, golden.row_valid, golden.magnitudes, spec, 1e-3, golden.baseline_out
    )
    fmt = format_check(out, golden.out, golden.row_valid, spec, 1e-3)
    return metrics, model, cells, temperature, fmt


@pytest.mark.parametrize("threads", ["2", "5"])
def test_the_judge_is_the_same_on_any_number_of_threads(monkeypatch: pytest.MonkeyPatch, threads: str) -> None:
    """Chunks merge in order, so every float is the one-thread float: a verdict never depends on cores."""
    golden = build_golden(CASE)
    rng = np.random.default_rng(5)
    out = (golden.out * (1 + 4e-3 * rng.standard_normal(golden.out.shape))).astype(ml_dtypes.bfloat16)
    monkeypatch.setattr(chunks, "CHUNK_ELEMENTS", 3 * 256)  # 3 rows a chunk: 22 chunks
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    alone = _judge(golden, out)
    monkeypatch.setenv("OMP_NUM_THREADS", threads)
    shared = _judge(golden, out)
    assert alone[0] == shared[0] and alone[1] == shared[1] and alone[3] == shared[3] and alone[4] == shared[4]
    assert np.array_equal(alone[2], shared[2], equal_nan=True)
    assert alone[0].n_elements == 64 * 2 * 128 and alone[1].max_ratio > 0.0  # it judged something


def test_an_error_in_a_chunk_reaches_the_caller_and_the_pool_lives_on(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OMP_NUM_THREADS", "2")
    monkeypatch.setattr(chunks, "CHUNK_ELEMENTS", 1)
    rows = row_chunks(np.ones(20, bool), 1)

    def fails_at_seven(chunk: RowChunk) -> int:
        if chunk.start == 7:
            raise ValueError("chunk 7")
        return chunk.start

    with pytest.raises(ValueError, match="chunk 7"):
        map_chunks(fails_at_seven, rows)
    assert map_chunks(lambda c: c.start, rows) == list(range(20))


def test_a_map_inside_a_chunk_runs_inline(monkeypatch: pytest.MonkeyPatch) -> None:
    """A pool thread that waited on the pool could wait forever once every thread did."""
    monkeypatch.setenv("OMP_NUM_THREADS", "2")
    monkeypatch.setattr(chunks, "CHUNK_ELEMENTS", 1)
    rows = row_chunks(np.ones(6, bool), 1)

    def inner(chunk: RowChunk) -> int:
        return sum(map_chunks(lambda c: c.start, rows)) + chunk.start

    assert map_chunks(inner, rows) == [15 + i for i in range(6)]


def _in_child(queue: multiprocessing.Queue) -> None:  # type: ignore[type-arg]
    queue.put(map_chunks(lambda c: c.start, row_chunks(np.ones(8, bool), 1)))


@pytest.mark.timeout(60)
def test_a_forked_child_makes_its_own_pool(monkeypatch: pytest.MonkeyPatch) -> None:
    """The parent's pool threads do not survive a fork: the child must not wait on them."""
    monkeypatch.setenv("OMP_NUM_THREADS", "2")
    monkeypatch.setattr(chunks, "CHUNK_ELEMENTS", 1)
    assert map_chunks(lambda c: c.start, row_chunks(np.ones(4, bool), 1)) == [0, 1, 2, 3]  # the parent's pool
    context = multiprocessing.get_context("fork")
    queue = context.Queue()
    child = context.Process(target=_in_child, args=(queue,))
    child.start()
    assert queue.get(timeout=30) == list(range(8))
    child.join(30)
    assert child.exitcode == 0


@pytest.mark.parametrize("threads", [2, 5])
def test_the_reference_is_the_same_on_any_number_of_threads(monkeypatch: pytest.MonkeyPatch, threads: int) -> None:
    """Tiles run on the one pool, never more at once than asked, and every bit is the one-thread bit."""
    spec = build_case({"q_seqlen": [70, 0, 31], "head_num": 3, "mask_type": 2, "dtype": "bf16"}, source="test")
    inputs = generate_inputs(spec)
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    alone, _ = reference_attention(inputs, spec, tile=16, threads=threads)  # a budget of one: inline
    monkeypatch.setenv("OMP_NUM_THREADS", str(threads))
    shared, _ = reference_attention(inputs, spec, tile=16, threads=threads)
    assert alone.tobytes() == shared.tobytes() and np.isfinite(alone).any()
    lock, running, most, names = threading.Lock(), [0], [0], set()

    def visit(*_: object) -> None:
        with lock:
            running[0] += 1
            most[0] = max(most[0], running[0])
            names.add(threading.current_thread().name)
        time.sleep(0.002)
        with lock:
            running[0] -= 1

    monkeypatch.setenv("OMP_NUM_THREADS", "5")  # a budget above what the caller asks for
    for_each_tile(inputs, spec, visit, np.float64, tile=8, threads=threads)
    assert 1 < most[0] <= threads and all(name.startswith("mlaconf-pool") for name in names)


def test_a_pool_worker_runs_torch_on_one_thread(monkeypatch: pytest.MonkeyPatch) -> None:
    """Workers never multiply into more threads than the budget: torch (and MKL under it) run one per worker,
    and the caller's own torch threads stay as they were."""
    import torch

    before = torch.get_num_threads()
    monkeypatch.setenv("OMP_NUM_THREADS", "2")
    monkeypatch.setattr(chunks, "CHUNK_ELEMENTS", 1)
    rows = row_chunks(np.ones(8, bool), 1)

    def pinned(chunk: RowChunk) -> tuple[int, str]:
        processes.pin_worker_threads()
        return torch.get_num_threads(), threading.current_thread().name

    try:
        counts = map_chunks(pinned, rows)
        assert {count for count, name in counts if name.startswith("mlaconf-pool")} == {1}
        assert any(name.startswith("mlaconf-pool") for _, name in counts)
        assert torch.get_num_threads() == before
    finally:
        torch.set_num_threads(before)  # torch's default for threads not yet started is process-wide
