"""Suite files: TOML suites, matrix expansion, the shipped suites and loading them by name.

A suite file holds ``[suite]`` (name, description, the cost above which goldens are sampled), optional
``[defaults]``, any number of ``[[case]]`` tables and ``[[matrix]]`` tables, and optional
``[relations.NAME]`` tables.  A matrix expands the product of its list-valued fields; an axis whose
alternatives are tables sets several fields at once (e.g. a batch's q and kv lengths together).  Each
case is built and validated by :func:`mlaconf.golden.specs.spec_build.build_case`; a file's sizes are
checked here, before anything is expanded.  A relation table names a metamorphic relation (the
metamorphic suite's test ``test_NAME``), its kind and the file's cases it runs on
(:class:`RelationTable`), so the relations' cases are a suite's cases
like any other: listed, built ahead and covered by the same verbs.
"""

from __future__ import annotations

import importlib.resources
import itertools
import math
import stat
import sys
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mlaconf.golden.specs.spec import CaseSpec, SpecError
from mlaconf.golden.specs.spec_build import FIELD_NAMES, SAFE_NAME, Fail, build_case, show_value

if sys.version_info >= (3, 11):
    import tomllib
else:  # Python 3.10: the same parser, from PyPI
    import tomli as tomllib

#: Most cases one suite file may define (matrix products are counted before they are expanded) and
#: most sequence-length entries in all its cases together.
MAX_CASES = 10_000
MAX_FILE_ENTRIES = 1 << 21
MAX_SUITE_BYTES = 16 << 20

#: The package whose ``*.toml`` files are the shipped suites (package data, so installs carry them).
SUITES_PACKAGE = "mlaconf.cases"
#: A relation's kinds: ``exact`` (the related outputs must be bit-identical) or ``tolerance`` (each side
#: passes its own float64 golden under the run's policy).
RELATION_KINDS = ("exact", "tolerance")
RELATION_KEYS = ("cases", "kind")
#: A ``[suite]`` table's keys: ``sample_above`` is the useful FLOPs above which a case that does not say
#: ``rows`` gets a sampled golden (``rows = "sample"``; docs/usage.md "Sampled goldens").
SUITE_KEYS = frozenset({"name", "description", "sample_above"})


@dataclass(frozen=True)
class RelationTable:
    """One ``[relations.NAME]`` table: the relation's kind and the file's cases it runs on."""

    name: str
    kind: str
    cases: tuple[CaseSpec, ...]


@dataclass(frozen=True)
class Suite:
    """A suite file read and checked: its cases and its relations (a file without relations has none)."""

    cases: list[CaseSpec]
    relations: dict[str, RelationTable]


def suites_dir() -> Path:
    """Where the shipped suite files live, in a checkout or an installed package alike."""
    return Path(str(importlib.resources.files(SUITES_PACKAGE)))


def read_toml(path: Path, fail: Callable[[str, str], Exception]) -> dict[str, Any]:
    """Parse a TOML file; ``fail(field, message)`` builds the caller's error (which names the file)."""
    try:
        status = path.stat()
        if not stat.S_ISREG(status.st_mode):  # a FIFO or a device would block the read, never end it
            raise fail("<file>", "not a regular file (a FIFO, device or folder is no suite file)")
        size = status.st_size
        if size > MAX_SUITE_BYTES:
            raise fail("<file>", f"{size} bytes; at most {MAX_SUITE_BYTES} are read")
        document: dict[str, Any] = tomllib.loads(path.read_bytes().decode("utf-8"))
        return document
    except UnicodeDecodeError as exc:
        raise fail("<file>", f"not UTF-8 text: {exc}") from exc
    except tomllib.TOMLDecodeError as exc:
        raise fail("<toml>", f"not valid TOML: {exc}") from exc
    except RecursionError as exc:
        raise fail("<toml>", "nested too deeply") from exc
    except OSError as exc:
        raise fail("<file>", f"cannot read: {exc}") from exc


def _matrix_axes(matrix: Mapping[str, Any], fail: Fail) -> list[list[dict[str, Any]]]:
    """A matrix table's axes: each a list of alternatives (field dictionaries), none empty."""
    axes: list[list[dict[str, Any]]] = []
    for key, value in matrix.items():
        if key in ("q_seqlen", "kv_seqlen"):
            is_axis = isinstance(value, list) and value and all(isinstance(v, (list, dict)) for v in value)
            axes.append([{key: alt} for alt in (value if is_axis else [value])])
        elif key in FIELD_NAMES:
            axes.append([{key: alt} for alt in (value if isinstance(value, list) else [value])])
        elif isinstance(value, list) and all(isinstance(v, dict) for v in value):
            axes.append([dict(v) for v in value])  # a zipped axis: each table sets several fields
        else:
            raise fail(key, "unknown field (a zipped axis needs a list of tables)")
        if not axes[-1]:
            raise fail(key, "an axis needs at least one value")
    return axes


