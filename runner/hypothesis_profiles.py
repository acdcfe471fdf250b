"""Hypothesis profiles for the property suites: ``ci``, ``dev`` and ``thorough``.

Select one with hypothesis' own ``--hypothesis-profile NAME``; without it, importing this module
loads ``ci`` when the ``CI`` environment variable is set and ``dev`` otherwise.  The module must
be imported before pytest configures plugins (the root ``conftest.py`` does), because hypothesis
loads a ``--hypothesis-profile`` in ``pytest_configure`` and refuses names not yet registered.

* ``ci``: derandomized (the same examples every run) and bounded, no example database: a CI
  failure reproduces anywhere and the run time is predictable.
* ``dev``: random, more examples, failures saved in ``.hypothesis/examples`` (git-ignored) and
  replayed first next time.
* ``thorough``: many more examples, same database; for a soak run before a release.
* ``soak``: 2,000 derandomized examples, no database: the zoo of correct implementations
  (``tests/zoo.py``) must pass all of them (docs/conformance.md records the run).
"""

from __future__ import annotations

import os
from pathlib import Path

from hypothesis import settings
from hypothesis.database import DirectoryBasedExampleDatabase

#: Relative: examples found in one working directory are replayed there (hypothesis's own default place).
DATABASE_DIR = Path(".hypothesis") / "examples"
PROFILES = ("ci", "dev", "thorough", "soak")


def register() -> None:
    """Register the profiles (idempotent)."""
    database = DirectoryBasedExampleDatabase(str(DATABASE_DIR))
    settings.register_profile("ci", max_examples=25, derandomize=True, deadline=None, database=None, print_blob=True)
    settings.register_profile("dev", max_examples=60, deadline=None, database=database, print_blob=True)
    settings.register_profile("thorough", max_examples=600, deadline=None, database=database, print_blob=True)
    settings.register_profile(
        "soak", max_examples=2000, derandomize=True, deadline=None, database=None, print_blob=True
    )


def default_profile() -> str:
    return "ci" if os.environ.get("CI") else "dev"


def load_default() -> None:
    """Load the default profile unless one was already chosen (e.g. by ``--hypothesis-profile``)."""
    if settings.get_current_profile_name() == "default":
        settings.load_profile(default_profile())


register()
load_default()
