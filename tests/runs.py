"""Run directories made by hand for the report verbs' tests: results.jsonl plus a run.json that
says the run completed (status and counts, schema version and run id, as a finished run writes them)."""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from mlaconf.reports.rundir import RunState, write_json, write_results


def record(case: str, **fields: Any) -> dict[str, Any]:
    """A passing conformance record of ``case`` that the readers accept (a real SHA-256 digest);
    ``fields`` override or add."""
    return {
        "schema_version": 2,
        "suite": "conformance",
        "test": f"t[{case}]",
        "case_id": case,
        "backend": "cpu",
        "verdict": "passed",
        "worst_slack": 0.25,
        "output_sha256": hashlib.sha256(case.encode()).hexdigest(),
    } | fields


def write_run_dir(directory: Path, records: Sequence[Mapping[str, Any]], status: str = "complete", **run: Any) -> Path:
    """``directory`` as a run that ``status``-ed after recording ``records`` (every test ran)."""
    directory.mkdir(parents=True, exist_ok=True)
    write_results(directory / "results.jsonl", [dict(r) for r in records])
    n = len(records)
    state = RunState.build(status, selected=n, run=n, recorded=n)
    identity = {"schema_version": 2, "run_id": hashlib.sha256(str(directory).encode()).hexdigest()[:32]}
    write_json(directory / "run.json", {"run_name": directory.name, **identity, **state.to_dict(), **run})
    return directory
