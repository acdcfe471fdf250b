"""The run's golden store: the store the suites' tests read, which notes every golden it had to rebuild.

A golden the store finds damaged or stale (its integrity check, its schema, content hash or generator version)
is rebuilt under the case lock and used; the run says so: the test that found it carries ``golden_rebuilt``
in its record (:func:`mlaconf.runner.recording.complete_report` takes what this store noted), run.json lists
them and the terminal summary prints one line per case (docs/reports.md)."""

from __future__ import annotations

from pathlib import Path

from mlaconf.golden.specs.spec import CaseSpec
from mlaconf.golden.specs.types import GoldenCase
from mlaconf.golden.store.directory import Builder, GoldenStore

#: ``EnsureResult.why`` of a build that rebuilt nothing: no file was there, or the caller forced it.
NOT_A_REBUILD = ("missing", "forced")


class RunStore(GoldenStore):
    """A :class:`GoldenStore` whose :meth:`ensure` notes each golden it rebuilt in ``rebuilt`` (case id -> why,
    the store's words) until the running test's record takes them."""

    def __init__(self, root: Path | str | None, rebuilt: dict[str, str]) -> None:
        super().__init__(root)
        self.rebuilt = rebuilt

    def ensure(self, spec: CaseSpec, builder: Builder | None = None, *, force: bool = False) -> GoldenCase:
        result = self.ensure_result(spec, builder, force=force)
        if result.action == "generated" and result.why not in NOT_A_REBUILD:
            self.rebuilt[spec.case_id] = result.why
        return result.golden
