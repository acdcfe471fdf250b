"""Verbs are registered one way (docs/architecture.md, "A CLI that starts at once"): each room's light ``verbs.py``
registers its verbs and names their work as a string; no module is named for being a command line."""

from __future__ import annotations

import argparse
from pathlib import Path

import mlaconf

ROOT = Path(__file__).resolve().parents[2]


def _verbs(parser: argparse.ArgumentParser) -> list[argparse.ArgumentParser]:
    found = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                found += _verbs(sub) or [sub]
    return found


def test_every_verb_module_is_a_rooms_verbs_py() -> None:
    assert all(name.endswith(".verbs") for name in mlaconf.VERB_MODULES), mlaconf.VERB_MODULES


def test_every_verb_names_its_work_as_a_string() -> None:
    verbs = _verbs(mlaconf.build_parser())
    assert len(verbs) > 10
    for verb in verbs:
        func = verb.get_default("func")
        assert isinstance(func, str) and ":" in func, (verb.prog, func)
        assert callable(mlaconf.verb_function(func)), func


def test_no_module_is_named_for_being_a_command_line() -> None:
    named = [
        str(path.relative_to(ROOT))
        for room in mlaconf.ROOMS
        for path in (ROOT / room).rglob("*.py")
        if path.stem in ("cli", "verb") or path.stem.endswith("_cli")
    ]
    assert not named, named
