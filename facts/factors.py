"""The factor model of the contract (``facts/factors.toml``): factors, levels with why each is there,
constraints between levels, the kernel-structure factor sets whose triples matter and the kernels that must
each meet every tiling level pair.

A level marked ``pending`` is part of the grown model (read from a kernel branch, facts/branches.toml) that
the shipped suites' covering sections do not target yet: :meth:`FactorModel.settled` is the model without
them, which coverage percentages and the covering generator use until the sections are regenerated;
``mlaconf coverage`` lists the pending levels apart.

Data only: classifying a case into levels lives in :mod:`mlaconf.golden.coverage.levels`.  Every problem with
the file is a :class:`FactorModelError` naming the file and the entry."""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

if sys.version_info >= (3, 11):
    import tomllib
else:  # Python 3.10: the same parser, from PyPI
    import tomli as tomllib

DEFAULT_PATH = Path(__file__).resolve().parent / "factors.toml"
SCOPES = ("case", "batch")


class FactorModelError(ValueError):
    """The factor model file is malformed; the message names the file and the entry."""


@dataclass(frozen=True)
class Level:
    """One level; ``source`` is the contract line it comes from (a repository file, e.g. ``docs/operator.md
    §4``), empty when a kernel branch of facts/branches.toml names it instead."""

    name: str
    why: str
    source: str = ""
    pending: bool = False


@dataclass(frozen=True)
class Factor:
    """One dimension; ``scope`` is ``batch`` for factors classified batch by batch (q_len, kv_len, prefix)."""

    name: str
    scope: str
    why: str
    levels: tuple[Level, ...]

    @property
    def level_names(self) -> tuple[str, ...]:
        return tuple(level.name for level in self.levels)


@dataclass(frozen=True)
class Constraint:
    """When a case has a level of ``when``, its levels of each factor in ``then`` are among those listed."""

    when: tuple[str, frozenset[str]]
    then: tuple[tuple[str, frozenset[str]], ...]
    why: str
    source: str = ""

    def forbids(self, assignment: Mapping[str, str]) -> bool:
        """Whether one level per factor (a partial assignment) breaks this constraint."""
        factor, levels = self.when
        if assignment.get(factor) not in levels:
            return False
        return any(f in assignment and assignment[f] not in allowed for f, allowed in self.then)


@dataclass(frozen=True)
class StructureSet:
    """Kernel-structure factors whose every valid triple a triple-covering suite holds."""

    name: str
    factors: tuple[str, ...]
    why: str


@dataclass(frozen=True)
class KernelSet:
    """The factors that pick a kernel (``kernel``) and those it tiles by (``factors``): a covering suite holds every
    valid tuple of one level per kernel factor with a level pair of the tiled factors, but a level of ``once``
    (``(factor, level)``) with the kernel alone, not in every pair."""

    name: str
    kernel: tuple[str, ...]
    factors: tuple[str, ...]
    why: str
    once: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True)
class FactorModel:
    factors: tuple[Factor, ...]
    constraints: tuple[Constraint, ...]
    structures: tuple[StructureSet, ...]
    kernels: tuple[KernelSet, ...] = ()

    def factor(self, name: str) -> Factor:
        for factor in self.factors:
            if factor.name == name:
                return factor
        raise KeyError(name)

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(f.name for f in self.factors)

    def allows(self, assignment: Mapping[str, str]) -> bool:
        """Whether no declared constraint forbids these levels together (one level per factor)."""
        return not any(c.forbids(assignment) for c in self.constraints)

    @property
    def pending(self) -> tuple[tuple[str, str], ...]:
        """``(factor, level)`` of every pending level, in model order."""
        return tuple((f.name, lv.name) for f in self.factors for lv in f.levels if lv.pending)

    def settled(self) -> FactorModel:
        """The model without its pending levels (a factor left with none goes, and so do the constraints and
        structure factors that named only what went): what the shipped covering sections target."""
        return _settled(self)


@cache
def _settled(model: FactorModel) -> FactorModel:
    factors = []
    for factor in model.factors:
        levels = tuple(lv for lv in factor.levels if not lv.pending)
        if levels:
            factors.append(dataclasses.replace(factor, levels=levels))
    kept = {f.name: set(f.level_names) for f in factors}
    constraints = []
    for constraint in model.constraints:
        name, when = constraint.when
        when = frozenset(when & kept.get(name, set()))
        then = tuple((f, frozenset(allowed & kept[f])) for f, allowed in constraint.then if f in kept)
        if when and then:
            constraints.append(dataclasses.replace(constraint, when=(name, when), then=then))
    structures = []
    for structure in model.structures:
        names = tuple(f for f in structure.factors if f in kept)
        if len(names) >= 3:
            structures.append(dataclasses.replace(structure, factors=names))
    kernels = []
    for kernel in model.kernels:
        names = tuple(f for f in kernel.factors if f in kept)
        once = tuple((f, lv) for f, lv in kernel.once if lv in kept.get(f, set()))
        if len(names) >= 2 and set(kernel.kernel) <= set(kept):
            kernels.append(dataclasses.replace(kernel, factors=names, once=once))
    return FactorModel(tuple(factors), tuple(constraints), tuple(structures), tuple(kernels))


