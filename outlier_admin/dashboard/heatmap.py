"""The group page's view over time: nodes x time, each cell saying where the node stood against its
peers as the detector judges it, with a band of each node's state.

One row per node (the nodes the table puts first: problems, then the highest Z), one column per time
bucket. A cell is the node's median reading in the bucket, read the way the detector reads it: by
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

Size: at most :data:`MAX_ROWS` x :data:`BUCKETS` cells, from two indexed queries (the rows, the
group's stored baselines) and one vectorised decision over every history write.
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
from detector.nodes import NodeArrays
from detector.signals import SIGNALS
from detector.thresholds import Thresholds
from outlier_admin.api.queries import attention_rank
from outlier_admin.control.models import GroupBaseline, NodeHistory
from outlier_admin.fleet.models import Node

MAX_ROWS = 50
BUCKETS = 60
STATE_COLORS = {
    "healthy": "#2e7d32", "forced_active": "#2e7d32", "degraded": "#ef8f00", "pending_approval": "#b8860b",
    "quarantined": "#c62828", "forced_quarantine": "#8e0000", "probing": "#1f5fbf", "recovering": "#64b5f6",
    "warming": "#9e9e9e",
}
NO_Z = "#d9d9d9"
#: A reading's level against the detector's lines: its cell's class and what the legend says of it.
AT_OR_UNDER, SLOWER, OVER_DEGRADE, OVER_QUARANTINE = 0, 1, 2, 3
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


def judge(z: np.ndarray, excess: np.ndarray, signals: Sequence[str], t: Thresholds) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The detector's reading of stored figures: ``z`` and ``excess`` (EMA over its baseline) are
    ``(len(SIGNALS), N)``, one column per node and history write, NaN where not recorded, filled on
    ``signals`` only. Returns, per column, the deciding Z, the index of its signal in ``SIGNALS``
    (-1: none), its excess and its level.

    The decision is :func:`~detector.detectors.zscore.decide` and the lines
    :func:`~detector.detectors.zscore.lines`, called once for all columns: each column is a node of
    one peer view whose baseline is 1 on ``signals`` (the EMAs are already divided by the baseline
    of their own write), so ``EMA / baseline`` there is each column's own excess."""
    n = z.shape[1]
    base = {s: 1.0 if s in signals else math.nan for s in SIGNALS}
    view = zscore.PeerView(z=z, ema=excess, baseline=base, spread=dict.fromkeys(SIGNALS, math.nan),
                           peers=dict.fromkeys(SIGNALS, 0), fresh=np.ones(n, dtype=bool))
    a = NodeArrays(map(str, range(n)))
    with np.errstate(invalid="ignore"):
        d = zscore.decide(view, a, t, now=0.0)
        over = zscore.lines(d, t)
    level = np.where(over.over_q, OVER_QUARANTINE, np.where(over.over_d, OVER_DEGRADE,
                                                            np.where(d.score > 0, SLOWER, AT_OR_UNDER)))
    return d.score, d.which, d.excess, level


