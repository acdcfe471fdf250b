"""``mlaconf run --ray``: the conformance run spread over a Ray cluster's devices, gathered into one run.

One shard per device slot: every NPU (Ray's ``NPU`` resource; Ray sets ``ASCEND_RT_VISIBLE_DEVICES``
for the task), else every GPU (``CUDA_VISIBLE_DEVICES``), else every CPU.  Shard K of N is a Ray task that
runs ``pytest --mla-shard K/N`` (the plugin's shard rule, the one ``regen --shard`` uses) in a subprocess
pinned to the task's device, into a report directory of its own, and returns its ``results.jsonl`` and
``run.json``.  The driver writes each shard under ``<run dir>/shards/`` and merges them with
:func:`mlaconf.reports.merge.merge_dirs` into the run directory, so the report is an unsharded run's:
the same records and counts.

A shard whose worker or node dies (or whose pytest dies by a signal or leaves no report) is run again
by Ray, up to ``retries`` times; a shard lost for good has its tests collected (a short Ray task) and
recorded as not run (an ``error`` record with a ``not_run`` failure, as the plugin records a test that
never ran), so no test is ever missing from the report, and the run is marked crashed and fails.
Ctrl-C cancels every shard, writes the shards that finished and marks the run interrupted.  Each
shard's files are written as the shard arrives (``<run dir>/shards/K-of-N/``) and its records
appended to the run's results.jsonl journal, so a driver killed outright keeps every shard that
arrived (run.json stays ``in_progress``).
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.resources
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from _pytest._io import TerminalWriter

from mlaconf.facts.cluster import node_resources
from mlaconf.facts.processes import INTERRUPTED, THREAD_ENV, kill_with_parent, process_alive
from mlaconf.golden.specs.suites import SUITES_PACKAGE
from mlaconf.golden.store.locations import chosen_root
from mlaconf.harness import registry
from mlaconf.reports import merge, safeio, summary
from mlaconf.reports.records import sort_records
from mlaconf.reports.rundir import (
    REPORTS_DIR,
    RESULTS_FILE,
    RUN_FILE,
    Journal,
    RunState,
    read_results,
    write_json,
    write_results,
)
from mlaconf.tools.command import pytest_command

#: Ray retries of a shard whose worker, node or pytest process died.
DEFAULT_RETRIES = 2
#: The pytest exit status of a session that collected no test (a shard can be empty).
NO_TESTS = 5
#: pytest's exit status for arguments or options it refuses: the same on every shard, never retried.
USAGE_ERROR = 4
OUTPUT_TAIL = 4000
SHARD, REPORT_DIR = "--mla-shard", "--mla-report-dir"
#: A shard's temp directory: ``mla-ray-shard-<worker pid>-<random>`` (so a dead worker's can be found).
SHARD_DIR_PREFIX = "mla-ray-shard-"
#: Outputs saved by the shards stay on their nodes (in a temp directory): refused rather than lost.
SAVE_OUTPUTS = ("--mla-save-outputs",)


@dataclass(frozen=True)
class Slots:
    """The kind of device a shard runs on and how many the cluster has."""

    kind: str  # "NPU", "GPU" or "CPU"
    count: int

    @classmethod
    def of(cls, nodes: Sequence[dict[str, float]]) -> Slots:
        for kind in ("NPU", "GPU", "CPU"):
            count = int(sum(n.get(kind, 0.0) for n in nodes))
            if count:
                return cls(kind, count)
        raise ValueError("the Ray cluster has no NPU, GPU or CPU")

    def options(self) -> dict[str, Any]:
        """The Ray resources of one shard: one device (and one CPU for its pytest process)."""
        if self.kind == "NPU":
            return {"num_cpus": 1, "resources": {"NPU": 1}}
        if self.kind == "GPU":
            return {"num_cpus": 1, "num_gpus": 1}
        return {"num_cpus": 1}


class ShardCrashed(Exception):
    """The shard's pytest died (signal) or left no report: Ray runs the shard again."""


@dataclass(frozen=True)
class ShardResult:
    shard: str
    returncode: int
    files: dict[str, bytes]
    host: str
    seconds: float
    output_tail: str


class Attempts:
    """Actor: every shard attempt registers here (host, pid), so the run says which shards were rerun."""

    def __init__(self) -> None:
        self.starts: dict[str, list[tuple[str, int]]] = {}

    def start(self, shard: str, host: str, pid: int) -> None:
        self.starts.setdefault(shard, []).append((host, pid))

    def get(self) -> dict[str, list[tuple[str, int]]]:
        return self.starts


