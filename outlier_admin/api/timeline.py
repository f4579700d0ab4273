"""A node's timeline (EMA, Z, P50, P99, weight, state) over a time range, downsampled for charts.

History rows arrive every ``HISTORY_EVERY_S`` seconds (10 s: 8,640 rows per signal a day), too many
to draw. :func:`downsample` splits ``[start, end)`` into at most ``max_points`` equal buckets and
keeps, per non-empty bucket:

- ``at``: the bucket's last timestamp; ``state``: the last state (what the node ended the bucket in);
- ``z``, ``p99``: the **maximum** (a spike must stay visible after downsampling: an operator looks
  for the moment Z crossed the threshold);
- ``ema``, ``p50``: the mean; ``weight``: the **minimum** (a dip to 0 must stay visible);
- ``samples``: the last value (a cumulative count).

The peer baseline is not stored per row; :func:`peer_baseline` estimates it as the per-bucket median
EMA of up to ``BASELINE_PEERS`` peers in a baseline state (healthy/degraded) — the robust baseline
is a median over those same nodes, so this tracks it closely while bounding the query.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import numpy as np
from django.db import connection

from outlier_admin.control.models import NodeHistory, Transition
from outlier_admin.fleet.models import Node

MAX_POINTS = 2000
BASELINE_PEERS = 8
BASELINE_STATES = ("healthy", "degraded")
FIELDS = ("at", "ema", "z", "p50", "p99", "weight", "samples", "state")


@dataclass(frozen=True)
class Point:
    at: datetime
    ema: float | None
    z: float | None
    p50: float | None
    p99: float | None
    weight: float
    samples: int
    state: str

    def to_dict(self) -> dict[str, Any]:
        return {
            "at": self.at.isoformat(), "ema": self.ema, "z": self.z, "p50": self.p50, "p99": self.p99,
            "weight": self.weight, "samples": self.samples, "state": self.state,
        }


def _clean(v: float) -> float | None:
    return None if v is None or math.isnan(v) else float(v)


def downsample(rows: list[tuple], start: datetime, end: datetime, max_points: int = MAX_POINTS) -> list[Point]:
    """``rows``: ``(at, ema, z, p50, p99, weight, samples, state)`` sorted by ``at``. Returns at most
    ``max_points`` points (rows are returned unchanged when they already fit). See module docstring."""
    if max_points < 1:
        raise ValueError(f"max_points must be >= 1, got {max_points}")
    if len(rows) <= max_points:
        return [Point(r[0], _clean(r[1]), _clean(r[2]), _clean(r[3]), _clean(r[4]), float(r[5]), int(r[6]), r[7])
                for r in rows]
    span = max((end - start).total_seconds(), 1e-9)
    t0 = start.timestamp()
    ts = np.fromiter((r[0].timestamp() for r in rows), dtype=float, count=len(rows))
    bucket = np.clip(((ts - t0) / span * max_points).astype(np.int64), 0, max_points - 1)

    def col(i: int) -> np.ndarray:
        return np.array([np.nan if r[i] is None else r[i] for r in rows], dtype=float)

    ema, z, p50, p99, weight = col(1), col(2), col(3), col(4), col(5)
    # Bucket boundaries in the sorted rows: starts of each run of equal bucket ids. Aggregates are
    # vectorised with ufunc.reduceat; fmax/fmin ignore NaN, the mean counts only non-NaN values.
    starts = np.flatnonzero(np.r_[True, bucket[1:] != bucket[:-1]])
    lasts = np.r_[starts[1:], len(rows)] - 1

    def nan_to_none(a: np.ndarray) -> list[float | None]:
        return [None if math.isnan(v) else v for v in a.tolist()]

    def mean(a: np.ndarray) -> list[float | None]:
        ok = ~np.isnan(a)
        sums = np.add.reduceat(np.where(ok, a, 0.0), starts)
        counts = np.add.reduceat(ok.astype(np.int64), starts)
        with np.errstate(invalid="ignore", divide="ignore"):
            return nan_to_none(np.where(counts > 0, sums / np.maximum(counts, 1), np.nan))

    z_max = nan_to_none(np.fmax.reduceat(z, starts))
    p99_max = nan_to_none(np.fmax.reduceat(p99, starts))
    w_min = [0.0 if v is None else v for v in nan_to_none(np.fmin.reduceat(weight, starts))]
    ema_mean, p50_mean = mean(ema), mean(p50)
    out: list[Point] = []
    for k, last_i in enumerate(lasts.tolist()):
        last = rows[last_i]
        out.append(Point(last[0], ema_mean[k], z_max[k], p50_mean[k], p99_max[k], w_min[k], int(last[6]), last[7]))
    return out


def node_timeline(
    node: Node, start: datetime, end: datetime, *, signal: str = "norm", max_points: int = MAX_POINTS
) -> list[Point]:
    """Downsampled history of ``node`` for ``signal`` in ``[start, end)``."""
    rows = list(
        NodeHistory.objects.filter(node=node, signal=signal, at__gte=start, at__lt=end)
        .order_by("at").values_list(*FIELDS)
    )
    return downsample(rows, start, end, max_points)


def peer_baseline(
    node: Node, start: datetime, end: datetime, *, signal: str = "norm", buckets: int = 300
) -> list[tuple[datetime, float]]:
    """Estimated peer baseline (median EMA of up to ``BASELINE_PEERS`` peers) per time bucket."""
    peers = list(
        Node.objects.filter(group_id=node.group_id, retired=False).exclude(pk=node.pk)
        .order_by("pk").values_list("pk", flat=True)[:BASELINE_PEERS]
    )
    if not peers or end <= start:
        return []
    width = max((end - start).total_seconds() / buckets, 1.0)
    t0 = start.timestamp()
    if connection.vendor == "postgresql":
        sql = (
            "SELECT floor((extract(epoch FROM at) - %s) / %s) AS b, "
            "percentile_cont(0.5) WITHIN GROUP (ORDER BY ema) "
            f"FROM {NodeHistory._meta.db_table} "
            "WHERE node_id = ANY(%s) AND signal = %s AND at >= %s AND at < %s "
            "AND state = ANY(%s) AND ema IS NOT NULL AND ema = ema GROUP BY b ORDER BY b"
        )
        with connection.cursor() as cur:
            cur.execute(sql, [t0, width, peers, signal, start, end, list(BASELINE_STATES)])
            rows = cur.fetchall()
        return [(start + timedelta(seconds=(int(b) + 0.5) * width), float(m)) for b, m in rows]
    values = NodeHistory.objects.filter(
        node_id__in=peers, signal=signal, at__gte=start, at__lt=end, state__in=BASELINE_STATES, ema__isnull=False
    ).values_list("at", "ema")
    by_bucket: dict[int, list[float]] = {}
    for at, ema in values:
        by_bucket.setdefault(int((at.timestamp() - t0) // width), []).append(ema)
    return [(start + timedelta(seconds=(b + 0.5) * width), float(np.median(v))) for b, v in sorted(by_bucket.items())]


def node_transitions(node: Node, start: datetime, end: datetime) -> list[Transition]:
    """Transitions of ``node`` in ``[start, end)``, oldest first (chart markers)."""
    return list(Transition.objects.filter(node=node, at__gte=start, at__lt=end).order_by("at"))


class RangeError(ValueError):
    """A bad ``start``/``end``/``hours`` query parameter (message names the parameter)."""


MAX_RANGE = timedelta(days=31)


def parse_range(params: Any, *, now: datetime, default_hours: float = 1.0) -> tuple[datetime, datetime]:
    """``[start, end)`` from query parameters: ``start``/``end`` (ISO 8601) or ``hours`` back from
    ``end`` (default ``now``). Refuses reversed ranges and ranges longer than 31 days."""
    from django.utils.dateparse import parse_datetime
    from django.utils.timezone import is_naive, make_aware

    def when(name: str) -> datetime | None:
        raw = params.get(name)
        if not raw:
            return None
        value = parse_datetime(raw)
        if value is None:
            raise RangeError(f"{name}: {raw!r} is not an ISO 8601 date-time (e.g. 2026-01-31T12:00:00Z)")
        return make_aware(value) if is_naive(value) else value

    end = when("end") or now
    start = when("start")
    if start is None:
        raw = params.get("hours")
        try:
            hours = float(raw) if raw else default_hours
        except ValueError:
            raise RangeError(f"hours: {raw!r} is not a number") from None
        if not 0 < hours <= MAX_RANGE.total_seconds() / 3600:
            raise RangeError(f"hours must be in (0, {MAX_RANGE.days * 24}], got {raw}")
        start = end - timedelta(hours=hours)
    if start >= end:
        raise RangeError("start must be before end")
    if end - start > MAX_RANGE:
        raise RangeError(f"the range may span at most {MAX_RANGE.days} days")
    return start, end
