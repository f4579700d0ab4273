"""Server-side SVG time-series charts: axes with units, threshold lines, state bands, transition markers.

No JavaScript, no CDN: the node page embeds the returned markup. One function,
:func:`time_chart`; x is time (UTC), y is linear from ``y_min`` (default: 0 or the data minimum) to
the data/threshold maximum plus 5% headroom. Gaps (``None`` values) break the line.

Accessibility: the ``<svg>`` has ``role="img"`` and a ``<title>``/``<desc>`` that state what the chart
shows and its latest values, so the information is not carried by colour or shape alone; threshold
lines are dashed and labelled with their name and value (labels of lines closer than a line of
text are moved apart, never drawn over each other), state bands and markers carry their text in a
``<title>``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import datetime
from html import escape

from django.utils.safestring import SafeString, mark_safe

PALETTE = ("#1f5fbf", "#b85c00", "#2e7d32", "#6a1b9a")


@dataclass(frozen=True)
class Series:
    label: str
    points: list[tuple[datetime, float | None]]
    color: str = PALETTE[0]
    dashed: bool = False
    dots: bool = False  # one dot per point, no line (e.g. canary probes: separate measurements)


@dataclass(frozen=True)
class Threshold:
    label: str
    value: float
    color: str = "#c62828"


@dataclass(frozen=True)
class Band:
    """A span of time shaded behind the plot (a node's state), with its label as a tooltip."""

    start: datetime
    end: datetime
    label: str
    color: str


@dataclass(frozen=True)
class Marker:
    at: datetime
    label: str
    color: str = "#444"


def nice_ticks(lo: float, hi: float, count: int = 5) -> list[float]:
    """Round tick values covering ``[lo, hi]`` (steps of 1, 2, 2.5 or 5 x 10^k)."""
    if not (math.isfinite(lo) and math.isfinite(hi)) or hi <= lo:
        return [lo]
    raw = (hi - lo) / max(count, 1)
    mag = 10 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw)
    first = math.ceil(lo / step - 1e-9) * step
    ticks, v = [], first
    while v <= hi + 1e-9 * step:
        ticks.append(round(v, 10))
        v += step
    return ticks


def _fmt(v: float) -> str:
    if v == 0:
        return "0"
    if abs(v) >= 1000:
        return f"{v:,.0f}"
    return f"{v:.3g}"


@dataclass(frozen=True)
class _Frame:
    """The plot's box in the SVG (left, top, width ``pw``, height ``ph``) and its scales: time
    ``[t0, t1]`` across, values ``[lo, hi]`` up."""

    start: datetime
    end: datetime
    left: int
    top: int
    pw: int
    ph: int
    lo: float
    hi: float
    t0: float
    t1: float

    def x(self, at: datetime) -> float:
        return self.left + (at.timestamp() - self.t0) / (self.t1 - self.t0) * self.pw

    def y(self, v: float) -> float:
        return self.top + self.ph - (v - self.lo) / (self.hi - self.lo) * self.ph


def _frame(series: list[Series], thresholds: list[Threshold], *, start: datetime, end: datetime, width: int,
           height: int, y_min: float | None) -> _Frame:
    """The plot's box and scales. Values run from ``y_min`` (default: 0, or the data minimum when
    below it) to the largest value or threshold plus 5 % headroom (1 above the bottom when there is
    nothing, or nothing above it); time from ``start`` to ``end``, at least a second."""
    left, right, top, bottom = 56, 12, 24, 28
    values = [v for s in series for _, v in s.points if v is not None and math.isfinite(v)]
    values += [t.value for t in thresholds]
    lo = y_min if y_min is not None else min([0.0, *values])
    hi = max(values) if values else 1.0
    if hi <= lo:
        hi = lo + 1.0
    hi += (hi - lo) * 0.05
    return _Frame(start=start, end=end, left=left, top=top, pw=width - left - right, ph=height - top - bottom,
                  lo=lo, hi=hi, t0=start.timestamp(), t1=max(end.timestamp(), start.timestamp() + 1))


