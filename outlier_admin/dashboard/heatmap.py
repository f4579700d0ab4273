"""The group page's view over time: nodes x time, each cell saying where the node stood against its
peers as the detector judges it, with a band of each node's state.

One row per node (the nodes the table puts first: problems, then the highest Z), one column per time
bucket; the axis spans the data (:func:`data_window`: three minutes of history fill it, an hour of it
is the last hour in minutes). A cell is the node's median reading in the bucket, read by the read
model (:func:`outlier_admin.history.replay.reading`, which the nodes table agrees with) the way the
detector reads it: by
default on the node's **deciding** signal (of the group's judged signals, the one with the larger Z,
as :func:`detector.detectors.zscore.decide` picks it; ``?signal=`` shows one signal instead), against
the detector's own lines (:func:`detector.detectors.zscore.lines`): over the degrade line only when
Z is over ``degrade_z`` **and** the node is materially slower (EMA at least ``degrade_materiality``
times its peers' baseline), at quarantine strength only on a signal that may quarantine. So a healthy
fleet whose prefill times spread a few percent, which gives Z over 2 with a small spread, is not
painted as a fleet of outliers. Colours (:data:`LEVELS`): white at or under the peers, pale yellow
slower but under the line, orange over the degrade line, red at quarantine strength; grey without a
Z (quarantined, probing: no traffic). Under each row a thin band shows the node's state, merged into
one segment per run of equal states, each with its name in a tooltip, so nothing is told by colour
alone. Server-rendered SVG, no script (CSP ``default-src 'self'``).

Size: at most :data:`MAX_ROWS` x :data:`BUCKETS` cells, from three indexed queries (the first write,
the rows, the group's stored baselines) and one vectorised decision over every history write.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from html import escape

import numpy as np
from django.utils.safestring import SafeString, mark_safe

from detector.detectors import zscore
from detector.signals import SIGNALS
from detector.states import NodeState as S
from detector.thresholds import Thresholds
from outlier_admin.control.models import NodeHistory
from outlier_admin.fleet.models import Node
from outlier_admin.history.queries import attention_rank
from outlier_admin.history.replay import (
    AT_OR_UNDER,
    OVER_DEGRADE,
    OVER_QUARANTINE,
    SLOWER,
    judged_in,
    load,
    reading,
)

MAX_ROWS = 50
#: At most this many time buckets (columns); the plot is :data:`PLOT_W` wide whatever their number.
BUCKETS = 60
PLOT_W = 960
STATE_COLORS = {s.label: colour for s, colour in {
    S.HEALTHY: "#2e7d32", S.FORCED_ACTIVE: "#2e7d32", S.DEGRADED: "#ef8f00", S.PENDING_APPROVAL: "#b8860b",
    S.QUARANTINED: "#c62828", S.FORCED_QUARANTINE: "#8e0000", S.PROBING: "#1f5fbf", S.RECOVERING: "#64b5f6",
    S.WARMING: "#9e9e9e",
}.items()}
NO_Z = "#d9d9d9"
#: A reading's level against the detector's lines (:mod:`outlier_admin.history.replay`): its cell's
#: class and what the legend says of it.
LEVELS = {
    AT_OR_UNDER: ("z-under", "#ffffff"),
    SLOWER: ("z-slower", "#fff0a8"),  # the paler end; the fill ramps from white with Z
    OVER_DEGRADE: ("z-degrade", "#ef8f00"),  # the lighter end; the fill darkens towards quarantine Z
    OVER_QUARANTINE: ("z-quarantine", "#c62828"),
}


def cell_color(level: int, z: float, thresholds: Thresholds) -> str:
    """The fill of a reading at ``level`` (:data:`LEVELS`) with Z ``z``: white -> pale yellow with Z
    under the degrade line (however high an immaterial Z is, it stays pale), orange darkening from
    the degrade to the quarantine Z over it, red at quarantine strength."""
    dz, qz = thresholds.degrade_z, thresholds.quarantine_z
    if level == OVER_QUARANTINE:
        return LEVELS[OVER_QUARANTINE][1]
    if level == OVER_DEGRADE:
        return _mix((239, 143, 0), (191, 54, 12), (z - dz) / max(qz - dz, 1e-9))
    if level == SLOWER:
        return _mix((255, 255, 255), (255, 240, 168), z / max(dz, 1e-9))
    return LEVELS[AT_OR_UNDER][1]


def _mix(a: tuple[int, int, int], b: tuple[int, int, int], f: float) -> str:
    f = min(max(f, 0.0), 1.0)
    return "#" + "".join(f"{round(x + (y - x) * f):02x}" for x, y in zip(a, b, strict=True))


@dataclass(frozen=True)
class Cell:
    """A node's median reading in one bucket: its deciding Z, the signal it was on, its EMA over the
    peers' baseline (``excess``, None when no baseline is known), its :data:`LEVELS` level (None:
    no Z); the highest Z of the bucket's ``readings``; and the most urgent state of the bucket."""

    z: float | None
    state: str | None
    signal: str | None = None
    excess: float | None = None
    level: int | None = None
    peak: float | None = None
    readings: int = 0


