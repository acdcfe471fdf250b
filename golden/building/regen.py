"""Regenerate and verify golden files: case selection, sharding, worker processes, recompute check.

Workers are ``spawn`` processes (no forked BLAS/thread state); each gets ``cores // jobs`` BLAS and
builder threads so the machine is not oversubscribed.  Workers die with the regen process that started
them, even when it is SIGKILLed: on Linux the kernel kills them (``prctl(PR_SET_PDEATHSIG)``), and
everywhere a thread in each worker exits it once its parent is gone.  Correctness under concurrency
comes from the store's per-case lock, so several ``regen`` processes (or hosts on a shared filesystem)
may run at once.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import inspect
import multiprocessing
import os
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ProcessPoolExecutor, as_completed
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

import numpy as np

from mlaconf.facts.processes import THREAD_ENV, kill_with_parent, usable_cpus
from mlaconf.facts.shard import in_shard
from mlaconf.golden.building import cost, drift
from mlaconf.golden.building import progress as work_progress
from mlaconf.golden.building.magnitudes import CANCELLING_MAGNITUDES, cancellation_noise
from mlaconf.golden.building.progress import CaseWork, Progress, flops_text
from mlaconf.golden.building.relations import suite_cases
from mlaconf.golden.specs.spec import CaseSpec
from mlaconf.golden.specs.suites import suite_paths
from mlaconf.golden.specs.types import GoldenCase
from mlaconf.golden.store.bundles import inputs_from
from mlaconf.golden.store.directory import Builder, GoldenStore
from mlaconf.golden.store.h5file import read_golden, read_meta
from mlaconf.golden.store.integrity import GoldenStoreError

DEFAULT_BUILDER = "mlaconf.golden.building.generate:build_golden"
#: Magnitudes are stored rounded up (bf16 per element, float32 per row): a recomputation whose float64
#: value lands across a rounding boundary differs by one step, element by element.
MAGNITUDE_STEP = {"bfloat16": 2.0**-7, "float32": 2.0**-22}
#: Absolute slack, relative to a magnitude array's largest value (float64 rounding of values near 0).
MAGNITUDE_FLOOR = 2.0**-20

BuilderRef = str | Builder | None
#: How often a worker checks that the regen process that started it is still alive.
PARENT_POLL_S = 0.5


# -- selection -------------------------------------------------------------------------------------


def select_cases(
    suites: Sequence[str],
    case_files: Sequence[str | Path] = (),
    shard: tuple[int, int] | None = None,
    bundles_to: Path | None = None,
) -> list[CaseSpec]:
    """Specs of the named suites and suite files with the sides their relations judge (deduplicated by
    content hash), in the shard; ``bundles_to``: the store that gets the sides' input bundles (regen)."""
    specs: list[CaseSpec] = []
    for path in [*(suite_paths(suites) if suites else []), *map(Path, case_files)]:
        specs.extend(suite_cases(path, bundles_to))
    unique = {spec.content_hash: spec for spec in reversed(specs)}
    return [spec for spec in specs if unique.get(spec.content_hash) is spec and in_shard(spec.content_hash, shard)]


# -- builders and threads --------------------------------------------------------------------------

#: The CPUs regen splits among its workers; golden.maintain reads it here too (one name to replace in tests).
cpu_count = usable_cpus


def resolve_builder(ref: BuilderRef, threads: int = 1) -> Builder:
    """A builder from a callable or ``pkg.mod:func``; binds ``threads`` when the builder takes it."""
    if ref is None or isinstance(ref, str):
        module_name, _, attr = (ref or DEFAULT_BUILDER).partition(":")
        if not attr:
            raise ValueError(f"builder must look like pkg.mod:func, got {ref!r}")
        fn: Callable[..., GoldenCase] = getattr(importlib.import_module(module_name), attr)
    else:
        fn = ref
    if "threads" in inspect.signature(fn).parameters:
        return functools.partial(fn, threads=threads)
    return fn


@contextlib.contextmanager
def thread_env(threads: int) -> Iterator[None]:
    """Cap BLAS/OpenMP threads for processes started inside the block (spawn copies os.environ)."""
    saved = {name: os.environ.get(name) for name in THREAD_ENV}
    os.environ.update({name: str(threads) for name in THREAD_ENV})
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


