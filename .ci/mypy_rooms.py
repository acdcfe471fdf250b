"""mypy over the checkout under the installed module names: ``golden/specs/spec.py`` is ``mlaconf.golden.specs.spec``.

The rooms are top-level folders (docs/architecture.md), which mypy would name ``golden.specs.spec`` and never
connect to the ``mlaconf.golden.specs.spec`` the code imports; this hands mypy each file with its module name,
the same mapping as ``[tool.setuptools.package-dir]``, and the strict settings of ``[tool.mypy]``.
Usage: ``python .ci/mypy_rooms.py`` from the repository root; the exit status is mypy's.
"""

from __future__ import annotations

import sys
from pathlib import Path

import tomllib
from mypy import build
from mypy.main import process_options
from mypy.modulefinder import BuildSource

REPO = Path(__file__).resolve().parent.parent
NAMESPACE = "mlaconf"
CACHE = ".mypy_cache/rooms"


def module_sources(repo: Path) -> list[BuildSource]:
    """Every module of the package (the extensions by their stubs), each under its installed name."""
    config = tomllib.loads((repo / "pyproject.toml").read_text())["tool"]["setuptools"]
    roots = {NAMESPACE: NAMESPACE} | {package: folder for package, folder in config["package-dir"].items()}
    sources = []
    for package, folder in sorted(roots.items()):
        base = repo / folder
        pattern = "*.py*" if package == NAMESPACE else "**/*.py*"
        for path in sorted(p for p in base.glob(pattern) if p.suffix in {".py", ".pyi"}):
            parts = path.relative_to(base).with_suffix("").parts
            module = ".".join((package, *parts[:-1])) if parts[-1] == "__init__" else ".".join((package, *parts))
            sources.append(BuildSource(str(path.relative_to(repo)), module))
    return sources


def main() -> int:
    # A cache of its own: one written by a plain ``mypy`` run names the same files by other modules.
    cache = [] if any(a.startswith("--cache-dir") for a in sys.argv[1:]) else ["--cache-dir", str(REPO / CACHE)]
    args = ["--config-file", str(REPO / "pyproject.toml"), *cache, *sys.argv[1:], "-p", NAMESPACE]
    _, options = process_options(args)
    sources = module_sources(REPO)
    try:
        result = build.build(sources, options)
    except build.CompileError as error:
        result_messages, errors = error.messages, True
    else:
        result_messages, errors = result.errors, bool(result.errors)
    for line in result_messages:
        print(line)
    summary = f"{len(sources)} source files" if not errors else f"{len(result_messages)} messages"
    print(("Success: no issues found in " if not errors else "Found errors: ") + summary)
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