def _pytest(plugin_args: Sequence[str], *extra: str, threads: int, cwd: Path) -> subprocess.CompletedProcess[str]:
    """pytest over this node's installed suites, BLAS/torch threads capped to the task's CPU share."""
    suites = str(importlib.resources.files(SUITES_PACKAGE))
    command = [sys.executable, "-m", "pytest", suites, *plugin_args, *extra]
    env = dict(os.environ) | {name: str(threads) for name in THREAD_ENV}
    return subprocess.run(
        command, env=env, cwd=cwd, capture_output=True, text=True, preexec_fn=kill_with_parent, check=False
    )


def remove_dead_shard_dirs() -> None:
    """Remove this node's shard directories whose worker died (a killed worker cannot clean up)."""
    for path in Path(tempfile.gettempdir()).glob(f"{SHARD_DIR_PREFIX}*-*"):
        pid = path.name.removeprefix(SHARD_DIR_PREFIX).split("-", 1)[0]
        if pid.isdigit() and not process_alive(int(pid)):
            shutil.rmtree(path, ignore_errors=True)


def run_shard(plugin_args: Sequence[str], shard: str, threads: int, attempts: Any) -> ShardResult:
    """Task: one shard's pytest run into a fresh report directory; its files come back."""
    import ray  # in a Ray worker: installed

    ray.get(attempts.start.remote(shard, socket.gethostname(), os.getpid()))  # waited for: it outlives a kill
    start = time.monotonic()
    remove_dead_shard_dirs()
    with tempfile.TemporaryDirectory(prefix=f"{SHARD_DIR_PREFIX}{os.getpid()}-") as tmp:
        report = Path(tmp) / "run"
        done = _pytest(plugin_args, SHARD, shard, REPORT_DIR, str(report), threads=threads, cwd=Path(tmp))
        tail = (done.stdout + done.stderr)[-OUTPUT_TAIL:]
        no_report = done.returncode not in (NO_TESTS, USAGE_ERROR) and not (report / RESULTS_FILE).exists()
        if done.returncode < 0 or no_report:
            raise ShardCrashed(f"shard {shard}: pytest exit status {done.returncode}, no report\n{tail}")
        files = {name: (report / name).read_bytes() for name in (RESULTS_FILE, RUN_FILE) if (report / name).exists()}
    return ShardResult(shard, done.returncode, files, socket.gethostname(), time.monotonic() - start, tail)


def collect_shard(plugin_args: Sequence[str], shard: str) -> list[str]:
    """Task: the node ids of a shard's tests (to record a lost shard's tests as not run)."""
    remove_dead_shard_dirs()
    with tempfile.TemporaryDirectory(prefix="mla-ray-collect-") as tmp:
        done = _pytest(plugin_args, SHARD, shard, "--collect-only", "-q", threads=1, cwd=Path(tmp))
    return [line.strip() for line in done.stdout.splitlines() if "::" in line and not line.startswith(" ")]


def not_run_records(nodeids: Sequence[str], shard: str, why: str) -> list[dict[str, Any]]:
    """A record per test of a lost shard, as the plugin records a test that never ran: in the
    report's counts, and the run fails."""
    from mlaconf.runner.ending import never_ran_record
    from mlaconf.runner.identity import BACKEND_LABELS, identity_from_nodeid

    labels = {name: BACKEND_LABELS.get(name, name) for name in registry.BUILTIN}
    lost = f"shard {shard} was lost on the Ray cluster ({why})"
    return [never_ran_record(identity_from_nodeid(nodeid, labels), lost).to_dict() for nodeid in nodeids]


def plugin_arguments(args: argparse.Namespace) -> list[str]:
    """``mlaconf run``'s pytest arguments after the suites' path, for a shard: no xdist (one device per
    shard), the store as an absolute path (the tasks run elsewhere), no report directory (each shard
    has its own)."""
    store = str(chosen_root(args.golden_dir or None))
    shard_args = argparse.Namespace(**vars(args))
    shard_args.jobs, shard_args.report_dir, shard_args.run_name = "0", None, None
    shard_args.golden_dir = str(Path(store).expanduser().resolve())
    command = pytest_command(shard_args)[4:]  # [python, -m, pytest, suites, ...]
    if command[:1] == ["-o"] and command[1].startswith("cache_dir="):  # the driver's directory: not on the nodes
        command[:2] = ["-p", "no:cacheprovider"]
    return command


def report_dir(args: argparse.Namespace) -> Path:
    if args.report_dir:
        return Path(args.report_dir)
    name = args.run_name or time.strftime("%Y%m%d-%H%M%S") + "-ray"
    return REPORTS_DIR / name


