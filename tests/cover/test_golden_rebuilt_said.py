"""A golden the store finds damaged during a run is rebuilt and said: one line in the terminal summary, the
``golden_rebuilt`` of the record of the test that found it, and run.json's ``goldens_rebuilt``; a golden that
was only missing is none of these (the run's one line about generating missing goldens says that)."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

from tests.pytest_runs import PytestRun, run_pytest

SUITE = textwrap.dedent("""
    [suite]
    name = "rebuilt"

    [defaults]
    q_seqlen = [8, 5]
    dtype = "fp16"

    [[matrix]]
    head_num = [1, 2]
""")


def _run(tmp_path: Path, report: str) -> PytestRun:
    return run_pytest(
        "cases/test_conformance.py",
        "-n",
        "0",
        "--mla-cases",
        str(tmp_path / "rebuilt.toml"),
        "--mla-backend",
        "torch-cpu",
        report=tmp_path / report,
        golden=tmp_path / "golden",
    )


def test_a_golden_damaged_between_runs_is_rebuilt_and_said_in_the_console_record_and_run_json(tmp_path: Path) -> None:
    (tmp_path / "rebuilt.toml").write_text(SUITE)
    first = _run(tmp_path, "first")
    assert first.returncode == 0, first.output
    assert "generating missing goldens on demand" in first.stderr + first.stdout
    assert "golden rebuilt" not in first.stdout and not any(r.get("golden_rebuilt") for r in first.records())
    assert json.loads((tmp_path / "first" / "run.json").read_text())["goldens_rebuilt"] == []

    damaged = next(p for p in sorted((tmp_path / "golden").glob("*.h5")) if "-h2-" in p.name)
    data = bytearray(damaged.read_bytes())
    data[len(data) // 2] ^= 0xFF  # one byte of the arrays flipped
    damaged.write_bytes(bytes(data))

    second = _run(tmp_path, "second")
    assert second.returncode == 0, second.output  # rebuilt, then used: the run passes
    case = damaged.stem
    records = {str(r["case_id"]): r for r in second.records()}
    why = records[case].get("golden_rebuilt", {}).get(case)
    assert why and why.startswith("GoldenCorruptError: ") and "digest mismatch" in why, records[case]
    assert [c for c, r in records.items() if r.get("golden_rebuilt")] == [case]
    line = f"golden rebuilt: {case}: {why} (found by {records[case]['test']})"
    assert line in second.stdout, second.output
    assert "generating missing goldens" not in second.stdout + second.stderr  # it was not missing
    run = json.loads((tmp_path / "second" / "run.json").read_text())
    assert run["goldens_rebuilt"] == [{"case_id": case, "why": why, "test": records[case]["test"]}]