def _text(entry: Mapping[str, Any], key: str, where: str, *, required: bool = True) -> str:
    value = entry.get(key, None if required else "")
    if not isinstance(value, str) or (required and not value):
        raise FactorModelError(f"{where}: {key!r} must be a non-empty string, got {value!r}")
    return value


def _level_map(raw: Any, known: Mapping[str, Factor], where: str) -> list[tuple[str, frozenset[str]]]:
    if not isinstance(raw, Mapping) or not raw:
        raise FactorModelError(f"{where}: must be a table {{ factor = [levels] }}, got {raw!r}")
    pairs = []
    for name, levels in raw.items():
        if name not in known:
            raise FactorModelError(f"{where}: unknown factor {name!r}; known: {sorted(known)}")
        if not isinstance(levels, list) or not levels or not set(levels) <= set(known[name].level_names):
            wanted = known[name].level_names
            raise FactorModelError(f"{where}: {name} needs a list of its levels {wanted}, got {levels!r}")
        pairs.append((name, frozenset(levels)))
    return pairs


def parse_model(data: Mapping[str, Any], source: str) -> FactorModel:
    """Build and check a model from the parsed TOML (names unique, every reference known)."""
    factors: dict[str, Factor] = {}
    for index, entry in enumerate(data.get("factor", [])):
        where = f"{source}: factor #{index}"
        name = _text(entry, "name", where)
        where = f"{source}: factor {name!r}"
        scope = entry.get("scope")
        if scope not in SCOPES:
            raise FactorModelError(f"{where}: scope must be one of {SCOPES}, got {scope!r}")
        levels = []
        for level in entry.get("levels", []):
            source_text = _text(level, "source", where, required=False)
            pending = level.get("pending", False)
            if not isinstance(pending, bool):
                raise FactorModelError(f"{where}: level {level.get('name')!r}: pending must be true or false")
            levels.append(Level(_text(level, "name", where), _text(level, "why", where), source_text, pending))
        names = [level.name for level in levels]
        if len(names) < 2 or len(set(names)) != len(names):
            raise FactorModelError(f"{where}: needs at least two levels with distinct names, got {names}")
        if name in factors:
            raise FactorModelError(f"{where}: defined twice")
        factors[name] = Factor(name, scope, _text(entry, "why", where), tuple(levels))
    constraints = []
    for index, entry in enumerate(data.get("constraint", [])):
        where = f"{source}: constraint #{index}"
        when = _level_map(entry.get("when"), factors, f"{where}: when")
        if len(when) != 1:
            raise FactorModelError(f"{where}: when names exactly one factor")
        then = tuple(_level_map(entry.get("then"), factors, f"{where}: then"))
        source_text = _text(entry, "source", where, required=False)
        constraints.append(Constraint(when[0], then, _text(entry, "why", where), source_text))
    structures = []
    for index, entry in enumerate(data.get("structure", [])):
        where = f"{source}: structure #{index}"
        names = entry.get("factors")
        if not isinstance(names, list) or len(names) < 3 or not set(names) <= set(factors):
            raise FactorModelError(f"{where}: factors must list three or more of {sorted(factors)}, got {names!r}")
        structures.append(StructureSet(_text(entry, "name", where), tuple(names), _text(entry, "why", where)))
    kernels = []
    for index, entry in enumerate(data.get("kernel", [])):
        where = f"{source}: kernel #{index}"
        picking, tiled = entry.get("kernel"), entry.get("factors")
        for key, names, least in (("kernel", picking, 1), ("factors", tiled, 2)):
            if not isinstance(names, list) or len(names) < least or not set(names) <= set(factors):
                raise FactorModelError(f"{where}: {key} must list {least} or more of {sorted(factors)}, got {names!r}")
        both = sorted(set(picking) & set(tiled))
        if both:
            raise FactorModelError(f"{where}: {both} both pick the kernel and are tiled by")
        once = []
        for item in entry.get("once", []):
            factor, _, level = str(item).partition(".")
            if factor not in tiled or level not in factors[factor].level_names:
                raise FactorModelError(f"{where}: once names 'factor.level' of a tiled factor, got {item!r}")
            once.append((factor, level))
        name, why = _text(entry, "name", where), _text(entry, "why", where)
        kernels.append(KernelSet(name, tuple(picking), tuple(tiled), why, tuple(once)))
    if not factors:
        raise FactorModelError(f"{source}: no [[factor]] tables")
    return FactorModel(tuple(factors.values()), tuple(constraints), tuple(structures), tuple(kernels))


@cache
def load_model(path: Path = DEFAULT_PATH) -> FactorModel:
    """The factor model (default: the shipped ``facts/factors.toml``)."""
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise FactorModelError(f"{path}: cannot read the factor model: {exc}") from exc
    return parse_model(data, str(path))
