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
