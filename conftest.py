"""Thin on purpose: the suites' pytest wiring is the installed plugin ``mlaconf.runner.plugin``.

It loads through the ``pytest11`` entry point of the installed package, before any conftest; a
source tree used without installing it (``PYTHONPATH=.``) loads the same module here instead.
"""

from __future__ import annotations

import sys

if "mlaconf.runner.plugin" not in sys.modules:
    pytest_plugins = ["mlaconf.runner.plugin"]
