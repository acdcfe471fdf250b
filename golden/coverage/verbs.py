"""``mlaconf coverage``'s command line, light to import (argparse only): the work is
:mod:`mlaconf.golden.coverage.report`'s, imported when the verb runs."""

from __future__ import annotations

from typing import Any

#: Uncovered tuples printed per strength unless --show says otherwise.
DEFAULT_SHOW = 10


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "coverage",
        help="t-way coverage of the factor model by suites, and what no case covers",
        description="For each selection (a suite or a --cases file), the share of the factor model's valid "
        "tuples of levels (facts/factors.toml) some case holds, for t = 1 .. --t, and the kernel-structure "
        "triples; then the uncovered tuples in words ('no case with group 6 and mask causal').",
    )
    p.add_argument("suites", nargs="*", metavar="SUITE", help="suite names or 'all' (default: smoke)")
    p.add_argument("--cases", action="append", default=[], metavar="FILE", help="a TOML suite file")
    p.add_argument("--t", type=int, default=3, choices=(1, 2, 3), help="highest strength t (default 3)")
    p.add_argument(
        "--show",
        type=int,
        default=DEFAULT_SHOW,
        metavar="N",
        help=f"uncovered tuples per t (default {DEFAULT_SHOW}; 0: all)",
    )
    p.add_argument("--json", action="store_true", help="machine-readable output on stdout")
    p.set_defaults(func="mlaconf.golden.coverage.report:cmd_coverage")
