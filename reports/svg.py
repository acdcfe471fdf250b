"""Small inline-SVG charts (histogram, strip, scatter/line, error map) so the HTML reports need no
plotting library, no JavaScript and no network.

Every axis gets "nice" tick values (1, 2, 5 times a power of ten; decades on log axes) labelled in
engineering notation with as many digits as it takes to tell the ticks apart, so two ticks never
read the same.  Values a chart cannot place (NaN/Inf, or <= 0 on a log axis) are counted in its
title rather than dropped silently.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from html import escape

W, H = 380, 200
LEFT, RIGHT, TOP, BOTTOM = 62, 26, 24, 36
LEGEND = 150  # width of a scatter's legend column
EDGE = 14  # band at a chart's far edge for NaN/inf points
#: Series colours (colour-blind safe, Okabe-Ito).
PALETTE = ("#0072b2", "#e69f00", "#009e73", "#cc79a7", "#56b4e9", "#d55e00", "#f0e442", "#000000")
#: Error-map colour levels: upper edges of slack (error / bound) and their fills; > 1 is red.
MAP_LEVELS: tuple[tuple[float, str], ...] = (
    (0.125, "#f7fbff"),
    (0.25, "#c6dbef"),
    (0.5, "#6baed6"),
    (1.0, "#2171b5"),
    (2.0, "#fcbba1"),
    (4.0, "#fb6a4a"),
    (16.0, "#cb181d"),
    (math.inf, "#67000d"),
)
MAP_MISSING = "#e0e0e0"
TILE = 128


# ---- numbers and axes -------------------------------------------------------------------------


def eng(value: float, decimals: int, exponent: int) -> str:
    """``value`` as mantissa x 10**exponent (exponent a multiple of 3), or plain when it is 0."""
    if not math.isfinite(value):
        return "inf" if value > 0 else "-inf" if value < 0 else "nan"
    mantissa = value / 10.0**exponent
    text = f"{mantissa:.{decimals}f}"
    if text.lstrip("-").strip("0.") == "":
        text = "0"
    return text if exponent == 0 or text == "0" else f"{text}e{exponent}"


def _exponent(values: Sequence[float]) -> int:
    """Engineering exponent for a set of tick values: from the largest magnitude, 0 for 0.01..9999."""
    big = max((abs(v) for v in values if math.isfinite(v)), default=0.0)
    if big == 0.0 or 1e-2 <= big < 1e4:
        return 0
    return 3 * math.floor(math.log10(big) / 3)


def tick_labels(values: Sequence[float], log: bool = False) -> list[str]:
    """Labels for tick ``values`` with the fewest decimals that keep them distinct: one exponent for
    a linear axis, each value's own on a log axis (its ticks span decades)."""
    exponents = [_exponent([v]) for v in values] if log else [_exponent(values)] * len(values)
    ordered = sorted(values)
    gaps = [b - a for a, b in itertools.pairwise(ordered) if b > a]
    tolerance = 1e-3 * min(gaps, default=max(map(abs, values), default=1.0) or 1.0)
    for decimals in range(0, 12):
        labels = [eng(v, decimals, e) for v, e in zip(values, exponents, strict=True)]
        faithful = all(abs(float(t) - v) <= tolerance for t, v in zip(labels, values, strict=True)) or log
        if faithful and len(set(labels)) == len(labels):
            return labels
    return [repr(v) for v in values]


def _nice_step(span: float, count: int) -> float:
    raw = span / max(count, 1)
    power = 10.0 ** math.floor(math.log10(raw))
    return next(m * power for m in (1.0, 2.0, 2.5, 5.0, 10.0) if m * power >= raw)


