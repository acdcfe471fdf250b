"""Self-contained report.html: tables, inline-SVG plots, failing-case details, environment.

No network, no JavaScript, no external CSS: the file must open the same on an air-gapped box
and in a CI artifact viewer.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from html import escape
from pathlib import Path
from typing import Any

from reports import svg
from reports.records import (
    HTML_FILE,
    VERDICTS,
    Record,
    case_records,
    failing_summary,
    fmt,
    fmt_slack,
    group_stats,
    metric,
    seq_bucket,
    slack,
    suite_counts,
    timing_value,
    verdict,
    worst_cases,
)

CSS = """
body{font:14px/1.4 system-ui,sans-serif;margin:1.5em;color:#222}
h1{font-size:1.4em}h2{font-size:1.2em;border-bottom:1px solid #ccc;margin-top:1.6em}
table{border-collapse:collapse;margin:.5em 0}
td,th{border:1px solid #ccc;padding:2px 6px;text-align:left;white-space:nowrap}
th{background:#f0f0f0}td.n{text-align:right;font-variant-numeric:tabular-nums}
.passed{color:#176b1d}.failed,.error,.regressed{color:#b00020;font-weight:bold}
.xfailed,.xpassed,.skipped,.missing,.added{color:#8a6100}.fixed{color:#176b1d;font-weight:bold}
.plots{display:flex;flex-wrap:wrap;gap:8px}.plot{border:1px solid #ddd;background:#fff}
.plot .t{font-size:11px;font-weight:bold}.plot .l{font-size:9px}.axis{stroke:#555}
.bar{fill:#4a7ab5}.dot{fill:#b5534a;fill-opacity:.7}.bound{stroke:#b00020;stroke-dasharray:3 2}
pre{background:#f7f7f7;padding:4px;overflow-x:auto}details{margin:4px 0}.note{color:#8a6100}
"""


class Raw(str):
    """Cell content that is already HTML (everything else is escaped)."""


def cell(value: Any) -> str:
    if isinstance(value, Raw):
        return f"<td>{value}</td>"
    if isinstance(value, int | float) and not isinstance(value, bool):
        return f'<td class="n">{escape(fmt(float(value)) if isinstance(value, float) else str(value))}</td>'
    return f"<td>{escape(str(value))}</td>"


def table(headers: Sequence[str], rows: Iterable[Sequence[Any]], cls: str = "") -> str:
    head = "".join(f"<th>{escape(h)}</th>" for h in headers)
    body = "".join("<tr>" + "".join(cell(v) for v in row) + "</tr>" for row in rows)
    return f'<table class="{cls}"><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>'


def tag(name: str, text: str, cls: str = "") -> Raw:
    return Raw(f'<{name} class="{escape(cls)}">{escape(text)}</{name}>')


def page(title: str, sections: Iterable[str]) -> str:
    return (
        '<!DOCTYPE html><html lang="en"><head><meta charset="utf-8">'
        f"<title>{escape(title)}</title><style>{CSS}</style></head><body>"
        f"<h1>{escape(title)}</h1>" + "".join(sections) + "</body></html>\n"
    )


def flatten(value: Any, prefix: str = "") -> list[tuple[str, str]]:
    """Nested run.json as dotted key/value rows."""
    if isinstance(value, Mapping):
        out: list[tuple[str, str]] = []
        for key in sorted(value, key=str):
            out += flatten(value[key], f"{prefix}.{key}" if prefix else str(key))
        return out
    if isinstance(value, list) and all(not isinstance(v, Mapping | list) for v in value):
        return [(prefix, ", ".join(str(v) for v in value))]
    if isinstance(value, list):
        return [row for i, v in enumerate(value) for row in flatten(v, f"{prefix}[{i}]")]
    return [(prefix, "" if value is None else str(value))]


def _verdict_cell(record: Record) -> Raw:
    v = verdict(record)
    return tag("span", v, v)


def _group_section(records: Sequence[Record]) -> str:
    rows = []
    for g in group_stats(records):
        rows.append(
            [
                *g.key,
                g.total,
                *(g.counts[v] for v in VERDICTS),
                Raw(fmt_slack(g.worst_slack)),
                Raw(fmt(g.max_rel_err, ".2e")),
                Raw(fmt(g.median_rmse, ".2e")),
                Raw(fmt(g.median_latency_ms)),
                Raw(fmt(g.median_tflops)),
            ]
        )
    headers = [
        "backend",
        "dtype",
        "mask",
        "cache",
        "cases",
        *VERDICTS,
        "worst slack",
        "max rel err",
        "median RMSE",
        "median latency ms",
        "median TFLOP/s",
    ]
    return (
        "<h2>Summary by group</h2>"
        + table(headers, rows, "groups")
        + ('<p class="note">Timing is informational and never part of a verdict.</p>')
    )


def _plots_section(records: Sequence[Record]) -> str:
    parts = ["<h2>Error distributions</h2>"]
    for g in group_stats(records):
        rel = [v for v in (metric(r, "max_rel_err") for r in g.records) if v is not None]
        slacks = [v for v in (slack(r) for r in g.records) if v is not None]
        by_len = [
            (str(b), v)
            for r in g.records
            if (b := seq_bucket(r)) is not None and (v := metric(r, "max_rel_err")) is not None
        ]
        parts.append(
            f'<h3>{escape(" / ".join(g.key))}</h3><div class="plots">'
            + svg.histogram(rel, "max rel err", "max_rel_err (log scale)", log10=True)
            + svg.histogram(slacks, "worst slack", "measured / allowed (line: bound)", marker=1.0)
            + svg.strip(by_len, "max rel err by sequence length", "max kv length bucket")
            + "</div>"
        )
    return "".join(parts)


def _case_row(r: Record) -> list[Any]:
    return [
        r.get("case_id", "?"),
        r.get("backend", "?"),
        r.get("dtype", "?"),
        r.get("mask", "?"),
        r.get("cache", "?"),
        _verdict_cell(r),
        Raw(fmt_slack(slack(r))),
        Raw(fmt(metric(r, "max_rel_err"), ".2e")),
        Raw(fmt(metric(r, "rmse"), ".2e")),
        Raw(fmt(timing_value(r, "latency_ms_median"))),
        Raw(fmt(timing_value(r, "tflops"))),
        str(r.get("output_sha256") or "")[:12],
    ]


CASE_HEADERS = [
    "case",
    "backend",
    "dtype",
    "mask",
    "cache",
    "verdict",
    "worst slack",
    "max rel err",
    "RMSE",
    "latency ms",
    "TFLOP/s",
    "output sha256",
]


def case_details(r: Record) -> str:
    """One failing case: message, checks against bounds, metrics, spec."""
    checks = [c for c in r.get("checks") or [] if isinstance(c, Mapping)]
    check_rows = [
        [
            c.get("rule", ""),
            c.get("metric", ""),
            Raw(fmt(_num(c.get("value")), ".3e")),
            Raw(fmt(_num(c.get("bound")), ".3e")),
            Raw(fmt(_num(c.get("slack")))),
            tag("span", "pass" if c.get("passed") else "FAIL", "passed" if c.get("passed") else "failed"),
        ]
        for c in checks
    ]
    raw_metrics = r.get("metrics")
    metrics: Mapping[str, Any] = raw_metrics if isinstance(raw_metrics, Mapping) else {}
    summary = (
        f"{r.get('case_id', '?')} [{r.get('backend', '?')}] {verdict(r)} slack {fmt_slack(slack(r))}: "
        f"{failing_summary(r)}"
    )
    return (
        f"<details><summary>{escape(summary)}</summary>"
        f"<p>policy {escape(str(r.get('policy', '-')))}, "
        f"node <code>{escape(str(r.get('test') or r.get('nodeid') or ''))}</code></p>"
        f"<pre>{escape(str(r.get('message') or ''))}</pre>"
        + table(["rule", "metric", "value", "bound", "slack", ""], check_rows, "checks")
        + table(["metric", "value"], [[k, Raw(fmt(_num(v), ".4e"))] for k, v in sorted(metrics.items())])
        + _evidence(r)
        + f"<pre>{escape(json.dumps(r.get('spec'), indent=1, sort_keys=True, default=str))}</pre></details>"
    )


#: Record fields shown as evidence when present: error contract, relation, property, failure.
EVIDENCE_FIELDS = ("error", "difference", "shrunk", "failure")


def _evidence(r: Record) -> str:
    rows = [[name, Raw(f"<pre>{escape(json.dumps(r[name], indent=1, sort_keys=True, default=str))}</pre>")]
            for name in EVIDENCE_FIELDS if r.get(name)]
    return table(["evidence", "value"], rows, "evidence") if rows else ""


def _num(value: Any) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def render(records: Sequence[Record], run: Mapping[str, Any]) -> str:
    counts = {v: sum(verdict(r) == v for r in records) for v in VERDICTS}
    head = table(
        ["run", "started", "finished", "shard", "policies", *VERDICTS],
        [
            [
                run.get("run_name", "?"),
                run.get("started", "?"),
                run.get("finished", "?"),
                run.get("shard") or "-",
                ", ".join(run.get("policies") or []) or "-",
                *(counts[v] for v in VERDICTS),
            ]
        ],
        "run",
    )
    bad = [r for r in records if verdict(r) in ("failed", "error", "xpassed")]
    sections = [
        head,
        "<h2>Suites</h2>" + table(["suite", "backend", *VERDICTS],
                                  [[s, b, *(c[v] for v in VERDICTS)] for s, b, c in suite_counts(records)], "suites"),
        _group_section(case_records(records) or list(records)),
        _plots_section(case_records(records) or list(records)),
        "<h2>Worst cases by slack</h2>" + table(CASE_HEADERS, [_case_row(r) for r in worst_cases(records)]),
        f"<h2>Failing and unexpected cases ({len(bad)})</h2>"
        + ("".join(case_details(r) for r in bad) or "<p>None.</p>"),
        f"<h2>All cases ({len(records)})</h2><details><summary>show</summary>"
        + table(CASE_HEADERS, [_case_row(r) for r in records], "cases")
        + "</details>",
        "<h2>Environment</h2>" + table(["key", "value"], flatten(dict(run)), "env"),
    ]
    return page(f"MLA prefill conformance: {run.get('run_name', '')}", sections)


def write_report(directory: Path, records: Sequence[Record], run: Mapping[str, Any]) -> Path:
    path = directory / HTML_FILE
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(render(records, run), encoding="utf-8")
    tmp.replace(path)
    return path