def cells(nodes: list[Node], window: Window, thresholds: Thresholds, signal: str | None = None) -> dict[int, list[Cell]]:
    """``{node pk: [Cell per bucket]}``: each bucket's median reading (by level, then Z) on each
    node's deciding signal (or on ``signal``): the read model's
    :func:`~outlier_admin.history.replay.reading`, the same Z the nodes table shows for the same
    history write; and its most urgent state (:func:`~outlier_admin.history.queries.attention_rank`);
    ``Cell(None, None)`` for a bucket without history.

    Vectorised (numpy) after the read model's two reads: 50 nodes x an hour of writes every 10 s x
    four signals is 72,000 rows."""
    buckets = window.buckets
    out = {n.pk: [Cell(None, None)] * buckets for n in nodes}
    if not nodes:
        return out
    group_id = nodes[0].group_id
    signals = judged_in(group_id, window.start, window.end) if signal is None else (signal,)
    f = load(group_id, window.start, window.end, signals, node_ids=list(out), tails=False)
    if not f.columns:
        return out
    r = reading(f, thresholds, signal)
    row_of = {pk: i for i, pk in enumerate(out)}
    col_row = np.array([row_of[f.node_ids[k]] for k in f.col_node.tolist()], dtype=np.int64)
    bucket = np.clip(((f.writes[f.col_write] - window.start.timestamp()) / window.step_s).astype(np.int64),
                     0, buckets - 1)
    labels = {int(s): s.label for s in S}
    # The most urgent state of each node's bucket.
    rank = np.array([attention_rank(labels[x]) if x in labels else 10**6 for x in f.state.tolist()], dtype=np.int64)
    urgent = np.full((len(out), buckets), 10**6, dtype=np.int64)
    np.minimum.at(urgent, (col_row, bucket), rank)
    label = {attention_rank(x): x for x in labels.values()}
    # The median reading of each node's bucket (the detector too cuts on persistence, not on one
    # tick: a node over the line for most of the minute is painted so, a single reading is not).
    judged = np.flatnonzero(np.isfinite(r.z))
    order = judged[np.lexsort((r.z[judged], r.level[judged], bucket[judged], col_row[judged]))]
    key = col_row[order] * buckets + bucket[order]
    starts = np.flatnonzero(np.r_[True, key[1:] != key[:-1]]) if len(order) else np.array([], np.int64)
    counts = np.diff(np.r_[starts, len(order)])
    peaks = np.maximum.reduceat(r.z[order], starts) if len(order) else np.array([])
    picked = {int(key[s0]): (int(order[s0 + c // 2]), float(pk), int(c))
              for s0, c, pk in zip(starts.tolist(), counts.tolist(), peaks.tolist(), strict=True)}
    for i, pk in enumerate(out):
        row = []
        for b in range(buckets):
            state = label.get(int(urgent[i, b]))
            if (i * buckets + b) in picked:
                c, peak, count = picked[i * buckets + b]
                x = float(r.excess[c])
                row.append(Cell(float(r.z[c]), state, SIGNALS[int(r.which[c])], x if math.isfinite(x) else None,
                                int(r.level[c]), peak=peak, readings=count))
            else:
                row.append(Cell(None, state))
        out[pk] = row
    return out


def heatmap(nodes: list[Node], thresholds: Thresholds, *, window: Window, signals: Sequence[str],
            signal: str | None = None) -> SafeString:
    """The SVG (see the module docstring) of the first :data:`MAX_ROWS` of ``nodes`` (in order), read
    on each node's deciding signal (``signals``: the group's judged ones now, for the caption) or on
    ``signal``, over ``window`` (:func:`data_window`)."""
    nodes = nodes[:MAX_ROWS]
    grid = cells(nodes, window, thresholds, signal)
    signals = (signal,) if signal else signals
    start, end, buckets = window.start, window.end, window.buckets
    label_w, top, cell_h, band_h, gap = 170, 18, 12, 4, 3
    cell_w = PLOT_W / buckets
    row_h = cell_h + band_h + gap
    width = label_w + PLOT_W + 10
    height = top + max(len(nodes), 1) * row_h + 22
    span = end - start
    fmt = "%H:%M" if window.step_s * buckets / 6 >= 60 and window.step_s >= 60 else "%H:%M:%S"
    on = " or ".join(signals) if len(signals) > 1 else signals[0]
    desc = (f"Each node against its peers on {on} ({len(nodes)} nodes) from {start:{fmt}} to {end:{fmt}} UTC in "
            f"{buckets} steps of {window.step_s:g} s; a band under each row shows the node's state.")
    out = [f'<svg class="heatmap" role="img" viewBox="0 0 {width} {height}" width="100%" '
           f'preserveAspectRatio="xMinYMin meet" xmlns="http://www.w3.org/2000/svg">',
           f"<title>Nodes against their peers ({escape(on)})</title><desc>{escape(desc)}</desc>"]
    ticks = sorted({round(buckets * j / 6) for j in range(7)})
    for k in ticks:
        at = start + span * k / buckets
        anchor = "start" if k == 0 else "end" if k == buckets else "middle"
        out.append(f'<text x="{label_w + k * cell_w:g}" y="{height - 6}" font-size="10" text-anchor="{anchor}">'
                   f"{at:{fmt}}</text>")
    for i, n in enumerate(nodes):
        y = top + i * row_h
        name = n.name if len(n.name) <= 26 else n.name[:25] + "…"
        out.append(f'<g class="heat-row" data-node="{n.pk}"><text x="{label_w - 6}" y="{y + cell_h - 2}" '
                   f'font-size="10" text-anchor="end"><title>{escape(n.name)}</title>{escape(name)}</text>')
        for b, c in enumerate(grid[n.pk]):
            if c.z is None and c.state is None:
                continue
            at = start + span * b / buckets
            if c.z is None or c.level is None:
                css, fill = "no-z", NO_Z
            else:
                css, fill = LEVELS[c.level][0], cell_color(c.level, c.z, thresholds)
            text = f"{n.name} {at:%H:%M:%S}: {reading_text(c, thresholds)}, {c.state or 'state unknown'}"
            out.append(f'<rect class="cell {css}" x="{label_w + b * cell_w:g}" y="{y}" width="{cell_w - 1:g}" '
                       f'height="{cell_h}" fill="{fill}" stroke="#ccc" stroke-width="0.5"><title>{escape(text)}</title></rect>')
        run_start, run_state = 0, None
        for b, c in enumerate([*grid[n.pk], Cell(None, "__end__")]):
            if c.state != run_state:
                if run_state is not None and b > run_start:
                    out.append(f'<rect class="band band-{escape(run_state)}" x="{label_w + run_start * cell_w:g}" '
                               f'y="{y + cell_h + 1}" width="{(b - run_start) * cell_w - 1:g}" height="{band_h}" '
                               f'fill="{STATE_COLORS.get(run_state, "#555")}"><title>{escape(n.name)}: '
                               f'{escape(run_state)}</title></rect>')
                run_start, run_state = b, c.state
        out.append("</g>")
    if not nodes:
        out.append(f'<text x="{label_w}" y="{top + 10}" font-size="11">No nodes.</text>')
    out.append("</svg>")
    return mark_safe("".join(out))


def reading_text(c: Cell, t: Thresholds) -> str:
    """A cell's tooltip: its Z (in peer spreads, σ) and signal, its EMA as a multiple of the peers'
    baseline, and which line it is over."""
    if c.z is None or c.level is None:
        return "no Z (no traffic judged)"
    ratio = f", {c.excess:.2f}× the peers' baseline" if c.excess is not None else ", peers' baseline unknown"
    m = float(zscore.materiality(np.array([SIGNALS.index(c.signal) if c.signal in SIGNALS else -1]), t)[0])
    verdict = {
        OVER_QUARANTINE: f"at quarantine strength (Z ≥ {t.quarantine_z:g} σ and ≥ {t.quarantine_materiality:g}×)",
        OVER_DEGRADE: f"over the degrade line (Z ≥ {t.degrade_z:g} σ and ≥ {m:g}×)",
        SLOWER: f"slower than its peers, under the degrade line (Z ≥ {t.degrade_z:g} σ and ≥ {m:g}× both needed)",
        AT_OR_UNDER: "as fast as its peers or faster",
    }[c.level]
    peak = f" (median of {c.readings} readings; highest Z {c.peak:.2f} σ)" if c.readings > 1 and c.peak is not None else ""
    return f"Z {c.z:.2f} σ on {c.signal}{ratio}: {verdict}{peak}"


def heatmap_legend(t: Thresholds) -> list[tuple[str, str, str]]:
    """``(class, colour, meaning)`` of each kind of cell, with the thresholds ``t`` in force and their
    units (Z in σ, the peers' robust spread; the EMA as a multiple of the peers' baseline)."""
    robust = t.baseline_mode == "robust"
    on_prefill = float(zscore.materiality(np.array([SIGNALS.index("prefill_time")]), t)[0])

    def line(z: float, m: float, *, per_signal: bool = False) -> str:
        if not robust:
            return f"Z ≥ {z:g} σ"
        other = f" ({on_prefill:g}× on prefill_time)" if per_signal and on_prefill != m else ""
        return f"Z ≥ {z:g} σ and EMA ≥ {m:g}× the peers' baseline{other}"

    return [
        (*LEVELS[AT_OR_UNDER], "as fast as its peers or faster (Z ≤ 0)"),
        (*LEVELS[SLOWER], "slower than its peers but under the degrade line "
                          f"({line(t.degrade_z, t.degrade_materiality, per_signal=True)} both needed); paler the lower its Z"),
        (*LEVELS[OVER_DEGRADE], f"over the degrade line ({line(t.degrade_z, t.degrade_materiality, per_signal=True)}):"
                                " the detector cuts its weight once its evidence holds; darker towards quarantine Z"),
        (*LEVELS[OVER_QUARANTINE], f"at quarantine strength ({line(t.quarantine_z, t.quarantine_materiality)}"
                                   + (", not on prefill_time alone" if robust else "") + ")"),
        ("no-z", NO_Z, "no Z (no traffic judged: quarantined, probing)"),
    ]


@dataclass(frozen=True)
class Window:
    """The heatmap's time axis: ``buckets`` columns of ``step_s`` seconds from ``start`` to ``end``."""

    start: datetime
    end: datetime
    step_s: float

    @property
    def buckets(self) -> int:
        return max(round((self.end - self.start).total_seconds() / self.step_s), 1)


#: Bucket widths the axis picks from (seconds): labels stay on round times.
STEPS = (1, 2, 5, 10, 15, 20, 30, 60)


def data_window(now: datetime, first: datetime | None, every_s: float) -> Window:
    """The axis over the data: from the first history write of the last hour (``first``; None: no
    data, the last ``BUCKETS`` history steps) to ``now``, in at most :data:`BUCKETS` buckets of a
    round width no shorter than a history step (``every_s``: each bucket holds a reading), ending at
    the next whole bucket so that refreshes do not shift every cell. Three minutes of data fill the
    axis (18 buckets of 10 s), an hour or more of it is the last hour in minutes."""
    earliest = now - timedelta(hours=1)
    first = max(first, earliest) if first is not None else now - timedelta(seconds=every_s * BUCKETS)
    span = max((now - first).total_seconds(), every_s)
    step = next((s for s in STEPS if s >= max(every_s, span / BUCKETS)), STEPS[-1])
    end = datetime.fromtimestamp(math.ceil(now.timestamp() / step) * step, tz=now.tzinfo)
    buckets = min(max(math.ceil((end - first).total_seconds() / step), 1), BUCKETS)
    return Window(end - timedelta(seconds=step * buckets), end, float(step))


def first_write(group_id: int, since: datetime) -> datetime | None:
    """The first history write of the group's nodes since ``since`` (one index probe on ``at``)."""
    return (NodeHistory.objects.filter(at__gte=since, node__group_id=group_id).order_by("at")
            .values_list("at", flat=True).first())