def _matrix_rows(axes: list[list[dict[str, Any]]]) -> Iterator[dict[str, Any]]:
    """Expand the product of a matrix's axes into field dictionaries."""
    for combo in itertools.product(*axes):
        row: dict[str, Any] = {}
        for part in combo:
            row.update(part)
        yield row


def _tables(value: Any, fail: Fail, what: str) -> list[Mapping[str, Any]]:
    """``[[case]]`` / ``[[matrix]]``: an array of tables."""
    if not isinstance(value, list) or not all(isinstance(item, Mapping) for item in value):
        raise fail(what, f"must be an array of tables ([[{what}]]), got {show_value(value)}")
    return value


def _relation_tables(value: Any, cases: list[CaseSpec], fail: Fail) -> dict[str, RelationTable]:
    """``[relations.NAME]`` tables, each checked: exactly ``kind`` and ``cases``, the cases named by the
    file's ``[[case]]`` names."""
    if not isinstance(value, Mapping):
        raise fail("relations", f"must be tables ([relations.NAME]), got {show_value(value)}")
    by_name = {case.name: case for case in cases}
    tables: dict[str, RelationTable] = {}
    for name, table in value.items():
        where = f"relations.{name}"
        if not SAFE_NAME.fullmatch(name):
            raise fail(where, f"a relation's name must match {SAFE_NAME.pattern}")
        if not isinstance(table, Mapping):
            raise fail(where, f"must be a table with keys {list(RELATION_KEYS)}, got {show_value(table)}")
        extra = sorted(set(table) - set(RELATION_KEYS))
        if extra:
            raise fail(f"{where}.{extra[0]}", f"unknown key; known keys: {list(RELATION_KEYS)}")
        missing = [key for key in RELATION_KEYS if key not in table]
        if missing:
            raise fail(f"{where}.{missing[0]}", "is required")
        if table["kind"] not in RELATION_KINDS:
            raise fail(f"{where}.kind", f"{show_value(table['kind'])} is not one of {', '.join(RELATION_KINDS)}")
        names = table["cases"]
        if not isinstance(names, list) or not names or not all(isinstance(n, str) for n in names):
            raise fail(f"{where}.cases", f"must be a non-empty list of case names, got {show_value(names)}")
        unknown = [n for n in names if n not in by_name]
        if unknown:
            raise fail(f"{where}.cases", f"names no case of the file: {', '.join(unknown)}")
        doubled = [n for n in names if sum(case.name == n for case in cases) > 1]
        if doubled:
            raise fail(f"{where}.cases", f"names several cases of the file: {', '.join(doubled)}")
        tables[name] = RelationTable(name, table["kind"], tuple(by_name[n] for n in names))
    return tables


def load_suite(path: str | Path, *, validate: bool = True) -> list[CaseSpec]:
    """Load one suite file's cases (:func:`read_suite`)."""
    return read_suite(path, validate=validate).cases


def load_relations(path: str | Path) -> dict[str, RelationTable]:
    """One suite file's relations by name (:func:`read_suite`)."""
    return read_suite(path).relations


