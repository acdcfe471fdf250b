"""Front-door defects, each with its regression test: suite files of your own, usage errors before
any test runs, an empty selection, malformed report inputs, an incomplete shard merge."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from mlaconf import verb_function
from mlaconf.golden.store.locations import golden_dir_problem
from mlaconf.reports import verbs
from tests.machine import HANG_S
from tests.pytest_runs import PytestRun, run_pytest
from tests.runs import write_run_dir

REPO = Path(__file__).resolve().parents[2]

#: A suite name that is not shipped, the README's example case, and error cases with mask types a
#: run has no marker for (1 = spec; 7 = no such mask).
MINE = textwrap.dedent("""
    [suite]
    name = "mine"

    [defaults]
    head_num = 16

    [[case]]
    dtype = "bf16"
    mask_type = "causal"
    kv_layout = "padded"
    q_seqlen = [1024, 512]
    kv_seqlen = [1152, 640]
    kv_head_num = 4

    [[case]]
    name = "spec-mask"
    q_seqlen = [8]
    mask_type = 1
    expect_error = "ERROR_INVALID_PARAM"
    expect_stage = "create"

    [[case]]
    name = "mask-seven"
    q_seqlen = [8]
    mask_type = 7
    expect_error = "ERROR_INVALID_PARAM"
    expect_stage = "create"
