"""``mlaconf regen --ray``: every case a Ray task, scheduled by its estimated peak memory.

A task asks for ``memory`` = the case's estimated peak (:func:`mlaconf.golden.building.cost.peak_bytes`) and
enough CPUs that the cluster's memory per CPU covers that peak; its builder runs that many threads.
The rules of local regen hold unchanged, because the task runs the same code
(:func:`mlaconf.golden.building.regen.regen_one`, the store's ``ensure_result``): only missing, stale or corrupt
files are built, each under the store's per-case lock, written to a temp file and renamed into place.

Where the files are written (``store``):

- ``shared`` (default): the tasks write into the store, which must be one directory every node mounts
  at the same path, with atomic ``rename`` and working ``flock`` locks (NFSv4, CephFS, Lustre, GPFS;
  not NFSv3 without lockd, not an object-store mount).  A marker file the driver writes first is
  checked by every task, so a node that sees another directory under that path fails its cases
  instead of writing elsewhere;
- ``driver``: the tasks return the golden through Ray's object store and the driver writes it, so the
  store needs only to be local to the driver (any filesystem where local regen works).

Progress is one line for the whole cluster, by useful FLOPs, including the running cases' progress
(reported through a small actor).  A task lost with its worker or node is retried by Ray on another
(``max_retries``); the retry finds a file its first attempt finished, under the lock.  Ctrl-C cancels
every task (running ones are killed, their temp files removed) and prints the summary.
"""

from __future__ import annotations

import contextlib
import math
import os
import socket
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

from mlaconf.facts.cluster import node_resources
from mlaconf.golden.building import cost
from mlaconf.golden.building import progress as work_progress
from mlaconf.golden.building.progress import Progress
from mlaconf.golden.building.regen import BuilderRef, CaseOutcome, RegenSummary, RegenTask, regen_one, resolve_builder
from mlaconf.golden.specs.spec import CaseSpec
from mlaconf.golden.specs.types import GoldenCase
from mlaconf.golden.store.directory import GoldenStore
from mlaconf.golden.store.integrity import GoldenStoreError

STORE_MODES = ("shared", "driver")
#: Retries of a task whose worker process or node died (Ray's own retry; failures of a build are outcomes).
MAX_RETRIES = 3
#: Seconds between two looks at finished tasks and in-case progress.
POLL_S = 0.5
MARKER_PREFIX = ".ray-store-"


@dataclass(frozen=True)
class ClusterShape:
    """What sizing needs of the cluster: memory per CPU (the smallest node's), the largest node."""

    memory_per_cpu: float
    largest_memory: int
    largest_cpus: int

    @classmethod
    def of(cls, nodes: Sequence[dict[str, float]]) -> ClusterShape:
        usable = [n for n in nodes if n.get("CPU", 0) >= 1 and n.get("memory", 0) > 0]
        if not usable:
            raise ValueError("the Ray cluster has no node with CPUs and memory")
        return cls(
            memory_per_cpu=min(n["memory"] / n["CPU"] for n in usable),
            largest_memory=int(max(n["memory"] for n in usable)),
            largest_cpus=int(max(n["CPU"] for n in usable)),
        )

    def size(self, spec: CaseSpec) -> tuple[int, int]:
        """(CPUs, memory bytes) of the case's task: the CPUs whose memory share covers its peak."""
        cpus = min(max(1, math.ceil(cost.peak_bytes(spec, 1) / self.memory_per_cpu)), self.largest_cpus)
        return cpus, cost.peak_bytes(spec, cpus)


class ProgressBoard:
    """Actor: running tasks post in-case progress and their pid here; the driver takes it."""

    def __init__(self) -> None:
        self.updates: list[tuple[str, float, str]] = []
        self.pids: dict[str, tuple[str, int]] = {}

    def started(self, case_id: str, host: str, pid: int) -> None:
        self.pids[case_id] = (host, pid)

    def report(self, case_id: str, fraction: float, note: str) -> None:
        self.updates.append((case_id, fraction, note))

    def take(self) -> tuple[list[tuple[str, float, str]], dict[str, tuple[str, int]]]:
        updates, self.updates = self.updates, []
        return updates, dict(self.pids)


