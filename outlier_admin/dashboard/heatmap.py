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
from django.db import connection
from django.utils.safestring import SafeString, mark_safe

from detector.detectors import zscore
from detector.nodes import NodeArrays
from detector.signals import SIGNALS
from detector.states import BASELINE_STATES
from detector.states import NodeState as S
from detector.thresholds import Thresholds
from outlier_admin.api.queries import attention_rank
from outlier_admin.control.models import GroupBaseline, NodeHistory
from outlier_admin.fleet.models import Node

MAX_ROWS = 50
BUCKETS = 60
STATE_COLORS = {s.label: colour for s, colour in {
    S.HEALTHY: "#2e7d32", S.FORCED_ACTIVE: "#2e7d32", S.DEGRADED: "#ef8f00", S.PENDING_APPROVAL: "#b8860b",
    S.QUARANTINED: "#c62828", S.FORCED_QUARANTINE: "#8e0000", S.PROBING: "#1f5fbf", S.RECOVERING: "#64b5f6",
    S.WARMING: "#9e9e9e",
}.items()}
_BASELINE_LABELS = tuple(sorted(s.label for s in BASELINE_STATES))  # the states that serve at a judged weight
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
    with np.errstate(invalid="ignore", divide="ignore"):
        d = zscore.decide(view, a, t, now=0.0)
        over = zscore.lines(d, t)
        level = np.where(over.over_q, OVER_QUARANTINE, np.where(over.over_d, OVER_DEGRADE,
                                                                np.where(d.cut_z > 0, SLOWER, AT_OR_UNDER)))
        # A reading the detector sets aside (prefill time under its own line: decode speaks for the
        # node) is shown with its Z, under the line, not as "no Z".
        raw, raw_which = zscore.nan_max(z)
        aside = ~np.isfinite(d.cut_z) & np.isfinite(raw)
        score = np.where(aside, raw, d.cut_z)
        which = np.where(aside, raw_which, d.cut_which)
        ratio = np.where(aside, excess[np.maximum(raw_which, 0), np.arange(n)], d.cut_excess)
        level = np.where(aside, np.where(raw > 0, SLOWER, AT_OR_UNDER), level)
    return score, which, ratio, level