""")


def pytest_run(tmp_path: Path, *args: str, paths: tuple[str, ...] = ("cases",)) -> PytestRun:
    return run_pytest(*paths, "-q", *args, report=tmp_path / "report", timeout=HANG_S)


def test_own_suite_file_collects_and_feeds_the_error_suite(tmp_path: Path) -> None:
    mine = tmp_path / "mine.toml"
    mine.write_text(MINE)
    result = pytest_run(
        tmp_path,
        "--collect-only",
        "--strict-markers",
        "--mla-cases",
        str(mine),
        "--mla-backend",
        "torch-cpu-strict",
        paths=("cases/test_conformance.py", "cases/test_error_contract.py", "cases/test_metamorphic.py"),
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-2000:]
    ids = [line for line in result.stdout.splitlines() if "::" in line]
    # one value case, both error cases of the file; none of errors.toml, no metamorphic relation
    assert len(ids) == 3, ids
    assert sum("test_error_contract" in i for i in ids) == 2
    assert any("-spec-" in i for i in ids) and any("-mask7-" in i for i in ids)


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (("--mla-policy", "no-such-policy"), "--mla-policy 'no-such-policy': no such policy; choose from"),
        (("--mla-golden-dir", "__FILE__"), "not a directory"),
        (("--mla-cases", "__EMPTY__"), "the file holds no case; an empty selection is not a pass"),
        (("--mla-cases", "__MISSING__"), "no such file"),
    ],
)
def test_usage_errors_come_before_any_test(tmp_path: Path, args: tuple[str, ...], fragment: str) -> None:
    (tmp_path / "a_file").write_text("x")
    (tmp_path / "empty.toml").write_text('[suite]\nname = "empty"\n')
    subst = {
        "__FILE__": str(tmp_path / "a_file"),
        "__EMPTY__": str(tmp_path / "empty.toml"),
        "__MISSING__": str(tmp_path / "missing.toml"),
    }
    result = pytest_run(tmp_path, "--mla-backend", "torch-cpu", *(subst.get(a, a) for a in args))
    assert result.returncode == 4, result.stdout[-2000:] + result.stderr[-2000:]
    assert fragment in result.stderr and "Traceback" not in result.stderr + result.stdout
    assert "passed" not in result.stdout and "failed" not in result.stdout


def test_unwritable_empty_golden_dir_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    store = tmp_path / "store"
    store.mkdir()
    assert golden_dir_problem(store) is None
    monkeypatch.setattr(os, "access", lambda path, mode: False)  # root may write anywhere: pretend not
    assert "cannot write" in str(golden_dir_problem(store))
    (store / "x.h5").write_text("")  # a read-only store with goldens in it is fine
    assert golden_dir_problem(store) is None
    assert "cannot be created" in str(golden_dir_problem(tmp_path / "new" / "store"))


def test_k_matching_nothing_is_not_a_pass(tmp_path: Path) -> None:
    """Exit 5 over an earlier complete run: the earlier run is moved aside, run.json says no_tests,
    and the gate refuses the directory (it never shows the previous run as this one)."""
    earlier = write_run_dir(
        tmp_path / "report", [{"suite": "conformance", "test": "t", "backend": "b", "verdict": "passed"}]
    )
    result = pytest_run(
        tmp_path, "--mla-backend", "torch-cpu", "-k", "no_such_test_anywhere", paths=("cases/test_conformance.py",)
    )
    assert result.returncode != 0
    assert "empty selection: no MLA test was selected" in result.stdout
    run = json.loads((earlier / "run.json").read_text())
    assert run["status"] == "no_tests" and run["counts"]["run"] == 0
    assert (tmp_path / "report.previous-1" / "run.json").is_file()  # nothing lost
    assert mlaconf("report", "html", str(earlier)) == 2


def mlaconf(*argv: str) -> int:
    parser = argparse.ArgumentParser()
    verbs.register(parser.add_subparsers(dest="verb", required=True))
    args = parser.parse_args(argv)
    return int(verb_function(args.func)(args))


def test_report_html_on_malformed_results_is_one_line(tmp_path: Path) -> None:
    (tmp_path / "results.jsonl").write_text('{"case_id": "a", "backend": "b", "verdict": "passed"}\n{not json\n')
    result = subprocess.run(
        [sys.executable, "-m", "mlaconf", "report", "html", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=HANG_S,
        env=dict(os.environ, PYTHONPATH=str(REPO)),
    )
    assert result.returncode == 2
    assert result.stderr.count("\n") == 1 and "Traceback" not in result.stderr
    assert "results.jsonl:2: not JSON" in result.stderr
    (tmp_path / "results.jsonl").write_text(
        '{"case_id": "a", "backend": "b", "suite": "bogus", "schema_version": 2, "test": "t", "verdict": "passed"}\n'
    )
    assert mlaconf("report", "html", str(tmp_path)) == 2


def test_merge_with_a_shard_missing_fails(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    dirs = []
    for k in (1, 3):
        record = {"case_id": f"c{k}", "backend": "b", "verdict": "passed"}
        dirs.append(str(write_run_dir(tmp_path / f"s{k}", [record], shard=f"{k}/3")))
    assert mlaconf("report", "merge", str(tmp_path / "m"), *dirs) == 1
    assert "error: shard set incomplete: shards missing: 2/3" in capsys.readouterr().err
    assert mlaconf("report", "merge", str(tmp_path / "m"), *dirs, "--allow-partial") == 0
    assert json.loads((tmp_path / "m" / "run.json").read_text())["records"] == 2


def test_a_suite_file_in_the_suites_folder_is_a_suite_everywhere(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`mlaconf list`, `--mla-suite` and `mlaconf run --suite` read suite names from the folder."""
    from mlaconf import build_parser
    from mlaconf.golden.specs import suites
    from mlaconf.runner.selection import suite_choices

    shipped = suites.suites_dir()
    for name in ("smoke", "errors"):
        (tmp_path / f"{name}.toml").write_text((shipped / f"{name}.toml").read_text())
    (tmp_path / "mine.toml").write_text(MINE)
    monkeypatch.setattr(suites, "suites_dir", lambda: tmp_path)
    assert suite_choices() == ["mine", "smoke", "metamorphic", "all"]
    assert {c.suite for c in suites.load_suites(["mine"])} == {"mine"}
    args = build_parser().parse_args(["run", "--suite", "mine"])
    assert args.suite == ["mine"]


