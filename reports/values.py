"""Record values the schema constrains beyond their JSON type.

:func:`records.validate_types` checks that a field is a string or a number; these checks say a
string or number is one the run side can have written: a digest is 64 lowercase hex digits (it
decides "identical" in a diff, so a mangled one must not pass as a different output), and a
latency is a finite time >= 0 (a NaN or ``Infinity`` latency would make every ratio and rank
test downstream meaningless rather than fail).  Metrics may be NaN or infinite, and slacks infinite: a
kernel that writes NaN has an infinite slack, and that is evidence, not damage.  A slack is never NaN (the
judge makes a non-finite value's slack Infinity), and a record agrees with itself: a check passes exactly
when its slack is at most 1 (``passed = value <= bound``, ``slack = value / bound``), and a record that says
"passed" has no deciding check that failed and no worst slack above 1.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from typing import Any, TypeGuard

_HEX_DIGEST = re.compile(r"[0-9a-f]{64}")


def _digest_problem(name: str, value: Any) -> str | None:
    if isinstance(value, str) and not _HEX_DIGEST.fullmatch(value):
        return f"record field {name!r}: {value[:80]!r} is not a SHA-256 digest (64 lowercase hex digits)"
    return None


def _latency_problem(name: str, value: Any) -> str | None:
    numbers = value if isinstance(value, list) else [value]
    for n, number in enumerate(numbers):
        if isinstance(number, float) and not (math.isfinite(number) and number >= 0.0):
            where = f"timing.{name}[{n}]" if isinstance(value, list) else f"timing.{name}"
            return f"record field {where!r}: {number!r} is not a time (finite and >= 0)"
        if isinstance(number, int) and not isinstance(number, bool) and number < 0:
            return f"record field 'timing.{name}': {number!r} is not a time (finite and >= 0)"
    return None


def value_problem(data: Mapping[str, Any]) -> str | None:
    """The first value in a record (already checked for JSON types) that the schema rules out, or None."""
    for name, value in data.items():
        if name.endswith("_sha256") and (problem := _digest_problem(name, value)):
            return problem
    if problem := _verdict_problem(data) or _error_map_problem(data.get("error_map")):
        return problem
    timing = data.get("timing")
    if isinstance(timing, Mapping):
        for name, value in timing.items():
            if "_ms" in name and (problem := _latency_problem(name, value)):
                return problem
    return None


def is_number(value: Any) -> TypeGuard[int | float]:
    """A JSON number (a bool is not one, though Python counts it as an int)."""
    return isinstance(value, int | float) and not isinstance(value, bool)


def _verdict_problem(data: Mapping[str, Any]) -> str | None:
    """A NaN slack, a check whose ``passed`` contradicts its slack, or a verdict its own checks contradict."""
    worst = data.get("worst_slack")
    if isinstance(worst, float) and math.isnan(worst):
        return "record field 'worst_slack': NaN is not a slack (a non-finite value's slack is Infinity)"
    checks = [c for c in data.get("checks") or () if isinstance(c, Mapping)]
    for n, check in enumerate(checks):
        slack, passed = check.get("slack"), check.get("passed")
        if isinstance(slack, float) and math.isnan(slack):
            return f"record field 'checks[{n}].slack': NaN is not a slack (a non-finite value's slack is Infinity)"
        if isinstance(passed, bool) and is_number(slack) and (slack > 1 if passed else slack < 1):
            said = "passed" if passed else "failed"
            return f"record field 'checks[{n}]': says {said} with slack {slack:g} (a check passes at slack <= 1)"
    if data.get("verdict") == "passed" and checks:
        failed = [n for n, c in enumerate(checks) if c.get("decisive", True) is not False and c.get("passed") is False]
        if failed:
            return f"record says 'passed' but its deciding check checks[{failed[0]}] failed"
        if is_number(worst) and worst > 1:
            return f"record says 'passed' with worst_slack {worst:g} (above 1 fails)"
    return None


def _error_map_problem(emap: Any) -> str | None:
    """An error map the page would draw wrong: its cells a grid of numbers >= 0 (Infinity for NaN output) or
    null, its strides positive counts, its sequence lengths counts."""
    if not isinstance(emap, Mapping):
        return None  # absent, or not an object (said by the type check)
    values = emap.get("values")
    if not isinstance(values, list) or not all(isinstance(row, list) for row in values):
        return "record field 'error_map.values': expected an array of arrays (token rows x heads)"
    for r, row in enumerate(values):
        for h, cell in enumerate(row):
            if cell is not None and not (is_number(cell) and cell >= 0):  # NaN fails both comparisons
                return f"record field 'error_map.values[{r}][{h}]': {cell!r} is not a slack (a number >= 0 or null)"
    for name in ("row_stride", "head_stride"):
        stride = emap.get(name)
        if not (isinstance(stride, int) and not isinstance(stride, bool) and stride > 0):
            return f"record field 'error_map.{name}': {stride!r} is not a stride (an integer > 0)"
    lengths = emap.get("q_seqlen", [])
    if not isinstance(lengths, list) or not all(
        isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in lengths
    ):
        return "record field 'error_map.q_seqlen': expected an array of counts (integers >= 0)"
    return None
