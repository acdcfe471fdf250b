"""report.html and diff.html in real headless Chromium at a laptop's 1400 px.

The pages must render without errors, draw their SVG charts, never make the page scroll sideways
(wide tables scroll inside their own box), and label every axis with distinct ticks.  The pages
have no script; the test injects a probe that records errors (window.onerror) and, once loaded,
writes what it measured into the DOM, which ``--dump-dom`` returns.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from mlaconf.reports import diff, diff_render, html
from tests.machine import HANG_S

CHROMIUM = next((p for p in map(shutil.which, ("chromium", "chromium-browser", "google-chrome")) if p), None)
WIDTH = 1400

# Tick labels are the <text> elements of an SVG that share one baseline (x axis) or one right
# edge (y axis, anchored at their end); a chart whose ticks repeat a label cannot be read.
PROBE = """<script>
window.__errors = [];
window.addEventListener('error', function (e) { window.__errors.push(String(e.message)); });
window.addEventListener('load', function () {
  var svgs = Array.prototype.slice.call(document.querySelectorAll('svg'));
  var drawn = svgs.filter(function (s) {
    var box = s.getBoundingClientRect();
    return box.width > 0 && box.height > 0 && s.querySelectorAll('rect, circle, polyline').length > 0;
  }).length;
  var duplicates = [];
  svgs.forEach(function (s, n) {
    var rows = {}, cols = {};
    Array.prototype.forEach.call(s.querySelectorAll('text'), function (t) {
      var key = s.querySelector('title') ? s.querySelector('title').textContent : String(n);
      var y = 'y' + t.getAttribute('y'), x = 'x' + t.getAttribute('x');
      (rows[y] = rows[y] || []).push(t.textContent);
      if (t.getAttribute('text-anchor') === 'end') { (cols[x] = cols[x] || []).push(t.textContent); }
      [rows[y], cols[x] || []].forEach(function (labels) {
        if (labels.length > 1 && labels.indexOf(t.textContent) !== labels.length - 1) {
          duplicates.push(key + ': ' + t.textContent);
        }
      });
    });
  });
  var wide = Array.prototype.slice.call(document.querySelectorAll('body *')).filter(function (e) {
    return e.getBoundingClientRect().right > document.documentElement.clientWidth + 1
      && !e.closest('.scroll');
  }).map(function (e) { return e.tagName + '.' + e.className; }).slice(0, 5);
  var top = function (sel) { var e = document.querySelector(sel); return e ? e.getBoundingClientRect().top : -1; };
  var banner = document.querySelector('.banner');
  var missing = Array.prototype.slice.call(document.querySelectorAll('a[href^="#"]')).filter(function (a) {
    return !document.getElementById(a.getAttribute('href').slice(1));
  }).map(function (a) { return a.getAttribute('href'); });
  var groupLinks = Array.prototype.slice.call(document.querySelectorAll('table.groups a')).map(function (a) {
    var target = document.getElementById(a.getAttribute('href').slice(1));
    var next = target ? target.nextElementSibling : null;
    return next ? next.tagName + '.' + next.className : 'none';
  });
  var overflowing = svgs.filter(function (s) {
    var t = s.querySelector('text.t');
    return t && t.getComputedTextLength() > s.getBoundingClientRect().width;
  }).map(function (s) { return s.querySelector('title').textContent; });
  var failedChip = document.querySelector('.counts .failed');
  var out = document.createElement('pre');
  out.id = 'probe';
  out.textContent = 'PROBE' + JSON.stringify({tables: document.querySelectorAll('table').length,
    rows: document.querySelectorAll('table.groups tbody tr').length, svgs: svgs.length, drawn: drawn,
    maps: document.querySelectorAll('svg.errmap').length,
    scrollWidth: document.documentElement.scrollWidth, clientWidth: document.documentElement.clientWidth,
    wide: wide, duplicates: duplicates, errors: window.__errors,
    bannerTop: banner ? banner.getBoundingClientRect().top : -1,
    bannerBackground: banner ? getComputedStyle(banner).backgroundColor : '',
    bannerText: banner ? banner.textContent : '',
    failedChipColour: failedChip ? getComputedStyle(failedChip).color : '',
    failedChipTop: failedChip ? failedChip.getBoundingClientRect().top : -1,
    contentsTop: top('#contents'), firstMapTop: top('svg.errmap'), failuresTop: top('#failures'),
    allCasesTop: top('#all'), missingTargets: missing, groupLinks: groupLinks,
    cases: document.querySelectorAll('details.case').length,
    openCases: document.querySelectorAll('details.case[open]').length,
    legend: Array.prototype.map.call(document.querySelectorAll('svg.errmap text.l'), function (t) {
      return t.textContent; }).join(' | '),
    overflowing: overflowing});
  document.body.appendChild(out);
});
</script>"""


def error_map(rows: int, heads: int) -> dict[str, Any]:
    """A failing case's map: the error sits in the tail rows past the 128-token tile."""
    values = [[(3.0 if r >= 128 else 0.2) + 0.01 * h for h in range(heads)] for r in range(rows)]
    return {
        "values": values,
        "row_stride": 1,
        "head_stride": 1,
        "rows": rows,
        "heads": heads,
        "q_seqlen": [rows],
        "bound": 0.0039,
        "quantity": "max |out-g| / max(1,|g|) / e",
    }


