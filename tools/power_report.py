"""``mlaconf power``: would this suite catch a bug, and does it fail a correct kernel?

Runs every catalogued defect (:mod:`mlaconf.harness.defects`) and every correct zoo member
(:mod:`mlaconf.harness.zoo`) over a suite's conformance cases, in-process (:mod:`mlaconf.tools.power`),
and writes power.json, power.md (the tables) and power.html.  Exit 0: every defect killed and no false
alarm; 1: a survivor or a false alarm (a gate for a change to a suite); 2: bad arguments; 3: a case raised
(the report partial, the error named); 130: stopped, the report partial.  Light at import: torch and h5py
load only when the verb runs.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time
import warnings
from pathlib import Path
from typing import Any

from mlaconf.facts.processes import INTERRUPTED

#: Exit status of a run a case's error stopped (its report is written, partial, and names the error).
FAILED = 3
#: Where the report goes without --out (relative to the working directory, like a run's reports).
DEFAULT_OUT = Path("reports") / "out" / "power"
#: Shipped suites a survivor's suggested cases come from (the conformance suites).
SUGGESTION_SUITES = ("smoke", "standard", "edge", "deepseek")


def _fail(message: str) -> int:
    print(f"mlaconf power: {message}", file=sys.stderr)
    return 2


def run_power(args: argparse.Namespace) -> int:
    from mlaconf.golden.specs.spec import SpecError
    from mlaconf.golden.specs.suites import load_suite, load_suites
    from mlaconf.judge.deviations import load_deviations
    from mlaconf.judge.policy import load_policies
    from mlaconf.tools import power

    if args.jobs < 1:
        return _fail(f"-j {args.jobs}: must be at least 1")
    # a defect's NaN or Inf output makes numpy warn while it is judged; the verdict already says it (finite:*)
    warnings.filterwarnings("ignore", category=RuntimeWarning)
    try:
        if args.cases is not None:
            cases, selection = load_suite(args.cases), f"cases file {shown_path(args.cases)}"
        else:
            names = args.suite or ["smoke"]
            cases, selection = load_suites(names), "suite " + " + ".join(names)
        chosen = power.subjects(args.defects, args.zoo or args.defects is None)
    except (SpecError, ValueError) as exc:
        return _fail(str(exc))
    cases = [c for c in cases if c.expect_error is None]  # the error contract is not a numeric verdict
    if not cases:
        return _fail(f"{selection}: no conformance case to run")
    run = power.PowerRun(selection, cases, {s.name: power.SubjectResult(s) for s in chosen})
    runner = power.PowerRunner(
        run,
        golden_dir=args.golden_dir,
        policy_set=load_policies(),
        deviations=load_deviations(),
        jobs=args.jobs,
    )
    load_before = os.getloadavg()
    start = time.perf_counter()
    runner.execute()
    if run.complete and run.survivors() and not args.no_suggest:
        try:
            runner.suggest(load_suites(SUGGESTION_SUITES))
        except KeyboardInterrupt:
            run.complete = False
    run.seconds = time.perf_counter() - start
    extra = {"jobs": args.jobs, "load_average": {"before": load_before, "after": os.getloadavg()}}
    _write(args.out, power.report(run, extra), power.markdown_tables(run), power.html_page(run))
    print(power.text_report(run))
    print(f"report: {args.out / 'power.json'}, {args.out / 'power.html'} ({run.seconds:.0f} s)")
    if run.error is not None:
        print(f"power: stopped by an error, the report is partial: {run.error}", file=sys.stderr)
        return FAILED
    if not run.complete:
        return INTERRUPTED
    return 1 if run.survivors() or run.false_alarms() else 0


def shown_path(path: Path) -> str:
    """A path as a page or report names it: relative to the working directory when inside it, else its name
    (an absolute path names one machine's folders)."""
    try:
        return str(path.resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return path.name


def _write(out: Path, content: dict[str, Any], markdown: str, page: str) -> None:
    import json

    from mlaconf.reports.safeio import atomic_write

    out.mkdir(parents=True, exist_ok=True)
    atomic_write(out / "power.json", json.dumps(_json_safe(content), indent=1, allow_nan=False) + "\n")
    atomic_write(out / "power.md", markdown)
    atomic_write(out / "power.html", page)


def _json_safe(value: Any) -> Any:
    """Infinite slacks (a NaN or Inf output) as the string "inf": strict JSON has no infinity."""
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, dict):
        return {key: _json_safe(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_json_safe(item) for item in value]
    return value