@dataclass(frozen=True)
class Axis:
    """A linear or log10 axis over [lo, hi] (log bounds are log10 of the values)."""

    lo: float
    hi: float
    log: bool = False

    @classmethod
    def fit(cls, values: Sequence[float], *, log: bool = False, include: Sequence[float] = ()) -> Axis:
        """An axis covering the finite ``values`` (and ``include``, e.g. a bound at 1)."""
        data = [v for v in (*values, *include) if math.isfinite(v) and (v > 0 or not log)]
        if not data:
            return cls(0.0, 1.0, log)
        lo, hi = (math.log10(min(data)), math.log10(max(data))) if log else (min(data), max(data))
        if hi - lo < 1e-12 * max(abs(lo), abs(hi), 1e-300):
            pad = 0.5 if log else max(abs(lo) * 1e-3, 1e-12)
            lo, hi = lo - pad, hi + pad
        return cls(lo, hi, log)

    def where(self, value: float) -> float:
        """Fraction 0..1 of the way along the axis (outside values clamp; NaN and +inf, the worst
        errors, sit on the far end)."""
        if not math.isfinite(value):
            return 0.0 if value < 0 else 1.0
        v = math.log10(value) if self.log else value
        return min(max((v - self.lo) / (self.hi - self.lo), 0.0), 1.0)

    def ticks(self, count: int = 4) -> list[float]:
        """Nice values inside the axis: 1-2-5 steps, decades (or 1-2-5 within few decades) on log axes."""
        if self.log and self.hi - self.lo >= 2:
            step = max(1, math.ceil((self.hi - self.lo) / count))
            return [10.0**e for e in range(math.ceil(self.lo), math.floor(self.hi) + 1, step)]
        if self.log:
            candidates = [m * 10.0**e for e in range(math.floor(self.lo), math.ceil(self.hi) + 1) for m in (1, 2, 5)]
            inside = [v for v in candidates if self.lo - 1e-9 <= math.log10(v) <= self.hi + 1e-9]
            if len(inside) >= 2:
                return inside[:: max(1, math.ceil(len(inside) / (count + 1)))]
            return [10.0**self.lo, 10.0**self.hi]
        span = _nice_step(self.hi - self.lo, count)
        first = math.ceil(self.lo / span - 1e-9)
        values = [(first + k) * span for k in range(int((self.hi - self.lo) / span + 1e-9) + 1)]
        return [v for v in values if self.lo - 1e-9 * span <= v <= self.hi + 1e-9 * span] or [self.lo, self.hi]


# ---- drawing ------------------------------------------------------------------------------------


def _frame(
    title: str,
    xlabel: str,
    body: Sequence[str],
    *,
    width: int = W,
    height: int = H,
    cls: str = "plot",
    ylabel: str = "",
    right: int = RIGHT,
) -> str:
    y_axis = (
        (
            f'<text transform="translate(11 {(TOP + height - BOTTOM) / 2:.0f}) rotate(-90)" '
            f'text-anchor="middle" class="l">{escape(ylabel)}</text>'
        )
        if ylabel
        else ""
    )
    return (
        f'<svg class="{cls}" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}" role="img"><title>{escape(title)}</title>'
        f'<text x="{width / 2}" y="14" text-anchor="middle" class="t">{escape(fitted(title, width))}</text>'
        f'<line x1="{LEFT}" y1="{height - BOTTOM}" x2="{width - right}" y2="{height - BOTTOM}" class="axis"/>'
        f'<line x1="{LEFT}" y1="{TOP}" x2="{LEFT}" y2="{height - BOTTOM}" class="axis"/>'
        + "".join(body)
        + y_axis
        + f'<text x="{(LEFT + width - right) / 2}" y="{height - 4}" text-anchor="middle" class="l">'
        f"{escape(xlabel)}</text></svg>"
    )


#: Width of a title character (11 px bold sans-serif), generous so an estimate never overflows.
TITLE_CHAR = 6.6


def title_width(title: str) -> float:
    return len(title) * TITLE_CHAR + 16


def fitted(title: str, width: float) -> str:
    """``title`` cut (with an ellipsis) to what fits ``width``; the full text is the chart's <title>."""
    keep = int((width - 16) / TITLE_CHAR)
    return title if len(title) <= keep else title[: max(keep - 1, 1)] + "…"


