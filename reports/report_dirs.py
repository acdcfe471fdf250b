"""``mlaconf report {diff,merge,html}``: work on report directories after (or between) runs."""

from __future__ import annotations

import argparse
import shutil
import sys
from typing import Any

from mlaconf.reports import diff, diff_render, html, merge, safeio
from mlaconf.reports.records import sort_records
from mlaconf.reports.rundir import IncompleteRun, load_run_dir


def one_line(message: str) -> str:
    """``message`` with every non-printable character escaped: a field name or value quoted from a
    damaged file (a newline, a carriage return, U+2028) must not break the error into several lines."""
    return "".join(c if c.isprintable() else c.encode("unicode_escape").decode("ascii") for c in message)


def _guarded(func: Any) -> Any:
    """Bad input (a malformed results.jsonl or run.json, an unreadable file) is one line on
    stderr and exit status 2, never a traceback."""

    def run(args: argparse.Namespace) -> int:
        try:
            return int(func(args))
        except IncompleteRun as exc:
            print(
                f"mlaconf report {args.report_verb}: error: {one_line(str(exc))}; --allow-incomplete to use it",
                file=sys.stderr,
            )
            return 2
        except (ValueError, OSError) as exc:
            print(f"mlaconf report {args.report_verb}: error: {one_line(str(exc))}", file=sys.stderr)
            return 2

    run.__name__ = func.__name__
    return run


@_guarded
def run_diff(args: argparse.Namespace) -> int:
    result = diff.diff_dirs(
        args.base,
        args.cand,
        slack_threshold=args.slack_threshold,
        latency_threshold=args.latency_threshold,
        base_backend=args.base_backend,
        cand_backend=args.cand_backend,
        allow_incomplete=args.allow_incomplete,
        min_compared=args.min_compared,
    )
    out = args.out or args.cand / "diff"
    gate = (args.fail_on_perf, args.allow_missing, args.skips_expected)
    earlier = safeio.move_aside(out)
    if earlier is not None:
        print(f"{out} held an earlier diff: moved to {earlier}")
    files = diff_render.write_outputs(result, out, gate)
    print(diff_render.terminal(result, shutil.get_terminal_size().columns if sys.stdout.isatty() else None, gate))
    print("wrote " + ", ".join(str(f) for f in files))
    return result.exit_status(*gate)


@_guarded
def run_merge(args: argparse.Namespace) -> int:
    result = merge.merge_dirs(args.dirs, allow_incomplete=args.allow_incomplete)
    merge.write_merged(result, args.out)
    incomplete = [w for w in result.warnings if w.startswith(merge.INCOMPLETE)]
    for warning in result.warnings:
        fatal = warning in incomplete and not args.allow_partial
        print(f"{'error' if fatal else 'warning'}: {warning}", file=sys.stderr)
    for conflict in result.conflicts:
        print(f"CONFLICT {conflict}", file=sys.stderr)
    print(f"merged {len(args.dirs)} directories, {len(result.records)} records -> {args.out}")
    if incomplete and not args.allow_partial:
        print("the merged run is incomplete: pass every shard, or --allow-partial", file=sys.stderr)
        return 1
    return 1 if result.conflicts else 0


@_guarded
def run_html(args: argparse.Namespace) -> int:
    records, run, _ = load_run_dir(args.dir, allow_incomplete=args.allow_incomplete)
    path = html.write_report(args.dir, sort_records(records), run)
    print(f"wrote {path}")
    return 0