def run_on_ray(ray: Any, args: argparse.Namespace, *, retries: int = DEFAULT_RETRIES) -> int:
    """The run over the connected cluster; the exit status is pytest's (1 when a shard was lost)."""
    if any(a.split("=")[0] in SAVE_OUTPUTS for a in args.pytest_args):
        print("error: --ray does not gather saved outputs (--mla-save-outputs); run without --ray", file=sys.stderr)
        return 2
    slots = Slots.of(node_resources(ray))
    out = report_dir(args).resolve()
    if out.exists() and any(out.iterdir()):
        print(
            f"error: run directory {out} exists and is not empty; choose another --run-name/--report-dir",
            file=sys.stderr,
        )
        return 2
    try:  # claim the run directory: a killed driver leaves a run in progress, never a stale one
        safeio.safe_dir(out)
        claim = RunState.build("in_progress", selected=0, run=0, recorded=0).to_dict()
        write_json(out / RUN_FILE, {"schema_version": 2, "run_name": out.name, **claim})
        safeio.create_exclusive(out / RESULTS_FILE, "")
        journal = Journal(out / RESULTS_FILE)
    except (OSError, safeio.ReportFileError) as exc:
        print(f"error: cannot claim run directory {out}: {exc}", file=sys.stderr)
        return 2
    plugin_args = plugin_arguments(args)
    print("+ pytest SUITES " + " ".join(plugin_args) + f" {SHARD} K/N {REPORT_DIR} (per shard)", flush=True)
    attempts = ray.remote(num_cpus=0)(Attempts).remote()
    task = ray.remote(run_shard).options(**slots.options(), max_retries=retries, retry_exceptions=[ShardCrashed])
    shards = [f"{k}/{slots.count}" for k in range(1, slots.count + 1)]
    print(f"run --ray: {slots.count} shards, one per {slots.kind} slot -> {out}", file=sys.stderr, flush=True)
    pending = {task.remote(plugin_args, shard, 1, attempts): shard for shard in shards}
    results: dict[str, ShardResult] = {}
    lost: dict[str, str] = {}
    problems: list[str] = []
    interrupted = False
    try:
        while pending:
            ready, _ = ray.wait(list(pending), num_returns=1)
            shard = pending.pop(ready[0])
            try:
                result: ShardResult = ray.get(ready[0])
            except Exception as exc:  # retries exhausted
                lost[shard] = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
                print(f"shard {shard}: lost after {retries} retries: {lost[shard]}", file=sys.stderr, flush=True)
                continue
            if result.returncode == USAGE_ERROR:  # every shard would say the same: end the run as a plain one does
                return _usage_error(ray, pending, out, journal, result)
            results[shard] = result
            keep_shard(out, result, journal)
            print(
                f"shard {shard} on {result.host}: pytest exit {result.returncode} in {result.seconds:.1f}s "
                f"({len(results)}/{len(shards)} done)",
                file=sys.stderr,
                flush=True,
            )
    except KeyboardInterrupt:
        interrupted = True
        for ref in pending:
            with contextlib.suppress(Exception):
                ray.cancel(ref, force=True)
        problems.append(f"interrupted: shards {', '.join(sorted(pending.values()))} did not finish")
    journal.close()
    starts: dict[str, list[tuple[str, int]]] = {}
    with contextlib.suppress(Exception):
        starts = ray.get(attempts.get.remote(), timeout=10)
    for shard, why in lost.items():
        try:
            nodeids = ray.get(
                ray.remote(collect_shard).options(**slots.options(), max_retries=retries).remote(plugin_args, shard)
            )
        except Exception as exc:
            problems.append(f"shard {shard} lost ({why}) and its tests could not be listed: {exc}")
            continue
        results[shard] = ShardResult(
            shard, 1, {RESULTS_FILE: _jsonl(not_run_records(nodeids, shard, why))}, "", 0.0, ""
        )
        problems.append(f"shard {shard} lost ({why}): its {len(nodeids)} tests recorded as not run")
    return _gather(out, shards, results, starts, problems, interrupted, set(lost))


def _usage_error(ray: Any, pending: dict[Any, str], out: Path, journal: Journal, result: ShardResult) -> int:
    """pytest refused the run's arguments: the other shards cancelled, the run directory marked
    ``usage_error``, pytest's words said once, exit 4 (as ``mlaconf run`` without ``--ray``)."""
    for ref in pending:
        with contextlib.suppress(Exception):
            ray.cancel(ref, force=True)
    journal.close()
    state = RunState.build("usage_error", selected=0, run=0, recorded=0).to_dict()
    write_json(out / RUN_FILE, {"schema_version": 2, "run_name": out.name, **state})
    lines = [line for line in result.output_tail.splitlines() if line.strip()]
    said = next((line for line in reversed(lines) if "error" in line.lower()), lines[-1] if lines else "")
    print(f"run --ray: pytest refused the run's arguments (shard {result.shard}): {said.strip()}", file=sys.stderr)
    print(f"run --ray: usage_error -> {out}", file=sys.stderr)
    return USAGE_ERROR


