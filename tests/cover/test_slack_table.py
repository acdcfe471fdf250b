"""The systematic table of tests.slack_table: the zoo's figures in docs/conformance.md come from it."""

from __future__ import annotations

from pathlib import Path

from tests.runs import record, write_run_dir
from tests.slack_table import systematic_table


def _check(rule: str, metric: str, slack: float, decisive: bool = True) -> dict[str, object]:
    return dict(rule=rule, metric=metric, value=slack, bound=1.0, slack=slack, passed=slack <= 1, decisive=decisive)


def test_deciding_slack_is_the_smaller_of_z_and_effect_and_a_rerun_replaces(tmp_path: Path) -> None:
    checks = [
        _check("model", "max_err_over_bound", 0.3),
        _check("systematic", "temperature_z", 8.0, decisive=False),  # certain, not material
        _check("systematic", "temperature_effect", 0.4, decisive=False),
        _check("systematic", "format_z", 0.0, decisive=False),
        _check("systematic", "format_effect", 0.7, decisive=False),
    ]
    first = write_run_dir(
        tmp_path / "a",
        [
            record("c1", backend="zoo-x", case_suite="standard", checks=checks),
            record("c2", backend="zoo-x", case_suite="standard", verdict="failed", checks=[]),
            record("c3", backend="zoo-x", case_suite="edge", verdict="skipped"),
            record("c4", backend="zoo-x", case_suite="standard", verdict="error"),  # never ran: no verdict
        ],
    )
    again = write_run_dir(tmp_path / "b", [record("c2", backend="zoo-x", case_suite="standard", checks=checks[:1])])
    rows = systematic_table([first, again]).splitlines()[2:]
    assert rows == ["| zoo-x | standard | 2 | 0 | 1 | 8.00 | 0.40 | 0.30 | model:max_err_over_bound |"]
