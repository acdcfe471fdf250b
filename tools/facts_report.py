"""The facts report of ``mlaconf ascend``: what the device did to every unconfirmed fact, and the change
to the project's facts it implies, ready to commit.

The unconfirmed facts are the known deviations with ``status = "unconfirmed"``
(judge/known_deviations.toml), the error cases with an ``unconfirmed_at`` boundary (cases/errors.toml)
and the unconfirmed torch_npu op rules (facts/torch_npu_ops.py).  The evidence is the result records of
the run directories (``<out>/runs/*/results.jsonl``); a fact no record touched says so.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections import Counter
from pathlib import Path
from typing import Any

from mlaconf.facts.evidence import UNCONFIRMED
from mlaconf.facts.torch_npu_ops import RULES
from mlaconf.facts.versions import RELEASE_UNKNOWN
from mlaconf.golden.specs.spec import CaseSpec
from mlaconf.golden.specs.suites import load_suites
from mlaconf.judge.deviations import DeviationSet, load_deviations

REPORT_JSON = "facts_report.json"
REPORT_MD = "facts_report.md"


def read_records(runs: Path) -> tuple[list[dict[str, Any]], list[str]]:
    """Every record under ``runs/*/results.jsonl``, and one line per unreadable line or file."""
    records: list[dict[str, Any]] = []
    problems: list[str] = []
    for path in sorted(runs.glob("*/results.jsonl")):
        try:
            lines = path.read_text(encoding="utf-8", errors="replace").splitlines()
        except OSError as exc:
            problems.append(f"{path}: unreadable ({exc.strerror})")
            continue
        for number, line in enumerate(lines, 1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except ValueError:
                problems.append(f"{path}:{number}: not a JSON record")
                continue
            if isinstance(record, dict):
                records.append(record)
    return records, problems


def _release(record: dict[str, Any]) -> str | None:
    versions = record.get("backend_versions") or {}
    return versions.get("atb") if isinstance(versions, dict) else None


def _deviation_fact(entry_id: str, versions: str, seen: list[dict[str, Any]]) -> dict[str, Any]:
    where = f'judge/known_deviations.toml, [[deviation]] id = "{entry_id}"'
    verdicts = Counter(str(r.get("verdict")) for r in seen)
    releases = sorted({str(_release(r)) for r in seen})
    devices = sorted({str(r.get("device", "?")) for r in seen})
    on = f"ATB {', '.join(releases)} on {', '.join(devices)}"
    if not seen:
        change = "none: no case of this run exercised it"
    elif set(verdicts) == {"xfailed"}:
        change = f'{where}: status = "confirmed"; add to reason "seen on {on}"'
    elif "xpassed" in verdicts:
        change = (
            f"{where}: the deviation did not happen on {on}: bound versions (now {versions or 'any'!r}) below "
            "that release, or remove the entry if the documented behaviour is right there too"
        )
    else:
        change = f"{where}: something else happened ({dict(verdicts)}): read the failing records before changing it"
    return {
        "fact": f"known deviation {entry_id}",
        "where": where,
        "device_did": dict(verdicts),
        "on": on,
        "change": change,
    }


def _boundary_fact(case: CaseSpec, seen: list[dict[str, Any]]) -> dict[str, Any]:
    where = f'cases/errors.toml, [[case]] name = "{case.name}"'
    answers = Counter(
        (str(_release(r)), str((r.get("error") or {}).get("observed_status")), str(r.get("device", "?"))) for r in seen
    )
    bounds = ", ".join(case.unconfirmed_at)
    changes = []
    for (release, status, device), _ in sorted(answers.items()):
        if not any(release.startswith(b) for b in case.unconfirmed_at):
            continue
        if status == case.expect_error:
            changes.append(
                f"{where}: ATB {release} ({device}) answers {status}, the documented rejection: the fix is in "
                f"{release}; drop unconfirmed_at (facts/releases.py MASK_RANK3_FIX stays)"
            )
        elif status in {error for _, error, _ in case.expect_by_release}:
            changes.append(
                f"{where}: ATB {release} ({device}) answers {status}: this package predates the fix; extend the "
                f"expect_by_release range that names {status} to include {release} and keep unconfirmed_at"
            )
        else:
            changes.append(f"{where}: ATB {release} ({device}) answers {status}, which no expectation names")
    return {
        "fact": f"error case {case.name} unconfirmed at {bounds}",
        "where": where,
        "device_did": {f"{r} {s} on {d}": n for (r, s, d), n in answers.items()},
        "change": "; ".join(changes) or f"none: no record at {bounds} (the device's release is another)",
    }


def facts_report(
    runs: Path, deviations: DeviationSet | None = None, cases: list[CaseSpec] | None = None
) -> dict[str, Any]:
    """Per unconfirmed fact: what the records say the device did, and the change it implies."""
    records, problems = read_records(runs)
    deviations = deviations or load_deviations()
    cases = load_suites(["errors"]) if cases is None else cases
    facts = [
        _deviation_fact(d.id, d.versions, [r for r in records if r.get("deviation") == d.id])
        for d in deviations.entries
        if d.status == "unconfirmed"
    ]
    for case in cases:
        if case.unconfirmed_at:
            facts.append(_boundary_fact(case, [r for r in records if r.get("case_id") == case.case_id]))
    for rule in RULES:
        if rule.confidence == UNCONFIRMED:
            facts.append(
                {
                    "fact": f"torch_npu rule {rule.id}",
                    "where": f"facts/torch_npu_ops.py {rule.id}",
                    "device_did": "not exercised: the route refuses what the rule forbids before any call",
                    "change": "none from this run (a direct probe of the op would settle it)",
                }
            )
    atb_records = [r for r in records if r.get("backend") == "atb"]
    unknown = bool(atb_records) and all(_release(r) is None for r in atb_records)
    return {"facts": facts, "problems": problems, "release_unknown": RELEASE_UNKNOWN if unknown else None}


def markdown(report: dict[str, Any]) -> str:
    """The report as Markdown, one section per fact."""
    lines = ["# Facts report", ""]
    if report["release_unknown"]:
        lines += [f"**{report['release_unknown']}**", ""]
    for fact in report["facts"]:
        lines += [f"## {fact['fact']}", "", f"- device: {fact['device_did']}", f"- change: {fact['change']}", ""]
    lines += [f"- unreadable: {p}" for p in report["problems"]]
    return "\n".join(lines).rstrip() + "\n"


def _write_text(path: Path, text: str) -> None:
    """Atomically, never through a symlink."""
    if path.is_symlink():
        raise OSError(f"{path} is a symlink: refusing to write through it")
    with tempfile.NamedTemporaryFile("w", dir=path.parent, prefix=f".{path.name}.", delete=False) as handle:
        handle.write(text)
        temp = Path(handle.name)
    os.replace(temp, path)


def write_facts_report(out: Path) -> Path:
    """``<out>/facts_report.md`` and ``.json`` from ``<out>/runs``; returns the Markdown's path."""
    report = facts_report(out / "runs")
    _write_text(out / REPORT_JSON, json.dumps(report, indent=2, sort_keys=True) + "\n")
    _write_text(out / REPORT_MD, markdown(report))
    return out / REPORT_MD
