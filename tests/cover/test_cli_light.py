"""A CLI that starts at once: every help and usage error of every registered verb, run in one fresh
interpreter, loads neither torch, ml_dtypes, h5py nor hypothesis (the rule for VERB_MODULES in
docs/architecture.md).  Verbs are found from the built parser, so a verb another room adds is held to it too."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys

import mlaconf
from tests.machine import HANG_S

HEAVY = ("torch", "ml_dtypes", "h5py", "hypothesis")

#: Runs in the child: each command line through mlaconf.main, then the heavy modules loaded (by then).
PROBE = """
import contextlib, io, json, sys
import mlaconf
HEAVY = %r
report = []
for argv in json.loads(sys.argv[1]):
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            status = mlaconf.main(argv)
        except SystemExit as exc:
            status = exc.code
    report.append([argv, status, err.getvalue()[-300:], [m for m in HEAVY if m in sys.modules]])
print(json.dumps(report))
"""


def verb_paths(parser: argparse.ArgumentParser, path: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    """Every (sub)command below ``parser`` as the words that select it."""
    found = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                found += [(*path, name), *verb_paths(sub, (*path, name))]
    return found


def command_lines() -> list[list[str]]:
    verbs = verb_paths(mlaconf.build_parser())
    assert {("regen",), ("run",), ("repro",), ("report", "diff")} <= set(verbs)
    lines = [["--help"], ["--no-such-option"], ["no-such-verb"]]
    for verb in verbs:
        lines += [[*verb, "--help"], [*verb, "--no-such-option"]]
    # usage errors found by a verb's own checks, not argparse's
    return [*lines, ["run", "--backend", "no-such-backend"], ["regen", "--shard", "9"], ["bench", "--cases", "x"]]


def test_help_and_usage_errors_load_no_heavy_module() -> None:
    lines = command_lines()
    probe = subprocess.run(
        [sys.executable, "-c", PROBE % (HEAVY,), json.dumps(lines)], capture_output=True, text=True, timeout=HANG_S
    )
    assert probe.returncode == 0, probe.stderr
    report = json.loads(probe.stdout)
    assert len(report) == len(lines)
    for argv, status, stderr, heavy in report:
        assert heavy == [], f"mlaconf {' '.join(argv)} imported {heavy}"
        assert status == (0 if "--help" in argv else 2), f"mlaconf {' '.join(argv)}: exit {status}: {stderr}"
        assert "--help" in argv or "error:" in stderr, f"mlaconf {' '.join(argv)}: no usage error: {stderr}"
