"""``mlaconf``'s own help: a version, a description for every verb, the complete backend list."""

from __future__ import annotations

import argparse
import re

import pytest

import mlaconf as cli
from mlaconf.harness.registry import AUTO_ORDER, BUILTIN


def verbs(parser: argparse.ArgumentParser, path: str = "mlaconf") -> list[tuple[str, argparse.ArgumentParser]]:
    """Every (sub)command parser below ``parser``, with its command line."""
    found = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                found += [(f"{path} {name}", sub), *verbs(sub, f"{path} {name}")]
    return found


def test_every_verb_has_a_description_without_markup() -> None:
    found = verbs(cli.build_parser())
    assert {"mlaconf list", "mlaconf show", "mlaconf bench", "mlaconf report diff"} <= {p for p, _ in found}
    for path, parser in found:
        assert parser.description and len(parser.description) > 40, f"{path} has no description"
        text = parser.format_help()
        assert "``" not in text and not re.search(r":\w+:`", text), f"{path} --help shows reST markup"


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["--version"])
    assert exit_info.value.code == 0
    assert re.fullmatch(r"mlaconf (\d+\.\d+\S*|unknown \(not installed\))\n", capsys.readouterr().out)


def test_run_help_names_every_builtin_backend() -> None:
    run = dict(verbs(cli.build_parser()))["mlaconf run"]
    text = " ".join(run.format_help().split()).replace("- ", "-")  # undo argparse's wrapping
    assert all(name in text for name in [*BUILTIN, *AUTO_ORDER, "pkg.module:factory"])
