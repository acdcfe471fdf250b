"""The verdict walk: how far one verdict's call path wanders through the house.

``python -m tests.verdict_walk [CASE_ID] [--backend NAME] [--from run_case|judge_resolved] [--list]``
judges one smoke case on a backend under :func:`sys.setprofile` and counts, over the calls made inside the
entry function (the entry included):

* **stops**: distinct first-party functions entered (a function is its code object: file and first line; a
  closure made again per call is one stop).  First-party means a module of one of the rooms
  (``mlaconf.ROOMS``) or ``mlaconf/`` itself; comprehensions and generator expressions are part of their
  function, not stops, and neither is code generated at run time (a dataclass's ``__init__``);
* **files**: distinct files among the stops;
* **climbs**: distinct (caller, callee) pairs where the caller's room lies *below* the callee's, i.e. the
  callee's room imports the caller's (directly or through other rooms) and not the other way round: the
  only way such a call happens is a callback (``golden/chunks.map_chunks`` calling a judge closure was one).
  The caller is the nearest first-party frame under the callee (stdlib frames such as ``functools`` or
  ``concurrent.futures`` in between are skipped: a function mapped with the builtin ``map`` or an
  executor's is called by the function that mapped it).  Which room imports which is read from the rooms' own
  imports (an AST scan, lazy imports included), so the house's order is the code's, not a list kept here;
* **jumps** (printed beside them): distinct (caller, callee) pairs in different files, the hops a reader
  makes between files.

The chunk pool is held to one thread while measuring, so that every callback runs under its caller's frame
(on a pool thread the caller would be the pool's worker loop) -- the walk does not depend on the cores.
From ``run_case`` the walk includes the backend's run (the runner's execution, the harness's backend) and the
record; from ``judge_resolved`` it is the judge alone.  tests/cover/test_verdict_walk.py holds the walk to its limits.
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import functools
import os
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from types import CodeType, FrameType
from typing import TYPE_CHECKING, Any

import mlaconf

if TYPE_CHECKING:
    from mlaconf.golden.specs.spec import CaseSpec
    from mlaconf.golden.specs.types import GoldenCase

REPO = Path(__file__).resolve().parents[1]
#: The smoke case measured by default (the suite's first): causal bf16, every rule of the default policy
#: applies (the error model over the golden's magnitudes, the systematic tests, msprobe's benchmark).
DEFAULT_CASE = "bf16-causal-krope_ctkv-b1-s129-h1-q3d-padded-0d4a17eb"
#: Code objects that are part of their function, not functions of their own.
INLINE_CODE = {"<listcomp>", "<dictcomp>", "<setcomp>", "<genexpr>", "<module>"}
ENTRIES = ("run_case", "judge_resolved")


def room_of(filename: str) -> str | None:
    """The room a first-party file belongs to (``mlaconf`` for the console-script package), else None."""
    try:
        parts = Path(filename).resolve().relative_to(REPO).parts
    except ValueError:
        return None
    if len(parts) < 2 or not parts[-1].endswith(".py"):
        return None
    return parts[0] if parts[0] in (*mlaconf.ROOMS, "mlaconf") else None


@functools.cache
def imports_between_rooms() -> dict[str, set[str]]:
    """room -> the rooms its modules import (any depth of the module, lazy imports included)."""
    graph: dict[str, set[str]] = {}
    for room in (*mlaconf.ROOMS, "mlaconf"):
        found: set[str] = set()
        for path in (REPO / room).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
                names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
                if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                    names = [node.module]
                for name in names:
                    parts = name.split(".")
                    if parts[0] == "mlaconf" and len(parts) > 1 and parts[1] in mlaconf.ROOMS:
                        found.add(parts[1])
        graph[room] = found - {room}
    return graph


@functools.cache
def reaches(room: str, other: str) -> bool:
    """Whether ``room`` imports ``other``, directly or through other rooms."""
    graph = imports_between_rooms()
    seen, todo = set(), list(graph.get(room, ()))
    while todo:
        current = todo.pop()
        if current == other:
            return True
        if current not in seen:
            seen.add(current)
            todo += graph.get(current, ())
    return False


def is_climb(caller_room: str, callee_room: str) -> bool:
    """A call up the house: the callee's room stands on the caller's (imports it), not the other way round."""
    return caller_room != callee_room and reaches(callee_room, caller_room) and not reaches(caller_room, callee_room)


@dataclass
class Walk:
    """What one traced call of the entry function entered."""

    stops: dict[CodeType, str] = field(default_factory=dict)  # code -> "file:line name", in order of entry
    climbs: set[tuple[str, str]] = field(default_factory=set)
    jumps: set[tuple[str, str]] = field(default_factory=set)  # (caller, callee) in different files

    @property
    def files(self) -> set[str]:
        return {where.split(":")[0] for where in self.stops.values()}

    def summary(self) -> str:
        return (
            f"{len(self.stops)} stops in {len(self.files)} files with {len(self.climbs)} climbs"
            f" ({len(self.jumps)} jumps between files)"
        )


def _name(code: CodeType) -> str:
    return f"{Path(code.co_filename).resolve().relative_to(REPO)}:{code.co_firstlineno} {code.co_qualname}"


def _first_party(frame: FrameType | None) -> FrameType | None:
    while frame is not None and (frame.f_code.co_name in INLINE_CODE or room_of(frame.f_code.co_filename) is None):
        frame = frame.f_back
    return frame


def trace(entry: Callable[..., Any], *args: Any, **kwargs: Any) -> tuple[Any, Walk]:
    """Call ``entry`` under a profiler; its result and the walk below it (the calling thread's: hold the chunk
    pool to one thread, :func:`one_thread`)."""
    walk = Walk()
    rooms: dict[str, str | None] = {}

    def room(code: CodeType) -> str | None:
        if code.co_filename not in rooms:
            rooms[code.co_filename] = room_of(code.co_filename)
        return rooms[code.co_filename]

    def profile(frame: FrameType, event: str, arg: object) -> None:
        code = frame.f_code
        if event != "call" or code.co_name in INLINE_CODE or (callee_room := room(code)) is None:
            return
        walk.stops.setdefault(code, _name(code))
        caller = _first_party(frame.f_back)
        if caller is None:
            return
        caller_room = room(caller.f_code)
        if caller.f_code.co_filename != code.co_filename:
            walk.jumps.add((_name(caller.f_code), _name(code)))
        if caller_room is not None and is_climb(caller_room, callee_room):
            walk.climbs.add((_name(caller.f_code), _name(code)))

    previous = sys.getprofile()
    sys.setprofile(profile)
    try:
        result = entry(*args, **kwargs)
    finally:
        sys.setprofile(previous)
    return result, walk


@contextlib.contextmanager
def one_thread() -> Iterator[None]:
    """The process's thread budget held to one thread (every chunk map inline, under its caller's frame)."""
    before = os.environ.get("OMP_NUM_THREADS")
    os.environ["OMP_NUM_THREADS"] = "1"
    try:
        yield
    finally:
        if before is None:
            del os.environ["OMP_NUM_THREADS"]
        else:
            os.environ["OMP_NUM_THREADS"] = before


def smoke_case(case_id: str = DEFAULT_CASE) -> CaseSpec:
    """A case of the shipped smoke suite by its id."""
    from mlaconf.golden.specs.suites import load_suites

    specs = {spec.case_id: spec for spec in load_suites(["smoke"])}
    if case_id not in specs:
        raise SystemExit(f"verdict_walk: {case_id!r} is not a smoke case")
    return specs[case_id]


def measure(golden: GoldenCase, backend_name: str = "torch-cpu", entry: str = "run_case") -> Walk:
    """The walk of one verdict of ``golden`` on a backend under the default policy, from ``run_case`` or from
    ``judge_resolved``.

    The case is judged once untraced first, so that what a session does once (a policy file read, a kernel
    loaded, a cache filled) is not counted: the walk is the path every further verdict takes."""
    from mlaconf.harness import registry
    from mlaconf.judge.deviations import load_deviations
    from mlaconf.judge.policy import load_policies
    from mlaconf.judge.verdict import judge_resolved
    from mlaconf.runner.conformance import run_case

    backend = registry.create(backend_name)
    policy_set, deviations = load_policies(), load_deviations()
    with one_thread():
        first = run_case(golden, backend, policy_set=policy_set, policy="default", deviations=deviations)
        if entry == "run_case":
            _, walk = trace(run_case, golden, backend, policy_set=policy_set, policy="default", deviations=deviations)
            return walk
        if first.output is None:
            raise SystemExit(f"verdict_walk: {backend_name} gave no output on {golden.spec.case_id}: {first.message}")
        spec = golden.spec
        resolved = policy_set.resolve("default", backend.name, spec.dtype, spec.mask_name, spec.case_id)
        _, walk = trace(judge_resolved, golden, first.output, resolved)
        return walk


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.verdict_walk", description=__doc__.split("\n\n")[0])
    parser.add_argument("case", nargs="?", default=DEFAULT_CASE, help=f"a smoke case id (default {DEFAULT_CASE})")
    parser.add_argument("--backend", default="torch-cpu", help="a backend name or pkg.module:factory")
    parser.add_argument("--from", dest="entry", choices=ENTRIES, action="append", help="entry (default both)")
    parser.add_argument("--list", action="store_true", help="name every stop and climb")
    parser.epilog = "The golden comes from the store ($MLA_GOLDEN_DIR or ./.golden), built there when missing."
    args = parser.parse_args(argv)
    from mlaconf.golden.building.generate import build_golden
    from mlaconf.golden.store.directory import GoldenStore

    golden = GoldenStore(builder=build_golden).ensure(smoke_case(args.case))
    for entry in args.entry or ENTRIES:
        walk = measure(golden, args.backend, entry)
        print(f"from {entry}: {walk.summary()}")
        if args.list:
            for where in walk.stops.values():
                print(f"  stop  {where}")
            for caller, callee in sorted(walk.climbs):
                print(f"  climb {caller} -> {callee}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
