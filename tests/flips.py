"""Fault injection: random one-byte flips in real golden files, each judged in a subprocess.

Every flip XORs one byte (a random non-zero mask) of a copy of a pristine golden file, then a worker
process loads the damaged file through the store and, when the damage is detected, lets
``GoldenStore.ensure_result`` rebuild it (the builder hands back the pristine case, so the store's own
detect-rebuild-reload path is what is measured, not the reference computation).  Outcomes:

- ``detected``: ``GoldenCorruptError`` naming the file, the rebuild wrote a file that loads and equals the
  pristine case (``rebuilt``) -- the only good outcome;
- ``accepted``: the damaged file loaded (a silent acceptance);
- ``store-other``: another ``GoldenStoreError`` subclass;  ``exception``: any other exception;
- ``crash``: the worker died (a signal or exit status), ``hang``: no answer within ``--timeout`` seconds.

Workers run many flips each; a crash or hang is charged to the flip in progress and a fresh worker
continues with the next one, so one segfault is counted, not fatal.  Regions: the integrity header
(user block), the HDF5 metadata (every byte that is neither header nor raw data) and the raw data of
the datasets.

    python -m tests.flips --store DIR [--suite smoke] [--flips 5000] [--seed 1] [--budget SECONDS]

builds the suite's goldens into DIR if needed and prints one summary line per region and in total.
"""

from __future__ import annotations

import argparse
import collections
import json
import logging
import os
import random
import select
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import h5py

REPO = Path(__file__).resolve().parents[1]
REGIONS = {"header": 0.1, "metadata": 0.45, "data": 0.45}
BAD = ("accepted", "store-other", "exception", "crash", "hang")


@dataclass(frozen=True)
class Flip:
    index: int
    file: str  # name of the pristine file in the store
    region: str
    offset: int
    mask: int


def regions(path: Path) -> dict[str, list[tuple[int, int]]]:
    """Byte ranges [start, end) of each region of a sealed golden file."""
    size = path.stat().st_size
    with h5py.File(path, "r", locking=False) as f:
        header = int(f.userblock_size)
        data: list[tuple[int, int]] = []
        f.visititems(
            lambda _name, obj: (
                data.append((obj.id.get_offset(), obj.id.get_offset() + obj.id.get_storage_size()))
                if isinstance(obj, h5py.Dataset) and obj.id.get_storage_size()
                else None
            )
        )
    data.sort()
    metadata, cursor = [], header
    for start, end in data:
        if start > cursor:
            metadata.append((cursor, start))
        cursor = max(cursor, end)
    if cursor < size:
        metadata.append((cursor, size))
    return {"header": [(0, header)], "metadata": metadata, "data": data}


def _pick(spans: list[tuple[int, int]], rng: random.Random) -> int:
    """A uniformly random offset in the union of ``spans``."""
    total = sum(end - start for start, end in spans)
    point = rng.randrange(total)
    for start, end in spans:
        if point < end - start:
            return start + point
        point -= end - start
    raise AssertionError("unreachable: point beyond the spans")


def plan(store: Path, count: int, seed: int) -> list[Flip]:
    rng = random.Random(seed)
    files = sorted(store.glob("*.h5"))
    layout = {path.name: regions(path) for path in files}
    names, weights = list(REGIONS), list(REGIONS.values())
    flips = []
    for index in range(count):
        name = rng.choice(files).name
        region = rng.choices(names, weights)[0]
        flips.append(Flip(index, name, region, _pick(layout[name][region], rng), rng.randrange(1, 256)))
    return flips


# -- worker ----------------------------------------------------------------------------------------


def _damage(pristine: Path, target: Path, flip: Flip) -> None:
    """A fresh file (new inode) holding the pristine bytes with one byte flipped."""
    data = bytearray(pristine.read_bytes())
    data[flip.offset] ^= flip.mask
    tmp = target.with_name(target.name + ".flip")
    tmp.write_bytes(data)
    os.replace(tmp, target)


def worker(pristine_dir: Path, work_dir: Path, suite: str, tasks: Path, start: int) -> None:
    """Judge the flips of ``tasks`` (JSON lines) from index ``start``; one JSON line per flip on stdout."""
    import numpy as np

    from mlaconf.golden.specs.suites import load_suites

    logging.disable(logging.WARNING)  # the store logs every rebuild; the answers say it all
    from mlaconf.golden.store.directory import GoldenStore
    from mlaconf.golden.store.integrity import GoldenCorruptError, GoldenStoreError

    specs = {spec.case_id: spec for spec in load_suites([suite])}
    pristine_store, store = GoldenStore(pristine_dir), GoldenStore(work_dir)
    cache = {}
    for line in tasks.read_text().splitlines()[start:]:
        flip = Flip(**json.loads(line))
        spec = specs[flip.file.removesuffix(".h5")]
        if spec.case_id not in cache:
            cache[spec.case_id] = pristine_store.load(spec)
        pristine = cache[spec.case_id]
        path = store.path_for(spec)
        _damage(pristine_dir / flip.file, path, flip)
        rebuilt, detail = False, ""
        try:
            store.load(spec)
            outcome = "accepted"
        except GoldenCorruptError as exc:
            outcome, detail = ("detected" if str(path) in str(exc) else "store-other"), str(exc)
        except GoldenStoreError as exc:
            outcome, detail = "store-other", f"{type(exc).__name__}: {exc}"
        except Exception as exc:
            outcome, detail = "exception", f"{type(exc).__name__}: {exc}"
        if outcome == "detected":
            try:
                result = store.ensure_result(spec, lambda _spec, case=pristine: case)
                rebuilt = result.action == "generated" and np.array_equal(store.load(spec).out, pristine.out)
            except Exception as exc:
                detail = f"rebuild failed: {type(exc).__name__}: {exc}"
        print(
            json.dumps({"index": flip.index, "outcome": outcome, "rebuilt": rebuilt, "detail": detail[:300]}),
            flush=True,
        )


