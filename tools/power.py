"""A suite's power: every catalogued defect and every zoo member over its conformance cases.

Cases run one after another (or on ``jobs`` threads), each golden read once for every backend that its
trigger lets reach the case, and judged in-process by :func:`mlaconf.runner.conformance.run_case`, the
code the pytest suite uses, under the default policy.  A defect is killed when some case fails it; a zoo
member (a correct kernel) failing a case is a false alarm.  ``mlaconf power`` (:mod:`.power_report`) is
the command; docs/conformance.md "Power" says how to read its report.
"""

from __future__ import annotations

import dataclasses
import math
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from typing import Any

from mlaconf.facts.processes import thread_share
from mlaconf.golden.building.blocks import with_inputs
from mlaconf.golden.building.generate import build_golden
from mlaconf.golden.building.progress import Progress
from mlaconf.golden.building.reference import blas_threads
from mlaconf.golden.coverage.levels import case_levels
from mlaconf.golden.specs.spec import CaseSpec
from mlaconf.golden.specs.types import GoldenCase
from mlaconf.golden.store.directory import GoldenStore
from mlaconf.harness import defects, zoo
from mlaconf.harness.backend import Backend
from mlaconf.judge.deviations import DeviationSet
from mlaconf.judge.policy import PolicySet
from mlaconf.reports.records import ResultRecord
from mlaconf.runner.conformance import run_case
from mlaconf.runner.identity import conformance_identity
from mlaconf.runner.metamorphic import poison_padding

#: The policy a power run judges with (the one a plain ``mlaconf run`` uses).
POLICY = "default"
#: A kill by a single case is thin: one changed case and the suite no longer sees the defect.
THIN = 1
#: Candidate cases tried per survivor when suggesting cases that kill it.
SUGGESTIONS_TRIED = 4
#: Largest candidate tried on a survivor (useful FLOPs): a suggestion costs a golden and a run.
SUGGESTION_FLOPS = 2e9

Trigger = Mapping[str, Sequence[str]]


@dataclass(frozen=True)
class Subject:
    """What a power run measures: a defect (must fail somewhere) or a zoo member (must never fail)."""

    name: str
    kind: str  # "defect" or "zoo"
    description: str
    make: Callable[[], Backend]
    trigger: Trigger = field(default_factory=dict)
    probe: str | None = None
    source: str | None = None
    releases: str | None = None


def subjects(defect_names: Iterable[str] | None, with_zoo: bool) -> list[Subject]:
    """The catalogue's defects (all, or those named: a pending one too) and, with ``with_zoo``, every zoo member."""
    chosen = list(defects.CATALOGUE) if defect_names is None else list(defect_names)
    unknown = [name for name in chosen if name not in defects.ENTRIES]
    if unknown:
        raise ValueError(f"--defects: no defect named {', '.join(unknown)}; have {', '.join(defects.ENTRIES)}")
    out = []
    for name in chosen:
        entry = defects.ENTRIES[name]
        bug = entry.real_bug
        out.append(
            Subject(
                name,
                "defect",
                entry.description,
                entry.make,
                entry.trigger,
                entry.probe,
                bug.source if bug else None,
                bug.releases if bug else None,
            )
        )
    if with_zoo:
        out += [Subject(name, "zoo", path, getattr(zoo, name)) for name, path in zoo.ZOO.items()]
    return out


def reaches(trigger: Trigger, levels: Mapping[str, frozenset[str]]) -> bool:
    """Whether a case with ``levels`` meets the trigger: for every factor named, a listed level."""
    return all(levels.get(factor, frozenset()) & set(wanted) for factor, wanted in trigger.items())


def levels_text(factor: str, wanted: Iterable[str]) -> str:
    return f"{factor} in {{{', '.join(wanted)}}}"


