"""The branch inventory of ATB's MLA prefill (``facts/branches.toml``): every condition the operation checks
and the tiling and kernels branch on, where it is in ATB's source at the pinned commit, and the factor levels
(facts/factors.toml) or error cases (cases/errors.toml) that take it; a branch no level takes yet is
``missing``, with a note: the factor model's backlog.

Data only, like :mod:`mlaconf.facts.factors`; :func:`problems` holds the inventory and the model to each other
(tests/cover/test_branches.py).  Every problem with the file is a :class:`BranchInventoryError` naming the file
and the entry."""

from __future__ import annotations

import re
import sys
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

from mlaconf.facts.factors import FactorModel

if sys.version_info >= (3, 11):
    import tomllib
else:  # Python 3.10: the same parser, from PyPI
    import tomli as tomllib

DEFAULT_PATH = Path(__file__).resolve().parent / "branches.toml"
MISSING = "missing"
#: One site: a key of the file's ``[files]`` table, a colon, a line or a ``first-last`` range.
SITE = re.compile(r"(?P<file>[a-z0-9_]+):(?P<first>[1-9][0-9]*)(?:-(?P<last>[1-9][0-9]*))?")
#: A level as a branch names it: ``factor.level``.
LEVEL = re.compile(r"(?P<factor>[a-z_]+)\.(?P<level>[A-Za-z0-9_]+)")


class BranchInventoryError(ValueError):
    """The inventory file is malformed; the message names the file and the entry."""


@dataclass(frozen=True)
class Site:
    """Lines of one file of ATB's source (a path in its repository)."""

    path: str
    first: int
    last: int

    def __str__(self) -> str:
        lines = str(self.first) if self.first == self.last else f"{self.first}-{self.last}"
        return f"{self.path}:{lines}"


@dataclass(frozen=True)
class Branch:
    """One condition ATB branches on: its sites, and the ``(factor, level)`` pairs and error cases that take
    it; ``levels`` empty with a ``note`` when the model has no level for it yet (``missing``)."""

    id: str
    on: str
    at: tuple[Site, ...]
    levels: tuple[tuple[str, str], ...]
    errors: tuple[str, ...] = ()
    note: str = ""

    @property
    def missing(self) -> bool:
        return not self.levels and not self.errors


@dataclass(frozen=True)
class Inventory:
    repository: str
    commit: str
    branches: tuple[Branch, ...]

    @property
    def missing(self) -> tuple[Branch, ...]:
        """The branches no factor level takes yet (the backlog)."""
        return tuple(b for b in self.branches if b.missing)

    def citing(self, factor: str, level: str) -> tuple[Branch, ...]:
        """The branches that name one level."""
        return tuple(b for b in self.branches if (factor, level) in b.levels)


def _text(entry: Mapping[str, Any], key: str, where: str) -> str:
    value = entry.get(key)
    if not isinstance(value, str) or not value:
        raise BranchInventoryError(f"{where}: {key!r} must be a non-empty string, got {value!r}")
    return value


def _names(entry: Mapping[str, Any], key: str, where: str) -> list[str]:
    value = entry.get(key, [])
    if not isinstance(value, list) or not all(isinstance(item, str) and item for item in value):
        raise BranchInventoryError(f"{where}: {key!r} must be a list of names, got {value!r}")
    return value


def _sites(raw: Any, files: Mapping[str, str], where: str) -> tuple[Site, ...]:
    if not isinstance(raw, list) or not raw:
        raise BranchInventoryError(f"{where}: 'at' must list one or more sites FILE:LINE, got {raw!r}")
    sites = []
    for item in raw:
        found = SITE.fullmatch(item) if isinstance(item, str) else None
        if found is None or found["file"] not in files:
            raise BranchInventoryError(
                f"{where}: site {item!r} is not FILE:LINE[-LINE] with FILE one of {sorted(files)}"
            )
        first = int(found["first"])
        last = int(found["last"] or first)
        if last < first:
            raise BranchInventoryError(f"{where}: site {item!r} ends before it starts")
        sites.append(Site(files[found["file"]], first, last))
    return tuple(sites)


