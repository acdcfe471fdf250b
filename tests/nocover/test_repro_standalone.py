"""Planted defects of five classes shrink to an eighth by the same check, and a
repro directory reruns in a venv that holds numpy, h5py and torch but no mlaconf.

The venv is made ``--without-pip`` with a ``.pth`` naming the site-packages that hold torch, numpy and
h5py (installing torch again is slow); that directory's other packages are visible too, but mlaconf is
not (the test checks it), and the plug-in defect (tests/standalone_defect.py) imports none of it.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import venv
from pathlib import Path

import numpy
import pytest

from mlaconf import main
from mlaconf.harness import registry
from mlaconf.tools.repro import attempt, resolve, score_elements, shrink

CASE = "fp16-causal-krope_ctkv-b2-s130-kv258-h4-g2-q3d-padded-99377e85"
#: padded, GQA 16/2, CAUSAL with a 256-key prefix: every class of the five applies
BIG = "fp16-causal-krope_ctkv-b1-s300-kv556-h16-g2-q3d-padded-8d9c441e"


@pytest.mark.parametrize(
    ("defect", "cause"),
    [
        ("causal_top_left", "causal_top_left"),
        ("one_key_short", "last_key_dropped"),
        ("scale_ignored", "scale_ignored"),
        ("gqa_modulo", "gqa_modulo"),
        ("padded_as_packed", "padded_as_packed"),
    ],
)
def test_planted_defects_shrink_to_an_eighth(defect: str, cause: str) -> None:
    spec, name = resolve(f"{CASE}-mlaconf.harness.defects:{defect}", None, None)
    backend = registry.create(name)
    first = attempt(spec, backend, "default")
    assert first.failed
    best, _ = shrink(first, backend, "default", budget_s=240, report=lambda _: None)
    assert best.failed and first.check in best.failing_checks
    assert score_elements(best.spec) * 8 <= score_elements(first.spec)
    assert first.cause == cause and best.cause == cause


def test_repro_reruns_in_a_venv_without_mlaconf(tmp_path: Path) -> None:
    out = tmp_path / "repro"
    assert main(["repro", f"{CASE}-tests.standalone_defect:top_left", "--out", str(out)]) == 0
    env_dir = tmp_path / "venv"
    venv.create(env_dir, with_pip=False)
    python = env_dir / "bin" / "python"
    site = subprocess.run(
        [python, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    Path(site, "deps.pth").write_text(str(Path(numpy.__file__).parent.parent) + "\n")
    plugin = tmp_path / "plugin" / "tests"
    plugin.mkdir(parents=True)
    (plugin / "__init__.py").write_text("")
    shutil.copy(Path(__file__).parents[1] / "standalone_defect.py", plugin)
    copied = shutil.copytree(out, tmp_path / "elsewhere")
    clean = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(plugin.parent)}
    probe = subprocess.run([python, "-c", "import mlaconf"], capture_output=True, text=True, env=clean, cwd=tmp_path)
    assert probe.returncode != 0, "the venv must not see mlaconf"
    run = subprocess.run([python, "repro.py"], cwd=copied, capture_output=True, text=True, env=clean, check=True)
    verdict = json.loads((copied / "verdict.json").read_text())
    assert verdict["verdict"] == "failed"
    value = float(run.stdout.split("relative_error ")[1].split()[0])
    assert value == pytest.approx(verdict["repro_numbers"]["relative_error"], rel=1e-5)
    assert f"worst element: {verdict['worst_element']['text']}\n" in run.stdout
