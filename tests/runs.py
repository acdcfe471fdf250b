"""Run directories made by hand for the report verbs' tests: results.jsonl plus a run.json that
says the run completed (status and counts, as a finished run writes them)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from mlaconf.reports.records import RunState, write_json, write_results


def write_run_dir(directory: Path, records: Sequence[Mapping[str, Any]], status: str = "complete", **run: Any) -> Path:
    """``directory`` as a run that ``status``-ed after recording ``records`` (every test ran)."""
    directory.mkdir(parents=True, exist_ok=True)
    write_results(directory / "results.jsonl", [dict(r) for r in records])
    n = len(records)
    state = RunState.build(status, selected=n, run=n, recorded=n)
    write_json(directory / "run.json", {"run_name": directory.name, **state.to_dict(), **run})
    return directory
