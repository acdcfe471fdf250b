"""Tiny inline-SVG charts (histogram, strip plot) so report.html needs no plotting library or JS."""

from __future__ import annotations

import math
from collections.abc import Sequence
from html import escape

W, H = 320, 180
LEFT, RIGHT, TOP, BOTTOM = 44, 10, 22, 34


def _frame(title: str, xlabel: str, body: list[str]) -> str:
    return (
        f'<svg xmlns="http://www.w3.org/2000/svg" class="plot" width="{W}" height="{H}" '
        f'viewBox="0 0 {W} {H}" role="img"><title>{escape(title)}</title>'
        f'<text x="{W / 2}" y="14" text-anchor="middle" class="t">{escape(title)}</text>'
        f'<line x1="{LEFT}" y1="{H - BOTTOM}" x2="{W - RIGHT}" y2="{H - BOTTOM}" class="axis"/>'
        f'<line x1="{LEFT}" y1="{TOP}" x2="{LEFT}" y2="{H - BOTTOM}" class="axis"/>'
        + "".join(body)
        + f'<text x="{W / 2}" y="{H - 4}" text-anchor="middle" class="l">{escape(xlabel)}</text></svg>'
    )


def _tick(x: float, label: str, anchor: str = "middle") -> str:
    y = H - BOTTOM
    return (
        f'<line x1="{x:.1f}" y1="{y}" x2="{x:.1f}" y2="{y + 4}" class="axis"/>'
        f'<text x="{x:.1f}" y="{y + 14}" text-anchor="{anchor}" class="l">{escape(label)}</text>'
    )


def _label(v: float, log10: bool) -> str:
    """Axis value; log axes show the value itself, not its exponent."""
    return f"{10**v:.3g}" if log10 else f"{v:.3g}"


def _ytick(y: float, label: str) -> str:
    return (
        f'<line x1="{LEFT - 4}" y1="{y:.1f}" x2="{LEFT}" y2="{y:.1f}" class="axis"/>'
        f'<text x="{LEFT - 6}" y="{y + 3:.1f}" text-anchor="end" class="l">{escape(label)}</text>'
    )


def histogram(
    values: Sequence[float],
    title: str,
    xlabel: str,
    *,
    log10: bool = False,
    bins: int = 20,
    marker: float | None = None,
) -> str:
    """Histogram of the finite values (log10 of the positive ones if ``log10``).

    Values that cannot be placed (NaN/Inf, or <= 0 on a log axis) are counted in the title, so
    a NaN output is never silently dropped from the picture.  ``marker`` draws a vertical line
    (e.g. slack = 1, the pass/fail bound).
    """
    usable = [v for v in values if math.isfinite(v) and (v > 0 or not log10)]
    dropped = len(values) - len(usable)
    data = [math.log10(v) for v in usable] if log10 else list(usable)
    if dropped:
        title = f"{title} ({dropped} non-finite{' or zero' if log10 else ''})"
    if not data:
        return _frame(title, xlabel, [f'<text x="{W / 2}" y="{H / 2}" text-anchor="middle">no data</text>'])
    lo, hi = min(data), max(data)
    if marker is not None:
        lo, hi = min(lo, marker), max(hi, marker)
    if hi - lo < 1e-12:
        lo, hi = lo - 0.5, hi + 0.5
    counts = [0] * bins
    for v in data:
        counts[min(int((v - lo) / (hi - lo) * bins), bins - 1)] += 1
    top = max(counts)
    pw, ph = W - LEFT - RIGHT, H - TOP - BOTTOM
    body: list[str] = []
    for i, n in enumerate(counts):
        if n:
            h = ph * n / top
            body.append(
                f'<rect x="{LEFT + pw * i / bins:.1f}" y="{H - BOTTOM - h:.1f}" '
                f'width="{max(pw / bins - 1, 1):.1f}" height="{h:.1f}" class="bar"><title>{n}</title></rect>'
            )
    for frac, anchor in ((0.0, "start"), (0.5, "middle"), (1.0, "end")):
        v = lo + (hi - lo) * frac
        body.append(_tick(LEFT + pw * frac, _label(v, log10), anchor))
    body.append(_ytick(TOP, str(top)))
    if marker is not None:
        x = LEFT + pw * (marker - lo) / (hi - lo)
        body.append(f'<line x1="{x:.1f}" y1="{TOP}" x2="{x:.1f}" y2="{H - BOTTOM}" class="bound"/>')
    return _frame(title, xlabel, body)


def strip(points: Sequence[tuple[str, float]], title: str, xlabel: str) -> str:
    """Dots per category (x) on a log10 y axis, e.g. max_rel_err by sequence-length bucket."""
    usable = [(c, math.log10(v)) for c, v in points if math.isfinite(v) and v > 0]
    if len(usable) < len(points):
        title = f"{title} ({len(points) - len(usable)} non-finite or zero)"
    if not usable:
        return _frame(title, xlabel, [f'<text x="{W / 2}" y="{H / 2}" text-anchor="middle">no data</text>'])
    cats = sorted({c for c, _ in usable}, key=lambda c: (len(c), c))
    lo, hi = min(v for _, v in usable), max(v for _, v in usable)
    if hi - lo < 1e-12:
        lo, hi = lo - 0.5, hi + 0.5
    pw, ph = W - LEFT - RIGHT, H - TOP - BOTTOM
    step = pw / len(cats)
    body = [_tick(LEFT + step * (i + 0.5), c) for i, c in enumerate(cats)]
    body += [_ytick(TOP, _label(hi, True)), _ytick(H - BOTTOM, _label(lo, True))]
    for c, v in usable:
        x = LEFT + step * (cats.index(c) + 0.5)
        y = H - BOTTOM - ph * (v - lo) / (hi - lo)
        body.append(f'<circle cx="{x:.1f}" cy="{y:.1f}" r="2.5" class="dot"/>')
    return _frame(title, xlabel, body)
