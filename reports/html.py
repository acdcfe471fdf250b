"""Self-contained report.html: tables, inline-SVG plots, failing-case details, environment.

No network, no JavaScript, no external CSS: the file must open the same on an air-gapped box
and in a CI artifact viewer.
"""

from __future__ import annotations

import json
import re
import shlex
from collections.abc import Callable, Iterable, Mapping, Sequence
from html import escape
from pathlib import Path
from typing import Any

from mlaconf.facts.versions import release_unknown_line
from mlaconf.reports import safeio, svg
from mlaconf.reports.aggregate import (
    GroupKey,
    GroupStats,
    case_records,
    failing_summary,
    fmt,
    fmt_slack,
    group_key,
    group_stats,
    metric,
    slack,
    suite_counts,
    timing_value,
    verdict,
    worst_cases,
)
from mlaconf.reports.records import VERDICTS, Record, not_applicable
from mlaconf.reports.rundir import HTML_FILE

CSS = """
body{font:14px/1.4 system-ui,sans-serif;margin:1.5em;color:#222;max-width:100%}
h1{font-size:1.4em}h2{font-size:1.2em;border-bottom:1px solid #ccc;margin-top:1.6em}h3{font-size:1.05em}
.scroll{overflow-x:auto;max-width:100%}
table{border-collapse:collapse;margin:.5em 0}
td,th{border:1px solid #ccc;padding:2px 6px;text-align:left;vertical-align:top}
td{overflow-wrap:break-word}table.env td,table.run td{overflow-wrap:anywhere}
td.n{text-align:right;font-variant-numeric:tabular-nums;white-space:nowrap}
th{background:#f0f0f0}abbr{text-decoration:underline dotted;white-space:nowrap}
.passed{color:#176b1d}.failed,.error,.regressed{color:#b00020;font-weight:bold}
.xfailed,.xpassed,.skipped,.missing,.added{color:#8a6100}.fixed{color:#176b1d;font-weight:bold}
.plots{display:flex;flex-wrap:wrap;gap:8px}.plot{border:1px solid #ddd;background:#fff;max-width:100%}
.plot .t{font-size:11px;font-weight:bold}.plot .l{font-size:9px}.axis{stroke:#555}
.bar{fill:#4a7ab5}.dot{fill:#4a7ab5;fill-opacity:.7}.dot.over{fill:#b00020}
.bound{stroke:#b00020;stroke-dasharray:3 2}.diag{stroke:#888}
.errmap .tile{stroke:#000;stroke-dasharray:2 2;stroke-opacity:.6}.errmap .batch{stroke:#000;stroke-width:1.5}
pre{background:#f7f7f7;padding:4px;white-space:pre-wrap;overflow-wrap:anywhere}details{margin:4px 0}
.note{color:#8a6100}
.banner{padding:.5em .8em;font-size:1.3em;font-weight:bold;color:#fff;border-radius:4px;margin:.4em 0}
.banner.fail{background:#b00020}.banner.pass{background:#176b1d}.banner.incomplete{background:#8a6100}
.banner.nothing{background:#555}.counts span{margin-right:1em;font-size:1.1em}
.counts .zero{color:#999;font-weight:normal}
nav.toc ol{margin:.3em 0;padding-left:1.4em;columns:2}nav.toc li{margin:1px 0}
summary{cursor:pointer}details.case>summary{font-weight:bold}
"""

#: Failing cases shown expanded (error map visible) before the rest collapse: a few keep the page
#: readable with dozens of failures (41 open cases made a 49,000-px page); every one stays linked.
OPEN_DETAILS = 5
#: Digest characters shown in tables; the full value is the cell's hover text.
DIGEST_CHARS = 12


class Raw(str):
    """Cell content that is already HTML (everything else is escaped)."""


class Num(str):
    """A number already formatted for its cell (right-aligned, never wrapped)."""


