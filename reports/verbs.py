"""``mlaconf report diff | merge | html``'s command lines, light to import: the work is
:mod:`mlaconf.reports.report_dirs`'s, imported when the verb runs."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from mlaconf.reports import latency
from mlaconf.reports.rundir import RESULTS_FILE

ALLOW_INCOMPLETE_HELP = (
    "use runs that are in progress, interrupted, crashed, from before run statuses, or whose counts "
    "disagree with results.jsonl (refused by default: exit 2)"
)


def _existing_dir(text: str) -> Path:
    """A directory holding a results.jsonl; whether that is a regular file the reader says, in one line."""
    path = Path(text)
    results = path / RESULTS_FILE
    if not (results.exists() or results.is_symlink()):
        raise argparse.ArgumentTypeError(f"{path} has no {RESULTS_FILE}")
    return path


def _share(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0.0 <= value <= 1.0:  # NaN fails too
        raise argparse.ArgumentTypeError(f"{text!r} is not a share between 0 and 1")
    return value


def register(subparsers: Any) -> None:
    report = subparsers.add_parser(
        "report",
        help="diff, merge or render conformance report directories",
        description="Work on report directories (results.jsonl + run.json) after or between runs: compare "
        "two runs as an upgrade gate, join sharded runs, or render a run's report.html again.",
    )
    verbs = report.add_subparsers(dest="report_verb", required=True, metavar="SUBVERB")

    p = verbs.add_parser(
        "diff",
        help="compare two runs (exit 1 when a case regressed)",
        description="Compare a candidate run with a baseline case by case: identical, changed within "
        "tolerance, regressed, fixed, added or missing, plus latency changes.  Prints one line per "
        "changed case (full lines unless on a terminal) and writes diff.md, diff.html (with a slack "
        "before/after chart) and diff.json.  Exit 1 when the gate fails (docs/reports.md, 'The gate'): a "
        "case regressed, is missing or ran on neither side, too little was compared, both sides are one run, "
        "or the candidate has problems or ran fewer tests than it selected; exit 2 when a run is not "
        "complete (see --allow-incomplete) or malformed.",
    )
    p.add_argument("base", type=_existing_dir, help="baseline report directory")
    p.add_argument("cand", type=_existing_dir, help="candidate report directory")
    p.add_argument("--out", type=Path, default=None, help="output directory (default CAND/diff/)")
    p.add_argument(
        "--slack-threshold",
        type=float,
        default=1.5,
        help="a passing case regresses when its worst slack grows beyond this factor and exceeds 0.5 (default 1.5)",
    )
    p.add_argument(
        "--latency-threshold",
        type=float,
        default=1.2,
        help="latency ratio cand/base (fastest calls and median, each call over the host calibration timed "
        "before it) listed as a perf regression when significant "
        f"(one-sided Mann-Whitney U, Holm-corrected at {latency.ALPHA:g}, at least {latency.MIN_REPEATS} timed calls "
        "per side; default 1.2)",
    )
    p.add_argument("--fail-on-perf", action="store_true", help="perf regressions also fail the exit status")
    p.add_argument(
        "--allow-missing",
        action="store_true",
        help="cases missing from the candidate, or skipped there, do not fail the exit status",
    )
    p.add_argument(
        "--skips-expected",
        action="store_true",
        help="pairs skipped or not run on both sides do not fail the gate (the verdict says how many)",
    )
    p.add_argument(
        "--min-compared",
        type=_share,
        default=None,
        metavar="SHARE",
        help="fail unless at least this share (0-1) of the baseline's records were compared with both sides "
        "run, whatever the flags above excuse (default: every pair compared or excused); none compared "
        "always fails",
    )
    p.add_argument(
        "--base-backend",
        default=None,
        metavar="NAME",
        help="compare only this backend's records of BASE (with --cand-backend: two backends case by "
        "case, e.g. --base-backend atb --cand-backend torch-cuda; BASE and CAND may be the same run)",
    )
    p.add_argument("--cand-backend", default=None, metavar="NAME", help="compare only this backend's records of CAND")
    p.add_argument("--allow-incomplete", action="store_true", help=ALLOW_INCOMPLETE_HELP)
    p.set_defaults(func="mlaconf.reports.report_dirs:run_diff")

    p = verbs.add_parser(
        "merge",
        help="combine --mla-shard K/N report directories into one run",
        description="Join the report directories of a run split with --mla-shard K/N into one, equal to "
        "an unsharded run.  Exit 1 when two shards disagree about a record.",
    )
    p.add_argument("out", type=Path, help="merged report directory (created)")
    p.add_argument("dirs", type=_existing_dir, nargs="+", help="shard report directories")
    p.add_argument(
        "--allow-partial",
        action="store_true",
        help="merge even when shards of the K/N set are missing or repeated (exit 0)",
    )
    p.add_argument("--allow-incomplete", action="store_true", help=ALLOW_INCOMPLETE_HELP)
    p.set_defaults(func="mlaconf.reports.report_dirs:run_merge")

    p = verbs.add_parser(
        "html",
        help="(re)render report.html from results.jsonl and run.json",
        description="Write DIR/report.html again from DIR/results.jsonl and DIR/run.json, e.g. after a "
        "merge or with a newer version of the report.",
    )
    p.add_argument("dir", type=_existing_dir, help="report directory")
    p.add_argument("--allow-incomplete", action="store_true", help=ALLOW_INCOMPLETE_HELP)
    p.set_defaults(func="mlaconf.reports.report_dirs:run_html")
