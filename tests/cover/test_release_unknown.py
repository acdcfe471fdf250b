"""An unknown ATB release is a state: the run's summary, the HTML page and the diff
say so in one line with its fix, and the gate never passes a candidate judged without its release."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from mlaconf.facts.versions import RELEASE_UNKNOWN, release_unknown_line
from mlaconf.reports.diff import diff_dirs
from mlaconf.reports.html import verdict_banner
from mlaconf.reports.summary import write_terminal
from tests.runs import record, write_run_dir

JUDGED_WITHOUT = f"c: xfailed: expected ERROR_RT_FAIL at setup ({RELEASE_UNKNOWN}; each named release's rejection ...)"


def rec(case: str, message: str = "", verdict: str = "passed") -> dict[str, Any]:
    return record(case, suite="error_contract", backend="atb", verdict=verdict, message=message)


def test_the_line_counts_the_verdicts_that_needed_the_release() -> None:
    assert release_unknown_line(["a passed", "b failed"]) is None
    line = release_unknown_line([JUDGED_WITHOUT, "plain", JUDGED_WITHOUT])
    assert line is not None and line.startswith(RELEASE_UNKNOWN) and "2 verdict(s)" in line
    assert "MLA_ATB_VERSION=<release>" in line and "\n" not in line


class Terminal:
    """Just what reports.summary.write_terminal uses of pytest's TerminalReporter."""

    isatty = False

    def __init__(self) -> None:
        self.lines: list[str] = []
        self._tw = type("TW", (), {"fullwidth": 120})()

    def write_sep(self, sep: str, title: str) -> None:
        self.lines.append(title)

    def ensure_newline(self) -> None:
        pass

    def write(self, text: str, **markup: bool) -> None:
        self.lines.append(text)

    def write_line(self, text: str, **markup: bool) -> None:
        self.lines.append(text)


def test_the_run_summary_and_the_page_say_it_once(tmp_path: Path) -> None:
    records = [rec("a", JUDGED_WITHOUT, "xfailed"), rec("b", JUDGED_WITHOUT, "passed"), rec("c")]
    terminal = Terminal()
    write_terminal(terminal, records, tmp_path)
    said = [line for line in terminal.lines if line.startswith(RELEASE_UNKNOWN)]
    assert len(said) == 1 and "2 verdict(s)" in said[0]
    banner = verdict_banner(records, {"status": "complete"})
    assert banner.count("ATB release unknown") == 1 and "MLA_ATB_VERSION" in banner
    known = [rec("a"), rec("b")]
    quiet = Terminal()
    write_terminal(quiet, known, tmp_path)
    assert not any("release unknown" in line for line in quiet.lines)
    assert "release unknown" not in verdict_banner(known, {"status": "complete"})


def test_the_gate_never_passes_a_candidate_judged_without_its_release(tmp_path: Path) -> None:
    known = [rec("a"), rec("b")]
    unknown = [rec("a", JUDGED_WITHOUT), rec("b")]
    base = write_run_dir(tmp_path / "base", known, run_id="base")
    cand = write_run_dir(tmp_path / "cand", unknown, run_id="cand")
    failing = diff_dirs(base, cand)
    assert failing.exit_status(fail_on_perf=False) == 1
    assert failing.verdict().startswith("GATE FAILS: the candidate run: " + RELEASE_UNKNOWN)
    # the base judged without its release: said, but the candidate's evidence decides
    reverse = diff_dirs(write_run_dir(tmp_path / "b2", unknown, run_id="b2"), write_run_dir(tmp_path / "c2", known))
    assert reverse.exit_status(fail_on_perf=False) == 0, reverse.verdict()
    assert any(note.startswith("the base run: " + RELEASE_UNKNOWN) for note in reverse.notes)