def records() -> list[dict[str, Any]]:
    """Realistic values: bf16 errors all about 2^-8 apart in the fourth digit, full digests."""
    out = []
    for i in range(30):
        dtype = ("bf16", "fp16")[i % 2]
        kv = 16 << (i % 5)
        failed = i == 7
        record: dict[str, Any] = {
            "case_id": f"{dtype}-causal-krope_ctkv-b1-s{kv}-h4-q3d-padded-{i:08x}",
            "backend": ("torch-cpu-strict", "my_kernels.module:factory")[i % 3 == 0],
            "dtype": dtype,
            "mask": ("causal", "mask_free")[i % 3 == 1],
            "cache": "krope_ctkv",
            "verdict": "failed" if failed else "passed",
            "worst_slack": 3.2 if failed else 0.2495 + 1e-5 * i,
            "metrics": {
                "max_rel_err": (0.0038910 if dtype == "bf16" else 0.000534) * (1 + 1e-5 * i),
                "rmse": 7.6e-05 * (1 + 1e-4 * i),
                "n_elements": 129 * 512,
                "n_rows": 129,
            },
            "checks": [
                {
                    "rule": "atb",
                    "metric": "atb_max_scaled_err",
                    "value": 0.001,
                    "bound": 0.0039,
                    "slack": 3.2 if failed else 0.2495,
                    "passed": not failed,
                }
            ],
            "policy": "default",
            "spec": {
                "q_seqlen": [kv],
                "kv_seqlen": [kv],
                "head_num": 4,
                "kv_head_num": (4, 2, 1)[i % 3],
                "q_layout": ("3d", "2d")[i % 2],
                "kv_layout": ("padded", "packed")[i % 4 < 2],
                "distribution": ("uniform", "normal", "outliers")[i % 3],
            },
            "failing": ["atb: atb_max_scaled_err = 0.0125 vs bound 0.0039 (slack 3.2)"] if failed else [],
            "message": "",
            "output_sha256": f"{i:064x}",
            "timing": {"latency_ms_median": 1.0 + i, "repeats": 3, "tflops": 3.0},
        }
        if failed:
            record["spec"].update(q_seqlen=[200], kv_seqlen=[200])
            record["error_map"] = error_map(200, 4)
        out.append(record)
    return out


RUN = {
    "run_name": "browser",
    "environment": {
        "host": "h",
        "args": " ".join(
            [
                "cases/test_conformance.py",
                "--mla-backend",
                "my_kernels.module:factory",
                "--mla-golden-dir",
                "/very/long/path/to/a/shared/golden/store/on/a/network/filesystem/mounted/somewhere",
            ]
            * 4
        ),
    },
}


def load(tmp_path: Path, name: str, page: str) -> tuple[dict[str, Any], subprocess.CompletedProcess[str]]:
    """Open ``page`` at 1400 px, return the probe's measurements (and a screenshot beside it)."""
    assert CHROMIUM is not None and page.count("<head>") == 1
    path = tmp_path / name
    path.write_text(page.replace("<head>", "<head>" + PROBE, 1), encoding="utf-8")
    common = [
        CHROMIUM,
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--disable-dev-shm-usage",
        "--hide-scrollbars",
        f"--user-data-dir={tmp_path / 'profile'}",
        f"--window-size={WIDTH},1000",
        "--virtual-time-budget=5000",
    ]
    proc = subprocess.run(
        [*common, "--enable-logging=stderr", "--v=0", "--dump-dom", path.as_uri()],
        capture_output=True,
        text=True,
        timeout=HANG_S,
        check=False,
    )
    match = re.search(r"PROBE(\{.*?\})</pre>", proc.stdout)
    assert match, f"probe missing (rc {proc.returncode}):\n{proc.stderr[-3000:]}"
    subprocess.run(
        [*common, f"--screenshot={path.with_suffix('.png')}", path.as_uri()],
        capture_output=True,
        timeout=HANG_S,
        check=False,
    )
    return json.loads(match.group(1).replace("&quot;", '"')), proc


