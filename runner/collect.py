"""Result records on their way to the report: attached in tests, gathered on the controller.

Records are attached by the suites through the ``mla_report`` fixture.  They travel inside
``TestReport.user_properties`` (the one channel xdist already ships from workers to the
controller), so the controller alone gathers them and writes ``results.jsonl``, ``run.json``
and ``report.html`` into the report directory, then prints the summary.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from reports import env, records
from reports.records import PROPERTY_NAME, Record

#: Scalar record fields also attached as plain properties, so ``--junitxml`` shows them.
JUNIT_FIELDS = ("verdict", "worst_slack", "policy", "backend")
JUNIT_METRICS = ("max_rel_err", "rmse")


@dataclass
class ReportState:
    """Per-session state; on xdist workers only ``report_dir`` and ``save_outputs`` matter."""

    report_dir: Path
    run_name: str
    save_outputs: bool
    shard: tuple[int, int] | None
    started: float = field(default_factory=time.time)
    records: list[Record] = field(default_factory=list)
    run_info: dict[str, Any] = field(default_factory=dict)


STATE = pytest.StashKey[ReportState]()


def set_run_info(config: pytest.Config, key: str, value: Any) -> None:
    """Record run-level facts (``golden_store``, ``backends``, ``suite``, ``policy`` ...) in run.json.

    Call it on the controller (``pytest_configure``/``pytest_sessionstart`` or a session fixture
    under ``-n 0``); values set on xdist workers never reach run.json.  ``value`` must be
    JSON-serialisable (anything else is written with ``str``).
    """
    config.stash[STATE].run_info[key] = value


class MlaReport:
    """What the ``mla_report`` fixture gives a test: ``attach(record)`` and ``outputs_dir``."""

    def __init__(self, node: pytest.Item, state: ReportState) -> None:
        self._node = node
        self._state = state

    @property
    def outputs_dir(self) -> Path | None:
        """Directory for saved outputs with ``--save-outputs`` (created on first use), else None."""
        if not self._state.save_outputs:
            return None
        path = self._state.report_dir / "outputs"
        path.mkdir(parents=True, exist_ok=True)
        return path

    def attach(self, record: Mapping[str, Any]) -> None:
        """Attach one result record (one per case and backend) to the running test."""
        if not isinstance(record, Mapping):
            raise TypeError(f"mla_report.attach expects a dict, got {type(record).__name__}")
        for name in ("case_id", "backend"):
            if not record.get(name):
                raise ValueError(f"mla_report.attach: record lacks {name!r}")
        data = dict(record)
        data.setdefault("nodeid", self._node.nodeid)
        props = self._node.user_properties
        props.append((PROPERTY_NAME, json.dumps(data, sort_keys=True, default=str)))
        props.extend((name, data[name]) for name in JUNIT_FIELDS if name in data)
        metrics = data.get("metrics")
        if isinstance(metrics, Mapping):
            props.extend((name, metrics[name]) for name in JUNIT_METRICS if name in metrics)


def _outcome(report: pytest.TestReport) -> str:
    """pytest's verdict for the phase, in the record vocabulary."""
    if hasattr(report, "wasxfail"):
        return "xfailed" if report.skipped else "xpassed"
    if report.when == "setup" and report.failed:
        return "error"
    return report.outcome


def _iso(timestamp: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S%z", time.localtime(timestamp))


class Collector:
    """Controller-only hooks: gather records from reports, write files, print the summary."""

    def __init__(self, config: pytest.Config, state: ReportState) -> None:
        self.config = config
        self.state = state

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        """Take the records of the call phase, or of a setup that failed or skipped."""
        if not (report.when == "call" or (report.when == "setup" and not report.passed)):
            return
        outcome = _outcome(report)
        for name, value in report.user_properties:
            if name == PROPERTY_NAME:
                record: Record = json.loads(str(value))
                record.setdefault("verdict", outcome)
                record["outcome"] = outcome
                self.state.records.append(record)

    def pytest_sessionfinish(self) -> None:
        """Write the report files, only if some test attached a record."""
        from reports import html

        state = self.state
        if not state.records:
            return
        state.report_dir.mkdir(parents=True, exist_ok=True)
        run = self.run_document(time.time())
        ordered = records.sort_records(state.records)
        records.write_results(state.report_dir / records.RESULTS_FILE, ordered)
        records.write_json(state.report_dir / records.RUN_FILE, run)
        html.write_report(state.report_dir, ordered, run)

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        from reports import summary

        if self.state.records:
            summary.write_terminal(terminalreporter, records.sort_records(self.state.records), self.state.report_dir)

    def run_document(self, finished: float) -> dict[str, Any]:
        """run.json: the lead's run info, then run facts and the environment (these win)."""
        state, config = self.state, self.config
        counts = dict.fromkeys(records.VERDICTS, 0)
        for record in state.records:
            counts[records.verdict(record)] += 1
        doc: dict[str, Any] = dict(state.run_info)
        doc.update(
            {
                "run_name": state.run_name,
                "started": _iso(state.started),
                "finished": _iso(finished),
                "shard": f"{state.shard[0]}/{state.shard[1]}" if state.shard else None,
                "workers": getattr(config.option, "numprocesses", None) or 0,
                "args": list(config.invocation_params.args),
                "records": len(state.records),
                "counts": counts,
                "policies": sorted({str(r["policy"]) for r in state.records if "policy" in r}),
                "devices_seen": sorted({f"{r.get('backend')}:{r.get('device')}" for r in state.records}),
                "environment": env.collect(Path(__file__).resolve().parent.parent),
            }
        )
        return doc
