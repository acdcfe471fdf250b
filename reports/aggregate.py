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

from mlaconf.facts.operator import UNIT_ROUNDOFF
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


#: The unit of :func:`scale_ulps`, as the diff prints it.
ULP_UNIT = "ulp of the output's scale"


def scale_ulps(record: Record) -> float | None:
    """The largest |error| against the golden in ulp of the output's largest |golden value|, in the output's
    dtype: the error on the output's own scale.  Not the ulp count between the element and its golden, which
    a sign flip next to zero makes thousands for an error far below the bound."""
    metrics = record.get("metrics")
    if not isinstance(metrics, Mapping):
        return None
    err, scale, dtype = metrics.get("max_abs_err"), metrics.get("max_abs_expected"), record.get("dtype")
    if dtype not in UNIT_ROUNDOFF or not isinstance(err, int | float) or not isinstance(scale, int | float):
        return None
    if not (math.isfinite(err) and math.isfinite(scale) and scale > 0):
        return None
    spacing = math.ldexp(2 * UNIT_ROUNDOFF[dtype], math.frexp(scale)[1] - 1)  # ulp at the scale's binade
    return float(err) / spacing


def record_metrics(record: Record) -> dict[str, float]:
    """The record's numeric metrics (non-numbers dropped)."""
    m = record.get("metrics")
    if not isinstance(m, Mapping):
        return {}
    # integers (counts) stay integers, so they print as such; an integral float stays a float
    return {
        k: v if isinstance(v, int) else float(v)
        for k, v in m.items()
        if isinstance(v, int | float) and not isinstance(v, bool)
    }


def failure_kind(record: Record) -> str | None:
    """How a test failed outside its verdict (``exception``, ``crash`` ...), None if it did not."""
    failure = record.get("failure")
    return str(failure.get("kind")) if isinstance(failure, Mapping) else None


def observed(record: Record) -> str:
    """What an error-contract record saw: 'STATUS at stage' or 'accepted'."""
    error = record.get("error")
    if not isinstance(error, Mapping) or not error.get("observed_status"):
        return "accepted"
    return f"{error.get('observed_status')} at {error.get('observed_stage') or '?'}"


def check_map(record: Record) -> dict[str, Mapping[str, Any]]:
    """``rule:metric`` -> check, for every check of the record."""
    checks = [c for c in record.get("checks") or [] if isinstance(c, Mapping)]
    return {f"{c.get('rule', '?')}:{c.get('metric', '?')}": c for c in checks}


def decisive(check: Mapping[str, Any]) -> bool:
    """A check that decides the verdict (one recorded as evidence only does not)."""
    return check.get("decisive", True) is not False


def failing_metrics(record: Record) -> list[str]:
    """Metrics of the deciding checks that fail (evidence-only checks never count)."""
    checks = check_map(record).values()
    return [str(c.get("metric")) for c in checks if decisive(c) and c.get("passed") is False and c.get("metric")]
