"""Merge shard report directories (``--mla-shard K/N`` runs) into one run directory.

A key present in two shards must hold the same record (timing aside); anything else is a
conflict, reported and fatal, because it means two shards judged one case differently.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mlaconf.reports import html, safeio
from mlaconf.reports.aggregate import verdict
from mlaconf.reports.records import VERDICTS, Record, dumps, goldens_rebuilt, record_key, sort_records, without_volatile
from mlaconf.reports.rundir import RESULTS_FILE, RUN_FILE, RunState, load_run_dir, write_json, write_results


@dataclass
class MergeResult:
    records: list[Record]
    run: dict[str, Any]
    conflicts: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)


#: Warnings that start so mean the merged run lacks or repeats a shard (fatal unless allowed).
INCOMPLETE = "shard set incomplete: "


def _shard_warnings(runs: Sequence[dict[str, Any]]) -> list[str]:
    """Say when the shards do not form exactly one complete K/N set."""
    shards = [r.get("shard") for r in runs]
    if any(s is None for s in shards):
        return ["some inputs are not shard runs (no --mla-shard); merged anyway"]
    totals = {str(s).split("/")[1] for s in shards}
    if len(totals) != 1:
        return [f"{INCOMPLETE}inputs come from different shard counts: {sorted(map(str, shards))}"]
    n = int(totals.pop())
    have = sorted(int(str(s).split("/")[0]) for s in shards)
    out = []
    if missing := sorted(set(range(1, n + 1)) - set(have)):
        out.append(f"{INCOMPLETE}shards missing: {', '.join(f'{k}/{n}' for k in missing)}")
    if len(have) != len(set(have)):
        out.append(f"{INCOMPLETE}a shard appears twice: {have}")
    return out


def _host(run: dict[str, Any]) -> Any:
    """The host a shard ran on; None when its ``environment`` is not an object."""
    environment = run.get("environment")
    return environment.get("host") if isinstance(environment, dict) else None


def merge_dirs(dirs: Sequence[Path], *, allow_incomplete: bool = False) -> MergeResult:
    """Join shard directories; a shard that is not complete and consistent raises IncompleteRun
    unless ``allow_incomplete`` (then the merged run is marked with the worst shard status)."""
    seen: dict[tuple[str, str], tuple[Path, Record]] = {}
    conflicts: list[str] = []
    loaded = [load_run_dir(d, allow_incomplete=allow_incomplete) for d in dirs]
    for directory, (shard_records, _, _) in zip(dirs, loaded, strict=True):
        for record in shard_records:
            key = record_key(record)
            if key not in seen:
                seen[key] = (directory, record)
            elif dumps(without_volatile(seen[key][1])) != dumps(without_volatile(record)):
                conflicts.append(
                    f"{key[0]} [{key[1]}]: {seen[key][0]} and {directory} disagree "
                    f"({verdict(seen[key][1])} vs {verdict(record)})"
                )
    merged = sort_records(r for _, r in seen.values())
    runs = [run for _, run, _ in loaded]
    states = [state for _, _, state in loaded]
    run: dict[str, Any] = dict(runs[0]) if runs else {}
    started = [str(r["started"]) for r in runs if r.get("started")]
    finished = [str(r["finished"]) for r in runs if r.get("finished")]
    run.update(
        {
            "run_name": run.get("run_name", "merged") + "+merged",
            # one id per set of shards: a merge diffed against the same merge is one run
            "run_id": "+".join(str(r.get("run_id") or "-") for r in runs),
            "problems": [p for r in runs if isinstance(r.get("problems"), list) for p in r["problems"]],
            "shard": None,
            "started": min(started, default=None),
            "finished": max(finished, default=None),
            "records": len(merged),
            "verdicts": {v: sum(verdict(r) == v for r in merged) for v in VERDICTS},
            "goldens_rebuilt": goldens_rebuilt(merged),
            "policies": sorted({p for r in runs for p in r.get("policies") or []}),
            "devices_seen": sorted({d for r in runs for d in r.get("devices_seen") or []}),
            "shards": [
                {
                    "dir": str(d),
                    "run_name": r.get("run_name"),
                    "shard": r.get("shard"),
                    "host": _host(r),
                    "started": r.get("started"),
                    "finished": r.get("finished"),
                    "records": r.get("records"),
                }
                for d, r in zip(dirs, runs, strict=True)
            ],
        }
    )
    state = _merged_state(states, len(merged))
    run.pop("status", None)
    run.pop("counts", None)
    run.update(state.to_dict() if state is not None else {})  # unknown stays unknown: no status
    if len({dumps(r.get("environment") or {}) for r in runs}) > 1:
        run["environments"] = [r.get("environment") for r in runs]
    return MergeResult(merged, run, conflicts, _shard_warnings(runs))


def _merged_state(states: Sequence[RunState | None], recorded: int) -> RunState | None:
    """Complete when every shard is; else the first shard status that is not; None (no status,
    completeness unknown) when a shard's run.json could not say."""
    if any(s is None for s in states):
        return None
    known = [s for s in states if s is not None]
    status = next((s.status for s in known if s.status != "complete"), "complete")
    selected = sum(s.counts.selected for s in known)
    ran = sum(s.counts.run for s in known)
    return RunState.build(status, selected=max(selected, ran), run=ran, recorded=recorded)


def write_merged(result: MergeResult, out: Path) -> None:
    safeio.safe_dir(out)
    write_results(out / RESULTS_FILE, result.records)
    write_json(out / RUN_FILE, result.run | {"merge_conflicts": result.conflicts, "merge_warnings": result.warnings})
    html.write_report(out, result.records, result.run)
