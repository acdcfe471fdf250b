"""The command lines of ``mlaconf shrink`` and ``mlaconf repro``, light to import (no torch): every help and usage
error builds them; the work is :mod:`mlaconf.tools.repro`'s, imported when the verb runs."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

#: Default wall-clock budget of ``shrink``, in seconds.
DEFAULT_BUDGET_S = 300.0


def _common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "test_id", metavar="TEST_ID", help="a conformance test id (…test_conformance[CASE-BACKEND]) or CASE id"
    )
    parser.add_argument("--backend", default=None, help="the backend (default: the one the test id ends with)")
    parser.add_argument("--cases", type=Path, default=None, metavar="FILE", help="the suite file holding the case")
    parser.add_argument("--policy", default="default", help="tolerance policy (default: default)")


def register(subparsers: Any) -> None:
    shrink_parser = subparsers.add_parser(
        "shrink",
        help="the smallest spec still failing by the same check",
        description="Search for the smallest spec (batch, lengths, heads, prefix, layout, distribution) that still "
        "fails by the same deciding check on the same backend, goldens built on the fly; print its TOML and the "
        "size reduction. Ctrl-C or the time budget keeps the best so far.",
    )
    _common(shrink_parser)
    shrink_parser.add_argument("--budget", type=float, default=DEFAULT_BUDGET_S, metavar="SECONDS", help="time budget")
    shrink_parser.add_argument(
        "--repeat", type=int, default=1, metavar="N", help="a candidate must fail N times (nondeterministic backends)"
    )
    shrink_parser.set_defaults(func="mlaconf.tools.repro:run_shrink")
    repro_parser = subparsers.add_parser(
        "repro",
        help="a directory that reruns one case without mlaconf",
        description="Write a directory a kernel engineer can run without mlaconf: the inputs and golden (case.npz), "
        "the call's arguments, the verdict with its likely cause, the environment, a standalone program and a README.",
    )
    _common(repro_parser)
    repro_parser.add_argument("--out", type=Path, required=True, metavar="DIR", help="the directory to write")
    repro_parser.set_defaults(func="mlaconf.tools.repro:run_repro")
