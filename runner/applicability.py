"""Tests a backend's own declarations rule out: recorded as not applicable, never as missing evidence.

A backend that declares no error contract, declares itself non-deterministic, or raises
:class:`mlaconf.harness.backend.Unsupported` for a case it cannot express has not lost evidence:
the test does not apply to it.  :func:`not_applicable` skips such a test with a skip pytest counts
as any other, and :mod:`mlaconf.runner.recording` records its reason in the record's
``not_applicable`` field, which ``report diff`` neither compares nor fails the gate on when both
sides agree (docs/reports.md, "The gate").  A skip for any other reason (a backend unavailable, a
missing golden) stays a plain skip: no evidence.
"""

from __future__ import annotations

from typing import NoReturn

import pytest


class NotApplicable(pytest.skip.Exception):  # type: ignore[misc,name-defined]  # pytest's public skip type
    """The skip of a test the backend's declarations rule out; its message is the reason."""


# pytest's skip summary names an exception outside builtins by its full path; this one reads
# "NotApplicable: <reason>" there and in the record's message
NotApplicable.__module__ = "builtins"


def not_applicable(reason: str) -> NoReturn:
    """Skip the running test as not applicable to its backend, for ``reason`` (one line); the
    skip summary points at the test, as a ``skip`` marker's does, not at this helper."""
    raise NotApplicable(reason, _use_item_location=True)


def declared_reason(excinfo: pytest.ExceptionInfo[BaseException] | None) -> str | None:
    """The reason of a not-applicable skip, or None for any other outcome."""
    if excinfo is None or not isinstance(excinfo.value, NotApplicable):
        return None
    return str(excinfo.value.msg)