def cells(nodes: list[Node], start: datetime, end: datetime, signals: Sequence[str],
          thresholds: Thresholds) -> dict[int, list[Cell]]:
    """``{node pk: [Cell per bucket]}``: each bucket's median reading (by level, then Z) on
    ``signals`` (:func:`judge`) and its most urgent state
    (:func:`~outlier_admin.api.queries.attention_rank`); ``Cell(None, None)`` for a bucket without
    history. A write without a stored baseline of a signal (rows from before baselines were stored)
    takes the median EMA of that write's nodes in service, as the threshold preview does."""
    span = (end - start).total_seconds() / BUCKETS
    states: dict[int, list[str | None]] = {n.pk: [None] * BUCKETS for n in nodes}
    if not nodes:
        return {}
    rows = list(NodeHistory.objects.filter(node_id__in=list(states), signal__in=list(signals), at__gte=start, at__lt=end)
                .values_list("node_id", "at", "signal", "z", "ema", "state"))
    stored = {(at, sig): b for at, sig, b in GroupBaseline.objects.filter(
        group_id=nodes[0].group_id, signal__in=list(signals), at__gte=start, at__lt=end,
    ).values_list("at", "signal", "baseline") if b is not None and b > 0}
    col: dict[tuple[int, datetime], int] = {}
    for node_id, at, *_ in rows:
        col.setdefault((node_id, at), len(col))
    z = np.full((len(SIGNALS), len(col)), np.nan)
    ema = np.full((len(SIGNALS), len(col)), np.nan)
    in_service: dict[tuple[datetime, str], list[float]] = {}
    for node_id, at, sig, rz, rema, state in rows:
        k, c = SIGNALS.index(sig), col[(node_id, at)]
        z[k, c] = np.nan if rz is None else rz
        ema[k, c] = np.nan if rema is None else rema
        if rema is not None and state in ("healthy", "degraded"):
            in_service.setdefault((at, sig), []).append(rema)
        b = min(int((at - start).total_seconds() / span), BUCKETS - 1)
        cur = states[node_id][b]
        if state and (cur is None or attention_rank(state) < attention_rank(cur)):
            states[node_id][b] = state
    for key, emas in in_service.items():
        if key not in stored and np.median(emas) > 0:
            stored[key] = float(np.median(emas))
    base = np.full((len(SIGNALS), len(col)), np.nan)
    for sig in signals:
        base[SIGNALS.index(sig)] = [stored.get((at, sig), np.nan) for _, at in col]
    # As in a tick, a signal without any baseline is not one the detector can judge on.
    with_base = [s for s in signals if np.isfinite(base[SIGNALS.index(s)]).any()]
    score, which, excess, level = judge(z, ema / base, with_base, thresholds)
    readings: dict[tuple[int, int], list[int]] = {}
    for (node_id, at), c in col.items():
        if math.isfinite(score[c]):
            readings.setdefault((node_id, min(int((at - start).total_seconds() / span), BUCKETS - 1)), []).append(c)
    out = {pk: [Cell(None, s) for s in states[pk]] for pk in states}
    for (node_id, b), cols in readings.items():
        # The median reading (by level, then Z): a node over the line for most of the minute is painted
        # so, a single reading over it is not (the detector too cuts on persistence, not on one tick).
        cols.sort(key=lambda c: (int(level[c]), score[c]))
        c = cols[len(cols) // 2]
        out[node_id][b] = Cell(float(score[c]), states[node_id][b], SIGNALS[int(which[c])],
                               float(excess[c]) if math.isfinite(excess[c]) else None, int(level[c]),
                               peak=float(max(score[k] for k in cols)), readings=len(cols))
    return out


def heatmap(nodes: list[Node], thresholds: Thresholds, *, start: datetime, end: datetime,
            signals: Sequence[str]) -> SafeString:
    """The SVG (see the module docstring) of the first :data:`MAX_ROWS` of ``nodes`` (in order), read
    on ``signals`` (the group's judged signals: each node's deciding one; or one signal)."""
    nodes = nodes[:MAX_ROWS]
    grid = cells(nodes, start, end, signals, thresholds)
    label_w, top, cell_w, cell_h, band_h, gap = 170, 18, 16, 12, 4, 3
    row_h = cell_h + band_h + gap
    width = label_w + BUCKETS * cell_w + 10
    height = top + max(len(nodes), 1) * row_h + 22
    span = end - start
    on = " or ".join(signals) if len(signals) > 1 else signals[0]
    desc = (f"Each node against its peers on {on} ({len(nodes)} nodes) from {start:%H:%M} to {end:%H:%M} UTC in "
            f"{BUCKETS} steps of {span.total_seconds() / BUCKETS:.0f} s; a band under each row shows the node's state.")
    out = [f'<svg class="heatmap" role="img" viewBox="0 0 {width} {height}" width="100%" '
           f'preserveAspectRatio="xMinYMin meet" xmlns="http://www.w3.org/2000/svg">',
           f"<title>Nodes against their peers ({escape(on)})</title><desc>{escape(desc)}</desc>"]
    for k in range(0, BUCKETS + 1, BUCKETS // 6):
        at = start + span * k / BUCKETS
        anchor = "start" if k == 0 else "end" if k == BUCKETS else "middle"
        out.append(f'<text x="{label_w + k * cell_w}" y="{height - 6}" font-size="10" text-anchor="{anchor}">'
                   f"{at:%H:%M}</text>")
    for i, n in enumerate(nodes):
        y = top + i * row_h
        name = n.name if len(n.name) <= 26 else n.name[:25] + "…"
        out.append(f'<g class="heat-row" data-node="{n.pk}"><text x="{label_w - 6}" y="{y + cell_h - 2}" '
                   f'font-size="10" text-anchor="end"><title>{escape(n.name)}</title>{escape(name)}</text>')
        for b, c in enumerate(grid[n.pk]):
            if c.z is None and c.state is None:
                continue
            at = start + span * b / BUCKETS
            if c.z is None or c.level is None:
                css, fill = "no-z", NO_Z
            else:
                css, fill = LEVELS[c.level][0], cell_color(c.level, c.z, thresholds)
            text = f"{n.name} {at:%H:%M:%S}: {reading_text(c, thresholds)}, {c.state or 'state unknown'}"
            out.append(f'<rect class="cell {css}" x="{label_w + b * cell_w}" y="{y}" width="{cell_w - 1}" '
                       f'height="{cell_h}" fill="{fill}" stroke="#ccc" stroke-width="0.5"><title>{escape(text)}</title></rect>')
        run_start, run_state = 0, None
        for b, c in enumerate([*grid[n.pk], Cell(None, "__end__")]):
            if c.state != run_state:
                if run_state is not None and b > run_start:
                    out.append(f'<rect class="band band-{escape(run_state)}" x="{label_w + run_start * cell_w}" '
                               f'y="{y + cell_h + 1}" width="{(b - run_start) * cell_w - 1}" height="{band_h}" '
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
    verdict = {
        OVER_QUARANTINE: f"at quarantine strength (Z ≥ {t.quarantine_z:g} σ and ≥ {t.quarantine_materiality:g}×)",
        OVER_DEGRADE: f"over the degrade line (Z ≥ {t.degrade_z:g} σ and ≥ {t.degrade_materiality:g}×)",
        SLOWER: f"slower than its peers, under the degrade line (Z ≥ {t.degrade_z:g} σ and ≥ "
                f"{t.degrade_materiality:g}× both needed)",
        AT_OR_UNDER: "as fast as its peers or faster",
    }[c.level]
    peak = f" (median of {c.readings} readings; highest Z {c.peak:.2f} σ)" if c.readings > 1 and c.peak is not None else ""
    return f"Z {c.z:.2f} σ on {c.signal}{ratio}: {verdict}{peak}"


def heatmap_legend(t: Thresholds) -> list[tuple[str, str, str]]:
    """``(class, colour, meaning)`` of each kind of cell, with the thresholds ``t`` in force and their
    units (Z in σ, the peers' robust spread; the EMA as a multiple of the peers' baseline)."""
    robust = t.baseline_mode == "robust"

    def line(z: float, m: float) -> str:
        return f"Z ≥ {z:g} σ and EMA ≥ {m:g}× the peers' baseline" if robust else f"Z ≥ {z:g} σ"

    return [
        (*LEVELS[AT_OR_UNDER], "as fast as its peers or faster (Z ≤ 0)"),
        (*LEVELS[SLOWER], f"slower than its peers but under the degrade line ({line(t.degrade_z, t.degrade_materiality)}"
                          " both needed); paler the lower its Z"),
        (*LEVELS[OVER_DEGRADE], f"over the degrade line ({line(t.degrade_z, t.degrade_materiality)}): the detector "
                                "cuts its weight once its evidence holds; darker towards quarantine Z"),
        (*LEVELS[OVER_QUARANTINE], f"at quarantine strength ({line(t.quarantine_z, t.quarantine_materiality)}"
                                   + (", not on prefill_time alone" if robust else "") + ")"),
        ("no-z", NO_Z, "no Z (no traffic judged: quarantined, probing)"),
    ]


def default_window(now: datetime) -> tuple[datetime, datetime]:
    """The last hour, ending at the next whole bucket so that refreshes do not shift every cell."""
    step = 3600 / BUCKETS
    end = datetime.fromtimestamp(math.ceil(now.timestamp() / step) * step, tz=now.tzinfo)
    return end - timedelta(hours=1), end
