"""Largest slack per backend, dtype and mask mode from run records: the tables of docs/conformance.md.

    python -m tests.slack_table REPORT_DIR_OR_RESULTS_JSONL... [--defects]

Reads every ``results.jsonl`` given (or found under a directory) and prints one markdown row per
(backend, dtype, mask): the number of cases, how many failed, the largest slack of the deciding
checks with its check and case, and the largest slack of the model rule and of ATB's rule (which
the default policy records as evidence).
"""

from __future__ import annotations

import argparse
import json
import math
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


@dataclass
class Group:
    cases: int = 0
    failed: int = 0
    worst: float = 0.0
    worst_check: str = ""
    worst_case: str = ""
    by_rule: dict[str, float] = field(default_factory=dict)

    def add(self, record: dict[str, Any]) -> None:
        self.cases += 1
        self.failed += record.get("verdict") == "failed"
        for check in record.get("checks") or []:
            slack = float(check.get("slack", 0.0))
            slack = math.inf if math.isnan(slack) else slack
            name = f"{check['rule']}:{check['metric']}"
            self.by_rule[name] = max(self.by_rule.get(name, 0.0), slack)
            if check.get("decisive", True) and slack > self.worst:
                self.worst, self.worst_check, self.worst_case = slack, name, str(record.get("case_id"))


def records(paths: Iterable[Path]) -> Iterator[dict[str, Any]]:
    """Every record, once per (backend, case id): a case run again later replaces the earlier record."""
    seen: dict[tuple[str, str], dict[str, Any]] = {}
    for path in paths:
        files = sorted(path.rglob("results.jsonl")) if path.is_dir() else [path]
        for file in files:
            for line in file.read_text().splitlines():
                if line.strip():
                    record = json.loads(line)
                    seen[(str(record.get("backend")), str(record.get("case_id")))] = record
    yield from seen.values()


def groups(paths: Iterable[Path]) -> dict[tuple[str, str, str], Group]:
    out: dict[tuple[str, str, str], Group] = {}
    for record in records(paths):
        if record.get("verdict") in ("skipped", None) or not record.get("checks"):
            if record.get("verdict") == "failed":
                out.setdefault((record["backend"], record["dtype"], record["mask"]), Group()).add(record)
            continue
        out.setdefault((str(record["backend"]), str(record["dtype"]), str(record["mask"])), Group()).add(record)
    return out


