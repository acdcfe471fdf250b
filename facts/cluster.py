"""The one way into Ray, for ``regen --ray`` and ``run --ray``: the optional extra's name, its import,
and the connection.

Ray is optional (``pip install ".[ray]"``): only ``--ray`` imports it, through :func:`require_ray`, so the
local paths never load it and a missing install is one usage line naming the extra.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
from collections.abc import Iterator
from typing import Any

#: The optional dependency group that installs Ray (pyproject.toml).
EXTRA = "ray"
#: What ``--ray`` without an address means: join the cluster ``$RAY_ADDRESS`` names, else start a local one.
LOCAL = ""


#: Seconds a ``HOST:PORT`` address has to accept a TCP connection before ``--ray`` gives up (Ray itself
#: retries for a minute and more, printing warnings).
CONNECT_TIMEOUT_S = 10.0


#: Signals whose handlers ``ray.init`` replaces and :func:`connected` gives back (the verbs stop on them).
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


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
    check_reachable(target)
    handlers = {signum: signal.getsignal(signum) for signum in STOP_SIGNALS}
    try:
        ray.init(address=target, include_dashboard=False, logging_level="WARNING", log_to_driver=False)
    except Exception as exc:  # ConnectionError, ValueError of a bad address, ...
        raise ClusterUnavailable(f"--ray {address or target or '(local)'}: cannot connect: {exc}") from None
    for signum, handler in handlers.items():  # Ray's core worker aborts on SIGTERM: the verb's clean stop wins
        if handler is not None:
            signal.signal(signum, handler)
    try:
        yield ray
    finally:
        ray.shutdown()


def check_reachable(address: str | None) -> None:
    """A ``HOST:PORT`` or ``ray://HOST:PORT`` address accepts a connection within :data:`CONNECT_TIMEOUT_S`,
    else one :class:`ClusterUnavailable` line (``auto`` and a local cluster are Ray's to find)."""
    if not address or address == "auto":
        return
    host, _, port = address.removeprefix("ray://").rpartition(":")
    if not host or not port.isdigit():
        return  # Ray's own error names what is wrong with the address
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=CONNECT_TIMEOUT_S).close()
    except OSError as exc:
        raise ClusterUnavailable(
            f"--ray {address}: no Ray cluster answers there ({exc or 'timed out'}); start one with "
            "'ray start --head' (docs/cluster.md) or check the address"
        ) from None


def node_resources(ray: Any) -> list[dict[str, float]]:
    """The resources of every alive node (CPU, GPU, NPU, memory in bytes, ...)."""
    return [dict(node.get("Resources", {})) for node in ray.nodes() if node.get("Alive")]
