"""The entry point is a guest in every pytest session: importing it loads almost nothing and changes nothing,
and a session that runs no MLA test never imports the suites' plugin (tests/nocover/test_guest.py checks the
same from an installed wheel, slowly)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.pytest_runs import run_pytest

#: Modules of the suites' plugin that only an MLA run may load.
MLA_ONLY = ("mlaconf.runner.session", "mlaconf.runner.collect", "mlaconf.runner.hypothesis_profiles")

IMPORT_PROBE = """
import json, os, sys
import pytest
before_modules, before_fds = set(sys.modules), set(os.listdir("/proc/self/fd"))
import mlaconf.runner.plugin
new = sorted(set(sys.modules) - before_modules)
print(json.dumps({"new": new, "fds": sorted(set(os.listdir("/proc/self/fd")) - before_fds)}))
"""

SESSION_TEST = """
import json, os, sys
from hypothesis import settings

def test_facts():
    facts = {"loaded": [m for m in %r if m in sys.modules], "profile": settings.get_current_profile_name()}
    with open(os.environ["FACTS"], "w") as out:
        json.dump(facts, out)
"""


def test_importing_the_entry_point_loads_almost_nothing_and_opens_nothing() -> None:
    probe = subprocess.run([sys.executable, "-c", IMPORT_PROBE], capture_output=True, text=True, check=True)
    found = json.loads(probe.stdout)
    ours = [m for m in found["new"] if m.startswith("mlaconf")]
    assert found["fds"] == [], "the entry point opened a file descriptor at import"
    assert not any(m.startswith(("hypothesis", "torch", "numpy", "h5py")) for m in found["new"]), found["new"]
    assert not set(MLA_ONLY) & set(ours)
    assert len(ours) <= 12, f"the entry point imports {len(ours)} of our modules: {ours}"


def session_facts(tmp_path: Path, *options: str) -> dict[str, object]:
    (tmp_path / "test_foreign.py").write_text(SESSION_TEST % (MLA_ONLY,))
    facts = tmp_path / "facts.json"
    env = {"FACTS": str(facts), "CI": None}  # CI would pick the mla-ci profile
    ran = run_pytest("-q", "-n", "0", "test_foreign.py", *options, cwd=tmp_path, inherit=True, env=env, timeout=300)
    assert ran.returncode == 0, ran.output
    result: dict[str, object] = json.loads(facts.read_text())
    return result


def test_a_foreign_session_never_loads_the_suites_plugin(tmp_path: Path) -> None:
    assert session_facts(tmp_path) == {"loaded": [], "profile": "default"}


def test_an_mla_option_loads_it(tmp_path: Path) -> None:
    facts = session_facts(tmp_path, "--mla-backend", "torch-cpu", "--mla-report-dir", str(tmp_path / "report"))
    assert facts == {"loaded": list(MLA_ONLY), "profile": "mla-dev"}


def test_our_hypothesis_profile_can_be_named_in_a_foreign_session(tmp_path: Path) -> None:
    facts = session_facts(tmp_path, "--hypothesis-profile", "mla-ci")
    assert facts == {"loaded": ["mlaconf.runner.hypothesis_profiles"], "profile": "mla-ci"}