def _no_data(title: str, xlabel: str) -> str:
    return _frame(title, xlabel, [f'<text x="{W / 2}" y="{H / 2}" text-anchor="middle">no data</text>'])


def _xtick(x: float, label: str, height: int = H) -> str:
    y = height - BOTTOM
    return (
        f'<line x1="{x:.1f}" y1="{y}" x2="{x:.1f}" y2="{y + 4}" class="axis"/>'
        f'<text x="{x:.1f}" y="{y + 14}" text-anchor="middle" class="l">{escape(label)}</text>'
    )


def _ytick(y: float, label: str) -> str:
    return (
        f'<line x1="{LEFT - 4}" y1="{y:.1f}" x2="{LEFT}" y2="{y:.1f}" class="axis"/>'
        f'<text x="{LEFT - 6}" y="{y + 3:.1f}" text-anchor="end" class="l">{escape(label)}</text>'
    )


def _labelled(axis: Axis, count: int = 4) -> list[tuple[float, str]]:
    """The axis's tick values with their labels."""
    values = axis.ticks(count)
    return list(zip(values, tick_labels(values, axis.log), strict=True))


def _x_ticks(axis: Axis, pw: float) -> list[str]:
    return [_xtick(LEFT + pw * axis.where(v), label) for v, label in _labelled(axis)]


def _y_ticks(axis: Axis, ph: float) -> list[str]:
    return [_ytick(H - BOTTOM - ph * axis.where(v), label) for v, label in _labelled(axis)]


def _dropped(title: str, count: int, what: str) -> str:
    return f"{title} ({count} {what})" if count else title


def _placeable(value: float, log: bool) -> bool:
    """Drawable on a scatter or strip axis: NaN/Inf are (on the far edge), <= 0 is not on a log axis."""
    return not math.isfinite(value) or value > 0 or not log


def _notes(title: str, pinned: int, dropped: int) -> str:
    title = _dropped(title, pinned, "NaN/inf: far edge")
    return _dropped(title, dropped, "zero, off the log axis")


def histogram(
    values: Sequence[float],
    title: str,
    xlabel: str,
    *,
    log10: bool = False,
    bins: int = 20,
    marker: float | None = None,
) -> str:
    """Histogram of the finite values (on a log10 axis if ``log10``); ``marker`` draws a vertical
    line (e.g. slack = 1, the pass/fail bound)."""
    usable = [v for v in values if math.isfinite(v) and (v > 0 or not log10)]
    title = _dropped(title, len(values) - len(usable), "non-finite or zero" if log10 else "non-finite")
    if not usable:
        return _no_data(title, xlabel)
    axis = Axis.fit(usable, log=log10, include=() if marker is None else (marker,))
    counts = [0] * bins
    for v in usable:
        counts[min(int(axis.where(v) * bins), bins - 1)] += 1
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
    body += _x_ticks(axis, pw)
    body += [_ytick(TOP, str(top)), _ytick(H - BOTTOM, "0")]
    if marker is not None:
        x = LEFT + pw * axis.where(marker)
        body.append(f'<line x1="{x:.1f}" y1="{TOP}" x2="{x:.1f}" y2="{H - BOTTOM}" class="bound"/>')
    return _frame(title, xlabel, body, ylabel="cases")


def _log_wanted(values: Sequence[float]) -> bool:
    """A log axis when the positive values span more than two decades."""
    positive = [v for v in values if math.isfinite(v) and v > 0]
    return bool(positive) and max(positive) > 100 * min(positive)


