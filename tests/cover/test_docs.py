"""The front door stays a front door: the README is short and every link in it and in docs/ resolves."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

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
