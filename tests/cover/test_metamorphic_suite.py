"""The metamorphic suite is a suite like every other: ``mlaconf list``, ``regen``, ``verify``, ``coverage``
and ``store`` read ``cases/metamorphic.toml`` with the suites' loader and see every golden a relation judges
(its cases' and its transformed sides'), a run after ``regen metamorphic`` builds and announces none on
demand, a bad ``[relations.NAME]`` table is one line naming the file, the relation and the field, and the
relations' cases are never run as conformance cases."""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

import pytest

from mlaconf import main
from mlaconf.golden.building.inputs import generate_inputs
from mlaconf.golden.building.regen import select_cases
from mlaconf.golden.building.relations import SIDES
from mlaconf.golden.specs.spec import SpecError
from mlaconf.golden.specs.suites import load_relations, load_suite, suite_path

REPO = Path(__file__).resolve().parents[2]
SUITE = suite_path("metamorphic")
ON_DEMAND = "generating missing goldens on demand"


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A store holding what ``mlaconf regen metamorphic`` builds."""
    root = tmp_path_factory.mktemp("meta-store")
    assert main(["regen", "metamorphic", "--out", str(root)]) == 0
    return root


def judged_case_ids() -> set[str]:
    """Every case whose golden a tolerance relation of the shipped file judges, sides included."""
    ids = set()
    for name, relation in load_relations(SUITE).items():
        if relation.kind == "tolerance":
            for case in relation.cases:
                ids |= {side.case.case_id for side in SIDES[name](case, generate_inputs(case))}
    return ids


def test_every_tolerance_relation_has_sides_and_every_relation_a_case_of_the_file() -> None:
    relations = load_relations(SUITE)
    cases = {case.case_id for case in load_suite(SUITE)}
    assert {name for name, r in relations.items() if r.kind == "tolerance"} == set(SIDES)
    assert all({c.case_id for c in r.cases} <= cases for r in relations.values())


def test_list_regen_verify_coverage_and_store_work_on_metamorphic_and_name_its_cases(
    store: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    judged = judged_case_ids()
    wanted = {case.case_id for case in load_suite(SUITE)} | judged
    assert any(case_id.split("-")[-2] == "dump" for case_id in judged)  # transformed sides are cases too
    assert {f"{case_id}.h5" for case_id in wanted} <= {path.name for path in store.iterdir()}
    capsys.readouterr()
    assert main(["list", "metamorphic", "--out", str(store)]) == 0
    listed = capsys.readouterr()
    assert all(case_id in listed.out for case_id in wanted)
    assert f"list: {len(wanted)} cases, {len(wanted)} with a valid golden" in listed.err
    assert main(["verify", "metamorphic", "--out", str(store)]) == 0
    assert f"verify: {len(wanted)} ok, 0 bad" in capsys.readouterr().out
    assert main(["store", "--out", str(store)]) == 0
    assert "unreferenced: 0 files" in capsys.readouterr().out  # prune would keep every side's golden
    assert main(["coverage", "metamorphic"]) == 0
    assert f"metamorphic: {len(load_suite(SUITE))} cases; 1-way" in capsys.readouterr().out


def test_all_means_every_shipped_suite_metamorphic_included() -> None:
    everything = {case.case_id for case in select_cases(["all"])}
    assert judged_case_ids() <= everything


def test_a_run_after_regen_metamorphic_builds_no_golden_and_says_none(store: Path, tmp_path: Path) -> None:
    """The relations ask the store for nothing regen did not build; the property suite's goldens, made
    outside the store on purpose, announce no on-demand generation either."""
    before = {path.name: path.stat().st_mtime_ns for path in store.rglob("*")}
    suites = [str(REPO / "cases" / name) for name in ("test_metamorphic.py", "test_properties.py")]
    command = [sys.executable, "-m", "pytest", *suites, "-p", "no:cacheprovider", "--hypothesis-profile", "mla-ci"]
    command += ["-q", "-n", "0", "--mla-backend", "torch-cpu", "--mla-golden-dir", str(store)]
    command += ["--mla-report-dir", str(tmp_path / "report")]
    done = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=900)
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-3000:]
    assert ON_DEMAND not in output, output[-3000:]
    assert {path.name: path.stat().st_mtime_ns for path in store.rglob("*")} == before


def test_the_relations_cases_are_no_conformance_cases() -> None:
    from mlaconf.runner.selection import selected_cases

    relations = {case.case_id for case in load_suite(SUITE)}
    for suites in (["all"], ["metamorphic"], ["smoke", "metamorphic"]):
        options = {"mla_suite": suites, "mla_cases": None, "mla_seeds": None}
        config = argparse.Namespace(getoption=options.__getitem__)
        assert not relations & {case.case_id for case in selected_cases(config)}, suites  # type: ignore[arg-type]


CASE = '[[case]]\nname = "one"\nq_seqlen = [4]\nhead_num = 2\n'


@pytest.mark.parametrize(
    ("table", "field", "says"),
    [
        ('[relations.batch_order]\nkind = "fuzzy"\ncases = ["one"]', "relations.batch_order.kind", "not one of"),
        ('[relations.batch_order]\nkind = "exact"', "relations.batch_order.cases", "is required"),
        ('[relations.batch_order]\nkind = "exact"\ncases = []', "relations.batch_order.cases", "non-empty list"),
        ('[relations.batch_order]\nkind = "exact"\ncases = ["two"]', "relations.batch_order.cases", "two"),
        (
            '[relations.batch_order]\nkind = "exact"\ncases = ["one"]\nspecs = ["one"]',
            "relations.batch_order.specs",
            "unknown key",
        ),
        (
            '[relations.batch_order]\nkind = "exact"\ncases = ["one"]\n' + CASE.replace("2", "4"),
            "relations.batch_order.cases",
            "several",
        ),
        ("relations = 3", "relations", "must be tables"),
        ("[relations]\nbatch_order = 1", "relations.batch_order", "must be a table"),
    ],
)
def test_a_malformed_relation_table_is_one_line_naming_file_relation_and_field(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], table: str, field: str, says: str
) -> None:
    path = tmp_path / "bad.toml"
    path.write_text(f"{table}\n\n{CASE}" if table.startswith("relations =") else f"{CASE}\n{table}\n")
    with pytest.raises(SpecError) as caught:
        load_suite(path)
    assert caught.value.field_name == field and says in str(caught.value), str(caught.value)
    assert main(["list", "--cases", str(path)]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert str(path) in line and f"field {field!r}" in line and says in line, line