def _description(series: list[Series], *, title: str, unit: str, start: datetime, end: datetime,
                 thresholds: list[Threshold], markers: list[Marker], bands: list[Band]) -> str:
    """The ``<desc>``: the chart in words (its window, each series' latest value, the thresholds, how
    many transitions are marked, what is shaded), so that nothing is told by colour or shape alone."""
    latest = []
    for s in series:
        last = next((v for _, v in reversed(s.points) if v is not None), None)
        latest.append(f"{s.label} {_fmt(last)} {unit}" if last is not None else f"{s.label}: no data")
    desc = f"{title}, {start:%Y-%m-%d %H:%M} to {end:%H:%M} UTC. Latest: " + "; ".join(latest)
    if thresholds:
        desc += ". Thresholds: " + "; ".join(f"{t.label} {_fmt(t.value)}" for t in thresholds)
    if markers:
        desc += f". {len(markers)} transition(s) marked."
    if bands:
        desc += ". Shaded: " + "; ".join(sorted({b.label for b in bands}))
    return desc


def _bands(f: _Frame, bands: list[Band]) -> list[str]:
    """The state bands behind the plot, each cut to the window (one wholly outside is not drawn)."""
    out = []
    for b in bands:
        x0, x1 = max(f.x(max(b.start, f.start)), f.left), min(f.x(min(b.end, f.end)), f.left + f.pw)
        if x1 > x0:
            out.append(f'<rect class="band" x="{x0:.1f}" y="{f.top}" width="{x1 - x0:.1f}" height="{f.ph}" '
                       f'fill="{b.color}" fill-opacity="0.13"><title>{escape(b.label)}</title></rect>')
    return out


def _axes(f: _Frame, height: int) -> list[str]:
    """The y axis (a grid line and a label at each round value, :func:`nice_ticks`) and the time axis
    (six labels, the dates shown past two days; the edge labels kept inside the box)."""
    out = []
    for tv in nice_ticks(f.lo, f.hi):
        yy = f.y(tv)
        out.append(f'<line x1="{f.left}" x2="{f.left + f.pw}" y1="{yy:.1f}" y2="{yy:.1f}" stroke="#eee"/>')
        out.append(f'<text x="{f.left - 4}" y="{yy + 4:.1f}" font-size="10" text-anchor="end">{_fmt(tv)}</text>')
    span = f.t1 - f.t0
    for k in range(6):
        tt = f.t0 + span * k / 5
        at = datetime.fromtimestamp(tt, tz=f.start.tzinfo)
        label = at.strftime("%H:%M") if span <= 2 * 86400 else at.strftime("%m-%d %H:%M")
        xx = f.left + f.pw * k / 5
        anchor = "start" if k == 0 else "end" if k == 5 else "middle"  # keep edge labels inside the box
        out.append(f'<text x="{xx:.1f}" y="{height - 8}" font-size="10" text-anchor="{anchor}">{label}</text>')
    out.append(f'<text x="{f.left + f.pw}" y="{height - 18}" font-size="9" text-anchor="end" fill="#666">'
               "time (UTC)</text>")
    return out


def _threshold_lines(f: _Frame, thresholds: list[Threshold]) -> list[str]:
    """Each threshold as a dashed line labelled with its name and value, top to bottom; a label
    closer than a line of text to the one above goes under its line instead."""
    out = []
    label_ys: list[float] = []
    for t in sorted(thresholds, key=lambda t: -t.value):  # top to bottom
        yy = f.y(t.value)
        out.append(f'<line class="threshold" x1="{f.left}" x2="{f.left + f.pw}" y1="{yy:.1f}" y2="{yy:.1f}" '
                   f'stroke="{t.color}" stroke-dasharray="6 4"/>')
        ly = max(yy - 3, f.top + 10)
        if label_ys and ly < label_ys[-1] + 12:  # too close to the label above: put it under its line
            ly = max(yy + 11, label_ys[-1] + 12)
        label_ys.append(ly)
        out.append(f'<text class="threshold-label" x="{f.left + f.pw - 4}" y="{ly:.1f}" font-size="10" '
                   f'text-anchor="end" fill="{t.color}">{escape(t.label)} {_fmt(t.value)}</text>')
    return out


