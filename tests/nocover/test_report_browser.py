"""report.html in real headless Chromium: it renders, tables and SVG plots are drawn, no JS errors.

The report itself has no script; the test injects a probe that records errors (window.onerror)
and, once loaded, writes what it measured into the DOM, which ``--dump-dom`` returns.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from reports import html

pytestmark = pytest.mark.slow

CHROMIUM = next((p for p in map(shutil.which, ("chromium", "chromium-browser", "google-chrome")) if p), None)

PROBE = """<script>
window.__errors = [];
window.addEventListener('error', function (e) { window.__errors.push(String(e.message)); });
window.addEventListener('load', function () {
  var svgs = Array.prototype.slice.call(document.querySelectorAll('svg'));
  var drawn = svgs.filter(function (s) {
    var box = s.getBoundingClientRect();
    return box.width > 0 && box.height > 0 && s.querySelectorAll('rect, circle').length > 0;
  }).length;
  var out = document.createElement('pre');
  out.id = 'probe';
  out.textContent = 'PROBE' + JSON.stringify({tables: document.querySelectorAll('table').length,
    rows: document.querySelectorAll('table.groups tbody tr').length, svgs: svgs.length, drawn: drawn,
    errors: window.__errors});
  document.body.appendChild(out);
});
</script>"""


def records() -> list[dict[str, Any]]:
    out = []
    for i in range(30):
        out.append(
            {
                "case_id": f"case{i:02d}",
                "backend": ("npu", "cpu")[i % 2],
                "dtype": "fp16",
                "mask": "causal",
                "cache": "krope_ctkv",
                "verdict": "failed" if i == 7 else "passed",
                "worst_slack": 0.04 * i,
                "metrics": {"max_rel_err": 1e-4 * (i + 1), "rmse": 1e-5 * (i + 1)},
                "policy": "atb",
                "spec": {"q_seqlen": [16 << (i % 4)], "kv_seqlen": [16 << (i % 4)]},
                "failing": ["atb:max_rel_err"] if i == 7 else [],
                "message": "",
                "output_sha256": f"{i:064x}",
                "timing": {"latency_ms_median": 1.0 + i, "repeats": 3, "tflops": 3.0},
            }
        )
    return out


@pytest.mark.skipif(CHROMIUM is None, reason="no chromium binary on PATH (apt-get install chromium)")
def test_report_renders_in_headless_chromium(tmp_path: Path) -> None:
    page = html.render(records(), {"run_name": "browser", "environment": {"host": "h"}})
    assert page.count("<head>") == 1
    (tmp_path / "report.html").write_text(page.replace("<head>", "<head>" + PROBE, 1), encoding="utf-8")
    assert CHROMIUM is not None
    proc = subprocess.run(
        [
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
            f"--user-data-dir={tmp_path / 'profile'}",
            "--enable-logging=stderr",
            "--v=0",
            "--virtual-time-budget=5000",
            "--dump-dom",
            (tmp_path / "report.html").as_uri(),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    match = re.search(r"PROBE(\{.*?\})</pre>", proc.stdout)
    assert match, f"probe missing (rc {proc.returncode}):\n{proc.stderr[-3000:]}"
    probe = json.loads(match.group(1).replace("&quot;", '"'))
    assert probe["errors"] == []
    assert probe["tables"] >= 5 and probe["rows"] == 2  # two groups: npu and cpu
    assert probe["svgs"] == 6 and probe["drawn"] == 6
    console = [line for line in proc.stderr.splitlines() if "CONSOLE" in line or "Uncaught" in line]
    assert console == []
