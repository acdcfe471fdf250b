"""Hypothesis profiles of the MLA suites: ``mla-ci``, ``mla-dev``, ``mla-thorough`` and ``mla-soak``.

The entry point registers them in an MLA run, or when ``--hypothesis-profile`` names one of them, before
hypothesis reads that option in its own ``pytest_configure`` (it refuses names not yet registered);
the names are prefixed so that they never stand in for a project's own ``ci`` or ``dev``. Only an MLA run
loads one: ``--hypothesis-profile NAME`` if given, else ``mla-ci`` when the ``CI`` environment variable is
set and ``mla-dev`` otherwise (:func:`load_default`).

* ``mla-ci``: derandomized (the same examples every run) and bounded, no example database: a CI failure
  reproduces anywhere and the run time is predictable.
* ``mla-dev``: random, more examples, failures saved in ``.hypothesis/examples`` (git-ignored) and
  replayed first next time.
* ``mla-thorough``: many more examples, same database; for a soak run before a release.
* ``mla-soak``: 2,000 derandomized examples, no database: the zoo of correct implementations
  (``harness/zoo.py``) must pass all of them (docs/conformance.md records the run).
"""

from __future__ import annotations

import os
from pathlib import Path

from hypothesis import settings
from hypothesis.database import DirectoryBasedExampleDatabase

#: Relative: examples found in one working directory are replayed there (hypothesis's own default place).
DATABASE_DIR = Path(".hypothesis") / "examples"


def register() -> None:
    """Register the profiles (idempotent)."""
    database = DirectoryBasedExampleDatabase(str(DATABASE_DIR))
    settings.register_profile(
        "mla-ci", max_examples=25, derandomize=True, database=None, deadline=None, print_blob=True
    )
    settings.register_profile("mla-dev", max_examples=60, database=database, deadline=None, print_blob=True)
    settings.register_profile("mla-thorough", max_examples=600, database=database, deadline=None, print_blob=True)
    settings.register_profile(
        "mla-soak", max_examples=2000, derandomize=True, database=None, deadline=None, print_blob=True
    )


def default_profile() -> str:
    return "mla-ci" if os.environ.get("CI") else "mla-dev"


def load_default() -> None:
    """Load the default profile unless one was already chosen (e.g. by ``--hypothesis-profile``)."""
    if settings.get_current_profile_name() == "default":
        settings.load_profile(default_profile())
