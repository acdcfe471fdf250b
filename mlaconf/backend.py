"""The public interface for people who write backends: what a backend receives, returns and raises.

A backend is any object with the :class:`Backend` protocol's members; ``--mla-backend pkg.mod:factory``
(or ``mlaconf run --backend pkg.mod:factory``) selects a zero-argument factory that returns one.  This is
the one module a backend needs to import; the definitions live in :mod:`mlaconf.harness.backend`.
"""

from mlaconf.harness.backend import Availability, Backend, BackendError, BackendInfo, MlaPrefillCall, Unsupported

__all__ = ["Availability", "Backend", "BackendError", "BackendInfo", "MlaPrefillCall", "Unsupported"]