@dataclass(frozen=True)
class CaseOutcome:
    """One subject on one case: the outcome, the slack and the check that decided it."""

    case: str
    outcome: str
    slack: float | None
    check: str

    @classmethod
    def of(cls, case: str, outcome: str, record: ResultRecord) -> CaseOutcome:
        decisive = [c for c in record.checks if c.get("decisive", True)]
        worst = max(decisive, key=lambda c: _slack(c.get("slack")), default=None)
        if worst is not None:
            check = f"{worst['rule']}:{worst['metric']}"
        else:  # no numeric verdict: the interface, an error or a rerun decided
            check = _non_numeric_check(record.failing[0] if record.failing else "")
        slack = record.worst_slack
        if slack is None and outcome == "failed":
            slack = math.inf
        return cls(case, outcome, None if slack is None else _slack(slack), check)


#: What decided a verdict without numeric checks, by the words of its failure (run_case's messages).
NON_NUMERIC_CHECKS = {"reruns differ": "determinism:reruns", "interface contract": "interface", "error:": "error"}


def _non_numeric_check(failing: str) -> str:
    return next((name for words, name in NON_NUMERIC_CHECKS.items() if words in failing), "other")


def _slack(value: Any) -> float:
    number = float(value) if value is not None else 0.0
    return math.inf if math.isnan(number) else number


@dataclass
class SubjectResult:
    subject: Subject
    reached: int = 0
    skipped: int = 0
    outcomes: list[CaseOutcome] = field(default_factory=list)

    @property
    def failures(self) -> list[CaseOutcome]:
        return [v for v in self.outcomes if v.outcome == "failed"]

    @property
    def known_deviations(self) -> list[CaseOutcome]:
        """The cases a known deviation covers for this subject and that went as it predicts (xfailed)."""
        return [v for v in self.outcomes if v.outcome == "xfailed"]

    def largest(self, only_failing: bool = False) -> CaseOutcome | None:
        """The largest slack of a failing case, or of any case judged by the contract (a known deviation's is its
        prediction's, not a margin)."""
        judged = [v for v in self.outcomes if v.slack is not None and v.outcome != "xfailed"]
        pool = self.failures if only_failing else judged
        return max(pool, key=lambda v: v.slack or 0.0, default=None)

    def smallest_failing(self) -> CaseOutcome | None:
        return min(self.failures, key=lambda v: v.slack or 0.0, default=None)


@dataclass
class PowerRun:
    """Everything a power report says; filled case by case (a partial run is a valid, partial report)."""

    selection: str
    cases: list[CaseSpec]
    results: dict[str, SubjectResult]
    levels: dict[str, dict[str, frozenset[str]]] = field(default_factory=dict)
    done: int = 0
    complete: bool = False
    seconds: float = 0.0
    suggestions: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    #: What stopped the run when a case raised (a full disk while a golden is built ...); None otherwise.
    error: str | None = None

    def defects(self) -> list[SubjectResult]:
        return [r for r in self.results.values() if r.subject.kind == "defect"]

    def zoo(self) -> list[SubjectResult]:
        return [r for r in self.results.values() if r.subject.kind == "zoo"]

    def survivors(self) -> list[SubjectResult]:
        return [r for r in self.defects() if not r.failures]

    def false_alarms(self) -> list[SubjectResult]:
        return [r for r in self.zoo() if r.failures]

    def missing(self, result: SubjectResult) -> str:
        """Why a survivor survived, in the factor model's terms."""
        trigger = result.subject.trigger
        seen = self.levels.values()
        absent = [f for f, wanted in trigger.items() if not any(lv.get(f, frozenset()) & set(wanted) for lv in seen)]
        if absent:
            return "; ".join(f"no case has {levels_text(f, trigger[f])}" for f in absent)
        if not result.reached:
            return "no case has " + " and ".join(levels_text(f, w) for f, w in trigger.items()) + " together"
        probe = f" (probe: {defects.PROBES[result.subject.probe]})" if result.subject.probe else ""
        return f"{result.reached} case(s) reach it{probe}, none fails it: its error stays within their bounds"


