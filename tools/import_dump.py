"""``mlaconf import-dump``: an msprobe dump's MLA prefill calls as a suite file (tools/msprobe_dump.py),
and with ``--judge`` each dumped device output judged like a backend's, msprobe's benchmark verdict beside
ours.  Light at import: the reading, the goldens and the judge load when the verb runs."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from mlaconf.golden.specs.spec import CaseSpec


def run_import_dump(args: argparse.Namespace) -> int:
    from mlaconf.tools.msprobe_dump import import_dump, suite_text
    from mlaconf.tools.msprobe_read import Unrecoverable

    try:
        result = import_dump(args.dump_dir, args.golden_dir)
    except Unrecoverable as err:
        print(f"mlaconf import-dump: {err}", file=sys.stderr)
        return 2
    for line in result.notes:
        print(f"imported {line}", file=sys.stderr)
    for line in result.unrecoverable:
        print(f"cannot recover {line}", file=sys.stderr)
    for line in result.skipped:
        print(f"skipped {line}", file=sys.stderr)
    if result.other_apis:
        counts = ", ".join(f"{api} ({n})" for api, n in sorted(result.other_apis.items()))
        print(f"skipped {sum(result.other_apis.values())} calls of other APIs: {counts}", file=sys.stderr)
    if not result.cases:
        print(f"mlaconf import-dump: {args.dump_dir}: no MLA prefill call could be imported", file=sys.stderr)
        return 1
    failed = judge_dumped(result.cases, args.golden_dir, args.policy) if args.judge else 0
    text = suite_text(result, args.dump_dir, args.suite)
    if args.out is None:
        sys.stdout.write(text)
    else:
        from mlaconf.reports.safeio import ReportFileError, atomic_write

        try:
            atomic_write(args.out, text)
        except (OSError, ReportFileError) as err:
            print(f"mlaconf import-dump: {args.out}: cannot write: {err}", file=sys.stderr)
            return 2
        print(f"wrote {len(result.cases)} cases to {args.out}", file=sys.stderr)
    return 1 if failed else 0


def judge_dumped(cases: list[CaseSpec], store: Path | None, policy: str) -> int:
    """Judge each case's dumped output against its golden (built here); one line each, ours and msprobe's
    verdict side by side.  Returns how many failed ours."""
    from mlaconf.golden.building.generate import build_golden
    from mlaconf.golden.store.bundles import load_dumped_output
    from mlaconf.golden.store.directory import GoldenStore
    from mlaconf.judge.policy import load_policies
    from mlaconf.judge.verdict import judge_output

    policies, goldens, failed = load_policies(), GoldenStore(store, builder=build_golden), 0
    for spec in cases:
        out = load_dumped_output(spec.case_id, goldens.root)
        if out is None:
            print(f"judged {spec.name}: no dumped output to judge", file=sys.stderr)
            continue
        _, verdict = judge_output(goldens.ensure(spec), out, policies, policy, "dumped")
        theirs = [c for c in verdict.checks if c.rule == "msprobe" and c.metric != "eb_ratio"]
        msprobe = "PASS" if theirs and all(c.passed for c in theirs) else "FAIL"
        failed += not verdict.passed
        print(
            f"judged {spec.name}: {verdict.summary()} msprobe's benchmark standard alone: {msprobe}.", file=sys.stderr
        )
    return failed