def strip(
    points: Sequence[tuple[str, float]],
    title: str,
    xlabel: str,
    *,
    ylabel: str = "",
    marker: float | None = None,
    log10: bool | None = None,
) -> str:
    """Dots per category (x) with hover text, e.g. worst slack by kv layout.  ``log10=None``
    chooses a log y axis when the values span more than two decades."""
    log = _log_wanted([v for _, v in points]) if log10 is None else log10
    usable = [(c, v) for c, v in points if _placeable(v, log)]
    title = _notes(title, sum(not math.isfinite(v) for _, v in usable), len(points) - len(usable))
    if not usable:
        return _no_data(title, xlabel)
    cats = sorted({c for c, _ in usable}, key=lambda c: (len(c), c))
    axis = Axis.fit([v for _, v in usable], log=log, include=() if marker is None else (marker,))
    pinned = any(not math.isfinite(v) for _, v in usable)
    pw, ph = W - LEFT - RIGHT, H - TOP - BOTTOM - (EDGE if pinned else 0)
    step = pw / len(cats)
    body = [_xtick(LEFT + step * (i + 0.5), c) for i, c in enumerate(cats)]
    body += _y_ticks(axis, ph) + ([_ytick(TOP + 3, "NaN/inf")] if pinned else [])
    if marker is not None:
        y = H - BOTTOM - ph * axis.where(marker)
        body.append(f'<line x1="{LEFT}" y1="{y:.1f}" x2="{W - RIGHT}" y2="{y:.1f}" class="bound"/>')
    for n, (c, v) in enumerate(usable):
        jitter = ((n * 7919) % 11 - 5) / 5 * min(step * 0.3, 12)
        x = LEFT + step * (cats.index(c) + 0.5) + jitter
        y = H - BOTTOM - ph * axis.where(v) if math.isfinite(v) else TOP + 3
        over = " over" if marker is not None and v > marker else ""
        body.append(
            f'<circle cx="{x:.1f}" cy="{y:.1f}" r="2.5" class="dot{over}"><title>{escape(c)}: {v:.4g}</title></circle>'
        )
    return _frame(title, xlabel, body, ylabel=ylabel)


@dataclass(frozen=True)
class Point:
    """One point of a scatter: position, hover text, and whether to mark it (e.g. a regression)."""

    x: float
    y: float
    label: str
    marked: bool = False


