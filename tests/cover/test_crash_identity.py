"""Under xdist a test whose setup errs, or whose worker dies in its setup before
reporting it, gets a record with the suite its markers declare: the worker reads them from the item,
the controller, which knows the dead worker's test by its id alone, from the test's code."""

from __future__ import annotations

import textwrap
from pathlib import Path

from tests.machine import HANG_S
from tests.pytest_runs import run_pytest

#: A plug-in backend whose probe fails in one test's setup and kills its worker in another's
#: (only on workers: the controller's front door probes it too).
FRAGILE = textwrap.dedent("""
    import os

    from mlaconf.harness.backend import Availability, BackendInfo

    class Fragile:
        name, error_contract, deterministic = "fragile", False, True

        def available(self):
            test = os.environ.get("PYTEST_CURRENT_TEST", "")
            if "gw" in os.environ.get("PYTEST_XDIST_WORKER", "") and "(setup)" in test:
                if "fp16-undefined" in test:
                    os._exit(3)
                if "bf16-mask_free" in test:
                    raise RuntimeError("probe failed")
            return Availability(True)

        def info(self): return BackendInfo(self.name, "cpu", {}, version="1")
        def synchronize(self): pass
        def run(self, call): raise AssertionError("never reached")

    def factory():
        return Fragile()
""")


def test_a_setup_error_and_a_setup_crash_keep_their_suite_under_xdist(tmp_path: Path) -> None:
    (tmp_path / "fragile.py").write_text(FRAGILE)
    done = run_pytest(
        "cases/test_metamorphic.py",
        "-q",
        "-n",
        "2",
        "--mla-backend",
        "fragile:factory",
        "-k",
        "q_layout and (fp16-undefined or bf16-mask_free)",
        report=tmp_path / "report",
        paths=[tmp_path],
        timeout=HANG_S,
    )
    out = done.output
    assert done.returncode == 1, out
    records = {str(r["case_id"]).split("-krope")[0]: r for r in done.records()}
    assert set(records) == {"fp16-undefined", "bf16-mask_free"}, out
    crashed, erred = records["fp16-undefined"], records["bf16-mask_free"]
    assert crashed["failure"]["kind"] == "crash" and "crashed" in crashed["message"], crashed
    assert erred["verdict"] == "error" and "probe failed" in erred["message"], erred
    for record in (crashed, erred):
        assert record["suite"] == "metamorphic" and record["relation"] == "q layout", record
        assert record["backend"] == "fragile", record