def table(found: dict[tuple[str, str, str], Group]) -> str:
    lines = [
        "| backend | dtype | mask | cases | failed | largest slack | check | model | atb (evidence) | case |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for (backend, dtype, mask), g in sorted(found.items()):
        model = g.by_rule.get("model:max_err_over_bound", math.nan)
        atb = g.by_rule.get("atb:atb_max_scaled_err", math.nan)
        lines.append(
            f"| {backend} | {dtype} | {mask} | {g.cases} | {g.failed} | {g.worst:.3g} | {g.worst_check} | "
            f"{model:.3g} | {atb:.3g} | {g.worst_case} |"
        )
    return "\n".join(lines)


def matrix(found: dict[tuple[str, str, str], Group]) -> str:
    """One row per backend, one column per dtype x mask: "default / model / atb" largest slacks."""
    columns = sorted({(dtype, mask) for _, dtype, mask in found})
    lines = [
        "| backend | " + " | ".join(f"{d} {m}" for d, m in columns) + " | cases | failed |",
        "|---|" + "---|" * (len(columns) + 2),
    ]
    for backend in sorted({b for b, _, _ in found}):
        cells, cases, failed = [], 0, 0
        for dtype, mask in columns:
            g = found.get((backend, dtype, mask))
            if g is None:
                cells.append("-")
                continue
            cases, failed = cases + g.cases, failed + g.failed
            model = g.by_rule.get("model:max_err_over_bound", math.nan)
            atb = g.by_rule.get("atb:atb_max_scaled_err", math.nan)
            cells.append(f"{g.worst:.2f} / {model:.2f} / {atb:.2f}")
        lines.append(f"| {backend} | " + " | ".join(cells) + f" | {cases} | {failed} |")
    return "\n".join(lines)


def defect_table(paths: Iterable[Path]) -> str:
    """Per backend: failing cases, the largest and smallest deciding slack among them, which rules
    failed, and how many cases ATB's rule (evidence) alone would have failed."""
    rows: dict[str, dict[str, Any]] = {}
    for record in records(paths):
        row = rows.setdefault(str(record["backend"]), dict(cases=0, failed=0, slacks=[], rules={}, atb=0))
        row["cases"] += 1
        checks = record.get("checks") or []
        if any(c["rule"] == "atb" and not c["passed"] for c in checks):
            row["atb"] += 1
        if record.get("verdict") != "failed":
            continue
        row["failed"] += 1
        slack = record.get("worst_slack")
        row["slacks"].append(math.inf if slack is None else float(slack))
        for c in checks:
            if c.get("decisive", True) and not c["passed"]:
                row["rules"][c["rule"]] = row["rules"].get(c["rule"], 0) + 1
    lines = [
        "| backend | failed / cases | largest slack | smallest failing slack | failing rule (cases) "
        "| atb alone fails |",
        "|---|---|---|---|---|---|",
    ]
    for name, row in sorted(rows.items()):
        slacks = row["slacks"]
        rules = ", ".join(f"{k} {v}" for k, v in sorted(row["rules"].items()))
        largest = f"{max(slacks):.3g}" if slacks else "-"
        smallest = f"{min(slacks):.3g}" if slacks else "-"
        lines.append(f"| {name} | {row['failed']}/{row['cases']} | {largest} | {smallest} | {rules} | {row['atb']} |")
    return "\n".join(lines)


def _slack(check: dict[str, Any]) -> float:
    slack = float(check.get("slack", 0.0))
    return math.inf if math.isnan(slack) else slack


def systematic_table(paths: Iterable[Path]) -> str:
    """Per backend and case suite: verdicts (failed), records without one (errors: a test that raised or,
    in an interrupted run, never ran), the temperature test's largest z / x, the systematic rule's
    largest deciding slack min(z / x, effect / floor) over its two tests (it fails a verdict only when
    both pass 1), and the largest slack of any deciding check."""
    rows: dict[tuple[str, str], dict[str, Any]] = {}
    for record in records(paths):
        if record.get("verdict") in ("skipped", None):
            continue
        key = (str(record["backend"]), str(record.get("case_suite") or "-"))
        row = rows.setdefault(key, dict(cases=0, failed=0, errors=0, z=0.0, deciding=0.0, worst=0.0, check=""))
        if record.get("verdict") not in ("passed", "failed"):
            row["errors"] += 1
            continue
        row["cases"] += 1
        row["failed"] += record.get("verdict") == "failed"
        slacks = {f"{c['rule']}:{c['metric']}": _slack(c) for c in record.get("checks") or []}
        row["z"] = max(row["z"], slacks.get("systematic:temperature_z", 0.0))
        for test in ("temperature", "format"):
            both = min(slacks.get(f"systematic:{test}_z", 0.0), slacks.get(f"systematic:{test}_effect", 0.0))
            row["deciding"] = max(row["deciding"], both)
        for check in record.get("checks") or []:
            if check.get("decisive", True) and _slack(check) > row["worst"]:
                row["worst"], row["check"] = _slack(check), f"{check['rule']}:{check['metric']}"
    lines = [
        "| backend | suite | verdicts | failed | errors | temperature z / x | systematic deciding "
        "| largest deciding | check |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for (backend, suite), row in sorted(rows.items()):
        lines.append(
            f"| {backend} | {suite} | {row['cases']} | {row['failed']} | {row['errors']} | {row['z']:.2f} "
            f"| {row['deciding']:.2f} | {row['worst']:.2f} | {row['check']} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("paths", nargs="+", type=Path)
    parser.add_argument("--defects", action="store_true", help="per-backend failure summary instead")
    parser.add_argument("--matrix", action="store_true", help="backend x (dtype, mask) grid of largest slacks")
    parser.add_argument("--systematic", action="store_true", help="per backend and suite: the systematic slacks")
    args = parser.parse_args(argv)
    if args.defects:
        print(defect_table(args.paths))
    elif args.systematic:
        print(systematic_table(args.paths))
    else:
        print(matrix(groups(args.paths)) if args.matrix else table(groups(args.paths)))


if __name__ == "__main__":
    main()
