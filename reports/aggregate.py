"""A record's numbers read tolerantly, and their aggregates for the tables: per backend x dtype x
mask x cache group, per suite, the worst cases, and how a number is printed in a cell.

The terminal summary, the HTML page, merge and the diff all read records through these, so
a missing or non-numeric field counts the same everywhere (absent, never an exception), and a NaN
error is the worst possible value in every ranking."""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from mlaconf.reports.records import SUITES, VERDICTS, Record, failure_text, record_key


def number(value: Any) -> float | None:
    """A finite-or-not float from a record field, None when absent or not numeric."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value)


def metric(record: Mapping[str, Any], name: str) -> float | None:
    """``record['metrics'][name]`` as a float, tolerant of missing pieces."""
    metrics = record.get("metrics")
    return number(metrics.get(name)) if isinstance(metrics, Mapping) else None


def slack(record: Mapping[str, Any]) -> float | None:
    """Worst slack (measured / allowed; > 1 fails).  NaN counts as infinitely bad."""
    value = number(record.get("worst_slack"))
    return math.inf if value is not None and math.isnan(value) else value


def verdict(record: Mapping[str, Any]) -> str:
    value = str(record.get("verdict", "error"))
    return value if value in VERDICTS else "error"


def failing_summary(record: Mapping[str, Any]) -> str:
    """The failing metric(s) in a few words, else the check closest to its bound."""
    if text := failure_text(record):
        return text
    failing = record.get("failing")
    if isinstance(failing, list) and failing:
        return ", ".join(str(f) for f in failing)
    checks = [c for c in record.get("checks") or [] if isinstance(c, Mapping) and c.get("decisive", True)]
    if checks:  # evidence-only checks (decisive false) never stand for the verdict
        worst = max(checks, key=lambda c: number(c.get("slack")) or -math.inf)
        return f"{worst.get('rule', '?')}:{worst.get('metric', '?')}"
    return str(record.get("message") or "")


GroupKey = tuple[str, str, str, str]
GROUP_FIELDS = ("backend", "dtype", "mask", "cache")


def group_key(record: Mapping[str, Any]) -> GroupKey:
    b, d, m, c = (str(record.get(name, "?")) for name in GROUP_FIELDS)
    return b, d, m, c


def finite(values: Iterable[float | None]) -> list[float]:
    return [v for v in values if v is not None and math.isfinite(v)]


def worst(values: Iterable[float | None]) -> float | None:
    """Largest value where NaN/Inf dominate (a NaN error is the worst possible)."""
    present = [math.inf if math.isnan(v) else v for v in values if v is not None]
    return max(present) if present else None


@dataclass
class GroupStats:
    """Aggregates of one backend x dtype x mask x cache group."""

    key: GroupKey
    counts: dict[str, int] = field(default_factory=lambda: dict.fromkeys(VERDICTS, 0))
    worst_slack: float | None = None
    max_rel_err: float | None = None
    median_rmse: float | None = None
    median_latency_ms: float | None = None
    median_tflops: float | None = None
    records: list[Record] = field(default_factory=list)

    @property
    def total(self) -> int:
        return sum(self.counts.values())


def timing_value(record: Mapping[str, Any], name: str) -> float | None:
    timing = record.get("timing")
    return number(timing.get(name)) if isinstance(timing, Mapping) else None


def _median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def group_stats(records: Iterable[Record]) -> list[GroupStats]:
    """Per-group counts and error aggregates, sorted by group key."""
    groups: dict[GroupKey, GroupStats] = {}
    for record in records:
        key = group_key(record)
        stats = groups.setdefault(key, GroupStats(key))
        stats.counts[verdict(record)] += 1
        stats.records.append(record)
    for stats in groups.values():
        rs = stats.records
        stats.worst_slack = worst(slack(r) for r in rs if verdict(r) != "skipped")
        stats.max_rel_err = worst(metric(r, "max_rel_err") for r in rs)
        stats.median_rmse = _median(finite(metric(r, "rmse") for r in rs))
        stats.median_latency_ms = _median(finite(timing_value(r, "latency_ms_median") for r in rs))
        stats.median_tflops = _median(finite(timing_value(r, "tflops") for r in rs))
    return [groups[k] for k in sorted(groups)]


def case_records(records: Iterable[Record]) -> list[Record]:
    """The conformance records (what the backend x dtype x mask x cache tables are about)."""
    return [r for r in records if str(r.get("suite") or "conformance") not in SUITES[1:]]


def suite_counts(records: Iterable[Record]) -> list[tuple[str, str, dict[str, int]]]:
    """Verdict counts per suite and backend, in :data:`SUITES` order."""
    counts: dict[tuple[str, str], dict[str, int]] = {}
    for record in records:
        suite = str(record.get("suite") or "conformance")
        key = (suite, str(record.get("backend", "?")))
        counts.setdefault(key, dict.fromkeys(VERDICTS, 0))[verdict(record)] += 1
    order = {name: i for i, name in enumerate(SUITES)}
    return [(s, b, c) for (s, b), c in sorted(counts.items(), key=lambda kv: (order.get(kv[0][0], 9), kv[0]))]


def worst_cases(records: Iterable[Record], count: int = 10) -> list[Record]:
    """The ``count`` measured records with the largest worst_slack (skipped ones never rank)."""
    ranked = [r for r in records if slack(r) is not None and verdict(r) != "skipped"]
    ranked.sort(key=lambda r: (-(slack(r) or 0.0), record_key(r)))
    return ranked[:count]


def fmt_slack(value: float | None) -> str:
    """Slack with fixed decimals (1.000 is the bound) unless it is huge."""
    return fmt(value, ".3f" if value is not None and abs(value) < 1000 else ".2e")


def fmt(value: float | None, spec: str = ".3g") -> str:
    """Number for a table cell; '-' when absent."""
    if value is None:
        return "-"
    if math.isnan(value):
        return "nan"
    if math.isinf(value):
        return "inf" if value > 0 else "-inf"
    return format(value, spec)