def check_layout(probe: dict[str, Any], proc: subprocess.CompletedProcess[str]) -> None:
    assert probe["errors"] == []
    assert probe["clientWidth"] <= WIDTH
    assert probe["scrollWidth"] <= probe["clientWidth"], f"page scrolls sideways: {probe['wide']}"
    assert probe["wide"] == []
    assert probe["duplicates"] == []
    console = [line for line in proc.stderr.splitlines() if "CONSOLE" in line or "Uncaught" in line]
    assert console == []


@pytest.mark.skipif(CHROMIUM is None, reason="no chromium binary on PATH (apt-get install chromium)")
def test_report_fits_1400px_with_distinct_ticks(tmp_path: Path) -> None:
    probe, proc = load(tmp_path, "report.html", html.render(records(), RUN))
    check_layout(probe, proc)
    assert probe["tables"] >= 5 and probe["rows"] >= 4
    assert probe["svgs"] >= 6 and probe["drawn"] == probe["svgs"]
    assert probe["maps"] == 1  # the one failing case's error map


FIRST_SCREEN = 1000  # px: the window's height


def failing_run() -> list[dict[str, Any]]:
    """62 failures among 123 records, as in the issue, each failing the error model (the atb check
    is evidence only) with its error map; the worst at slack 6.4 with a long case id."""
    out = []
    for i, r in enumerate(records() * 5):
        r = dict(r, case_id=f"{r['case_id']}-{i}", output_sha256=f"{i:064x}")
        r.pop("error_map", None)
        if i % 2 == 0 and i < 124:
            slack = 6.4 if i == 0 else 1.0 + i / 50
            emap = error_map(200, 4)
            emap.update(values=[[slack if row >= 128 else 0.3] * 4 for row in range(200)], bound=1.0)
            emap.update(rule="model:max_err_over_bound", quantity="max_v |out - g| / bound_e")
            r.update(verdict="failed", worst_slack=slack, failing=["model: max_err_over_bound ..."], error_map=emap)
            r["spec"] = dict(r["spec"], q_seqlen=[200], kv_seqlen=[200])
        out.append(r)
    out[0]["case_id"] = "bf16-causal-krope_ctkv-b4-s1024-kv1152-h16-g4-q3d-padded-large_logits-3fa2c1d0"
    return out[:123]


@pytest.mark.skipif(CHROMIUM is None, reason="no chromium binary on PATH (apt-get install chromium)")
def test_report_says_the_verdict_on_the_first_screen(tmp_path: Path) -> None:
    run = dict(RUN, status="complete", counts={"selected": 123, "run": 123, "recorded": 123})
    recs = failing_run()
    failures = sum(r["verdict"] == "failed" for r in recs)
    probe, proc = load(tmp_path, "failing.html", html.render(recs, run))
    check_layout(probe, proc)
    assert 0 <= probe["bannerTop"] < FIRST_SCREEN and probe["bannerText"].startswith(f"FAIL: {failures} of 123")
    assert probe["bannerBackground"] == "rgb(176, 0, 32)"  # red
    assert 0 <= probe["failedChipTop"] < FIRST_SCREEN and probe["failedChipColour"] == "rgb(176, 0, 32)"
    assert 0 <= probe["contentsTop"] < FIRST_SCREEN and probe["missingTargets"] == []
    assert 0 <= probe["failuresTop"] < FIRST_SCREEN < probe["allCasesTop"]  # failures first
    assert 0 <= probe["firstMapTop"] < FIRST_SCREEN  # was ~3,600 px down
    assert probe["groupLinks"] and all(g == "DETAILS.case" for g in probe["groupLinks"])  # a group -> its cases
    assert probe["cases"] == failures and probe["openCases"] == html.OPEN_DETAILS  # the rest expand on demand
    assert "slack of the deciding check" in probe["legend"] and "model:max_err_over_bound" in probe["legend"]
    assert probe["overflowing"] == []  # every chart title fits its chart


@pytest.mark.skipif(CHROMIUM is None, reason="no chromium binary on PATH (apt-get install chromium)")
def test_diff_page_fits_1400px_with_distinct_ticks(tmp_path: Path) -> None:
    base = records()
    cand = [dict(r) for r in base]
    for n, r in enumerate(cand):
        r["output_sha256"] = f"{n + 1000:064x}"
        r["metrics"] = {k: v * 1.01 for k, v in r["metrics"].items()}
        if n == 4:
            r.update(verdict="failed", worst_slack=1.7)
    cases, perf = diff.diff_records(base, cand)
    result = diff.DiffResult("/runs/cann-8.0.RC2/" + "x" * 60, "/runs/cann-8.0.RC3/" + "y" * 60, cases, perf, [], [])
    probe, proc = load(tmp_path, "diff.html", diff_render.render_html(result))
    check_layout(probe, proc)
    assert probe["svgs"] >= 1 and probe["drawn"] == probe["svgs"]