def _marker_lines(f: _Frame, markers: list[Marker]) -> list[str]:
    """Each transition within the window as a dotted vertical line topped by a small triangle."""
    out = []
    top = f.top
    for m in markers:
        if not f.start <= m.at <= f.end:
            continue
        xx = f.x(m.at)
        out.append(f'<g class="marker"><title>{escape(m.label)}</title>'
                   f'<line x1="{xx:.1f}" x2="{xx:.1f}" y1="{top}" y2="{top + f.ph}" stroke="{m.color}" '
                   f'stroke-dasharray="2 2"/><path d="M{xx - 4:.1f},{top} L{xx + 4:.1f},{top} L{xx:.1f},{top + 6}" '
                   f'fill="{m.color}"/></g>')
    return out


def _series_marks(f: _Frame, series: list[Series]) -> list[str]:
    """Each series: dots (the points within the window) or a line that a gap (``None``, not finite)
    breaks."""
    out = []
    for s in series:
        if s.dots:
            dots = "".join(f'<circle cx="{f.x(at):.1f}" cy="{f.y(v):.1f}" r="3"/>' for at, v in s.points
                           if v is not None and math.isfinite(v) and f.start <= at <= f.end)
            out.append(f'<g class="dots" fill="{s.color}"><title>{escape(s.label)}</title>{dots}</g>')
            continue
        d, pen = [], "M"
        for at, v in s.points:
            if v is None or not math.isfinite(v):
                pen = "M"
                continue
            d.append(f"{pen}{f.x(at):.1f},{f.y(v):.1f}")
            pen = "L"
        dash = ' stroke-dasharray="4 3"' if s.dashed else ""
        out.append(f'<path class="series" d="{" ".join(d)}" fill="none" stroke="{s.color}" stroke-width="1.5"{dash}>'
                   f"<title>{escape(s.label)}</title></path>")
    return out


def _legend(f: _Frame, series: list[Series]) -> list[str]:
    """The legend along the top of the plot: each series' dot or line (dashed as drawn) and label."""
    out = []
    lx, top = f.left + 8, f.top
    for s in series:
        dash = ' stroke-dasharray="4 3"' if s.dashed else ""
        if s.dots:
            out.append(f'<circle cx="{lx + 8}" cy="{top + 10}" r="3" fill="{s.color}"/>')
        else:
            out.append(f'<line x1="{lx}" x2="{lx + 16}" y1="{top + 10}" y2="{top + 10}" stroke="{s.color}" '
                       f'stroke-width="2"{dash}/>')
        out.append(f'<text x="{lx + 20}" y="{top + 14}" font-size="10">{escape(s.label)}</text>')
        lx += 28 + 6 * len(s.label)
    return out


def time_chart(
    series: list[Series],
    *,
    title: str,
    unit: str,
    start: datetime,
    end: datetime,
    thresholds: list[Threshold] | None = None,
    markers: list[Marker] | None = None,
    bands: list[Band] | None = None,
    width: int = 720,
    height: int = 220,
    y_min: float | None = None,
) -> SafeString:
    """An SVG line chart of ``series`` over ``[start, end]`` with a y axis labelled in ``unit``: drawn
    back to front (bands, axes, thresholds, markers, the series, the legend)."""
    thresholds = thresholds or []
    markers = markers or []
    bands = bands or []
    f = _frame(series, thresholds, start=start, end=end, width=width, height=height, y_min=y_min)
    desc = _description(series, title=title, unit=unit, start=start, end=end, thresholds=thresholds,
                        markers=markers, bands=bands)
    out = [
        f'<svg class="chart" role="img" viewBox="0 0 {width} {height}" width="100%" '
        f'preserveAspectRatio="xMinYMin meet" xmlns="http://www.w3.org/2000/svg">',
        f"<title>{escape(title)}</title><desc>{escape(desc)}</desc>",
        f'<text x="{f.left}" y="14" class="chart-title" font-size="12" font-weight="bold">{escape(title)} '
        f"({escape(unit)})</text>",
        f'<rect x="{f.left}" y="{f.top}" width="{f.pw}" height="{f.ph}" fill="#fff" stroke="#999"/>',
    ]
    out += _bands(f, bands)
    out += _axes(f, height)
    out += _threshold_lines(f, thresholds)
    out += _marker_lines(f, markers)
    out += _series_marks(f, series)
    out += _legend(f, series)
    out.append("</svg>")
    return mark_safe("".join(out))
