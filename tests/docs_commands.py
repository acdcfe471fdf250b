"""Every command the README and docs/usage.md show, with what running it must give.

A command is narrowed so it stays cheap, never reworded: the documented arguments all go through, and
after them ``verify --recompute`` gets a quarter of its goldens (``--shard 1/4``), a run (``mlaconf run``:
after ``--``) a one-case suite file (the README's smoke case 0d4a17eb, so
``mlaconf show 0d4a17eb`` finds the golden a run made), no property test, no xdist, and paths in the
test's folder.  tests/cover/test_docs.py checks that every command has a plan here;
tests/nocover/test_docs_commands.py runs them (minutes: ``mlaconf regen smoke -j 2`` is among them).
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
import tarfile
from dataclasses import dataclass
from pathlib import Path

from tests.machine import HANG_S
from tests.pytest_runs import pytest_argv

REPO = Path(__file__).resolve().parents[1]
#: The documents whose shell blocks a new user copies from.
HOW_TOS = [REPO / "README.md", REPO / "docs" / "usage.md"]
#: The tools whose documented commands are planned here (the set-up lines, pip and apt-get, are CI's).
TOOLS = ("mlaconf", "pytest")
#: The README's smoke case 0d4a17eb as a suite of its own (every documented selection keeps it).
TINY = """\
[suite]
name = "tiny"

[[case]]
dtype = "bf16"
mask_type = "causal"
kv_layout = "padded"
q_layout = "3d"
head_num = 1
q_seqlen = [129]
seed = 1
"""
#: After a run's documented arguments: the tiny suite, no hypothesis examples, no xdist.
NARROW = ("--mla-cases", "tiny.toml", "--ignore-glob=/*test_properties.py", "-n", "0")
#: After ``verify --recompute``'s documented arguments: one shard of the selected goldens.
RECOMPUTE_SHARD = ("--shard", "1/4")


@dataclass(frozen=True)
class Plan:
    """What a documented command must do: exit ``status`` and print ``text``; ``not_run`` says why
    a command is not run by the tests at all."""

    status: int = 0
    text: str = ""
    not_run: str = ""


#: The framework's own suites: running them from a test of that suite would run it again.
OWN_SUITE = "the framework's own test suite (CI runs it: .ci/run)"
#: Hours of float64 goldens (deepseek's long cases): docs/benchmarks.md has the measured times.
ALL_GOLDENS = "every shipped suite's goldens: hours of float64 work on 2 cores"

PLANS: dict[str, Plan] = {
    "mlaconf run": Plan(0, "1 passed"),
    "mlaconf run --suite standard --backend torch-cpu": Plan(0, "1 passed"),
    "mlaconf run --backend atb --backend torch-cpu": Plan(1, "backend atb was named explicitly but is unavailable"),
    "mlaconf run --backend my_kernels:factory": Plan(0, "1 passed"),
    "mlaconf run -- -k 'bf16 and causal' --lf": Plan(0, "1 passed"),
    "mlaconf list smoke": Plan(0, "list: 169 cases"),
    "mlaconf regen smoke -j 2": Plan(0, "regen: 169 cases"),
    "mlaconf regen all --shard 2/4": Plan(not_run=ALL_GOLDENS),
    "mlaconf regen --cases my.toml --out /data/golden --force": Plan(0, "regen: 1 generated"),
    "mlaconf verify": Plan(0, "0 bad, 0 problems"),
    "mlaconf verify smoke --recompute": Plan(0, "0 bad, 0 problems"),
    "mlaconf show 0d4a17eb": Plan(0, "bf16-causal-krope_ctkv-b1-s129-h1-q3d-padded-0d4a17eb"),
    "mlaconf store --prune": Plan(0, "unreferenced:"),
    "mlaconf regen all -j 8": Plan(not_run=ALL_GOLDENS),
    "mlaconf run --backend atb --suite all --run-name cann-old": Plan(1, "backend atb was named explicitly"),
    "mlaconf run --backend atb --suite all --run-name cann-new": Plan(1, "backend atb was named explicitly"),
    # without an NPU both runs skip every atb test: nothing compared, and the gate says so
    "mlaconf report diff reports/out/cann-old reports/out/cann-new": Plan(1, "Not run (skipped on both sides"),
    "mlaconf shrink 'test_conformance[fp16-causal-krope_ctkv-b2-s130-kv258-h4-g2-q3d-padded-99377e85-torch-cpu]'": Plan(
        0, "nothing to shrink"
    ),
    "mlaconf repro fp16-causal-krope_ctkv-b2-s130-kv258-h4-g2-q3d-padded-99377e85 --backend my_kernels:factory "
    "--out repro/": Plan(0, "the repro in repro shows a pass"),
    "pytest -n auto": Plan(not_run=OWN_SUITE),
    "pytest cases -n auto --mla-suite standard --mla-backend torch-cpu --junitxml=out.xml": Plan(0, "1 passed"),
    "pytest -n auto -m 'not slow'": Plan(not_run=OWN_SUITE),
    "pytest tests/nocover": Plan(not_run=OWN_SUITE),
    "pytest cases -n auto --mla-suite standard --mla-backend torch-cpu": Plan(0, "1 passed"),
    "pytest cases --mla-suite smoke --mla-backend atb --mla-backend torch-cpu": Plan(
        1, "backend atb was named explicitly"
    ),
    "pytest cases -m 'bf16 and causal'": Plan(0, "1 passed"),
    "pytest cases -k s129 --mla-policy strict --junitxml=out.xml": Plan(0, "1 passed"),
    "pytest cases --mla-seeds 1,2,3,4,5": Plan(0, "5 passed"),
    "pytest cases --mla-cases my_cases.toml": Plan(0, "1 passed"),
    "mlaconf coverage smoke": Plan(0, "2-way 100.0 %"),
    "mlaconf coverage smoke --backend atb": Plan(0, "atb runs 49 of 169 valid cases to a numeric verdict"),
    "mlaconf power --suite smoke -j 2": Plan(
        not_run="about 2,000 backend runs, tens of minutes on 2 cores: tests/nocover/test_power_smoke.py runs it"
    ),
    "mlaconf power --cases my.toml": Plan(1, "survived"),
    "mlaconf import-dump msprobe_dump --out imported.toml": Plan(0, "wrote 2 cases to imported.toml"),
    "mlaconf run --backend torch-cpu -- --mla-cases imported.toml": Plan(
        not_run="the narrowing's tiny suite would replace imported.toml: tests/nocover/test_msprobe_dumps.py runs it"
    ),
}


def documented_commands(tool: str) -> list[tuple[str, list[str]]]:
    """Every ``tool ...`` line of the how-tos' shell blocks, as (document, argv without the tool)."""
    found = []
    for document in HOW_TOS:
        for block in re.findall(r"```(?:bash|sh)\n(.*?)```", document.read_text(), re.S):
            for line in block.replace("\\\n", " ").splitlines():
                words = shlex.split(line, comments=True)
                if words and words[0] == tool:
                    found.append((document.name, words[1:]))
    return found


