"""The entry point is a guest in every pytest session: importing it loads almost nothing and changes nothing,
and a session that runs no MLA test never imports the suites' plugin (tests/nocover/test_guest.py checks the
same from an installed wheel, slowly)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.machine import HANG_S
from tests.pytest_runs import run_pytest

#: Modules of the suites' plugin that only an MLA run may load.
MLA_ONLY = ("mlaconf.runner.suites_plugin", "mlaconf.runner.recording", "mlaconf.runner.hypothesis_profiles")

IMPORT_PROBE = """
import json, os, sys
import pytest
before_modules, before_fds = set(sys.modules), set(os.listdir("/proc/self/fd"))
import mlaconf.runner.plugin
new = sorted(set(sys.modules) - before_modules)
print(json.dumps({"new": new, "fds": sorted(set(os.listdir("/proc/self/fd")) - before_fds)}))
"""

#: What importing the entry point may not do: start work (an fd duplicated, a thread), change the process
#: (environment, signal handlers, hypothesis's profile) or load the suites' heavy libraries.
SIDE_EFFECT_PROBE = """
import json, os, signal, sys, threading
import pytest
dups = []
for name in ("dup", "dup2"):
    real = getattr(os, name)
    setattr(os, name, lambda *a, _real=real, _name=name: dups.append(_name) or _real(*a))
environ, threads = dict(os.environ), threading.active_count()
handlers = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
import mlaconf.runner.plugin
heavy = ("numpy", "h5py", "torch", "hypothesis", "ml_dtypes")
print(json.dumps({
    "dups": dups,
    "environ": sorted(k for k in os.environ.keys() | environ.keys() if os.environ.get(k) != environ.get(k)),
    "threads": threading.active_count() - threads,
    "handlers": [s.name for s, h in handlers.items() if signal.getsignal(s) != h],
    "heavy": sorted({m.split(".")[0] for m in sys.modules if m.split(".")[0] in heavy}),
}))
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
    assert ours == ["mlaconf", "mlaconf.runner", "mlaconf.runner.plugin"], ours  # its package, and itself


def test_importing_the_entry_point_does_nothing() -> None:
    """Every pytest session of a project where we are installed imports the entry point: it duplicates no
    descriptor, starts no thread, sets no variable or handler and loads none of the suites' libraries."""
    probe = subprocess.run([sys.executable, "-c", SIDE_EFFECT_PROBE], capture_output=True, text=True, check=True)
    assert json.loads(probe.stdout) == {"dups": [], "environ": [], "threads": 0, "handlers": [], "heavy": []}


def session_facts(tmp_path: Path, *options: str) -> dict[str, object]:
    (tmp_path / "test_foreign.py").write_text(SESSION_TEST % (MLA_ONLY,))
    facts = tmp_path / "facts.json"
    env = {"FACTS": str(facts), "CI": None}  # CI would pick the mla-ci profile
    ran = run_pytest("-q", "-n", "0", "test_foreign.py", *options, cwd=tmp_path, inherit=True, env=env, timeout=HANG_S)
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