def cell(value: Any) -> str:
    if isinstance(value, Num):
        return f'<td class="n">{escape(value)}</td>'
    if isinstance(value, Raw):
        return f"<td>{value}</td>"
    if isinstance(value, int | float) and not isinstance(value, bool):
        return f'<td class="n">{escape(fmt(float(value)) if isinstance(value, float) else str(value))}</td>'
    return f"<td>{escape(str(value))}</td>"


def table(headers: Sequence[str], rows: Iterable[Sequence[Any]], cls: str = "") -> str:
    """A table in its own horizontally scrolling box, so a wide one never widens the page."""
    head = "".join(f"<th>{escape(h)}</th>" for h in headers)
    body = "".join("<tr>" + "".join(cell(v) for v in row) + "</tr>" for row in rows)
    return f'<div class="scroll"><table class="{cls}"><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table></div>'


def abbreviated(text: str, keep: int = DIGEST_CHARS) -> Raw:
    """A long value (a digest) cut to ``keep`` characters, the full value on hover."""
    if len(text) <= keep:
        return Raw(escape(text))
    return Raw(f'<abbr title="{escape(text)}">{escape(text[:keep])}…</abbr>')


def stat(value: Any, spec: str = ".4e") -> Num:
    """A statistic in its own type: integers (counts) as integers, booleans as words, floats by ``spec``."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return Num(str(value))
    return Num(str(value) if isinstance(value, int) else fmt(float(value), spec))


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


def _count_cell(g: GroupStats, name: str, failing_groups: set[GroupKey]) -> Any:
    """A verdict count; a failing group's failure counts link to its cases in the failures section."""
    n = g.counts[name]
    if n and name in BAD and g.key in failing_groups:
        return Raw(f'<a class="{name}" href="#{group_anchor(g.key)}">{n}</a>')
    return n


