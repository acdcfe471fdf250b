"""The golden verbs' command lines (``regen``, ``verify``, ``show``, ``list``, ``store``), light to import:
``mlaconf --help`` and a usage error build every verb's parser, so this module loads neither numpy nor h5py;
each verb's work is imported from :mod:`mlaconf.golden.maintain` when it runs (docs/architecture.md, "A CLI that
starts at once")."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from mlaconf.facts.cluster import LOCAL
from mlaconf.facts.shard import parse_shard


def shard_argument(text: str) -> tuple[int, int]:
    """``--shard K/N`` for argparse: the reason in the usage error, not 'invalid value'."""
    try:
        return parse_shard(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from exc


def _common(parser: argparse.ArgumentParser, *, selects: bool = True) -> None:
    parser.add_argument(
        "--out",
        "--golden-dir",
        dest="out",
        type=Path,
        default=None,
        metavar="DIR",
        help="golden store directory (default: $MLA_GOLDEN_DIR, else .golden in the working directory)",
    )
    if selects:
        parser.add_argument("suites", nargs="*", metavar="SUITE", help="suite names or 'all'")
        parser.add_argument("--cases", action="append", default=[], metavar="FILE", help="a TOML suite file")
        parser.add_argument(
            "--shard",
            type=shard_argument,
            default=None,
            metavar="K/N",
            help="only cases with int(content_hash) %% N == K-1 (split across hosts)",
        )
    parser.add_argument("--builder", default=None, help=argparse.SUPPRESS)


def _oversize_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--allow-oversize",
        action="store_true",
        help="build cases whose estimated peak memory exceeds this host's memory or whose file exceeds "
        "the store's free disk (refused otherwise, before any work)",
    )


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "regen",
        help="generate missing, stale or corrupt golden files",
        description="Generate golden files; only missing, stale or corrupt ones "
        "unless --force.  Safe to run in several processes or hosts at once.",
    )
    _common(p)
    p.add_argument("--jobs", "-j", type=int, default=1, metavar="N", help="worker processes (default 1)")
    p.add_argument("--force", action="store_true", help="rebuild even valid files")
    _oversize_flag(p)
    p.add_argument(
        "--ray",
        nargs="?",
        const=LOCAL,
        default=None,
        metavar="ADDRESS",
        help="run every case as a task on a Ray cluster (auto, HOST:PORT, ray://HOST:10001; none: "
        "$RAY_ADDRESS or a local cluster); needs the 'ray' extra; see docs/cluster.md",
    )
    p.add_argument(
        "--ray-store",
        choices=("shared", "driver"),
        default="shared",
        help="with --ray: tasks write into the store (shared: a filesystem every node mounts at the same "
        "path, with atomic rename and locks), or return the golden for this process to write (driver)",
    )
    p.set_defaults(func="mlaconf.golden.maintain:cmd_regen")

    p = subparsers.add_parser(
        "verify",
        help="check golden checksums (and recompute the reference)",
        description="Verify golden files of the selected cases, or every file in the "
        "store when no case is selected.  Exit 1 on any problem.",
    )
    _common(p)
    p.add_argument(
        "--recompute",
        action="store_true",
        help="rebuild and compare: inputs bit-exact, golden/out within its documented agreement of |g|+A, "
        "magnitudes within one rounding step, the baseline and its statistics within the baseline's rounding "
        "bound (a move within it is reported as ok; docs/golden-files.md)",
    )
    p.set_defaults(func="mlaconf.golden.maintain:cmd_verify")

    p = subparsers.add_parser(
        "show",
        help="describe one golden file",
        description="Describe one golden file: its spec, every dataset's dtype, shape "
        "and value range, the emulated baseline's error against the golden, and "
        "where and how it was built.  Exit 1 if the file is corrupt.",
    )
    _common(p, selects=False)
    p.add_argument("case", metavar="CASE", help="case id, case id prefix, or content hash prefix")
    p.set_defaults(func="mlaconf.golden.maintain:cmd_show")

    p = subparsers.add_parser(
        "list",
        help="list cases, their cost and whether a valid golden exists",
        description="One line per case: output and kv shapes, useful FLOPs, bytes on "
        "disk (the file's, else '~' an estimate), estimated peak memory of generating "
        "it with --jobs 1, and the golden's state; then the totals.",
    )
    _common(p)
    p.add_argument(
        "--jobs", "-j", type=int, default=1, metavar="N", help="judge the fit for regen with N jobs (default 1)"
    )
    p.set_defaults(func="mlaconf.golden.maintain:cmd_list")

    p = subparsers.add_parser(
        "store",
        help="size of the store per suite; prune files no suite references",
        description="Show the store's size per shipped suite (and --cases files) and the "
        "files no suite references (other seeds, removed or edited cases, leftover "
        "temp files).  --prune lists what it would delete; add --yes to delete.",
    )
    _common(p, selects=False)
    p.add_argument(
        "--cases",
        action="append",
        default=[],
        metavar="FILE",
        help="a TOML suite file whose cases count as referenced too",
    )
    p.add_argument("--prune", action="store_true", help="list unreferenced files for deletion (dry run)")
    p.add_argument("--yes", action="store_true", help="with --prune: really delete them")
    p.set_defaults(func="mlaconf.golden.maintain:cmd_store")
