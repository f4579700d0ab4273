"""The group page's view over time: a heatmap of Z, nodes x time, with a band of each node's state.

One row per node (the nodes the table puts first: problems, then the highest Z), one column per time
bucket. A cell is coloured by the node's highest Z in the bucket on the signal the detector decides
on (white below 0, then yellow to the degrade threshold, orange to the quarantine threshold, red
beyond); a node without a Z in a bucket (quarantined, probing: it gets no traffic) has a grey cell.
Under each row a thin band shows the node's state, merged into one segment per run of equal
states, each with its name in a tooltip, so nothing is told by colour alone. Server-rendered SVG,
no script (CSP ``default-src 'self'``).

Size: at most :data:`MAX_ROWS` x :data:`BUCKETS` cells, from one indexed history query.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import datetime, timedelta
from html import escape

from django.utils.safestring import SafeString, mark_safe

from detector.thresholds import Thresholds
from outlier_admin.api.queries import attention_rank
from outlier_admin.control.models import NodeHistory
from outlier_admin.fleet.models import Node

MAX_ROWS = 50
BUCKETS = 60
STATE_COLORS = {
    "healthy": "#2e7d32", "forced_active": "#2e7d32", "degraded": "#ef8f00", "pending_approval": "#b8860b",
    "quarantined": "#c62828", "forced_quarantine": "#8e0000", "probing": "#1f5fbf", "recovering": "#64b5f6",
    "warming": "#9e9e9e",
}
NO_Z = "#d9d9d9"


def z_color(z: float, thresholds: Thresholds) -> str:
    """White at Z <= 0, yellow at the degrade threshold, orange just under quarantine, red at and
    above the quarantine threshold (a linear ramp between them)."""
    dz, qz = thresholds.degrade_z, thresholds.quarantine_z
    if z >= qz:
        return "#c62828"
    if z <= 0:
        return "#ffffff"
    if z < dz:
        f = z / dz  # white -> yellow
        return _mix((255, 255, 255), (255, 224, 102), f)
    return _mix((255, 224, 102), (239, 108, 0), (z - dz) / max(qz - dz, 1e-9))  # yellow -> orange


def _mix(a: tuple[int, int, int], b: tuple[int, int, int], f: float) -> str:
    f = min(max(f, 0.0), 1.0)
    return "#" + "".join(f"{round(x + (y - x) * f):02x}" for x, y in zip(a, b, strict=True))


@dataclass(frozen=True)
class Cell:
    z: float | None
    state: str | None


def cells(nodes: list[Node], start: datetime, end: datetime, signal: str) -> dict[int, list[Cell]]:
    """``{node pk: [Cell per bucket]}``: the highest Z and the most urgent state
    (:func:`~outlier_admin.api.queries.attention_rank`) of each bucket; ``Cell(None, None)`` for a
    bucket without history."""
    span = (end - start).total_seconds() / BUCKETS
    zs: dict[int, list[float | None]] = {n.pk: [None] * BUCKETS for n in nodes}
    states: dict[int, list[str | None]] = {n.pk: [None] * BUCKETS for n in nodes}
    rows = (NodeHistory.objects.filter(node_id__in=list(zs), signal=signal, at__gte=start, at__lt=end)
            .values_list("node_id", "at", "z", "state"))
    for node_id, at, z, state in rows.iterator(chunk_size=5000):
        b = min(int((at - start).total_seconds() / span), BUCKETS - 1)
        if z is not None and math.isfinite(z) and (zs[node_id][b] is None or z > zs[node_id][b]):
            zs[node_id][b] = z
        cur = states[node_id][b]
        if state and (cur is None or attention_rank(state) < attention_rank(cur)):
            states[node_id][b] = state
    return {pk: [Cell(z, s) for z, s in zip(zs[pk], states[pk], strict=True)] for pk in zs}


def heatmap(nodes: list[Node], thresholds: Thresholds, *, start: datetime, end: datetime, signal: str) -> SafeString:
    """The SVG (see the module docstring) of the first :data:`MAX_ROWS` of ``nodes`` (in order)."""
    nodes = nodes[:MAX_ROWS]
    grid = cells(nodes, start, end, signal)
    label_w, top, cell_w, cell_h, band_h, gap = 170, 18, 16, 12, 4, 3
    row_h = cell_h + band_h + gap
    width = label_w + BUCKETS * cell_w + 10
    height = top + max(len(nodes), 1) * row_h + 22
    span = end - start
    desc = (f"Z of {len(nodes)} nodes from {start:%H:%M} to {end:%H:%M} UTC in {BUCKETS} steps of "
            f"{span.total_seconds() / BUCKETS:.0f} s; a band under each row shows the node's state.")
    out = [f'<svg class="heatmap" role="img" viewBox="0 0 {width} {height}" width="100%" '
           f'preserveAspectRatio="xMinYMin meet" xmlns="http://www.w3.org/2000/svg">',
           f"<title>Z-score heatmap ({escape(signal)})</title><desc>{escape(desc)}</desc>"]
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
            fill = z_color(c.z, thresholds) if c.z is not None else NO_Z
            text = f"{n.name} {at:%H:%M:%S}: " + (f"Z {c.z:.2f}" if c.z is not None else "no Z") + \
                f", {c.state or 'state unknown'}"
            out.append(f'<rect class="cell" x="{label_w + b * cell_w}" y="{y}" width="{cell_w - 1}" '
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


def default_window(now: datetime) -> tuple[datetime, datetime]:
    """The last hour, ending at the next whole bucket so that refreshes do not shift every cell."""
    step = 3600 / BUCKETS
    end = datetime.fromtimestamp(math.ceil(now.timestamp() / step) * step, tz=now.tzinfo)
    return end - timedelta(hours=1), end
