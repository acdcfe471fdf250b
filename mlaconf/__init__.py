"""``mlaconf``: one console script; each area registers its own verbs."""

from __future__ import annotations

import argparse
import importlib
import importlib.abc
import importlib.machinery
import importlib.metadata
import importlib.util
import signal
import sys
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from types import ModuleType

DISTRIBUTION = "mla-prefill-conformance"
DESCRIPTION = """\
Conformance and golden-data testing of the ATB MLA prefill operator: build and check the float64
golden files, run the conformance suites on a backend, and compare, merge or render their reports.
'mlaconf VERB --help' describes each verb."""
#: The top-level folders of a checkout; installed, they are the subpackages ``mlaconf.<room>``.
ROOMS = ("facts", "golden", "harness", "native", "judge", "runner", "tools", "cases", "reports")
#: Modules exposing ``register(subparsers)``; each verb sets ``func(args) -> int`` as its default.  Every one is
#: imported to print any help or usage error, so each must be light: it loads neither torch, ml_dtypes, h5py
#: nor hypothesis, and names its heavy work as ``func="module:function"`` (:func:`verb_function`; docs/architecture.md;
#: tests/cover/test_cli_light.py holds every registered verb to this).
VERB_MODULES = (
    "mlaconf.golden.verbs",
    "mlaconf.golden.bench.verbs",
    "mlaconf.reports.verbs",
    "mlaconf.tools.verbs",
)


class CheckoutRooms(importlib.abc.MetaPathFinder):
    """Finds ``mlaconf.<room>`` as the checkout's ``<room>/`` folder, so each file has one path (the one git
    knows) and no symlink is needed; the installed wheel holds real subpackages and never installs this."""

    def __init__(self, checkout: Path) -> None:
        self.checkout = checkout

    def find_spec(
        self, fullname: str, path: Sequence[str] | None = None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        namespace, _, room = fullname.partition(".")
        if namespace != __name__ or room not in ROOMS:
            return None
        init = self.checkout / room / "__init__.py"
        return importlib.util.spec_from_file_location(fullname, init, submodule_search_locations=[str(init.parent)])


def _install_checkout_rooms() -> None:
    """Run from a checkout (``PYTHONPATH=<checkout>`` or an editable install), the rooms sit beside this
    package; ahead of every other finder, so a checkout on PYTHONPATH wins over another one installed."""
    checkout = Path(__file__).parent.parent
    if (Path(__file__).parent / ROOMS[0]).is_dir() or not all((checkout / r / "__init__.py").is_file() for r in ROOMS):
        return  # installed from a wheel: the rooms are real subpackages
    if not any(isinstance(finder, CheckoutRooms) for finder in sys.meta_path):
        sys.meta_path.insert(0, CheckoutRooms(checkout))


_install_checkout_rooms()


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="mlaconf", description=DESCRIPTION)
    parser.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    subparsers = parser.add_subparsers(dest="verb", required=True, metavar="VERB")
    for module_name in VERB_MODULES:
        importlib.import_module(module_name).register(subparsers)
    return parser


def verb_function(func: Callable[[argparse.Namespace], int] | str) -> Callable[[argparse.Namespace], int]:
    """A verb's ``func`` default: a function, or ``"package.module:function"`` imported only when the verb runs,
    so building the parser for a help text or a usage error never loads a verb's heavy work."""
    if callable(func):
        return func
    module_name, _, name = func.partition(":")
    function: Callable[[argparse.Namespace], int] = getattr(importlib.import_module(module_name), name)
    return function


def _version() -> str:
    try:
        return importlib.metadata.version(DISTRIBUTION)
    except importlib.metadata.PackageNotFoundError:  # run from a source tree that was never installed
        return "unknown (not installed)"


#: Signals that stop a verb as Ctrl-C does (what ``timeout``, ``docker stop``, systemd and CI cancels send).
STOP_SIGNALS = tuple(
    getattr(signal, name) for name in ("SIGTERM", "SIGHUP") if hasattr(signal, name)
)  # no SIGHUP on Windows


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt(signal.Signals(signum).name)


def main(argv: Sequence[str] | None = None) -> int:
    in_main_thread = threading.current_thread() is threading.main_thread()  # only it may set a handler
    for stop in STOP_SIGNALS if in_main_thread else ():  # every verb's Ctrl-C clean-up runs for these too
        if signal.getsignal(stop) == signal.SIG_DFL:  # (a nohup'd SIGHUP stays ignored)
            signal.signal(stop, _interrupt)
    try:
        args = build_parser().parse_args(argv)
        return int(verb_function(args.func)(args))
    except KeyboardInterrupt:  # a verb's own handling prints its summary; this one only ends quietly
        from mlaconf.facts.processes import INTERRUPTED

        print("interrupted", file=sys.stderr)
        return INTERRUPTED


if __name__ == "__main__":
    sys.exit(main())