def _group_section(records: Sequence[Record], failing_groups: set[GroupKey] | None = None) -> str:
    rows = []
    for g in group_stats(records):
        rows.append(
            [
                *g.key,
                g.total,
                *(_count_cell(g, v, failing_groups or set()) for v in VERDICTS),
                Num(fmt_slack(g.worst_slack)),
                Num(fmt(g.max_rel_err, ".2e")),
                Num(fmt(g.median_rmse, ".2e")),
                Num(fmt(g.median_latency_ms)),
                Num(fmt(g.median_tflops)),
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
        '<h2 id="groups">Summary by group</h2>'
        + table(headers, rows, "groups")
        + ('<p class="note">Timing is informational and never part of a verdict.</p>')
    )


def _spec(record: Record) -> Mapping[str, Any]:
    spec = record.get("spec")
    return spec if isinstance(spec, Mapping) else {}


def kv_length(record: Record) -> int | None:
    """The case's longest kv sequence (its q sequence when kv is not given), from its spec."""
    for name in ("kv_seqlen", "q_seqlen"):
        lengths = [x for x in _spec(record).get(name) or [] if isinstance(x, int) and not isinstance(x, bool)]
        if lengths and max(lengths) > 0:
            return max(lengths)
    return None


def gqa_ratio(record: Record) -> str | None:
    """Query heads per kv head, e.g. '4' for 8 query heads sharing 2 kv heads."""
    heads, kv_heads = _spec(record).get("head_num"), _spec(record).get("kv_head_num")
    if isinstance(heads, int) and isinstance(kv_heads, int) and kv_heads > 0:
        return str(heads // kv_heads)
    return None


def _spec_field(name: str) -> Callable[[Record], str | None]:
    def get(record: Record) -> str | None:
        value = _spec(record).get(name)
        return None if value is None else str(value)

    return get


#: Case properties along which layout, addressing and data-dependent bugs separate.
BREAKDOWNS: tuple[tuple[str, str, Callable[[Record], str | None]], ...] = (
    ("worst slack by q layout", "q layout", _spec_field("q_layout")),
    ("worst slack by kv layout", "kv layout", _spec_field("kv_layout")),
    ("worst slack by GQA ratio", "query heads per kv head", gqa_ratio),
    ("worst slack by input distribution", "input distribution", _spec_field("distribution")),
)


def _measured(records: Sequence[Record]) -> list[Record]:
    return [r for r in records if verdict(r) != "skipped"]


def _by_length(records: Sequence[Record], value: Callable[[Record], float | None]) -> dict[str, list[svg.Point]]:
    """One series per dtype x mask: value against kv length."""
    series: dict[str, list[svg.Point]] = {}
    for r in sorted(records, key=lambda r: (str(r.get("dtype")), str(r.get("mask")))):
        length, v = kv_length(r), value(r)
        if length is not None and v is not None:
            label = f"{r.get('case_id', '?')} [{r.get('backend', '?')}] kv {length}: {v:.4g}"
            series.setdefault(f"{r.get('dtype', '?')} {r.get('mask', '?')}", []).append(
                svg.Point(float(length), v, label, verdict(r) in ("failed", "error"))
            )
    return series


def _overview_section(records: Sequence[Record]) -> str:
    """Charts across groups (per backend): error against sequence length, and breakdowns by case property."""
    measured = _measured(records)
    charts = []
    backends = sorted({str(r.get("backend", "?")) for r in measured})
    for backend in backends:
        mine = [r for r in measured if str(r.get("backend", "?")) == backend]
        suffix = f": {backend}" if len(backends) > 1 else ""
        slack_series = _by_length(mine, slack)
        if slack_series:
            charts.append(
                svg.scatter(
                    slack_series,
                    f"worst slack against kv length{suffix}",
                    "longest kv sequence of the case (line: worst per length; ringed: failed)",
                    "worst slack (dashed: bound)",
                    xlog=True,
                    lines=True,
                    marker=1.0,
                )
            )
        rmse_series = _by_length(mine, lambda r: metric(r, "rmse"))
        if rmse_series:
            charts.append(
                svg.scatter(
                    rmse_series,
                    f"RMSE against kv length{suffix}",
                    "longest kv sequence of the case (line: worst per length; ringed: failed)",
                    "RMSE",
                    xlog=True,
                    lines=True,
                )
            )
    breakdowns = []
    for title, xlabel, key in BREAKDOWNS:
        points = [(k, v) for r in measured if (k := key(r)) is not None and (v := slack(r)) is not None]
        if points:
            breakdowns.append(svg.strip(points, title, xlabel, ylabel="worst slack", marker=1.0))
    if not charts and not breakdowns:
        return ""
    return (
        '<h2 id="across">Across groups</h2>'
        + (f'<div class="plots">{"".join(charts)}</div>' if charts else "")
        + (
            f'<h3>Breakdowns by case property (all backends)</h3><div class="plots">{"".join(breakdowns)}</div>'
            if breakdowns
            else ""
        )
    )


def _plots_section(records: Sequence[Record]) -> str:
    parts = ['<h2 id="distributions">Distributions per group</h2>']
    for g in group_stats(records):
        slacks = [v for v in (slack(r) for r in _measured(g.records)) if v is not None]
        rmse = [v for v in (metric(r, "rmse") for r in g.records) if v is not None]
        parts.append(
            f'<h3>{escape(" / ".join(g.key))}</h3><div class="plots">'
            + svg.histogram(slacks, "worst slack", "measured / allowed (line: bound)", marker=1.0)
            + svg.histogram(rmse, "RMSE", "root mean square error (log scale)", log10=True)
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
        Num(fmt_slack(slack(r))),
        Num(fmt(metric(r, "max_rel_err"), ".2e")),
        Num(fmt(metric(r, "rmse"), ".2e")),
        Num(fmt(timing_value(r, "latency_ms_median"))),
        Num(fmt(timing_value(r, "tflops"))),
        abbreviated(str(r.get("output_sha256") or "")),
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


def error_map_chart(r: Record) -> str:
    """The failing case's error over (token row x head), when its record carries one."""
    emap = r.get("error_map")
    if not isinstance(emap, Mapping) or not isinstance(emap.get("values"), list):
        return ""
    values = [[_num(v) for v in row] for row in emap["values"] if isinstance(row, list)]
    stride, head_stride = emap.get("row_stride"), emap.get("head_stride")
    q_seqlen = [n for n in emap.get("q_seqlen") or [] if isinstance(n, int)]
    title = f"where the error sits: {r.get('case_id', '?')}"
    return svg.error_map(
        values,
        title,
        row_stride=stride if isinstance(stride, int) and stride > 0 else 1,
        q_seqlen=q_seqlen,
        legend=map_legend(emap),
        head_stride=head_stride if isinstance(head_stride, int) and head_stride > 0 else 1,
    )


def map_legend(emap: Mapping[str, Any]) -> list[str]:
    """What an error map's colours mean: the deciding rule's slack (or, for maps written before the
    rule was recorded, the atb bound's or the largest value's)."""
    rule = emap.get("rule")
    if isinstance(rule, str) and rule:
        return ["slack of the deciding check", rule, "(scaled to its slack)" if emap.get("scaled") else "(per element)"]
    if _num(emap.get("bound")) is not None:
        return ["slack of atb (error / e)", "(not the deciding rule)"]
    return ["error / largest error"]


def case_details(r: Record, open_: bool = False, run: Mapping[str, Any] | None = None) -> str:
    """One failing case: its error map, message, checks against bounds, metrics, spec."""
    checks = [c for c in r.get("checks") or [] if isinstance(c, Mapping)]
    check_rows = [
        [
            c.get("rule", ""),
            c.get("metric", ""),
            Num(fmt(_num(c.get("value")), ".3e")),
            Num(fmt(_num(c.get("bound")), ".3e")),
            Num(fmt(_num(c.get("slack")))),
            tag("span", "pass" if c.get("passed") else "FAIL", "passed" if c.get("passed") else "failed"),
            "evidence only" if c.get("decisive") is False else "deciding",
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
        f'<details class="case" id="{case_anchor(r)}"{" open" if open_ else ""}><summary>{escape(summary)}</summary>'
        + next_steps(r, run)
        + error_map_chart(r)
        + f"<p>policy {escape(str(r.get('policy', '-')))}, "
        f"node <code>{escape(str(r.get('test') or r.get('nodeid') or ''))}</code></p>"
        f"<pre>{escape(str(r.get('message') or ''))}</pre>"
        + worst_element_line(r)
        + table(["rule", "metric", "value", "bound", "slack", "", "role"], check_rows, "checks")
        + table(["metric", "value"], [[k, stat(v)] for k, v in sorted(metrics.items()) if not k.startswith("worst_")])
        + _evidence(r)
        + f"<pre>{escape(json.dumps(r.get('spec'), indent=1, sort_keys=True, default=str))}</pre></details>"
    )


def worst_element_line(r: Record) -> str:
    """The element the verdict names, in the judge's words as the record keeps them (``worst_element.text``:
    the failure text's and the repro's line); the metric table shows no other element (a record from before
    this line kept the metrics' own worst element as ``worst_*`` metrics, left out there)."""
    named = r.get("worst_element")
    text = named.get("text") if isinstance(named, Mapping) else None
    return f'<p class="worst"><b>worst element:</b> {escape(text)}</p>' if isinstance(text, str) else ""


def repro_commands(r: Record, run: Mapping[str, Any] | None = None) -> list[str]:
    """The commands that shrink a failing case and write its repro: by its test id when it has one
    (the id names case and backend), else by case and backend; a plug-in backend named by its import path,
    which the run's run.json holds (a test id carries only its label)."""
    test = str(r.get("test") or "")
    backend = str(r.get("backend"))
    spec = plugin_backends(run or {}).get(backend)
    if "[" in test:
        target = shlex.quote(test) + (f" --backend {shlex.quote(spec)}" if spec else "")
    else:
        target = f"{r.get('case_id', '?')} --backend {shlex.quote(spec or backend)}"
    return [f"mlaconf shrink {target}", f"mlaconf repro {target} --out repro-{r.get('case_id', 'case')}"]


def plugin_backends(run: Mapping[str, Any]) -> dict[str, str]:
    """Label -> import path (``pkg.module:factory``) of the plug-in backends a run named."""
    named = [b for b in run.get("backends") or [] if isinstance(b, Mapping)]
    return {str(b.get("label")): str(b["name"]) for b in named if ":" in str(b.get("name", ""))}


def next_steps(r: Record, run: Mapping[str, Any] | None = None) -> str:
    """A failing conformance case's likely cause and the commands that shrink it and write its repro."""
    if r.get("suite") != "conformance" or r.get("verdict") != "failed":
        return ""
    cause = r.get("likely_cause")
    text = f"<p><b>likely cause:</b> {escape(str(cause.get('text')))}</p>" if isinstance(cause, Mapping) else ""
    return text + f'<pre class="next">{escape(chr(10).join(repro_commands(r, run)))}</pre>'


#: Record fields shown as evidence when present: error contract, relation (and its sides that fail
#: their golden), property, failure.
EVIDENCE_FIELDS = ("error", "difference", "conformance_failures", "shrunk", "failure")


def _evidence(r: Record) -> str:
    rows = [
        [name, Raw(f"<pre>{escape(json.dumps(r[name], indent=1, sort_keys=True, default=str))}</pre>")]
        for name in EVIDENCE_FIELDS
        if r.get(name)
    ]
    return table(["evidence", "value"], rows, "evidence") if rows else ""


def _num(value: Any) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


#: Verdicts that make a run red (an unexpected pass of a known deviation too: the deviation file is stale).
BAD = ("failed", "error", "xpassed")


def anchor(*parts: str) -> str:
    """An HTML id from free text (case ids, group keys): letters, digits, '-', '_' and '.' only."""
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", "-".join(parts)).strip("-") or "x"


def case_anchor(r: Record) -> str:
    return anchor(
        "case",
        str(r.get("suite") or "conformance"),
        str(r.get("case_id") or r.get("relation") or "?"),
        str(r.get("backend", "?")),
        str(r.get("test") or ""),
    )


def group_anchor(key: Sequence[str]) -> str:
    return anchor("fail", *key)


def _path(value: Any, *keys: str) -> Any:
    for key in keys:
        value = value.get(key) if isinstance(value, Mapping) else None
    return value


def backend_line(records: Sequence[Record], run: Mapping[str, Any]) -> str:
    """What the verdicts ran on, for the banner: each backend with the versions it reported, then
    the toolkit, libraries, BLAS and CPU of run.json's environment (absent entries left out)."""
    versions: dict[str, dict[str, str]] = {}
    for r in records:
        reported = r.get("backend_versions")
        versions.setdefault(str(r.get("backend")), {}).update(reported if isinstance(reported, Mapping) else {})
    parts = [
        f"backend {name}" + (" (" + ", ".join(f"{k} {v}" for k, v in sorted(vs.items())) + ")" if vs else "")
        for name, vs in sorted(versions.items())
    ]
    environment = run.get("environment")
    builds = {k: _path(environment, "builds", k, "version") for k in ("torch", "torch_npu")}
    packages = _path(environment, "packages") or {}
    libraries = {
        "CANN": _path(environment, "ascend", "cann_toolkit", "version"),
        "ATB": _path(environment, "ascend", "atb", "version"),
        "torch": builds["torch"] or packages.get("torch"),
        "torch_npu": builds["torch_npu"] or packages.get("torch_npu"),
        **{k: packages.get(k) for k in ("numpy", "ml_dtypes", "h5py")},
    }
    parts += [f"{k} {v}" for k, v in libraries.items() if v]
    runtime = _path(environment, "torch_runtime") or {}
    if runtime.get("blas_info"):
        threads, capability = runtime.get("num_threads"), runtime.get("cpu_capability")
        parts.append(f"torch BLAS {runtime['blas_info']}, {threads} threads, {capability}")
    blas = _path(environment, "blas")
    for lib in blas if isinstance(blas, list) else []:
        if isinstance(lib, Mapping) and lib.get("user_api") == "blas":
            parts.append(f"{lib.get('internal_api')} {lib.get('version') or ''} ({lib.get('num_threads')} threads)")
    isa = _path(environment, "cpu", "isa")
    if isinstance(isa, list) and isa:
        parts.append(f"CPU {_path(environment, 'cpu', 'machine') or ''} {' '.join(map(str, isa))}")
    return " · ".join(p.replace("  ", " ") for p in parts)


def pass_counts(records: Sequence[Record], counts: Mapping[str, int]) -> str:
    """A passing run's tests as what they are: those that conform (known deviations among them), those the
    backend's own declarations rule out, and other skips, never "N of M conform" as if the rest did not."""
    ruled_out = sum(verdict(r) == "skipped" and not_applicable(r) is not None for r in records)
    conform = counts["passed"] + counts["xfailed"]
    parts = [f"{conform} tests conform" + (f" ({counts['xfailed']} as known deviations)" if counts["xfailed"] else "")]
    if ruled_out:
        parts.append(f"{ruled_out} not applicable (ruled out by the backend's own declarations)")
    if counts["skipped"] - ruled_out:
        parts.append(f"{counts['skipped'] - ruled_out} skipped")
    return "; ".join(parts)


def verdict_banner(records: Sequence[Record], run: Mapping[str, Any]) -> str:
    """The run's verdict in one coloured line, then every verdict's count (failures in red)."""
    counts = {v: sum(verdict(r) == v for r in records) for v in VERDICTS}
    bad = sum(counts[v] for v in BAD)
    problems = [str(p) for p in run.get("problems") or [] if p]
    status = run.get("status")
    raw = run.get("counts")
    state = raw if isinstance(raw, Mapping) else {}
    selected, ran = state.get("selected"), state.get("run")
    short = isinstance(selected, int) and isinstance(ran, int) and ran < selected
    if status not in (None, "complete"):
        cls, text = (
            "incomplete",
            f"INCOMPLETE: the run is {status} after {ran} of {selected} selected tests; no verdict",
        )
    elif short:
        assert isinstance(selected, int) and isinstance(ran, int)
        cls, text = "incomplete", f"INCOMPLETE: {selected - ran} of {selected} selected tests never ran; no verdict"
    elif bad or problems:
        why = f"{bad} of {len(records)} tests failed" if bad else "the run cannot pass"
        cls, text = "fail", f"FAIL: {why}" + (f"; {len(problems)} run problems" if problems else "")
    elif counts["skipped"] == len(records):
        cls, text = "nothing", f"NOTHING TESTED: all {len(records)} tests skipped"
    else:
        cls, text = "pass", "PASS: " + pass_counts(records, counts)
    if status is None:
        text += " (run.json has no status: completeness unknown)"
    chips = "".join(f'<span class="{v if counts[v] else "zero"}">{counts[v]} {escape(v)}</span>' for v in VERDICTS)
    lines = "".join(f'<p class="failed">ERROR: {escape(p)}</p>' for p in problems)
    unknown = release_unknown_line(str(r.get("message") or "") for r in records)
    if unknown:
        lines += f'<p class="release-unknown">{escape(unknown)}</p>'
    ran_on = backend_line(records, run)
    ran_on = f'<p class="backend" id="backend">{escape(ran_on)}</p>' if ran_on else ""
    return f'<div class="banner {cls}" id="verdict">{escape(text)}</div>{ran_on}<p class="counts">{chips}</p>{lines}'


def contents(entries: Sequence[tuple[str, str]]) -> str:
    items = "".join(f'<li><a href="#{escape(i)}">{escape(t)}</a></li>' for i, t in entries)
    return f'<nav class="toc" id="contents"><b>Contents</b><ol>{items}</ol></nav>'


def _failures_section(bad: Sequence[Record], run: Mapping[str, Any]) -> str:
    """Failing and unexpected records grouped by backend x dtype x mask x cache, worst first."""
    if not bad:
        return '<h2 id="failures">Failing and unexpected cases (0)</h2><p>None.</p>'
    groups: dict[tuple[str, ...], list[Record]] = {}
    for r in sorted(bad, key=lambda r: (-(slack(r) or 0.0) if slack(r) is not None else 0.0, str(r.get("case_id")))):
        groups.setdefault(group_key(r), []).append(r)
    parts = [f'<h2 id="failures">Failing and unexpected cases ({len(bad)})</h2>']
    shown = 0
    for key in sorted(groups, key=lambda k: (-len(groups[k]), k)):
        parts.append(f'<h3 id="{group_anchor(key)}">{escape(" / ".join(key))} ({len(groups[key])})</h3>')
        for r in groups[key]:
            parts.append(case_details(r, shown < OPEN_DETAILS, run))
            shown += 1
    return "".join(parts)


def render(records: Sequence[Record], run: Mapping[str, Any]) -> str:
    counts = {v: sum(verdict(r) == v for r in records) for v in VERDICTS}
    head = table(
        ["run", "status", "started", "finished", "shard", "policies", *VERDICTS],
        [
            [
                run.get("run_name", "?"),
                run.get("status", "unknown"),
                run.get("started", "?"),
                run.get("finished", "?"),
                run.get("shard") or "-",
                ", ".join(run.get("policies") or []) or "-",
                *(counts[v] for v in VERDICTS),
            ]
        ],
        "run",
    )
    bad = [r for r in records if verdict(r) in BAD]
    cases = case_records(records) or list(records)
    failing_groups = {group_key(r) for r in bad}
    ordered = sorted(records, key=lambda r: verdict(r) not in BAD)  # failures first, then the run's order
    sections = [
        ("failures", f"Failing and unexpected cases ({len(bad)})", _failures_section(bad, run)),
        (
            "suites",
            "Suites",
            '<h2 id="suites">Suites</h2>'
            + table(
                ["suite", "backend", *VERDICTS],
                [[s, b, *(c[v] for v in VERDICTS)] for s, b, c in suite_counts(records)],
                "suites",
            ),
        ),
        ("groups", "Summary by group", _group_section(cases, failing_groups)),
        ("across", "Across groups", _overview_section(cases)),
        ("distributions", "Distributions per group", _plots_section(cases)),
        (
            "worst",
            "Worst cases by slack",
            '<h2 id="worst">Worst cases by slack</h2>'
            + table(CASE_HEADERS, [_case_row(r) for r in worst_cases(records)]),
        ),
        (
            "all",
            f"All cases ({len(records)})",
            f'<h2 id="all">All cases ({len(records)}, failures first)</h2><details><summary>show</summary>'
            + table(CASE_HEADERS, [_case_row(r) for r in ordered], "cases")
            + "</details>",
        ),
        (
            "environment",
            "Environment",
            '<h2 id="environment">Environment</h2>' + table(["key", "value"], flatten(dict(run)), "env"),
        ),
    ]
    present = [(i, t, body) for i, t, body in sections if body]
    return page(
        f"MLA prefill conformance: {run.get('run_name', '')}",
        [verdict_banner(records, run), contents([(i, t) for i, t, _ in present]), head, *(b for _, _, b in present)],
    )


def write_report(directory: Path, records: Sequence[Record], run: Mapping[str, Any]) -> Path:
    return safeio.atomic_write(directory / HTML_FILE, render(records, run))
