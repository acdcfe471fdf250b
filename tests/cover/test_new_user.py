"""What a new user meets first: the run's verdict in one word with its report's path, a command line that can
be pasted back, one line per bad store path (not one per case)."""

from __future__ import annotations

import shlex
import warnings
from pathlib import Path

import pytest

import mlaconf
from mlaconf.tools import run
from tests.machine import HANG_S
from tests.pytest_runs import run_pytest

pytest_plugins = ["pytester"]
# pytester restores sys.modules after every in-process run: what an inner MLA run imports (torch for run.json's
# device probe, hypothesis's example database for our profiles, ml_dtypes for the judge) is imported here once,
# so each inner run shares it (as tests/cover/test_report_plugin.py does for torch).
pytest.importorskip("torch")
pytest.importorskip("hypothesis.database")
pytest.importorskip("ml_dtypes")

REPO = Path(__file__).resolve().parents[2]

SUITE = """
import pytest

@pytest.mark.parametrize("verdict", [pytest.param(%r, marks=pytest.mark.mla_case(case_id="c1", content_hash="ab"))])
def test_case(verdict, mla_report):
    mla_report.attach({"case_id": "c1", "suite": "fake", "backend": "fake", "verdict": verdict, "message": "",
                       "checks": [], "metrics": {}, "failing": [] if verdict == "passed" else ["x:y"]})
    assert verdict == "passed"
"""


@pytest.mark.parametrize(
    "verdict, word, extra",
    [
        ("passed", "PASS", []),
        ("failed", "FAIL", []),
        # every test passed, yet the run fails (a backend named explicitly is unavailable): the word is pytest's
        ("passed", "FAIL", ["--mla-backend", "atb"]),
    ],
)
def test_the_run_ends_with_its_verdict_and_report(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, verdict: str, word: str, extra: list[str]
) -> None:
    monkeypatch.setenv("PYTHONPATH", str(REPO))
    pytester.makepyfile(test_fake=SUITE % verdict)
    out = pytester.path / "report"
    result = pytester.runpytest("-p", "no:cacheprovider", "--mla-report-dir", str(out), *extra)
    assert result.ret == (0 if word == "PASS" else 1)
    last = [line for line in result.outlines if "MLA run:" in line]
    assert len(last) == 1 and f"MLA run: {word}; report: {out / 'report.html'}" in last[0], result.outlines[-15:]
    assert (out / "report.html").is_file()


def test_the_echoed_command_is_shell_quoted(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(run.subprocess, "Popen", lambda *a, **k: None)  # the echo only: no pytest is started
    monkeypatch.setattr(run, "wait_forwarding_stops", lambda child: run.PytestExit(0, None, False))
    assert mlaconf.main(["run", "--backend", "torch-cpu", "--", "-k", "bf16 and causal"]) == 0
    echoed = capsys.readouterr().out.strip().removeprefix("+ ")
    assert "-k 'bf16 and causal'" in echoed and shlex.split(echoed)[-2:] == ["-k", "bf16 and causal"]


STORE_HINT = "(--out/--golden-dir or $MLA_GOLDEN_DIR names a file)"


@pytest.mark.parametrize("verb", [["regen", "smoke", "--out"], ["verify", "--golden-dir"], ["list", "smoke", "--out"]])
def test_a_store_path_that_is_a_file_is_one_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], verb: list[str]
) -> None:
    not_a_store = tmp_path / "golden.h5"
    not_a_store.write_bytes(b"")
    assert mlaconf.main([*verb, str(not_a_store)]) == 2
    captured = capsys.readouterr()
    assert captured.err.splitlines() == [f"error: golden store {not_a_store} is not a directory " + STORE_HINT]
    assert captured.out == ""


def test_verify_says_when_the_store_does_not_exist(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert mlaconf.main(["verify", "--golden-dir", str(tmp_path / "nowhere")]) == 1
    assert "(no such directory)" in capsys.readouterr().err


def test_the_likely_cause_catalogue_warns_nothing_on_a_row_it_leaves_without_keys() -> None:
    """last_key_dropped leaves batch 1's first causal row no key (3 queries, 2 keys): a NaN prediction there,
    silently; the other rows are finite."""
    import numpy as np

    from mlaconf.golden.building.generate import build_golden
    from mlaconf.golden.specs.spec_build import build_case
    from mlaconf.judge import causes

    fields = {"q_seqlen": [1, 3], "head_num": 1, "dtype": "fp16", "mask_type": "causal", "kv_layout": "padded"}
    golden = build_golden(build_case({**fields, "seed": 1}, source="test"))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        predicted = dict(causes.mistake_goldens(golden))
    dropped = [out for mistake, out in predicted.items() if mistake.name == "last_key_dropped"]
    assert len(dropped) == 1
    nan_rows = np.isnan(dropped[0]).reshape(4, -1).all(axis=1)
    assert nan_rows.tolist() == [False, True, False, False] and np.isfinite(dropped[0][~nan_rows]).all()


def test_a_run_that_generates_goldens_says_so_once(tmp_path: Path) -> None:
    suite = tmp_path / "tiny.toml"
    suite.write_text("[defaults]\nhead_num = 1\n\n[[case]]\nq_seqlen = [4]\n\n[[case]]\nq_seqlen = [5]\n")
    store = tmp_path / "store"
    options = ["--mla-cases", str(suite), "--mla-golden-dir", str(store), "--mla-backend", "torch-cpu"]
    options += ["--mla-report-dir", str(tmp_path / "report"), str(REPO / "cases" / "test_conformance.py")]
    ran = run_pytest("-q", "-n", "0", *options, cwd=tmp_path, inherit=True, timeout=HANG_S)
    assert ran.returncode == 0, ran.output
    notices = [
        line for line in (ran.stdout + ran.stderr).splitlines() if "generating missing goldens on demand" in line
    ]
    assert len(notices) == 1 and f"mlaconf regen SUITE --out {store.resolve()}" in notices[0], notices
    assert len(list(store.glob("*.h5"))) == 2


def test_repro_of_a_plugin_test_id_says_which_option_is_missing(capsys: pytest.CaptureFixture[str]) -> None:
    from mlaconf.golden.specs.suites import load_suite, suite_path

    case = load_suite(suite_path("smoke"))[0].case_id
    assert mlaconf.main(["repro", f"cases/test_conformance.py::test_conformance[{case}-my-npu]", "--out", "x"]) == 2
    err = capsys.readouterr().err
    assert "'my-npu', no built-in backend" in err and "--backend pkg.module:factory" in err
