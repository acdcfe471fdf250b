"""The one way into Ray, for ``regen --ray`` and ``run --ray``: the optional extra's name, its import,
and the connection.

Ray is optional (``pip install ".[ray]"``): only ``--ray`` imports it, through :func:`require_ray`, so the
local paths never load it and a missing install is one usage line naming the extra.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from typing import Any

#: The optional dependency group that installs Ray (pyproject.toml).
EXTRA = "ray"
#: What ``--ray`` without an address means: join the cluster ``$RAY_ADDRESS`` names, else start a local one.
LOCAL = ""


class ClusterUnavailable(Exception):
    """Ray is not installed or the cluster cannot be reached; the message is the one line to print."""


def require_ray() -> Any:
    """The ``ray`` module, or :class:`ClusterUnavailable` naming the extra that installs it."""
    try:
        import ray
    except ImportError as exc:
        raise ClusterUnavailable(
            f"--ray needs Ray, which is not installed: pip install 'mla-prefill-conformance[{EXTRA}]' "
            f'(from a checkout: pip install ".[{EXTRA}]") ({exc})'
        ) from None
    return ray


@contextlib.contextmanager
def connected(address: str | None) -> Iterator[Any]:
    """Ray, connected: the running session if the process already has one (tests start a local cluster
    themselves), else ``address`` (``auto``, ``HOST:PORT``, ``ray://HOST:10001``; empty: ``$RAY_ADDRESS``
    or a new local cluster, stopped again on exit)."""
    ray = require_ray()
    if ray.is_initialized():
        yield ray
        return
    target = address or os.environ.get("RAY_ADDRESS") or None
    try:
        ray.init(address=target, include_dashboard=False, logging_level="WARNING", log_to_driver=False)
    except Exception as exc:  # ConnectionError, ValueError of a bad address, ...
        raise ClusterUnavailable(f"--ray {address or target or '(local)'}: cannot connect: {exc}") from None
    try:
        yield ray
    finally:
        ray.shutdown()


def node_resources(ray: Any) -> list[dict[str, float]]:
    """The resources of every alive node (CPU, GPU, NPU, memory in bytes, ...)."""
    return [dict(node.get("Resources", {})) for node in ray.nodes() if node.get("Alive")]
