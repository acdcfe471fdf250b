"""How a failing metamorphic record reads: a broken relation, or the conformance failure of a side.

A relation is broken when two of the backend's outputs disagree where it says they must not (the
problems of the record's ``difference``); a tolerance relation whose side fails its own float64
golden records that side in ``conformance_failures`` instead: the conformance failure, which the
test's message and the diff name as such.  Records of runs before that field have none, so any
failure of theirs reads as broken, as it did."""

from __future__ import annotations

from collections.abc import Mapping

from mlaconf.reports.aggregate import fmt, fmt_slack, number
from mlaconf.reports.records import Record


def conformance_text(side: str, worst_slack: float | None) -> str:
    """A side that fails its own golden, in the words of the test's message and of the diff alike."""
    return f"conformance: side {side!r} fails its golden (worst slack {fmt_slack(worst_slack)})"


def side_failures(record: Record) -> list[str]:
    """A relation record's sides that fail their own golden (``conformance_failures``; records of
    runs before that field have none), each as ``conformance: side ... fails its golden``."""
    failures = record.get("conformance_failures")
    sides = [f for f in failures if isinstance(f, Mapping)] if isinstance(failures, list) else []
    return [conformance_text(str(f.get("side")), number(f.get("worst_slack"))) for f in sides]


def relation_broken(record: Record) -> bool:
    """Whether a failing relation is broken (two of the backend's outputs disagree where it says
    they must not), not explained by the conformance failure of a side alone: a record with side
    failures and no problem of the relation itself reports under the conformance failure."""
    difference = record.get("difference")
    problems = difference.get("problems") if isinstance(difference, Mapping) else None
    return bool(problems) or not side_failures(record)


def relation_reason(record: Record) -> str:
    """Why a relation's pair is listed: the largest difference, the failing sides, the problems."""
    difference = record.get("difference")
    if not isinstance(difference, Mapping):
        return "; ".join(side_failures(record)) or str(record.get("message") or "")
    gap = difference.get("max_abs_diff")
    parts = [f"max |diff| {fmt(float(gap), '.4g')}" if isinstance(gap, int | float) else ""]
    parts += [*side_failures(record), *(str(p) for p in difference.get("problems") or [])]
    return "; ".join(p for p in parts if p)
