"""One failing test of a planted defect names one worst element, in the same words, in pytest's failure
text, the record, the HTML page and the output of the ``mlaconf repro`` command the page prints."""

from __future__ import annotations

import html
import json
import shlex
from pathlib import Path

import pytest

from mlaconf import main
from mlaconf.reports.html import repro_commands
from tests.pytest_runs import run_pytest

#: A tiny smoke case (one query row over 128 keys after an empty batch, 14 heads) a top-left causal mask
#: fails by the error model; its worst element (the largest error over its bound) is not the one of largest
#: |out - g| nor of largest scaled error.
CASE = "fp16-causal-krope_ctkv-b2-s1-kv128-h14-g2-q3d-padded-near_tie-vmean-49163822"
DEFECT = "mlaconf.harness.defects:causal_top_left"


def test_a_planted_defect_names_one_element_in_its_failure_text_page_and_repro(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    report = tmp_path / "report"
    done = run_pytest(
        "cases/test_conformance.py",
        "--mla-suite",
        "smoke",
        "--mla-backend",
        DEFECT,
        "-k",
        CASE,
        report=report,
        golden=tmp_path / "golden",
    )
    assert done.returncode == 1, done.output
    [record] = done.records()
    named = record["worst_element"]
    line = named["text"]
    assert named["located_by"] == "model:max_err_over_bound" and "bound" in line, named
    assert f"Worst element: {line}." in done.stdout, done.output  # pytest's failure text
    assert f". Worst element: {line}." in record["message"]  # a likely cause may follow
    page = (report / "report.html").read_text()
    assert f"<b>worst element:</b> {html.escape(line)}</p>" in page
    assert page.count("(token ") == page.count(html.escape(line)) * line.count("(token ")  # no other element
    assert "worst_token" not in page and "largest_abs_error" not in page
    run = json.loads((report / "run.json").read_text())
    command = shlex.split(repro_commands(record, run)[1])  # the page's copy-ready repro command
    assert command[:2] == ["mlaconf", "repro"]
    command[command.index("--out") + 1] = str(tmp_path / "repro")
    capsys.readouterr()
    assert main(command[1:]) == 0
    assert f"worst element: {line}\n" in capsys.readouterr().out
