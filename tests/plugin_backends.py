"""Plug-in backends the framework's tests hand to a child pytest or ``mlaconf run`` by import path
(``--mla-backend tests.plugin_backends:<factory>``), as a user names a module of their own: each wraps the
torch CPU backend and misbehaves in one way a test needs.  A child imports this module through the
repository on its ``PYTHONPATH`` (tests/pytest_runs.py ``child_env``); the variables each one reads say how
it behaves in that child."""

from __future__ import annotations

import os
import time
from typing import Any

import numpy as np
import torch

from mlaconf.harness.backend import Availability, BackendError, BackendInfo
from mlaconf.harness.contract import strict_torch_cpu
from mlaconf.harness.torch_backend import torch_cpu


class _Wrapper:
    """The torch CPU backend under another name (what every backend here starts from)."""

    name, error_contract, deterministic = "wrapper", False, True

    def __init__(self, inner: Any = None) -> None:
        self.inner = inner if inner is not None else torch_cpu()

    def available(self) -> Any:
        return self.inner.available()

    def info(self) -> Any:
        return self.inner.info()

    def synchronize(self) -> None:
        pass

    def run(self, call: Any) -> Any:
        return self.inner.run(call)


class Bf16Broken(_Wrapper):
    """Wrong on bf16 only (``2 out + 1``): a property failure must shrink to a bf16 case."""

    name = "bf16-broken"

    def run(self, call: Any) -> Any:
        out = self.inner.run(call)
        return out * 2 + 1 if str(out.dtype) == "torch.bfloat16" else out


class Slow(_Wrapper):
    """Sleeps ``$SLOW_S`` seconds per call, exits the process (``os._exit(3)``, a crashed worker) on a call
    of at least ``$EXIT_HEADS`` heads, and notes each call that returned in ``$DONE_FILE`` (its head_num
    and when)."""

    name = "slow"

    def run(self, call: Any) -> Any:
        time.sleep(float(os.environ.get("SLOW_S", "0")))
        if call.head_num >= int(os.environ.get("EXIT_HEADS", "99")):
            os._exit(3)
        out = self.inner.run(call)
        if os.environ.get("DONE_FILE"):
            with open(os.environ["DONE_FILE"], "a") as done:
                done.write(f"{call.head_num} {time.time()}\n")
        return out


class Upgraded(_Wrapper):
    """``torch-cpu-strict``; with ``$MODE=rerun`` a new toolkit's: it rejects at another stage (execute),
    perturbs outputs by one ulp on every other call (breaks exact relations and determinism) and hangs on
    the case with 3 heads."""

    name, error_contract = "upgraded", True

    def __init__(self) -> None:
        super().__init__(strict_torch_cpu())
        self.calls = 0

    def run(self, call: Any) -> Any:
        rerun = os.environ.get("MODE") == "rerun"
        try:
            out = self.inner.run(call)
        except BackendError as exc:
            if rerun:
                raise BackendError(exc.status_name, "execute", "new toolkit") from exc
            raise
        if rerun:
            if call.head_num == 3:
                time.sleep(600)
            self.calls += 1
            if self.calls % 2:
                bits = out.view(torch.int16).clone()
                bits.view(-1)[0] += 1
                out = bits.view(out.dtype)
        return out


class Misbehaving(_Wrapper):
    """One misbehaviour per head count: raises (1), returns None (2), an array of the wrong shape (3), a
    list (4), hangs (5: the per-test timeout ends it), takes its xdist worker down (6); else correct."""

    name = "misbehaving"

    def available(self) -> Any:
        return Availability(True)

    def info(self) -> Any:
        return BackendInfo(self.name, "cpu", {"misbehaving": "1"}, version="1")

    def run(self, call: Any) -> Any:
        heads = call.head_num
        if heads == 1:
            raise RuntimeError("kernel launch failed: out of descriptors")
        if heads == 2:
            return None
        if heads == 3:
            return np.zeros((13, 3 * 128), dtype=np.float16)
        if heads == 4:
            return [0.0] * 13
        if heads == 5:
            time.sleep(600)  # hangs: the per-test timeout ends it
        if heads == 6:
            os._exit(3)  # takes its xdist worker down
        return self.inner.run(call)


def bf16_broken() -> Bf16Broken:
    return Bf16Broken()


def slow() -> Slow:
    return Slow()


def upgraded() -> Upgraded:
    return Upgraded()


def misbehaving() -> Misbehaving:
    return Misbehaving()