# -- regen -----------------------------------------------------------------------------------------


def watch_parent(parent_pid: int, interval: float) -> None:
    """Exit this process at once when its parent is no longer ``parent_pid`` (it died: re-parented)."""
    while os.getppid() == parent_pid:
        time.sleep(interval)
    os._exit(1)


def die_with_parent(parent_pid: int) -> None:
    """Worker initializer: the worker must not outlive (and keep writing goldens for) a killed regen."""
    kill_with_parent()  # a failure leaves the watcher below in charge
    threading.Thread(target=watch_parent, args=(parent_pid, PARENT_POLL_S), name="watch-parent", daemon=True).start()


@dataclass(frozen=True)
class RegenTask:
    spec: CaseSpec
    root: str
    generator_version: str
    builder: BuilderRef
    threads: int
    force: bool


@dataclass(frozen=True)
class CaseOutcome:
    case_id: str
    action: str  # "generated", "up-to-date", "failed" or "cancelled" (Ctrl-C: not started or stopped)
    why: str = ""
    bytes_written: int = 0
    seconds: float = 0.0


_worker_queue: Any = None


def _report_to_queue(work: CaseWork) -> None:
    """In a worker process: send in-case progress to the parent (never blocks the build)."""
    with contextlib.suppress(Exception):
        _worker_queue.put_nowait((work.case_id, work.fraction, work.text()))