def every_command() -> list[str]:
    """Each documented command once, in the order the documents show them, as :data:`PLANS` keys."""
    seen = [shlex.join([tool, *argv]) for tool in TOOLS for _, argv in documented_commands(tool)]
    return list(dict.fromkeys(seen))


def narrowed(command: str, work: Path) -> list[str]:
    """The command as run here: documented arguments first, then :data:`NARROW` for runs; ``cases``
    is the repository's, a path outside the working folder is moved into it."""
    tool, *argv = shlex.split(command)
    argv = [str(work / arg.lstrip("/")) if arg.startswith("/data/") else arg for arg in argv]
    if tool == "pytest":
        argv = [str(REPO / "cases") if arg == "cases" else arg for arg in argv]
        return pytest_argv(*argv, *NARROW)  # without the cache provider: its cache would be the repo's
    if argv[0] == "run":
        after = argv.index("--") if "--" in argv else len(argv)
        argv = [*argv[:after], "--", *argv[after + 1 :], *NARROW]
    if argv[0] == "verify" and "--recompute" in argv:  # a quarter of the goldens rebuilt shows the same
        argv = [*argv, *RECOMPUTE_SHARD]
    return [sys.executable, "-m", "mlaconf", *argv]


def run_documented(command: str, work: Path, golden: Path | None = None) -> subprocess.CompletedProcess[str]:
    """Run one documented command in ``work`` (its reports and plug-in modules live there) with the store
    ``golden`` as ``$MLA_GOLDEN_DIR`` (default ``work/.golden``): the documented commands name no store, so
    ``regen smoke`` fills it, ``show`` and ``verify`` read it."""
    store = golden if golden is not None else work / ".golden"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(work), str(REPO)]), "MLA_GOLDEN_DIR": str(store)}
    env.pop("MLA_BACKEND", None)
    return subprocess.run(narrowed(command, work), cwd=work, env=env, capture_output=True, text=True, timeout=HANG_S)


def prepare(work: Path, my_lib: str) -> None:
    """The files the documents assume: the suite files they name and usage.md's own backend example."""
    for name in ("tiny.toml", "my.toml", "my_cases.toml"):
        (work / name).write_text(TINY)
    with tarfile.open(REPO / "tests" / "data" / "msprobe" / "sdpa.tar.xz") as archive:  # a dump msprobe wrote
        archive.extractall(work, filter="data")
    (work / "sdpa").rename(work / "msprobe_dump")
    usage = (REPO / "docs" / "usage.md").read_text()
    (work / "my_kernels.py").write_text(re.search(r"```python\n(# my_kernels\.py.*?)```", usage, re.S).group(1))  # type: ignore[union-attr]
    (work / "my_lib.py").write_text(my_lib)