def scatter(
    series: Mapping[str, Sequence[Point]],
    title: str,
    xlabel: str,
    ylabel: str,
    *,
    xlog: bool = False,
    ylog: bool | None = None,
    lines: bool = False,
    marker: float | None = None,
    diagonal: bool = False,
    colours: Mapping[str, str] | None = None,
    width: int = 660,
    totals: Mapping[str, int] | None = None,
) -> str:
    """Points per series (own colour, legend), optionally joined through each x's largest y
    (``lines``: e.g. worst slack against kv length).  ``marker`` draws the horizontal (and, with
    ``diagonal``, vertical) bound line; ``diagonal`` the y = x line of an unchanged value.
    ``ylog=None`` chooses a log axis when the values span more than two decades; ``colours``
    fixes a series' colour (others take the palette's in order); ``totals`` gives a series' count as its
    table states it (the legend then reads "n, k plotted" when fewer points could be placed)."""
    height = H + 40
    ys = [p.y for pts in series.values() for p in pts]
    log = (
        (_log_wanted(ys) or (diagonal and _log_wanted([p.x for pts in series.values() for p in pts])))
        if ylog is None
        else ylog
    )
    xlog = xlog or (diagonal and log)
    usable = {name: [p for p in pts if _placeable(p.x, xlog) and _placeable(p.y, log)] for name, pts in series.items()}
    points = [p for pts in usable.values() for p in pts]
    title = _notes(
        title,
        sum(not (math.isfinite(p.x) and math.isfinite(p.y)) for p in points),
        sum(len(p) for p in series.values()) - len(points),
    )
    if not points:
        return _no_data(title, xlabel)
    extra = () if marker is None else (marker,)
    xaxis = Axis.fit(
        [p.x for p in points] + ([p.y for p in points] if diagonal else []), log=xlog, include=extra if diagonal else ()
    )
    yaxis = xaxis if diagonal else Axis.fit([p.y for p in points], log=log, include=extra)
    x_pinned = any(not math.isfinite(p.x) for p in points)
    y_pinned = any(not math.isfinite(p.y) for p in points)
    plot_bottom = height - BOTTOM
    full_w, full_h = width - LEFT - RIGHT - LEGEND, plot_bottom - TOP
    pw, ph = full_w - (EDGE if x_pinned else 0), full_h - (EDGE if y_pinned else 0)

    def at(p: Point) -> tuple[float, float]:
        x = LEFT + pw * xaxis.where(p.x) if math.isfinite(p.x) else LEFT + full_w - 3
        return x, plot_bottom - ph * yaxis.where(p.y) if math.isfinite(p.y) else TOP + 3

    body = [_xtick(LEFT + pw * xaxis.where(v), label, height) for v, label in _labelled(xaxis, 6)]
    body += [_ytick(plot_bottom - ph * yaxis.where(v), label) for v, label in _labelled(yaxis)]
    body += [_xtick(LEFT + full_w - 3, "NaN/inf", height)] if x_pinned else []
    body += [_ytick(TOP + 3, "NaN/inf")] if y_pinned else []
    if diagonal:
        body.append(f'<line x1="{LEFT}" y1="{plot_bottom}" x2="{LEFT + pw}" y2="{TOP}" class="diag"/>')
    if marker is not None:
        y = plot_bottom - ph * yaxis.where(marker)
        body.append(f'<line x1="{LEFT}" y1="{y:.1f}" x2="{LEFT + pw}" y2="{y:.1f}" class="bound"/>')
        if diagonal:
            x = LEFT + pw * xaxis.where(marker)
            body.append(f'<line x1="{x:.1f}" y1="{TOP}" x2="{x:.1f}" y2="{plot_bottom}" class="bound"/>')
    for n, (name, pts) in enumerate(usable.items()):
        colour = (colours or {}).get(name, PALETTE[n % len(PALETTE)])
        if lines and pts:
            top: dict[float, Point] = {}
            for p in pts:
                if p.x not in top or math.isnan(p.y) or p.y > top[p.x].y:
                    top[p.x] = p
            path = " ".join(f"{x:.1f},{y:.1f}" for x, y in (at(top[k]) for k in sorted(top)))
            body.append(f'<polyline points="{path}" fill="none" stroke="{colour}" stroke-width="1.5"/>')
        for p in pts:
            x, y = at(p)
            ring = ' stroke="#b00020" stroke-width="2"' if p.marked else ""
            body.append(
                f'<circle cx="{x:.1f}" cy="{y:.1f}" r="{4 if p.marked else 2.8}" fill="{colour}" '
                f'fill-opacity=".75"{ring}><title>{escape(p.label)}</title></circle>'
            )
        ly = TOP + 14 * n
        total = (totals or {}).get(name, len(pts))
        count = f"{total}" if total == len(pts) else f"{total}, {len(pts)} plotted"
        body.append(
            f'<rect x="{width - LEGEND + 10}" y="{ly}" width="10" height="10" fill="{colour}"/>'
            f'<text x="{width - LEGEND + 24}" y="{ly + 9}" class="l">{escape(name)} ({count})</text>'
        )
    return _frame(title, xlabel, body, width=width, height=height, ylabel=ylabel, right=RIGHT + LEGEND)


# ---- error map ----------------------------------------------------------------------------------


def map_colour(value: float | None) -> str:
    if value is None or math.isnan(value):
        return MAP_MISSING
    return next(fill for edge, fill in MAP_LEVELS if value <= edge)


#: Widest error map (a title never widens it beyond); its legend column.
MAP_MAX_WIDTH, MAP_LEGEND = 900, 150