# -- driver ----------------------------------------------------------------------------------------


@dataclass
class Tally:
    outcomes: collections.Counter[tuple[str, str]] = field(default_factory=collections.Counter)
    not_rebuilt: int = 0
    done: int = 0
    examples: list[str] = field(default_factory=list)
    seconds: float = 0.0

    def bad(self) -> int:
        return sum(n for (_, outcome), n in self.outcomes.items() if outcome in BAD) + self.not_rebuilt

    def lines(self) -> list[str]:
        out = []
        for region in [*REGIONS, "total"]:
            counts: collections.Counter[str] = collections.Counter()
            for (where, outcome), n in self.outcomes.items():
                if region in (where, "total"):
                    counts[outcome] += n
            parts = " ".join(f"{name} {counts[name]}" for name in ("detected", *BAD))
            out.append(f"{region:8s} flips {sum(counts.values()):5d}  {parts}")
        out.append(f"detected but not rebuilt {self.not_rebuilt}; {self.done} flips in {self.seconds:.0f}s")
        return out

    def record(self, flip: Flip, outcome: str, detail: str) -> None:
        self.outcomes[(flip.region, outcome)] += 1
        if outcome in BAD and len(self.examples) < 20:
            self.examples.append(f"{outcome}: {flip} {detail}")


def _start(pristine: Path, work: Path, suite: str, tasks: Path, start: int) -> subprocess.Popen[bytes]:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]))
    command = [
        sys.executable,
        "-m",
        "tests.flips",
        "--worker",
        "--store",
        str(pristine),
        "--work",
        str(work),
        "--suite",
        suite,
        "--tasks",
        str(tasks),
        "--start",
        str(start),
    ]
    return subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, env=env, cwd=REPO)


def _answers(proc: subprocess.Popen[bytes], timeout: float) -> Iterator[str | None]:
    """Lines from the worker (read unbuffered); None when none arrives within ``timeout`` seconds."""
    assert proc.stdout is not None
    fd, pending = proc.stdout.fileno(), b""
    while True:
        while b"\n" not in pending:
            if not select.select([fd], [], [], timeout)[0]:
                yield None
                return
            chunk = os.read(fd, 1 << 16)
            if not chunk:
                return
            pending += chunk
        line, pending = pending.split(b"\n", 1)
        yield line.decode()


def run(
    pristine: Path, work: Path, suite: str, flips: Sequence[Flip], *, timeout: float = 30.0, budget: float | None = None
) -> Tally:
    """Judge ``flips`` in worker subprocesses; stops early (``done`` < len) when ``budget`` runs out."""
    work.mkdir(parents=True, exist_ok=True)
    tasks = work / "flips.jsonl"
    tasks.write_text("".join(json.dumps(asdict(f)) + "\n" for f in flips))
    tally = Tally()
    start = time.monotonic()
    position = 0

    def out_of_time() -> bool:
        return budget is not None and time.monotonic() - start > budget

    while position < len(flips) and not out_of_time():
        proc = _start(pristine, work, suite, tasks, position)
        for answer in _answers(proc, timeout):
            if answer is None:
                tally.record(flips[position], "hang", f"no answer in {timeout:g}s")
                position += 1
                break
            record = json.loads(answer)
            tally.record(flips[position], record["outcome"], record["detail"])
            tally.not_rebuilt += record["outcome"] == "detected" and not record["rebuilt"]
            position += 1
            if out_of_time():
                break
        else:
            rc = proc.wait()
            if position < len(flips):  # the worker died on this flip
                tally.record(flips[position], "crash", f"exit status {rc}")
                position += 1
        proc.kill()
        proc.wait()
    tally.done, tally.seconds = position, time.monotonic() - start
    return tally


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tests.flips", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--store", type=Path, required=True, help="pristine goldens (built when missing)")
    parser.add_argument("--work", type=Path, default=None, help="scratch store (default: STORE-flips)")
    parser.add_argument("--suite", default="smoke")
    parser.add_argument("--flips", type=int, default=5000)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--timeout", type=float, default=30.0, help="seconds without an answer = a hang")
    parser.add_argument("--budget", type=float, default=None, help="stop after this many seconds")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--tasks", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--start", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    work = args.work or args.store.with_name(args.store.name + "-flips")
    if args.worker:
        worker(args.store, work, args.suite, args.tasks, args.start)
        return 0
    from mlaconf.golden.building.regen import regen
    from mlaconf.golden.specs.suites import load_suites
    from mlaconf.golden.store.directory import GoldenStore

    summary = regen(load_suites([args.suite]), GoldenStore(args.store))
    if summary.count("failed"):
        print(summary.format(), file=sys.stderr)
        return 2
    tally = run(
        args.store, work, args.suite, plan(args.store, args.flips, args.seed), timeout=args.timeout, budget=args.budget
    )
    print("\n".join(tally.lines()))
    for example in tally.examples:
        print(f"  {example}")
    return 1 if tally.bad() else 0


if __name__ == "__main__":
    sys.exit(main())