def test_a_misspelt_suite_is_our_usage_error(tmp_path: Path) -> None:
    run = subprocess.run(
        [sys.executable, "-m", "mlaconf", "run", "--suite", "smok"], capture_output=True, text=True, timeout=HANG_S
    )
    assert run.returncode == 2 and "invalid choice: 'smok'" in run.stderr and "Traceback" not in run.stderr
    result = pytest_run(tmp_path, "--mla-suite", "smok", paths=("cases/test_conformance.py",))
    assert result.returncode == 4, result.stdout[-2000:] + result.stderr[-2000:]
    choices = "branches, deepseek, edge, long, smoke, standard, metamorphic, all"
    assert f"--mla-suite 'smok': no such suite (did you mean 'smoke'?); choose from {choices}" in result.stderr


@pytest.mark.parametrize(
    ("suites", "cases", "metamorphic"),
    [
        ([], None, True),  # no filter: the default selection
        (["mine"], None, False),
        (["smoke"], None, False),
        (["metamorphic"], None, True),
        (["smoke", "metamorphic"], None, True),
        (["all"], None, True),
        ([], "mine.toml", False),
        (["metamorphic"], "mine.toml", True),
    ],
)
def test_a_suite_filter_runs_the_metamorphic_suite_only_when_it_selects_it(
    suites: list[str], cases: str | None, metamorphic: bool
) -> None:
    from mlaconf.runner.selection import runs_metamorphic

    options = {"mla_suite": suites or None, "mla_cases": cases}
    config = argparse.Namespace(getoption=options.__getitem__)
    assert runs_metamorphic(config) is metamorphic  # type: ignore[arg-type]


def test_mlaconf_run_without_suite_passes_no_filter(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from mlaconf import build_parser
    from mlaconf.tools.run import pytest_command

    monkeypatch.chdir(tmp_path)
    assert "--mla-suite" not in pytest_command(build_parser().parse_args(["run"]))
    command = pytest_command(build_parser().parse_args(["run", "--suite", "smoke"]))
    assert command[command.index("--mla-suite") + 1] == "smoke"


def test_a_misspelt_policy_names_the_option_typed(capsys: pytest.CaptureFixture[str]) -> None:
    from mlaconf import main

    assert main(["run", "--policy", "nosuch", "--backend", "torch-cpu"]) == 2  # before pytest starts
    err = capsys.readouterr().err
    assert err.startswith("mlaconf run: error: --policy 'nosuch': no such policy; choose from ")
    assert err.count("\n") == 1 and "--mla-policy" not in err and "default" in err


def test_mlaconf_run_keeps_pytests_cache_for_lf(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``mlaconf run -- --lf``: the cache provider stays on, its folder in the working directory."""
    from mlaconf import build_parser
    from mlaconf.tools.run import pytest_command

    monkeypatch.chdir(tmp_path)
    command = pytest_command(build_parser().parse_args(["run", "--backend", "torch-cpu", "--", "--lf"]))
    assert "no:cacheprovider" not in command and command[-1] == "--lf"
    assert f"cache_dir={tmp_path / '.pytest_cache'}" in command
    assert command[command.index("--mla-backend") + 1] == "torch-cpu" and "--backend" not in command


def test_the_run_verb_names_the_option_typed(tmp_path: Path) -> None:
    """`mlaconf run --golden-dir FILE` is refused by the verb, naming --golden-dir (pytest's option is
    --mla-golden-dir, which the user never typed), before pytest or torch load."""
    (tmp_path / "a_file").write_text("x")
    ran = subprocess.run(
        [sys.executable, "-m", "mlaconf", "run", "--golden-dir", str(tmp_path / "a_file")],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
    )
    assert ran.returncode == 2 and ran.stderr.strip().splitlines() == [
        f"mlaconf run: error: --golden-dir {tmp_path / 'a_file'}: not a directory"
    ]
    assert not (tmp_path / "reports").exists()


def test_a_usage_error_says_the_named_run_directory_it_marked(tmp_path: Path) -> None:
    result = pytest_run(tmp_path, "--mla-policy", "no-such-policy")  # named: --mla-report-dir DIR
    directory = tmp_path / "report"
    assert result.returncode == 4 and f"(run.json in {directory} records this usage error)" in result.stderr
    assert json.loads((directory / "run.json").read_text())["status"] == "usage_error"