def _with_board(board: Any, case_id: str, run: Callable[[], Any]) -> Any:
    """In a task: tell the board where it runs, forward in-case progress, run."""
    with contextlib.suppress(Exception):  # not waited for: a task blocked in ray.get lends its CPU to a new worker
        board.started.remote(case_id, socket.gethostname(), os.getpid())

    def forward(work: work_progress.CaseWork) -> None:
        with contextlib.suppress(Exception):
            board.report.remote(work.case_id, work.fraction, work.text())

    remove = work_progress.add_listener(forward)
    try:
        return run()
    finally:
        remove()


def build_into_store(task: RegenTask, marker: str, board: Any) -> CaseOutcome:
    """Task (``shared``): the local regen of one case, once the store is known to be the driver's."""
    if not (Path(task.root) / marker).exists():
        why = f"store {task.root} on node {socket.gethostname()} is not the driver's (no shared filesystem?)"
        return CaseOutcome(task.spec.case_id, "failed", why)
    outcome: CaseOutcome = _with_board(board, task.spec.case_id, lambda: regen_one(task))
    return outcome


def build_only(spec: CaseSpec, builder: BuilderRef, threads: int, board: Any) -> tuple[GoldenCase | None, str, float]:
    """Task (``driver``): build the golden and hand it back; (golden, failure text, seconds)."""
    start = time.monotonic()
    try:
        golden = _with_board(board, spec.case_id, lambda: resolve_builder(builder, threads)(spec))
    except Exception as exc:  # one bad case must not stop the others
        return None, f"{type(exc).__name__}: {exc}", time.monotonic() - start
    return golden, "", time.monotonic() - start


def _write_on_driver(
    store: GoldenStore, spec: CaseSpec, result: tuple[GoldenCase | None, str, float], force: bool
) -> CaseOutcome:
    """``driver`` mode: write a task's golden under the case lock (or take a file another wrote)."""
    golden, failure, seconds = result
    if golden is None:
        return CaseOutcome(spec.case_id, "failed", failure, 0, seconds)
    try:
        done = store.ensure_result(spec, lambda _: golden, force=force)  # under the lock, like a local build
    except GoldenStoreError as exc:
        return CaseOutcome(spec.case_id, "failed", f"{type(exc).__name__}: {exc}", 0, seconds)
    return CaseOutcome(spec.case_id, done.action, done.why, done.bytes_written, seconds)


def _current(store: GoldenStore, spec: CaseSpec) -> bool:
    try:
        store.load(spec)
    except GoldenStoreError:
        return False
    return True


