"""The front door stays a front door: the README is short and every link in it and in docs/ resolves."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

import mlaconf
from tests.docs_commands import PLANS, documented_commands, every_command
from tests.machine import HANG_S
from tests.pytest_runs import run_pytest

REPO = Path(__file__).resolve().parents[2]
DOCUMENTS = [
    REPO / "README.md",
    REPO / "CHANGELOG.md",
    *sorted((REPO / "docs").glob("*.md")),
    REPO / "native" / "README.md",
]
LINK = re.compile(r"\]\(([^)\s#]*)(?:#([^)\s]*))?\)")
README_LINES = 250


def anchors(path: Path) -> set[str]:
    """GitHub's heading anchors of a markdown file (lowercase, punctuation dropped, spaces to dashes)."""
    text = re.sub(r"```.*?```", "", path.read_text(), flags=re.S)
    headings = re.findall(r"^#+ (.+)$", text, flags=re.M)
    return {re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-") for h in headings}


def broken_links(document: Path) -> list[str]:
    """Relative links of a markdown file whose file or heading does not exist."""
    broken = []
    for target, anchor in LINK.findall(document.read_text()):
        if target.startswith(("http://", "https://", "mailto:")):
            continue
        path = (document.parent / target).resolve() if target else document
        if not path.exists():
            broken.append(f"{target} (no such file)")
        elif anchor and path.suffix == ".md" and anchor not in anchors(path):
            broken.append(f"{target}#{anchor} (no such heading)")
    return broken


@pytest.mark.parametrize("document", DOCUMENTS, ids=lambda p: str(p.relative_to(REPO)))
def test_every_relative_link_resolves(document: Path) -> None:
    broken = broken_links(document)
    assert not broken, f"{document.relative_to(REPO)}: " + "; ".join(broken)


def test_the_readme_is_a_front_door() -> None:
    lines = (REPO / "README.md").read_text().splitlines()
    assert len(lines) <= README_LINES, f"README.md has {len(lines)} lines; reference material belongs in docs/"


def test_the_link_checker_finds_a_broken_link(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    (tmp_path / "other.md").write_text("# Other page\n")
    page.write_text(
        "# Title here\n\n[ok](#title-here) [bad](#nothing) [gone](missing.md) [there](other.md#other-page)\n"
    )
    assert broken_links(page) == ["#nothing (no such heading)", "missing.md (no such file)"]


def run_mlaconf(args: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO), "MLA_GOLDEN_DIR": str(cwd / ".golden")}
    return subprocess.run(
        [sys.executable, "-m", "mlaconf", *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=HANG_S
    )


@pytest.mark.parametrize(("document", "argv"), documented_commands("mlaconf"), ids=lambda v: " ".join(v)[:60])
def test_every_documented_mlaconf_command_parses(
    document: str, argv: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The verbs, options and choices as written (the runs themselves: the next tests and tests/nocover)."""
    import mlaconf

    monkeypatch.chdir(tmp_path)
    for run_dir in (word for word in argv if word.startswith("reports/out/")):  # report verbs check their runs
        (tmp_path / run_dir).mkdir(parents=True)
        (tmp_path / run_dir / "results.jsonl").touch()
    try:
        mlaconf.build_parser().parse_args(argv)
    except SystemExit as refused:
        pytest.fail(f"{document}: 'mlaconf {shlex.join(argv)}' is refused by the parser (exit {refused.code})")


def test_every_documented_pytest_option_exists(tmp_path: Path) -> None:
    listed = run_pytest("--help", inherit=True, timeout=HANG_S)
    assert listed.returncode == 0, listed.stderr[-2000:]
    aliases = {"--junitxml": "--junit-xml"}  # pytest's help lists only the second spelling
    words = (word.split("=")[0] for _, argv in documented_commands("pytest") for word in argv if word[:2] == "--")
    options = {aliases.get(word, word) for word in words}
    assert options, "no pytest command found in the how-tos"
    unknown = sorted(option for option in options if not re.search(rf"(^|[\s,]){re.escape(option)}\b", listed.stdout))
    assert not unknown, f"documented pytest options pytest does not know: {unknown}"


def test_every_documented_command_has_a_plan() -> None:
    """tests/nocover/test_docs_commands.py runs each command the how-tos show as its plan says; a
    command added to the docs without a plan, or a plan whose command the docs dropped, fails here."""
    documented = every_command()
    assert documented and not [c for c in documented if c not in PLANS], [c for c in documented if c not in PLANS]
    assert not [c for c in PLANS if c not in documented], [c for c in PLANS if c not in documented]
    assert all(plan.not_run or plan.text for plan in PLANS.values())  # every run is checked by what it prints


def test_the_cheap_commands_run_as_documented(tmp_path: Path) -> None:
    """list, show (of the README's case) and store in an empty directory; verify there finds nothing to
    verify, which is never green; run's unknown suite."""
    listed = run_mlaconf(["list", "smoke"], tmp_path)
    assert listed.returncode == 0, listed.stderr[-2000:]
    cases = [line.split()[0] for line in listed.stdout.splitlines() if line.startswith(("bf16-", "fp16-"))]
    shown = [argv[1] for _, argv in documented_commands("mlaconf") if argv[0] == "show"]
    assert shown and all(any(case.endswith("-" + h) for case in cases) for h in shown), shown
    assert "list: 169 cases" in listed.stdout + listed.stderr  # the count docs/ quote for smoke
    store = run_mlaconf(["store", "--prune"], tmp_path)
    assert store.returncode == 0 and "unreferenced: 0 files" in store.stdout, store.stderr[-1000:]
    nothing = run_mlaconf(["verify"], tmp_path)
    assert nothing.returncode == 1 and "no golden files selected" in nothing.stdout + nothing.stderr
    refused = run_mlaconf(["run", "--suite", "nosuch"], tmp_path)
    assert refused.returncode == 2 and "invalid choice: 'nosuch'" in refused.stderr  # README: exit 2
    assert "exit 2" in (REPO / "README.md").read_text()


#: Names the documents mention as what does *not* exist (docs/architecture.md: a package at the root).
NOT_CODE = {"mlaconf.tests", "mlaconf.setup", "mlaconf.build"}
#: A code name in backticks: ``mlaconf.room.module.Name.attr`` or ``Class.attr`` (a class of the product).
CODE_NAME = re.compile(r"`(mlaconf(?:\.\w+)+|[A-Z]\w*[a-z]\w*\.\w+)(?:\(\))?`")
ROOMS = tuple(sorted({*mlaconf.ROOMS, "mlaconf"}))


def _has(owner: object, name: str) -> bool:
    fields = {**getattr(owner, "__annotations__", {}), **getattr(owner, "__dataclass_fields__", {})}
    return hasattr(owner, name) or name in fields


def resolves(name: str, classes: dict[str, str]) -> bool:
    """Whether a documented code name exists: the longest importable module prefix, then attributes."""
    import importlib

    parts = name.split(".")
    if parts[0] != "mlaconf":
        home = classes.get(parts[0], "")
        if home.endswith((".cpp", ".h")):  # a class of the native harness: a member by that name
            return re.search(rf"\b{parts[1]}\s*\(", (REPO / home).read_text()) is not None
        if not home:
            return False
        parts = [*home.split("."), *parts]
    for cut in range(len(parts), 0, -1):
        try:
            owner: object = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for attr in parts[cut:]:
            if not _has(owner, attr):
                return False
            owner = getattr(owner, attr, None)
        return True
    return False


def product_classes() -> dict[str, str]:
    """Class name -> its module (``mlaconf.room.module``), or its C++ file for the native harness's."""
    classes = {}
    for room in ROOMS:
        for path in (REPO / room).rglob("*.py"):
            parts = path.relative_to(REPO).with_suffix("").parts
            module = ".".join(parts if parts[0] == "mlaconf" else ("mlaconf", *parts))
            classes.update(dict.fromkeys(re.findall(r"^class (\w+)", path.read_text(), re.M), module))
    for path in [*(REPO / "native").rglob("*.cpp"), *(REPO / "native").rglob("*.h")]:
        classes.update(dict.fromkeys(re.findall(r"^class (\w+)", path.read_text(), re.M), str(path.relative_to(REPO))))
    return classes


def test_every_code_name_in_the_docs_exists() -> None:
    """``mlaconf.x.y`` and ``Class.attr`` in the documents name code that exists (a rename leaves none behind)."""
    classes = product_classes()
    missing = []
    for document in (d for d in DOCUMENTS if d.name != "CHANGELOG.md"):  # history names what was
        for name in sorted(set(CODE_NAME.findall(document.read_text())) - NOT_CODE):
            if not resolves(name, classes):
                missing.append(f"{document.relative_to(REPO)}: `{name}`")
    assert not missing, "documented names the code lacks: " + "; ".join(missing)
    assert not resolves("DeviationSet.unused", classes) and resolves("DeviationSet.entries", classes)
