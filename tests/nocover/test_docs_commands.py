"""Every command the README and docs/usage.md show, run for real in one working folder in the order
the documents show them (a run makes the golden ``mlaconf show`` reads, the two CANN runs are what
``report diff`` compares); how each is narrowed and what it must give: tests/docs_commands.py.  The store the
commands name (``$MLA_GOLDEN_DIR``) is the session's shared one: ``regen smoke`` builds or finds the goldens
every smoke run of the session reads, ``verify smoke --recompute`` recomputes a quarter of them."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.cover.test_registry import MY_LIB
from tests.docs_commands import PLANS, every_command, prepare, run_documented


@pytest.mark.timeout(4 * 3600)  # only a hang: each command has its own limit
def test_every_documented_command_runs_as_documented(tmp_path: Path, shared_golden: Path) -> None:
    prepare(tmp_path, MY_LIB)
    wrong = []
    for command in every_command():
        plan = PLANS[command]
        if plan.not_run:
            continue
        done = run_documented(command, tmp_path, shared_golden)
        out = done.stdout + done.stderr
        if done.returncode != plan.status or plan.text not in out or "Traceback" in out:
            wrong.append(
                f"{command}: exit {done.returncode} (want {plan.status}), wanted {plan.text!r}:\n{out[-1500:]}"
            )
    assert not wrong, "\n\n".join(wrong)