def _init_worker(queue: Any, parent_pid: int) -> None:
    """Worker process start: die with the parent, report in-case progress through ``queue``, and leave
    Ctrl-C to the parent (the terminal sends SIGINT to the whole group; the parent stops the workers)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})  # blocked by the parent while spawning
    die_with_parent(parent_pid)
    global _worker_queue
    _worker_queue = queue
    work_progress.add_listener(_report_to_queue)


def regen_one(task: RegenTask) -> CaseOutcome:
    """One case (runs in a worker process); failures are reported, not raised."""
    start = time.monotonic()
    store = GoldenStore(task.root, generator_version=task.generator_version)
    try:
        builder = resolve_builder(task.builder, task.threads)
        result = store.ensure_result(task.spec, builder, force=task.force)
    except Exception as exc:  # one bad case must not stop the others
        why, action, size = f"{type(exc).__name__}: {exc}", "failed", 0
    else:
        why, action, size = result.why, result.action, result.bytes_written
    return CaseOutcome(task.spec.case_id, action, why, size, time.monotonic() - start)


@dataclass
class RegenSummary:
    outcomes: list[CaseOutcome] = field(default_factory=list)
    skipped: int = 0
    elapsed: float = 0.0
    interrupted: bool = False

    def count(self, action: str) -> int:
        return sum(o.action == action for o in self.outcomes)

    @property
    def bytes_written(self) -> int:
        return sum(o.bytes_written for o in self.outcomes)

    def format(self) -> str:
        lines = [f"failed {o.case_id}: {o.why}" for o in self.outcomes if o.action == "failed"]
        cancelled = f", {self.count('cancelled')} cancelled" if self.interrupted else ""
        lines.append(
            f"regen{': interrupted' if self.interrupted else ''}: {self.count('generated')} generated, "
            f"{self.count('up-to-date')} up-to-date, {self.count('failed')} failed{cancelled}, "
            f"{self.skipped} skipped (error cases) in {self.elapsed:.1f}s, {self.bytes_written / 1e6:.1f} MB written"
        )
        return "\n".join(lines)


def regen(
    specs: Sequence[CaseSpec],
    store: GoldenStore,
    *,
    jobs: int = 1,
    force: bool = False,
    builder: BuilderRef = None,
    stream: TextIO | None = None,
) -> RegenSummary:
    """Build missing, stale or corrupt goldens (all with ``force``); ``jobs`` worker processes."""
    start = time.monotonic()
    todo = [s for s in specs if s.expect_error is None]  # error cases are rejected, never computed
    summary = RegenSummary(skipped=len(specs) - len(todo))
    jobs = max(1, min(jobs, len(todo)))
    threads = max(1, cpu_count() // jobs)
    tasks = [RegenTask(s, str(store.root), store.generator_version, builder, threads, force) for s in todo]
    flops = {s.case_id: float(cost.golden_flops(s)) for s in todo}
    to_build = {s.case_id for s in todo if force or not store.looks_fresh(s)}  # what the progress counts
    work = sum(flops[c] for c in to_build)
    if len(to_build) < len(todo):
        print(
            f"regen: {len(todo) - len(to_build)} of {len(todo)} goldens up to date; "
            f"{len(to_build)} to build ({flops_text(work)})",
            file=stream if stream is not None else sys.stderr,
            flush=True,
        )
    progress = Progress(len(to_build), "regen", stream, work=work or None)
    running: dict[str, float] = {}  # case id -> fraction of its build done (in-case progress)
    lock = threading.Lock()

    def in_case(case_id: str, fraction: float, note: str) -> None:
        with lock:
            if case_id in done:
                return
            running[case_id] = fraction
            progress.partial(sum(flops.get(c, 0.0) * f for c, f in running.items()), note)

    done: set[str] = set()

    def record(outcome: CaseOutcome) -> None:
        summary.outcomes.append(outcome)
        with lock:
            done.add(outcome.case_id)
            running.pop(outcome.case_id, None)
            progress.partial(sum(flops.get(c, 0.0) * f for c, f in running.items()))
        counted = outcome.case_id in to_build
        if not counted and outcome.action != "generated":
            return  # up to date, as its header said: no work, no line
        if not counted:  # its header looked current, the file was not: built after all
            progress.expect(flops.get(outcome.case_id, 0.0))
        progress.advance(
            f"{outcome.action} {outcome.case_id} ({outcome.seconds:.1f}s)",
            work=flops.get(outcome.case_id, 0.0),
            skipped=outcome.action != "generated",
        )

    try:
        if jobs == 1:
            remove = work_progress.add_listener(lambda w: in_case(w.case_id, w.fraction, w.text()))
            try:
                for task in tasks:
                    record(regen_one(task))
            finally:
                remove()
        else:
            _regen_in_workers(tasks, jobs, threads, store.root, record, in_case)
    except KeyboardInterrupt:
        summary.interrupted = True
        finished = {o.case_id for o in summary.outcomes}
        summary.outcomes += [CaseOutcome(t.spec.case_id, "cancelled") for t in tasks if t.spec.case_id not in finished]
    progress.close()
    summary.elapsed = time.monotonic() - start
    return summary


@contextlib.contextmanager
def sigint_blocked() -> Iterator[None]:
    """Hold Ctrl-C back while worker processes are spawned: they inherit the blocked mask (and ignore
    SIGINT before unblocking it), and a Ctrl-C pressed meanwhile is raised here once the block ends."""
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)


def stop_workers(workers: Sequence[multiprocessing.process.BaseProcess], root: Path) -> None:
    """Kill the pool's worker processes and remove their temp files: nothing they were writing reaches
    a final name (a golden is renamed into place only once complete), so finished files are kept."""
    for worker in workers:
        with contextlib.suppress(Exception):
            worker.kill()
    for worker in workers:
        with contextlib.suppress(Exception):
            worker.join(5.0)
        for leftover in root.glob(f".*.h5.{worker.pid}.tmp"):
            with contextlib.suppress(OSError):
                leftover.unlink()


def _finished(
    future: Future[CaseOutcome], task: RegenTask, workers: Sequence[multiprocessing.process.BaseProcess]
) -> CaseOutcome | None:
    """A case that finished although the interrupt stopped its worker: its result arrived, or the
    worker had renamed the file into place (the file names its writer's host and pid) before it was
    killed.  None: it did not finish (cancelled)."""
    if future.done() and not future.cancelled() and future.exception() is None:
        return future.result()
    store = GoldenStore(task.root, generator_version=task.generator_version)
    path = store.path_for(task.spec)
    try:
        meta = read_meta(path)
        store.check_stale(meta, task.spec)
    except (GoldenStoreError, OSError):
        return None
    ours = meta.attrs.get("hostname") == socket.gethostname() and meta.attrs.get("created_pid") in {
        w.pid for w in workers
    }
    return CaseOutcome(task.spec.case_id, "generated", "", path.stat().st_size) if ours else None


def _regen_in_workers(
    tasks: Sequence[RegenTask],
    jobs: int,
    threads: int,
    root: Path,
    record: Callable[[CaseOutcome], None],
    in_case: Callable[[str, float, str], None],
) -> None:
    """Run ``tasks`` in ``jobs`` spawned worker processes; Ctrl-C cancels the queued ones, stops the
    workers and propagates (as KeyboardInterrupt) once they are gone."""
    context = multiprocessing.get_context("spawn")
    queue = context.Queue()
    stop = threading.Event()

    def drain() -> None:
        while not stop.is_set():
            with contextlib.suppress(Exception):
                in_case(*queue.get(timeout=0.2))

    listener = threading.Thread(target=drain, name="regen-progress", daemon=True)
    listener.start()
    pool: ProcessPoolExecutor | None = None
    futures: dict[Future[CaseOutcome], RegenTask] = {}
    handled: set[Future[CaseOutcome]] = set()
    try:
        with thread_env(threads), sigint_blocked():
            pool = ProcessPoolExecutor(
                jobs, mp_context=context, initializer=_init_worker, initargs=(queue, os.getpid())
            )
            futures.update({pool.submit(regen_one, task): task for task in tasks})
        for future in as_completed(futures):
            handled.add(future)
            try:
                record(future.result())
            except Exception as exc:  # a crashed worker fails its case, not the run
                record(CaseOutcome(futures[future].spec.case_id, "failed", f"worker died: {exc!r}"))
    except KeyboardInterrupt:
        previous = signal.signal(signal.SIGINT, signal.SIG_IGN)  # a second Ctrl-C must not cut the clean-up short
        try:
            if pool is not None:
                workers = multiprocessing.active_children()
                pool.shutdown(wait=False, cancel_futures=True)
                stop_workers(workers, root)
                pool.shutdown(wait=True)
                for future, task in futures.items():  # those that finished while the interrupt came
                    if future not in handled and (outcome := _finished(future, task, workers)) is not None:
                        record(outcome)
        finally:
            signal.signal(signal.SIGINT, previous)
        raise
    finally:
        if pool is not None:
            pool.shutdown(wait=True, cancel_futures=True)
        stop.set()
        listener.join(2.0)


# -- verify ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Problem:
    path: Path
    message: str
    dataset: str | None = None

    def __str__(self) -> str:
        where = f"{self.path}: dataset {self.dataset!r}" if self.dataset else str(self.path)
        return f"{where}: {self.message}"


#: Elements per chunk when comparing a stored golden with a recomputed one (bounded temporaries).
COMPARE_CHUNK = 1 << 22


def _flat_chunks(*arrays: np.ndarray) -> Iterator[tuple[np.ndarray, ...]]:
    """The arrays (equal sizes) flattened and cut into the same COMPARE_CHUNK-element pieces."""
    flat = [a.reshape(-1) for a in arrays]
    for start in range(0, flat[0].size, COMPARE_CHUNK):
        yield tuple(f[start : start + COMPARE_CHUNK] for f in flat)


def relative_difference(actual: np.ndarray, expected: np.ndarray) -> float:
    """max |a - b| / max(max |b|, tiny) over non-NaN entries; inf when NaN positions differ."""
    largest, scale = 0.0, float(np.finfo(np.float64).tiny)
    for a, b in _flat_chunks(actual, expected):
        nan_b = np.isnan(b)
        if not np.array_equal(np.isnan(a), nan_b):
            return float("inf")
        if nan_b.any():
            a, b = a[~nan_b], b[~nan_b]
        if a.size:
            scale = max(scale, float(np.max(np.abs(b))))
            largest = max(largest, float(np.max(np.abs(a - b))))
    return largest / scale


def _same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    raw = [np.ascontiguousarray(x).reshape(-1).view(np.uint8) for x in (a, b)]
    return all(np.array_equal(x, y) for x, y in _flat_chunks(*raw))


@dataclass(frozen=True)
class Recomputed:
    """A stored golden against its recomputation: the problems, and what moved within its yardstick."""

    problems: list[Problem]
    #: (what moved within which yardstick, by how much), e.g. ("baseline moved within its bound", "3 of ...")
    moved: list[tuple[str, str]]


def compare_recomputed(path: Path, stored: GoldenCase, fresh: GoldenCase) -> Recomputed:
    """Inputs and row_valid bit for bit, golden/out within its agreement (:mod:`mlaconf.golden.building.drift`),
    magnitudes within one rounding step, the baseline and its statistics within the baseline's
    rounding bound; every move within its yardstick is named in ``moved``."""
    problems: list[Problem] = []
    moved: list[tuple[str, str]] = []
    old, new = stored.inputs.arrays(), fresh.inputs.arrays()
    for name in sorted(set(old) | set(new)):
        a, b = old.get(name), new.get(name)
        if a is None or b is None:
            problems.append(Problem(path, "present in only one of stored / recomputed", f"inputs/{name}"))
        elif not _same_bits(a, b):
            problems.append(
                Problem(
                    path,
                    f"recomputed input differs ({b.dtype}{b.shape} vs stored {a.dtype}{a.shape})",
                    f"inputs/{name}",
                )
            )
    records = [g.inputs_record.digests if g.inputs_record else {} for g in (stored, fresh)]
    for name in sorted(set(records[0]) | set(records[1])):  # a sampled golden's inputs: their digests
        if records[0].get(name) != records[1].get(name):
            problems.append(Problem(path, "recomputed inputs' digest differs from the recorded one", f"inputs/{name}"))
    if not np.array_equal(stored.row_valid, fresh.row_valid):
        problems.append(Problem(path, "recomputed row_valid differs", "golden/row_valid"))
    sampled = [(g.sample.rows, g.sample.reasons) for g in (stored, fresh) if g.sample is not None]
    if len(sampled) == 1 or (sampled and not all(map(np.array_equal, *sampled))):
        problems.append(Problem(path, "recomputed row sample differs", "golden/sample_rows"))
    same_shapes = stored.out.shape == fresh.out.shape and stored.baseline_out.shape == fresh.baseline_out.shape
    if not same_shapes:
        message = f"recomputed shape {fresh.out.shape} vs stored {stored.out.shape}"
        problems.append(Problem(path, message, "golden/out"))
    else:
        reference = drift.reference_drift(stored, fresh)
        if not reference.ok:
            problems.append(Problem(path, f"reference drift: {reference.text()}", "golden/out"))
        elif reference.moved:
            moved.append(("reference moved within its agreement", reference.text()))
    for name in sorted(set(stored.magnitudes) | set(fresh.magnitudes)):
        a, b = stored.magnitudes.get(name), fresh.magnitudes.get(name)
        if a is None or b is None or a.shape != b.shape:
            problems.append(Problem(path, "magnitude missing or reshaped in stored / recomputed", f"golden/{name}"))
        elif stored.out.shape == fresh.out.shape and not _within_one_step(stored, name, b):
            step = MAGNITUDE_STEP.get(a.dtype.name, 0.0)
            problems.append(
                Problem(path, f"magnitude drift beyond one {a.dtype.name} rounding step ({step:g})", f"golden/{name}")
            )
    if same_shapes:
        problems += _baseline_problems(path, stored, fresh, moved)
    return Recomputed(problems, moved)


def _baseline_problems(
    path: Path, stored: GoldenCase, fresh: GoldenCase, moved: list[tuple[str, str]]
) -> list[Problem]:
    """The baseline element by element within its rounding bound, its statistics within what that
    move allows; a move within both is appended to ``moved``."""
    try:
        found = drift.baseline_drift(stored, fresh)
    except KeyError as exc:  # a magnitude the bound needs is missing (reported above)
        return [Problem(path, f"baseline not comparable: magnitude {exc} missing", "baseline/out")]
    problems = []
    if not found.worst <= 1.0:
        problems.append(Problem(path, f"baseline drift beyond its rounding bound: {found.text()}", "baseline/out"))
    for side, golden in (("stored", stored), ("recomputed", fresh)):
        mismatch = drift.stats_mismatch(golden)
        if mismatch:
            message = f"{side} baseline statistics are not their baseline's: {', '.join(mismatch)}"
            problems.append(Problem(path, message, "baseline (attributes)"))
    stats = [] if problems and problems[-1].dataset == "baseline (attributes)" else found.stat_problems()
    if stats:
        message = f"baseline statistics drift beyond the baseline's move: {', '.join(stats)}"
        problems.append(Problem(path, message, "baseline (attributes)"))
    if not problems and found.moved:
        moved.append(("baseline moved within its bound", found.text()))
    return problems


def _within_one_step(stored: GoldenCase, name: str, fresh: np.ndarray) -> bool:
    """Every element of a recomputed magnitude within one rounding step (of the stored dtype) of the
    stored value, plus MAGNITUDE_FLOOR of the array's largest value; S and T, expanded sums that
    cancel, also within their float64 noise (:func:`mlaconf.golden.building.magnitudes.cancellation_noise`)."""
    kept = stored.magnitudes[name]
    if kept.dtype != fresh.dtype:
        return False
    spec, held = stored.spec, drift.held_rows(stored)
    step = MAGNITUDE_STEP.get(kept.dtype.name, 0.0)
    per_row = kept.size // max(held, 1)
    rows = max(COMPARE_CHUNK // max(per_row, 1), 1)
    a_all, b_all = kept.reshape(held, -1), fresh.reshape(held, -1)
    floor = MAGNITUDE_FLOOR * max(
        (float(np.max(np.abs(a_all[i : i + rows].astype(np.float64)), initial=0.0)) for i in range(0, held, rows)),
        default=0.0,
    )
    for start in range(0, held, rows):
        tokens = slice(start, start + rows)
        a, b = a_all[tokens].astype(np.float64), b_all[tokens].astype(np.float64)
        allowed = step * np.minimum(np.abs(a), np.abs(b)) + floor
        if name in CANCELLING_MAGNITUDES:
            noise = cancellation_noise(spec, stored.magnitudes, stored.out, tokens, stored.token_rows)[name]
            allowed = allowed + noise.reshape(a.shape)
        if not np.all(np.abs(a - b) <= allowed):
            return False
    return True


@dataclass(frozen=True)
class VerifyReport:
    checked: int
    problems: list[Problem]
    #: file -> what moved within its yardstick on recompute (a file with problems is not listed)
    moved: dict[Path, list[tuple[str, str]]] = field(default_factory=dict)

    def format(self) -> str:
        files = len({p.path for p in self.problems})
        lines = [f"PROBLEM {problem}" for problem in self.problems]
        for path, notes in self.moved.items():  # one line per file: what moved within which yardstick, by how much
            what, size = zip(*sorted(notes), strict=True)
            lines.append(f"ok ({'; '.join(what)}) {path}: {' | '.join(size)}")
        within = f" ({len(self.moved)} moved within their bounds)" if self.moved else ""
        lines.append(f"verify: {self.checked - files} ok{within}, {files} bad, {len(self.problems)} problems")
        return "\n".join(lines)


def verify(
    store: GoldenStore,
    specs: Sequence[CaseSpec] | None = None,
    *,
    recompute: bool = False,
    builder: BuilderRef = None,
    stream: TextIO | None = None,
) -> VerifyReport:
    """Check the selected cases' files (or every ``*.h5`` in the store): checksums, staleness, and
    with ``recompute`` each array against a fresh build by its own yardstick (:func:`compare_recomputed`)."""
    if specs is None:
        targets: list[tuple[Path, CaseSpec | None]] = [(path, None) for path in store.files()]
    else:
        targets = [(store.path_for(s), s) for s in specs if s.expect_error is None]
    build = resolve_builder(builder, cpu_count()) if recompute else None
    problems: list[Problem] = []
    moved: dict[Path, list[tuple[str, str]]] = {}
    progress = Progress(len(targets), "verify", stream)
    for path, spec in targets:
        found = _verify_one(store, path, spec, build)
        problems.extend(found.problems)
        if found.moved and not found.problems:
            moved[path] = found.moved
        progress.advance(f"{'FAIL' if found.problems else 'ok'} {path.name}")
    progress.close()
    return VerifyReport(len(targets), problems, moved)


def _verify_one(store: GoldenStore, path: Path, spec: CaseSpec | None, build: Builder | None) -> Recomputed:
    try:
        stored, meta = read_golden(path, spec)
        store.check_stale(meta, stored.spec)
    except GoldenStoreError as exc:
        return Recomputed([Problem(exc.path, f"{type(exc).__name__}: {exc.reason}", exc.dataset)], [])
    if path.name != f"{meta.attrs.get('case_id')}.h5":
        return Recomputed([Problem(path, f"file name does not match its case_id {meta.attrs.get('case_id')!r}")], [])
    if build is None:
        return Recomputed([], [])
    with inputs_from(store.root):  # a case with explicit inputs reads them from this store
        fresh = build(stored.spec)
    return compare_recomputed(path, stored, fresh)
