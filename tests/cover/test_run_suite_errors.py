"""A suite file with a TOML error in the suites folder breaks only what selects it, in one line naming
file and line: ``mlaconf --help``, the verbs' parsers and the other suites still work."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from mlaconf import build_parser
from mlaconf.golden.specs import suites as suite_files
from mlaconf.golden.specs.spec import SpecError
from mlaconf.runner.selection import suite_choices

BROKEN = '[suite]\nname = "broken"\n\n[[matrix]\nhead_num = 1\n'


@pytest.fixture
def suites(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The shipped suites folder, copied, with a suite that does not parse beside them."""
    folder = tmp_path / "suites"
    folder.mkdir()
    for path in suite_files.suites_dir().glob("*.toml"):
        shutil.copy(path, folder / path.name)
    (folder / "broken.toml").write_text(BROKEN)
    monkeypatch.setattr(suite_files, "suites_dir", lambda: folder)
    return folder


def test_help_and_every_parser_still_work(suites: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as done:
        build_parser().parse_args(["--help"])
    assert done.value.code == 0 and "VERB" in capsys.readouterr().out
    assert "broken" in suite_choices() and "smoke" in suite_choices()  # selectable, so its error is shown
    assert build_parser().parse_args(["run", "--suite", "smoke"]).suite == ["smoke"]


def test_only_the_broken_suite_fails_in_one_line_naming_file_and_line(suites: Path) -> None:
    assert suite_files.load_suites(["smoke"])  # the others load
    with pytest.raises(SpecError) as caught:
        suite_files.load_suites(["broken"])
    text = str(caught.value)
    assert str(suites / "broken.toml") in text and "line 4" in text and "\n" not in text, text