def _run_one(
    golden: GoldenCase,
    subject: Subject,
    backend: Backend,
    policy_set: PolicySet,
    deviations: DeviationSet,
) -> CaseOutcome:
    spec = golden.spec
    if subject.probe == "nan_padding":
        golden = dataclasses.replace(golden, inputs=poison_padding(golden.inputs, spec, "nan"))
    result = run_case(
        golden,
        backend,
        policy_set=policy_set,
        policy=POLICY,
        deviations=deviations,
        reruns=2 if subject.probe == "rerun" else 1,
        causes_for="none",
    )
    record = result.ending.record(conformance_identity(spec, backend.name, POLICY))
    return CaseOutcome.of(spec.case_id, result.outcome, record)


class PowerRunner:
    """Runs subjects over cases; :meth:`stop` (from a signal handler) ends it after the cases under way."""

    def __init__(
        self,
        run: PowerRun,
        *,
        golden_dir: str | None,
        policy_set: PolicySet,
        deviations: DeviationSet,
        jobs: int = 1,
        progress: bool = True,
    ) -> None:
        self.run, self.golden_dir, self.jobs = run, golden_dir, max(1, jobs)
        self.policy_set, self.deviations = policy_set, deviations
        self.progress = progress
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._local = threading.local()

    def stop(self) -> None:
        self._stop.set()

    def _store(self) -> GoldenStore:
        """One store per thread: a store reuses one golden's memory from load to load."""
        store = getattr(self._local, "store", None)
        if store is None:
            store = self._local.store = GoldenStore(self.golden_dir, builder=build_golden)
        return store

    def case(self, spec: CaseSpec) -> None:
        levels = case_levels(spec)
        reaching = [r for r in self.run.results.values() if reaches(r.subject.trigger, levels)]
        outcomes: list[tuple[SubjectResult, CaseOutcome]] = []
        if reaching:
            golden = with_inputs(self._store().ensure(spec))  # a sampled golden's inputs drawn once for every subject
            for result in reaching:
                if self._stop.is_set():
                    return  # the case is not counted: a partial case would skew the report
                subject = result.subject
                outcomes.append((result, _run_one(golden, subject, subject.make(), self.policy_set, self.deviations)))
        with self._lock:
            self.run.levels[spec.case_id] = levels
            for result in self.run.results.values():
                if result not in reaching:
                    result.skipped += 1
            for result, outcome in outcomes:
                result.reached += 1
                result.outcomes.append(outcome)
            self.run.done += 1

    @staticmethod
    def _job_threads(share: int) -> None:
        """A job's torch calls on ``share`` threads (torch counts them per calling thread; BLAS's are set for
        the whole pool by :meth:`execute`): ``-j 2`` on 2 cores with each job fanning out over both ran
        15 % longer (docs/benchmarks.md)."""
        import torch

        torch.set_num_threads(share)

    def execute(self) -> None:
        """Every case; returns early (``run.complete`` False) after :meth:`stop`, a KeyboardInterrupt or a
        case that raised (``run.error`` says which and why; the cases done stay in the report)."""
        cases = self.run.cases
        triggers = [r.subject.trigger for r in self.run.results.values()]
        work = {s.case_id: float(s.useful_flops) * sum(reaches(t, case_levels(s)) for t in triggers) for s in cases}
        bar = Progress(len(cases), "power", work=sum(work.values())) if self.progress else None
        share = max(1, thread_share() // self.jobs)
        jobs = ThreadPoolExecutor(self.jobs, initializer=self._job_threads, initargs=(share,))
        with blas_threads(share), jobs as pool:
            pending: dict[Future[None], CaseSpec] = {}
            queue = list(cases)
            try:
                while (queue or pending) and not self._stop.is_set():
                    while queue and len(pending) < self.jobs:
                        spec = queue.pop(0)
                        pending[pool.submit(self.case, spec)] = spec
                    finished, _ = wait(pending, timeout=0.5, return_when=FIRST_COMPLETED)
                    for future in finished:
                        spec = pending.pop(future)
                        try:
                            future.result()
                        except Exception as exc:  # any failure ends the run; the report keeps what was done
                            reason = (str(exc).splitlines() or [""])[0]
                            self.run.error = f"case {spec.name}: {type(exc).__name__}: {reason}"
                            self._stop.set()
                            continue
                        if bar is not None:
                            bar.advance(spec.name, work[spec.case_id], skipped=not work[spec.case_id])
            except KeyboardInterrupt:
                self._stop.set()  # the cases under way stop at their next backend and are not counted
            finally:
                wait(pending)
                if bar is not None:
                    bar.close()
        self.run.complete = self.run.done == len(cases)

    def suggest(self, candidates: Sequence[CaseSpec]) -> None:
        """For each survivor, shipped cases that reach it, each tried (those that kill it listed first): of the
        cases up to :data:`SUGGESTION_FLOPS`, those with the most levels no case of the suite has, then the
        cheapest (a survivor its cases reach and pass needs something they lack)."""
        tried: dict[tuple[str, str], CaseOutcome] = {}
        own = {s.case_id for s in self.run.cases}
        seen = {(f, level) for levels in self.run.levels.values() for f, names in levels.items() for level in names}

        affordable = [s for s in candidates if s.case_id not in own and s.useful_flops <= SUGGESTION_FLOPS]
        levels = {s.case_id: case_levels(s) for s in affordable}  # once per case, not once per survivor

        def rank(spec: CaseSpec) -> tuple[int, int]:
            new = {(f, level) for f, names in levels[spec.case_id].items() for level in names} - seen
            return -len(new), spec.useful_flops

        for result in self.run.survivors():
            subject = result.subject
            reaching = [s for s in affordable if reaches(subject.trigger, levels[s.case_id])]
            found: list[dict[str, Any]] = []
            for spec in sorted(reaching, key=rank)[:SUGGESTIONS_TRIED]:
                if self._stop.is_set():
                    return
                key = (subject.name, spec.case_id)
                if key not in tried:
                    golden = with_inputs(
                        self._store().ensure(spec)
                    )  # a sampled golden's inputs drawn once for every subject
                    tried[key] = _run_one(golden, subject, subject.make(), self.policy_set, self.deviations)
                outcome = tried[key]
                found.append(
                    {
                        "case": spec.case_id,
                        "suite": spec.suite,
                        "name": spec.name,
                        "kills": outcome.outcome == "failed",
                        "slack": outcome.slack,
                        "check": outcome.check,
                        "toml": spec.to_toml(),
                    }
                )
            found.sort(key=lambda s: not s["kills"])
            self.run.suggestions[subject.name] = found


# -- the report -------------------------------------------------------------------------------------


def _fmt(value: float | None) -> str:
    if value is None:
        return "-"
    return "inf" if math.isinf(value) else f"{value:.3g}"


def _names(results: Sequence[SubjectResult]) -> str:
    return f" ({', '.join(r.subject.name for r in results)})" if results else ""


def summary_line(run: PowerRun) -> str:
    """Kills, survivors, thin kills and the zoo's margin in one line (the report's first)."""
    found = run.defects()
    survivors = run.survivors()
    thin = [r for r in found if len(r.failures) == THIN]
    parts = [f"power of {run.selection} ({run.done} of {len(run.cases)} cases)"]
    if not run.complete:
        why = f"stopped by an error: {run.error}" if run.error else "interrupted"
        parts[0] = "PARTIAL " + parts[0] + f" ({why}: kills are a lower bound)"
    if found:
        text = f"{len(found) - len(survivors)} of {len(found)} defects killed"
        text += f", {len(survivors)} survived" + (
            f" ({', '.join(r.subject.name for r in survivors)})" if survivors else ""
        )
        text += f", {len(thin)} thin kill(s) on one case" + (
            f" ({', '.join(r.subject.name for r in thin)})" if thin else ""
        )
        parts.append(text)
    members = run.zoo()
    if members:
        alarms = run.false_alarms()
        margins = [(r.largest(), r.subject.name) for r in members]
        top = max(((v.slack or 0.0, name) for v, name in margins if v is not None), default=(0.0, "-"))
        text = f"zoo: {len(alarms)} false alarm(s) in {len(members)} members"
        text += _names(alarms)
        parts.append(text + f", margin {_fmt(top[0])} ({top[1]}; a correct kernel fails at 1)")
    return "; ".join(parts)


def defect_row(result: SubjectResult) -> dict[str, Any]:
    largest, smallest = result.largest(only_failing=True), result.smallest_failing()
    subject = result.subject
    return {
        "name": subject.name,
        "description": subject.description,
        "trigger": {f: list(levels) for f, levels in subject.trigger.items()},
        "probe": subject.probe,
        "source": subject.source,
        "releases": subject.releases,
        "killed": bool(result.failures),
        "failed_cases": len(result.failures),
        "reached_cases": result.reached,
        "skipped_cases": result.skipped,
        "largest_failing_slack": None if largest is None else largest.slack,
        "smallest_failing_slack": None if smallest is None else smallest.slack,
        "deciding_check": None if largest is None else largest.check,
        "largest_case": None if largest is None else largest.case,
        "failed": [dataclasses.asdict(v) for v in result.failures],
    }


def zoo_row(result: SubjectResult) -> dict[str, Any]:
    largest = result.largest()
    return {
        "name": result.subject.name,
        "path": result.subject.description,
        "cases": result.reached,
        "largest_slack": None if largest is None else largest.slack,
        "check": None if largest is None else largest.check,
        "case": None if largest is None else largest.case,
        "false_alarms": [dataclasses.asdict(v) for v in result.failures],
        "known_deviations": [v.case for v in result.known_deviations],
    }


def report(run: PowerRun, extra: Mapping[str, Any]) -> dict[str, Any]:
    """power.json's content: the summary, then one entry per defect and per zoo member."""
    return {
        "schema": 1,
        "summary": summary_line(run),
        "complete": run.complete,
        "error": run.error,
        "selection": run.selection,
        "policy": POLICY,
        "cases": [s.case_id for s in run.cases],
        "cases_done": run.done,
        "seconds": round(run.seconds, 1),
        **extra,
        "survivors": {
            r.subject.name: {"missing": run.missing(r), "suggested": run.suggestions.get(r.subject.name, [])}
            for r in run.survivors()
        },
        "defects": [defect_row(r) for r in run.defects()],
        "zoo": [zoo_row(r) for r in run.zoo()],
    }


def text_report(run: PowerRun) -> str:
    """The terminal report: the summary line, then a line per defect and per zoo member."""
    lines = [summary_line(run), ""]
    for result in run.defects():
        row = defect_row(result)
        name = result.subject.name
        skipped = f", {result.skipped} skipped (trigger unreachable)" if result.skipped else ""
        if row["killed"]:
            lines.append(
                f"  killed    {name}: {row['failed_cases']} of {result.reached} cases{skipped}; failing slack "
                f"{_fmt(row['largest_failing_slack'])} .. {_fmt(row['smallest_failing_slack'])}, "
                f"decided by {row['deciding_check']}"
            )
        else:
            lines.append(f"  SURVIVED  {name}: {run.missing(result)}{skipped}")
            for suggestion in run.suggestions.get(name, []):
                verdict = f"kills it at {_fmt(suggestion['slack'])}" if suggestion["kills"] else "reaches it, passes"
                lines.append(f"            suggest {suggestion['suite']}:{suggestion['name']} ({verdict})")
    for result in run.zoo():
        row = zoo_row(result)
        if result.failures:
            cases = ", ".join(v.case for v in result.failures[:3])
            lines.append(
                f"  FALSE ALARM zoo {result.subject.name}: a correct kernel failed "
                f"{len(result.failures)} case(s): {cases}"
            )
        else:
            expected = len(row["known_deviations"])
            lines.append(
                f"  zoo       {result.subject.name}: largest slack {_fmt(row['largest_slack'])} ({row['check']})"
                + (f"; {expected} case(s) a known deviation covers, as it predicts" if expected else "")
            )
    return "\n".join(lines)


def markdown_tables(run: PowerRun) -> str:
    """The defect and zoo tables of docs/conformance.md."""
    lines = [
        "| defect | what is wrong | killed | cases failed (of reached) | largest failing slack "
        "| smallest failing slack | deciding check |",
        "|---|---|---|---|---|---|---|",
    ]
    for result in run.defects():
        row = defect_row(result)
        lines.append(
            f"| `{row['name']}` | {row['description']} | {'yes' if row['killed'] else '**no**'} | "
            f"{row['failed_cases']} ({result.reached}) | {_fmt(row['largest_failing_slack'])} | "
            f"{_fmt(row['smallest_failing_slack'])} | {row['deciding_check'] or '-'} |"
        )
    if run.zoo():
        lines += [
            "",
            "| member | rounding path | cases | failed | largest slack | check |",
            "|---|---|---|---|---|---|",
        ]
        for result in run.zoo():
            row = zoo_row(result)
            lines.append(
                f"| `{row['name']}` | {row['path']} | {row['cases']} | {len(row['false_alarms'])} | "
                f"{_fmt(row['largest_slack'])} | {row['check'] or '-'} |"
            )
    return "\n".join(lines) + "\n"


def verdict_banner(run: PowerRun) -> str:
    """The power run's verdict in one coloured line, as a run's page opens: what the exit status says."""
    from html import escape

    found, survivors, alarms = run.defects(), run.survivors(), run.false_alarms()
    if not run.complete:
        cls, text = "incomplete", f"INCOMPLETE: {run.done} of {len(run.cases)} cases judged; kills are a lower bound"
    elif survivors or alarms:
        cls, text = "fail", f"FAIL: {len(survivors)} defect(s) survived, {len(alarms)} correct kernel(s) failed a case"
    else:
        cls, text = "pass", f"PASS: all {len(found)} defects killed, no correct kernel failed a case"
    return f'<div class="banner {cls}" id="verdict">{escape(text)}</div>'


def html_page(run: PowerRun) -> str:
    from mlaconf.reports import html

    defect_rows = [
        [
            r["name"],
            r["description"],
            html.tag("b", "killed" if r["killed"] else "SURVIVED", "" if r["killed"] else "bad"),
            r["failed_cases"],
            r["reached_cases"],
            _fmt(r["largest_failing_slack"]),
            _fmt(r["smallest_failing_slack"]),
            r["deciding_check"] or "-",
            r["source"] or "",
        ]
        for r in map(defect_row, run.defects())
    ]
    zoo_rows = [
        [r["name"], r["path"], r["cases"], len(r["false_alarms"]), _fmt(r["largest_slack"]), r["check"] or "-"]
        for r in map(zoo_row, run.zoo())
    ]
    survivors = [[r.subject.name, run.missing(r)] for r in run.survivors()]
    sections: list[str] = [verdict_banner(run), html.tag("p", summary_line(run))]
    if survivors:
        sections += [html.tag("h2", "Survivors"), html.table(["defect", "what no case has"], survivors)]
    sections += [
        html.tag("h2", "Defects"),
        html.table(
            ["defect", "what is wrong", "verdict", "failed", "reached", "largest", "smallest", "check", "source"],
            defect_rows,
        ),
    ]
    if zoo_rows:
        sections += [
            html.tag("h2", "Zoo"),
            html.table(["member", "path", "cases", "failed", "largest slack", "check"], zoo_rows),
        ]
    return html.page(f"Power of {run.selection}", sections)