def error_map(
    values: Sequence[Sequence[float | None]],
    title: str,
    *,
    row_stride: int,
    q_seqlen: Sequence[int],
    legend: Sequence[str],
    head_stride: int = 1,
) -> str:
    """Error over token rows (x, pooled by ``row_stride``) and heads (y, by ``head_stride``), one colour
    level per slack band (above 1 fails: red); ``legend`` says what the values are (the deciding
    rule).  Batch starts are solid lines, tile boundaries (every 128 rows of a sequence) dashed,
    so layout, masking and tail bugs show as stripes and blocks."""
    rows, heads = len(values), max((len(r) for r in values), default=0)
    if not rows or not heads:
        return _no_data(title, "token position")
    legend = [*legend, "red (above 1): fails"]
    cell_w = max(1.0, min(8.0, 720 / rows))
    top = TOP + 11 * (len(legend) - 1)
    cell_h = max(2.0, min(14.0, 224 / heads), (12 + 13 * len(MAP_LEVELS) + 11 * len(legend)) / heads)
    pw, ph = cell_w * rows, cell_h * heads
    width = int(max(LEFT + pw + RIGHT + MAP_LEGEND, min(title_width(title), MAP_MAX_WIDTH)))
    height = int(TOP + ph + BOTTOM)
    body: list[str] = []
    for h in range(heads):
        r = 0
        while r < rows:  # one rect per run of equal colour along the row
            colour = map_colour(values[r][h] if h < len(values[r]) else None)
            end = r + 1
            while end < rows and map_colour(values[end][h] if h < len(values[end]) else None) == colour:
                end += 1
            worst = [v for v in (values[k][h] for k in range(r, end) if h < len(values[k])) if v is not None]
            heads_text = f"head {h}" if head_stride == 1 else f"heads {h * head_stride}-{(h + 1) * head_stride - 1}"
            hover = f"tokens {r * row_stride}-{end * row_stride - 1}, {heads_text}: " + (
                f"max {max(worst):.3g}" if worst else "not checked"
            )
            body.append(
                f'<rect x="{LEFT + r * cell_w:.1f}" y="{TOP + h * cell_h:.1f}" '
                f'width="{(end - r) * cell_w:.1f}" height="{cell_h:.1f}" fill="{colour}">'
                f"<title>{escape(hover)}</title></rect>"
            )
            r = end
    total = rows * row_stride
    starts: list[int] = []
    tiles: list[int] = []
    start = 0
    for n in q_seqlen:
        starts.append(start)
        tiles += range(start + TILE, start + n, TILE)
        start += n
    for token, cls in [(t, "batch") for t in starts[1:] if t < total] + [(t, "tile") for t in tiles if t < total]:
        x = LEFT + token / row_stride * cell_w
        body.append(f'<line x1="{x:.1f}" y1="{TOP}" x2="{x:.1f}" y2="{TOP + ph:.1f}" class="{cls}"/>')
    labelled = sorted({0, *starts, *tiles} & set(range(total)))
    every = max(1, math.ceil(len(labelled) * 40 / max(pw, 1)))
    for token in labelled[::every]:
        body.append(_xtick(LEFT + token / row_stride * cell_w, str(token), height))
    for h in sorted({0, heads // 2, heads - 1}):
        body.append(_ytick(TOP + (h + 0.5) * cell_h, f"h{h * head_stride}"))
    x0 = LEFT + pw + RIGHT
    for n, line in enumerate(legend):
        body.append(f'<text x="{x0}" y="{TOP + 6 + 11 * n}" class="l">{escape(line)}</text>')
    edges = [edge for edge, _ in MAP_LEVELS]
    for n, (edge, fill) in enumerate(MAP_LEVELS):
        text = f"> {edges[n - 1]:g}" if math.isinf(edge) else f"<= {edge:g}"
        y = top + 12 + 13 * n
        body.append(
            f'<rect x="{x0}" y="{y}" width="10" height="10" fill="{fill}" stroke="#999"/>'
            f'<text x="{x0 + 14}" y="{y + 9}" class="l">{escape(text)}</text>'
        )
    xlabel = f"token row (1 column = {row_stride} rows; solid: batch start, dashed: every {TILE} rows)"
    return _frame(
        title, xlabel, body, width=width, height=height, cls="plot errmap", ylabel="head", right=int(width - LEFT - pw)
    )
