"""Where a golden store is: the one rule every reader and writer of a store follows (a leaf, so the input
bundles and a ``--ray`` run resolve it without loading the store's HDF5 code)."""

from __future__ import annotations

import os
from pathlib import Path

ENV_DIR = "MLA_GOLDEN_DIR"
#: The store when neither an argument nor $MLA_GOLDEN_DIR names one: ``.golden`` in the working directory.
DEFAULT_DIR_NAME = ".golden"


def chosen_root(root: Path | str | None = None) -> Path:
    """``root``, else ``$MLA_GOLDEN_DIR``, else ``.golden`` in the working directory (not resolved)."""
    return Path(root if root is not None else os.environ.get(ENV_DIR) or Path.cwd() / DEFAULT_DIR_NAME)


def golden_dir_problem(path: Path) -> str | None:
    """Why ``path`` cannot serve as a golden store (not a directory, nothing can be written there), or None:
    checked before a run starts, by the verb that was given it."""
    if path.exists() and not path.is_dir():
        return "not a directory"
    if path.is_dir():
        empty = not any(path.iterdir())
        if empty and not os.access(path, os.W_OK | os.X_OK):
            return "an empty directory this user cannot write: no golden can be read or created there"
        return None
    parent = next((p for p in path.absolute().parents if p.exists()), None)
    if parent is None or not parent.is_dir() or not os.access(parent, os.W_OK | os.X_OK):
        return f"does not exist and cannot be created (no write access to {parent})"
    return None
