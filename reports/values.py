"""Record values the schema constrains beyond their JSON type.

:func:`records.validate_types` checks that a field is a string or a number; these checks say a
string or number is one the run side can have written: a digest is 64 lowercase hex digits (it
decides "identical" in a diff, so a mangled one must not pass as a different output), and a
latency is a finite time >= 0 (a NaN or ``Infinity`` latency would make every ratio and rank
test downstream meaningless rather than fail).  Slacks and metrics may be NaN or infinite: a
kernel that writes NaN has an infinite slack, and that is evidence, not damage.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from typing import Any

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
    timing = data.get("timing")
    if isinstance(timing, Mapping):
        for name, value in timing.items():
            if "_ms" in name and (problem := _latency_problem(name, value)):
                return problem
    return None
