"""``mlaconf``: one console script; each area registers its own verbs."""

from __future__ import annotations

import argparse
import importlib
import importlib.metadata
import signal
import sys
from collections.abc import Sequence

DISTRIBUTION = "mla-prefill-conformance"
DESCRIPTION = """\
Conformance and golden-data testing of the ATB MLA prefill operator: build and check the float64
golden files, run the conformance suites on a backend, and compare, merge or render their reports.
'mlaconf VERB --help' describes each verb."""
#: Modules exposing ``register(subparsers)``; each verb sets ``func(args) -> int`` as its default.
VERB_MODULES = (
    "mlaconf.golden.cli",
    "mlaconf.golden.bench",
    "mlaconf.reports.cli",
    "mlaconf.runner.run",
    "mlaconf.runner.repro",
    "mlaconf.runner.ascend",
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="mlaconf", description=DESCRIPTION)
    parser.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    subparsers = parser.add_subparsers(dest="verb", required=True, metavar="VERB")
    for module_name in VERB_MODULES:
        importlib.import_module(module_name).register(subparsers)
    return parser


def _version() -> str:
    try:
        return importlib.metadata.version(DISTRIBUTION)
    except importlib.metadata.PackageNotFoundError:  # run from a source tree that was never installed
        return "unknown (not installed)"


#: Signals that stop a verb as Ctrl-C does (what ``timeout``, ``docker stop``, systemd and CI cancels send).
STOP_SIGNALS = (signal.SIGTERM, signal.SIGHUP)


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt(signal.Signals(signum).name)


def main(argv: Sequence[str] | None = None) -> int:
    for stop in STOP_SIGNALS:  # every verb's Ctrl-C clean-up runs for these too (a nohup'd SIGHUP stays ignored)
        if signal.getsignal(stop) == signal.SIG_DFL:
            signal.signal(stop, _interrupt)
    try:
        args = build_parser().parse_args(argv)
        return int(args.func(args))
    except KeyboardInterrupt:  # a verb's own handling prints its summary; this one only ends quietly
        print("interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