def regen_on_ray(
    ray: Any,
    specs: Sequence[CaseSpec],
    store: GoldenStore,
    *,
    force: bool = False,
    builder: BuilderRef = None,
    mode: str = "shared",
    stream: TextIO | None = None,
) -> RegenSummary:
    """Build missing, stale or corrupt goldens as Ray tasks on the connected cluster."""
    if mode not in STORE_MODES:
        raise ValueError(f"store mode must be one of {STORE_MODES}, got {mode!r}")
    start = time.monotonic()
    todo = [s for s in specs if s.expect_error is None]
    summary = RegenSummary(skipped=len(specs) - len(todo))
    shape = ClusterShape.of(node_resources(ray))
    store.root.mkdir(parents=True, exist_ok=True)
    if mode == "driver" and not force:  # the driver writes: it alone judges what is current
        for spec in [s for s in todo if _current(store, s)]:
            summary.outcomes.append(CaseOutcome(spec.case_id, "up-to-date"))
            todo.remove(spec)
    flops = {s.case_id: float(cost.golden_flops(s)) for s in todo}
    progress = Progress(len(todo) + len(summary.outcomes), "regen", stream, work=sum(flops.values()) or None)
    for outcome in summary.outcomes:
        progress.advance(f"up-to-date {outcome.case_id}", skipped=True)
    board = ray.remote(num_cpus=0)(ProgressBoard).remote()
    marker = f"{MARKER_PREFIX}{uuid.uuid4().hex}"
    (store.root / marker).write_text(socket.gethostname())
    pending: dict[Any, CaseSpec] = {}
    running: dict[str, float] = {}
    into_store = ray.remote(build_into_store)
    build = ray.remote(build_only)
    try:
        for spec in todo:
            cpus, memory = shape.size(spec)
            options = {"num_cpus": cpus, "memory": min(memory, shape.largest_memory), "max_retries": MAX_RETRIES}
            if mode == "shared":
                task = RegenTask(spec, str(store.root), store.generator_version, builder, cpus, force)
                ref = into_store.options(**options).remote(task, marker, board)
            else:
                ref = build.options(**options).remote(spec, builder, cpus, board)
            pending[ref] = spec
        while pending:
            ready, _ = ray.wait(list(pending), num_returns=len(pending), timeout=POLL_S)
            for ref in ready:
                spec = pending.pop(ref)
                try:
                    result = ray.get(ref)
                except Exception as exc:  # retries exhausted: the worker or node kept dying
                    outcome = CaseOutcome(spec.case_id, "failed", f"task lost: {type(exc).__name__}: {exc}")
                else:
                    outcome = result if mode == "shared" else _write_on_driver(store, spec, result, force)
                summary.outcomes.append(outcome)
                running.pop(spec.case_id, None)
                progress.advance(
                    f"{outcome.action} {outcome.case_id} ({outcome.seconds:.1f}s)",
                    work=flops.get(outcome.case_id, 0.0),
                    skipped=outcome.action != "generated",
                )
            updates, _ = ray.get(board.take.remote())
            done = {o.case_id for o in summary.outcomes}
            for case_id, fraction, note in updates:
                if case_id not in done:
                    running[case_id] = fraction
                    progress.partial(sum(flops.get(c, 0.0) * f for c, f in running.items()), note)
    except KeyboardInterrupt:
        summary.interrupted = True
        for spec, result in _cancel(ray, pending, board, store):  # those that finished meanwhile count
            summary.outcomes.append(result if mode == "shared" else _write_on_driver(store, spec, result, force))
        finished = {o.case_id for o in summary.outcomes}
        summary.outcomes += [CaseOutcome(s.case_id, "cancelled") for s in todo if s.case_id not in finished]
    finally:
        with contextlib.suppress(OSError):
            (store.root / marker).unlink()
    progress.close()
    summary.elapsed = time.monotonic() - start
    return summary


def _cancel(ray: Any, pending: dict[Any, CaseSpec], board: Any, store: GoldenStore) -> list[tuple[CaseSpec, Any]]:
    """Kill every unfinished task and remove the temp files of those that were writing; returns the
    results of the tasks that finished before the cancellation reached them."""
    for ref in pending:
        with contextlib.suppress(Exception):
            ray.cancel(ref, force=True)
    finished: list[tuple[CaseSpec, Any]] = []
    with contextlib.suppress(Exception):
        ready, _ = ray.wait(list(pending), num_returns=len(pending), timeout=5.0)
        for ref in ready:
            with contextlib.suppress(Exception):  # a cancelled task raises TaskCancelledError
                finished.append((pending[ref], ray.get(ref, timeout=1.0)))
    done = {spec.case_id for spec, _ in finished}
    with contextlib.suppress(Exception):
        _, pids = ray.get(board.take.remote(), timeout=5.0)
        for spec in pending.values():
            if spec.case_id in pids and spec.case_id not in done:
                temp = store.root / f".{spec.case_id}.h5.{pids[spec.case_id][1]}.tmp"
                temp.unlink(missing_ok=True)
    return finished
