"""``mlaconf``: one console script; each area registers its own verbs."""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

#: Modules exposing ``register(subparsers)``; each verb sets ``func(args) -> int`` as its default.
VERB_MODULES = ("golden.cli", "golden.bench", "reports.cli", "runner.run")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="mlaconf", description=__doc__)
    subparsers = parser.add_subparsers(dest="verb", required=True, metavar="VERB")
    for module_name in VERB_MODULES:
        importlib.import_module(module_name).register(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return int(args.func(args))


if __name__ == "__main__":
    sys.exit(main())