def _levels(raw: Any, where: str) -> tuple[tuple[str, str], ...]:
    if raw == MISSING:
        return ()
    pairs = []
    for item in raw if isinstance(raw, list) and raw else [None]:
        found = LEVEL.fullmatch(item) if isinstance(item, str) else None
        if found is None:
            raise BranchInventoryError(
                f"{where}: 'levels' must be {MISSING!r} or a list of 'factor.level' names, got {raw!r}"
            )
        pairs.append((found["factor"], found["level"]))
    return tuple(pairs)


def parse_inventory(data: Mapping[str, Any], source: str) -> Inventory:
    """Build and check an inventory from the parsed TOML (ids unique, every site a known file and a line)."""
    files = data.get("files")
    if not isinstance(files, Mapping) or not all(isinstance(p, str) and p for p in files.values()):
        raise BranchInventoryError(f"{source}: [files] must map short names to paths in ATB's repository")
    branches: dict[str, Branch] = {}
    for index, entry in enumerate(data.get("branch", [])):
        where = f"{source}: branch #{index}"
        name = _text(entry, "id", where)
        where = f"{source}: branch {name!r}"
        if name in branches:
            raise BranchInventoryError(f"{where}: defined twice")
        errors = tuple(_names(entry, "errors", where))
        if "levels" not in entry and not errors:
            raise BranchInventoryError(f"{where}: needs 'levels' (a list, or {MISSING!r} with a note) or 'errors'")
        levels = _levels(entry.get("levels", []), where) if "levels" in entry else ()
        note = entry.get("note", "")
        if entry.get("levels") == MISSING and (errors or not isinstance(note, str) or not note):
            raise BranchInventoryError(f"{where}: a {MISSING!r} branch needs a note and names no error case")
        at = _sites(entry.get("at"), files, where)
        branches[name] = Branch(name, _text(entry, "on", where), at, levels, errors, note)
    if not branches:
        raise BranchInventoryError(f"{source}: no [[branch]] tables")
    return Inventory(_text(data, "repository", source), _text(data, "commit", source), tuple(branches.values()))


@cache
def load_inventory(path: Path = DEFAULT_PATH) -> Inventory:
    """The branch inventory (default: the shipped ``facts/branches.toml``)."""
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise BranchInventoryError(f"{path}: cannot read the branch inventory: {exc}") from exc
    return parse_inventory(data, str(path))


def problems(inventory: Inventory, model: FactorModel, error_cases: Collection[str], root: Path) -> list[str]:
    """What keeps the inventory and the model from holding each other: a branch naming a level the model lacks
    or an error case ``error_cases`` lacks, and a level neither named by a branch nor citing a contract line
    (its ``source``: a file under ``root``, the repository, e.g. ``docs/operator.md §4``)."""
    found = []
    known = {(f.name, lv.name) for f in model.factors for lv in f.levels}
    for branch in inventory.branches:
        found += [
            f"branch {branch.id}: no level {f}.{lv} in the model" for f, lv in branch.levels if (f, lv) not in known
        ]
        found += [f"branch {branch.id}: no error case {name!r}" for name in branch.errors if name not in error_cases]
    named = {pair for branch in inventory.branches for pair in branch.levels}
    for factor in model.factors:
        for level in factor.levels:
            if (factor.name, level.name) in named:
                continue
            cited = level.source.split(" ", 1)[0].split(":", 1)[0]
            if not level.source:
                found.append(f"level {factor.name}.{level.name}: no branch names it and it cites no contract line")
            elif Path(cited).is_absolute() or not (root / cited).is_file():
                found.append(f"level {factor.name}.{level.name}: source {level.source!r} is no file of the repository")
    return found