def read_suite(path: str | Path, *, validate: bool = True) -> Suite:
    """Load one suite file; duplicate cases (same content hash) are an error naming both.

    Any problem with the file, whatever its content, is a :class:`SpecError` naming file, case (or
    relation) and field; sizes are checked before anything is expanded (at most MAX_CASES cases,
    MAX_FILE_ENTRIES sequence lengths in all)."""
    path = Path(path)
    source = str(path)

    def file_fail(field_name: str, message: str) -> SpecError:
        return SpecError(source, "<file>", field_name, message)

    data = read_toml(path, file_fail)
    unknown = set(data) - {"suite", "defaults", "case", "matrix", "relations"}
    if unknown:
        raise file_fail(sorted(unknown)[0], "unknown top-level table")
    meta, defaults = data.get("suite", {}), data.get("defaults", {})
    for what, table in (("suite", meta), ("defaults", defaults)):
        if not isinstance(table, Mapping):
            raise file_fail(what, f"must be a table ([{what}]), got {show_value(table)}")
    for what, table, known in (("suite", meta, SUITE_KEYS), ("defaults", defaults, FIELD_NAMES)):
        extra = set(table) - known
        if extra:
            raise file_fail(f"{what}.{sorted(extra)[0]}", f"unknown key in table [{what}]; known keys: {sorted(known)}")
    suite = meta.get("name", path.stem)
    if not isinstance(suite, str) or not SAFE_NAME.fullmatch(suite):
        raise file_fail(
            "suite.name", f"must match {SAFE_NAME.pattern} (default: the file name), got {show_value(suite)}"
        )
    if not isinstance(meta.get("description", ""), str):
        raise file_fail("suite.description", f"must be a string, got {show_value(meta['description'])}")
    sample_above = meta.get("sample_above")
    if sample_above is not None and not (
        isinstance(sample_above, (int, float)) and not isinstance(sample_above, bool) and sample_above >= 0
    ):
        raise file_fail("suite.sample_above", f"must be a number of FLOPs >= 0, got {show_value(sample_above)}")
    tables = _tables(data.get("case", []), file_fail, "case")
    if len(tables) > MAX_CASES:
        raise file_fail("case", f"the file defines {len(tables)} cases; at most {MAX_CASES}")
    raws: list[dict[str, Any]] = [{**defaults, **case} for case in tables]
    planned = len(raws)
    matrices = []
    for m_index, matrix in enumerate(_tables(data.get("matrix", []), file_fail, "matrix")):

        def matrix_fail(field_name: str, message: str, label: str = f"matrix #{m_index}") -> SpecError:
            return SpecError(source, label, field_name, message)

        axes = _matrix_axes(matrix, matrix_fail)
        planned += math.prod(len(axis) for axis in axes)
        if planned > MAX_CASES:
            raise matrix_fail("<matrix>", f"the file would define {planned}+ cases; at most {MAX_CASES}")
        matrices.append(axes)
    for axes in matrices:
        raws.extend({**defaults, **row} for row in _matrix_rows(axes))
    cases: list[CaseSpec] = []
    seen: dict[str, str] = {}
    entries = 0
    for index, raw in enumerate(raws):
        spec = build_case(raw, source=source, suite=suite, index=index, validate=validate)
        explicit = "rows" in raw or "inputs" in raw  # explicit inputs are never sampled (their rows are data)
        if sample_above is not None and not explicit and spec.useful_flops > sample_above:
            spec = build_case({**raw, "rows": "sample"}, source=source, suite=suite, index=index, validate=validate)
        entries += spec.batch + len(spec.kv_seqlen)
        if entries > MAX_FILE_ENTRIES:
            raise SpecError(
                source,
                spec.name,
                "q_seqlen",
                f"the file's cases hold more than {MAX_FILE_ENTRIES} sequence lengths in all",
            )
        if spec.content_hash in seen:
            raise SpecError(source, spec.name, "<case>", f"duplicates case {seen[spec.content_hash]!r}")
        seen[spec.content_hash] = spec.name
        cases.append(spec)
    return Suite(cases, _relation_tables(data.get("relations", {}), cases, file_fail))


def suite_path(name: str) -> Path:
    return suites_dir() / f"{name}.toml"


def available_suites() -> list[str]:
    """Suites shipped in ``cases/`` (every TOML file that has a ``[suite]`` table)."""
    names = []
    for path in sorted(suites_dir().glob("*.toml")):
        try:
            is_suite = "suite" in tomllib.loads(path.read_text())
        except (tomllib.TOMLDecodeError, OSError, UnicodeDecodeError):
            is_suite = True  # listed all the same: only what selects it fails, with file and line (load_suite)
        if is_suite:
            names.append(path.stem)
    return names


#: Shipped suites ``all`` leaves out: ``errors`` has no goldens (its cases are rejected), ``long`` is
#: device-scale (its sampled goldens still take a golden host: name it to build or run it).
NOT_IN_ALL = ("errors", "long")


def suites_in_all() -> list[str]:
    """The shipped suites ``all`` stands for."""
    return [name for name in available_suites() if name not in NOT_IN_ALL]


def suite_paths(names: Iterable[str]) -> list[Path]:
    """The files of suites named (``all`` expands to :func:`suites_in_all`), each once."""
    wanted: list[str] = []
    for name in names:
        if name == "all":
            wanted.extend(suites_in_all())
        else:
            wanted.append(name)
    paths: list[Path] = []
    for name in dict.fromkeys(wanted):
        path = suite_path(name)
        if not SAFE_NAME.fullmatch(name) or not path.exists():
            raise SpecError(str(path), "<file>", "<suite>", f"no suite named {name!r}; have {available_suites()}")
        paths.append(path)
    return paths


def load_suites(names: Iterable[str]) -> list[CaseSpec]:
    """Load suites by name (:func:`suite_paths`)."""
    return [case for path in suite_paths(names) for case in load_suite(path)]