def cells(nodes: list[Node], start: datetime, end: datetime, signals: Sequence[str],
          thresholds: Thresholds) -> dict[int, list[Cell]]:
    """``{node pk: [Cell per bucket]}``: each bucket's median reading (by level, then Z) on
    ``signals`` (:func:`judge`) and its most urgent state
    (:func:`~outlier_admin.api.queries.attention_rank`); ``Cell(None, None)`` for a bucket without
    history. A write without a stored baseline of a signal (rows from before baselines were stored)
    takes the median EMA of that write's nodes in service, as the threshold preview does.

    Vectorised (numpy) after the two reads: 50 nodes x an hour of writes every 10 s x two signals is
    36,000 rows."""
    out = {n.pk: [Cell(None, None)] * BUCKETS for n in nodes}
    rows = _history(list(out), signals, start, end)
    if not rows:
        return out
    pks = [n.pk for n in nodes]
    node_ids, ts_list, sigs, zs, emas, row_states = zip(*rows, strict=True)
    pk_order = np.argsort(pks)
    node_i = pk_order[np.searchsorted(np.asarray(pks)[pk_order], np.asarray(node_ids, dtype=np.int64))]
    ts = np.array(ts_list, dtype=np.float64)
    names, sig_of = np.unique(np.asarray(sigs, dtype=str), return_inverse=True)
    sig_i = np.array([SIGNALS.index(x) for x in names.tolist()], dtype=np.int64)[sig_of]
    z_row, ema_row = np.array(zs, dtype=np.float64), np.array(emas, dtype=np.float64)  # None -> NaN
    labels, state_of = np.unique(np.asarray([x or "" for x in row_states], dtype=str), return_inverse=True)
    # One column per node and history write: the rows of its signals side by side.
    writes, write_of_row = np.unique(ts, return_inverse=True)
    keys, col_of_row = np.unique(node_i * len(writes) + write_of_row, return_inverse=True)
    col_node, col_write = keys // len(writes), keys % len(writes)
    z = np.full((len(SIGNALS), len(keys)), np.nan)
    ema = np.full((len(SIGNALS), len(keys)), np.nan)
    z[sig_i, col_of_row], ema[sig_i, col_of_row] = z_row, ema_row
    # The peers' baseline of every write and signal: stored, else the median EMA of those in service.
    base = np.full((len(SIGNALS), len(writes)), np.nan)
    at_write = {float(w): k for k, w in enumerate(writes)}
    for at, sig, b in GroupBaseline.objects.filter(group_id=nodes[0].group_id, signal__in=list(signals), at__gte=start,
                                                  at__lt=end).values_list("at", "signal", "baseline"):
        k = at_write.get(_epoch(at))
        if k is not None and b is not None and b > 0:
            base[SIGNALS.index(sig), k] = b
    serving = np.isin(labels, _BASELINE_LABELS)[state_of] & np.isfinite(ema_row)
    missing = serving & np.isnan(base[sig_i, write_of_row])
    for k_sig, k_write in set(zip(sig_i[missing].tolist(), write_of_row[missing].tolist(), strict=True)):
        peers = ema_row[missing & (sig_i == k_sig) & (write_of_row == k_write)]
        if np.median(peers) > 0:
            base[k_sig, k_write] = float(np.median(peers))
    # As in a tick, a signal without any baseline is not one the detector can judge on.
    with_base = [s for s in signals if np.isfinite(base[SIGNALS.index(s)]).any()]
    with np.errstate(invalid="ignore", divide="ignore"):
        score, which, excess, level = judge(z, ema / base[:, col_write], with_base, thresholds)
    span = (end - start).total_seconds() / BUCKETS
    bucket_of_write = np.clip(((writes - start.timestamp()) / span).astype(np.int64), 0, BUCKETS - 1)
    # The most urgent state of each node's bucket.
    rank = np.array([attention_rank(x) if x else 10**6 for x in labels.tolist()], dtype=np.int64)[state_of]
    urgent = np.full((len(pks), BUCKETS), 10**6, dtype=np.int64)
    np.minimum.at(urgent, (node_i, bucket_of_write[write_of_row]), rank)
    label = {attention_rank(x): x for x in labels.tolist() if x}
    # The median reading of each node's bucket (the detector too cuts on persistence, not on one
    # tick: a node over the line for most of the minute is painted so, a single reading is not).
    judged = np.flatnonzero(np.isfinite(score))
    b_col = bucket_of_write[col_write[judged]]
    order = judged[np.lexsort((score[judged], level[judged], b_col, col_node[judged]))]
    group_key = col_node[order] * BUCKETS + bucket_of_write[col_write[order]]
    starts = np.flatnonzero(np.r_[True, group_key[1:] != group_key[:-1]]) if len(order) else np.array([], np.int64)
    counts = np.diff(np.r_[starts, len(order)])
    peaks = np.maximum.reduceat(score[order], starts) if len(order) else np.array([])
    picked = {int(group_key[s0]): (int(order[s0 + c // 2]), float(pk), int(c))
              for s0, c, pk in zip(starts.tolist(), counts.tolist(), peaks.tolist(), strict=True)}
    for i, pk in enumerate(pks):
        row = []
        for b in range(BUCKETS):
            state = label.get(int(urgent[i, b]))
            if (i * BUCKETS + b) in picked:
                c, peak, count = picked[i * BUCKETS + b]
                x = float(excess[c])
                row.append(Cell(float(score[c]), state, SIGNALS[int(which[c])], x if math.isfinite(x) else None,
                                int(level[c]), peak=peak, readings=count))
            else:
                row.append(Cell(None, state))
        out[pk] = row
    return out


def _epoch(at: datetime) -> float:
    """A timestamp as the epoch seconds :func:`_history` reads (microseconds exact, as stored)."""
    return round(at.timestamp(), 6)


def _history(node_ids: list[int], signals: Sequence[str], start: datetime, end: datetime) -> list[tuple]:
    """``(node_id, epoch seconds, signal, z, ema, state)`` of the nodes' history rows in the window.
    On PostgreSQL the time is read as a number (building a datetime per row was most of the cost
    of 36,000 rows); elsewhere (the demo's SQLite) through the ORM."""
    if connection.vendor != "postgresql":
        qs = (NodeHistory.objects.filter(node_id__in=node_ids, signal__in=list(signals), at__gte=start, at__lt=end)
              .values_list("node_id", "at", "signal", "z", "ema", "state"))
        return [(i, _epoch(at), *rest) for i, at, *rest in qs]
    sql = (f"SELECT node_id, round(EXTRACT(EPOCH FROM at)::numeric, 6)::float8, signal, z, ema, state "
           f"FROM {NodeHistory._meta.db_table} WHERE node_id = ANY(%s) AND signal = ANY(%s) AND at >= %s AND at < %s")
    with connection.cursor() as cur:
        cur.execute(sql, [node_ids, list(signals), start, end])
        return cur.fetchall()


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


def default_window(now: datetime) -> tuple[datetime, datetime]:
    """The last hour, ending at the next whole bucket so that refreshes do not shift every cell."""
    step = 3600 / BUCKETS
    end = datetime.fromtimestamp(math.ceil(now.timestamp() / step) * step, tz=now.tzinfo)
    return end - timedelta(hours=1), end