def write_shard(out: Path, result: ShardResult) -> Path:
    """A shard's files under ``out/shards/K-of-N/``."""
    directory = safeio.safe_dir(out / "shards" / result.shard.replace("/", "-of-"))
    for name, data in result.files.items():
        safeio.atomic_write(directory / name, data.decode("utf-8"))
    return directory


def keep_shard(out: Path, result: ShardResult, journal: Journal) -> Path:
    """A shard's files, and its records in the run's journal, as it arrives (a killed driver keeps them)."""
    directory = write_shard(out, result)
    if RESULTS_FILE in result.files:
        for record in read_results(directory / RESULTS_FILE):
            journal.append(record)
    return directory


def _jsonl(records: Sequence[dict[str, Any]]) -> bytes:
    return "".join(json.dumps(r, sort_keys=True) + "\n" for r in records).encode()


def _gather(
    out: Path,
    shards: Sequence[str],
    results: dict[str, ShardResult],
    starts: dict[str, list[tuple[str, int]]],
    problems: list[str],
    interrupted: bool,
    lost: set[str],
) -> int:
    """Write every shard's files under ``out/shards`` and their merge into ``out``; the exit status."""
    dirs = []
    for shard, result in sorted(results.items(), key=lambda item: int(item[0].split("/")[0])):
        directory = write_shard(out, result)
        if RESULTS_FILE not in result.files:
            write_results(directory / RESULTS_FILE, [])
        if RUN_FILE not in result.files:  # a lost shard (its tests never ran), or one without MLA tests
            recorded = len(result.files.get(RESULTS_FILE, b"").splitlines())
            status = "crashed" if shard in lost else "complete"
            state = RunState.build(status, selected=recorded, run=0, recorded=recorded)
            write_json(directory / RUN_FILE, {"schema_version": 2, "shard": shard, **state.to_dict()})
        dirs.append(directory)
    merged = merge.merge_dirs(dirs, allow_incomplete=True)  # the merged status is the worst shard's
    run = merged.run
    if "status" not in run:  # a shard's run.json could not say whether it finished
        count = len(merged.records)
        run.update(RunState.build("crashed", selected=count, run=0, recorded=count).to_dict())
    if interrupted:
        run["status"] = "interrupted"
    run.update(
        {
            "run_name": out.name,
            "problems": [*(run.get("problems") or []), *problems],
            "ray": {
                "shards": len(shards),
                "attempts": {shard: [f"{h}:{p}" for h, p in starts.get(shard, [])] for shard in shards},
                "interrupted": interrupted,
            },
        }
    )
    merge.write_merged(merged, out)
    for line in [*merged.conflicts, *[w for w in merged.warnings if not interrupted], *problems]:
        print(f"run --ray: {line}", file=sys.stderr)
    for result in results.values():
        if result.returncode not in (0, 1, NO_TESTS):
            print(f"run --ray: shard {result.shard} ended with pytest exit {result.returncode}:\n{result.output_tail}")
    if merged.records:  # the tables a local run prints
        summary.write_terminal(_Terminal(), sort_records(merged.records), out)
    verdicts = run.get("verdicts", {})
    print(
        f"run --ray: {run['status']}, {len(merged.records)} records ("
        + ", ".join(f"{v} {k}" for k, v in verdicts.items() if v)
        + f") -> {out}"
    )
    code = _exit_status(results, problems, merged.conflicts, run["status"], interrupted)
    _Terminal().write_sep("=", summary.run_verdict(code == 0, out))  # the last word, as a local run's
    return code


def _exit_status(
    results: dict[str, ShardResult], problems: list[str], conflicts: list[str], status: str, interrupted: bool
) -> int:
    """pytest's exit status for the whole run: interrupted, a lost shard or conflict, failures, no tests."""
    if interrupted:
        return INTERRUPTED
    codes = [r.returncode for r in results.values()]
    if problems or conflicts or status != "complete" or any(c not in (0, 1, NO_TESTS) for c in codes):
        return max([1, *[c for c in codes if c not in (0, NO_TESTS)]])
    if all(c == NO_TESTS for c in codes):
        return NO_TESTS
    return 1 if 1 in codes else 0


class _Terminal:
    """The part of pytest's terminal reporter the run summary writes through, on stdout."""

    def __init__(self) -> None:
        self._tw = TerminalWriter(sys.stdout)
        self.isatty = sys.stdout.isatty()

    def ensure_newline(self) -> None:
        """Lines are whole here (the reporter's own progress output is what it guards against)."""

    def write(self, text: str, **markup: bool) -> None:
        self._tw.write(text, **markup)

    def write_sep(self, sep: str, title: str) -> None:
        self._tw.sep(sep, title)

    def write_line(self, line: str, **markup: bool) -> None:
        self._tw.line(line, **markup)
