"""A node's timeline (EMA, Z, P50, P99, weight, state, evidence) over a time range, downsampled for charts.

History rows arrive every ``HISTORY_EVERY_S`` seconds (10 s: 8,640 rows per signal a day), too many
to draw. :func:`downsample` splits ``[start, end)`` into at most ``max_points`` equal buckets and
keeps, per non-empty bucket:

- ``at``: the bucket's last timestamp; ``state``: the last state (what the node ended the bucket in);
- ``z``, ``p99``, ``evidence``: the **maximum** (a spike must stay visible after downsampling: an
  operator looks for the moment Z or the evidence crossed its line);
- ``ema``, ``p50``: the mean; ``weight``: the **minimum** (a dip to 0 must stay visible);
- ``samples``: the last value (a cumulative count).

The peer baseline is the detector's own: the tick stores it per group and signal
(:class:`~outlier_admin.control.models.GroupBaseline`) with every history write, and
:func:`group_baseline` downsamples it the same way (per bucket: mean baseline and spread, the
fewest peers).

On PostgreSQL a range with more rows than points is aggregated by the database (same buckets, same
rules, checked against :func:`downsample` by the tests), and short ranges are read with the time as
epoch seconds (``extract(epoch FROM at)``): building thousands of timezone-aware datetimes cost more
than the query; only the returned points get one. Other databases (the SQLite demo) use the ORM.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import numpy as np
from django.db import connection

from outlier_admin.control.models import GroupBaseline, NodeHistory
from outlier_admin.fleet.models import Node

MAX_POINTS = 2000
#: Points of the baseline series on the node page's EMA chart (a line, not a spike detector).
BASELINE_POINTS = 300
FIELDS = ("at", "ema", "z", "p50", "p99", "weight", "samples", "state", "evidence")


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
    evidence: float | None = None  # only on the signal the detector decides on

    def to_dict(self) -> dict[str, Any]:
        return {
            "at": self.at.isoformat(), "ema": self.ema, "z": self.z, "p50": self.p50, "p99": self.p99,
            "weight": self.weight, "samples": self.samples, "state": self.state, "evidence": self.evidence,
        }


def _clean(v: float) -> float | None:
    return None if v is None or math.isnan(v) else float(v)


def _when(at: datetime | float) -> datetime:
    """A row's time: a datetime, or epoch seconds as read by the PostgreSQL fast path."""
    return at if isinstance(at, datetime) else datetime.fromtimestamp(at, tz=UTC)


def _epochs(rows: list[tuple]) -> np.ndarray:
    return np.fromiter((r[0] if isinstance(r[0], float) else r[0].timestamp() for r in rows),
                       dtype=float, count=len(rows))


def _buckets(ts: np.ndarray, start: datetime, end: datetime, count: int) -> np.ndarray:
    """Bucket id in ``[0, count)`` of each epoch time: ``floor((t - start) / (end - start) * count)``."""
    span = max((end - start).total_seconds(), 1e-9)
    return np.clip(((ts - start.timestamp()) / span * count).astype(np.int64), 0, count - 1)


def _read_rows(model: type, columns: tuple[str, ...], start: datetime, end: datetime, **where: Any) -> list[tuple]:
    """``model`` rows in ``[start, end)`` matching ``where`` (equality), sorted by ``at``; ``columns[0]``
    must be ``at``. PostgreSQL: the time comes back as epoch seconds (float); elsewhere a datetime."""
    if connection.vendor != "postgresql":
        return list(model.objects.filter(at__gte=start, at__lt=end, **where).order_by("at").values_list(*columns))
    table = model._meta.db_table
    cond = " AND ".join(f"{model._meta.get_field(k).column} = %s" for k in where)
    sql = (f"SELECT extract(epoch FROM at)::float8, {', '.join(columns[1:])} FROM {table} "
           f"WHERE {cond} AND at >= %s AND at < %s ORDER BY at")
    with connection.cursor() as cur:
        cur.execute(sql, [*where.values(), start, end])
        return cur.fetchall()


def _sql_buckets(
    model: type, aggregates: tuple[str, ...], start: datetime, end: datetime, count: int, **where: Any
) -> list[tuple]:
    """PostgreSQL only: ``model`` rows in ``[start, end)`` grouped into the same ``count`` buckets as
    :func:`_buckets` (same float formula on the same epoch seconds, so the same bucket per row); one
    ``(rows in bucket, last epoch, *aggregates)`` tuple per non-empty bucket, in time order. Moves
    the work of a long range (8,640 rows a day) into the database: only the buckets cross the wire.
    Callers whose range holds no more than ``count`` rows read the rows themselves (returned as
    stored), which the first column tells them without a separate ``COUNT``."""
    table = model._meta.db_table
    cond = " AND ".join(f"{model._meta.get_field(k).column} = %s" for k in where)
    span = max((end - start).total_seconds(), 1e-9)
    sql = (
        f"SELECT count(*), max(e), {', '.join(aggregates)} FROM ("
        f"SELECT *, extract(epoch FROM at)::float8 AS e FROM {table} "
        f"WHERE {cond} AND at >= %s AND at < %s) AS r "
        "GROUP BY least(greatest(floor((e - %s) / %s * %s), 0), %s - 1) ORDER BY 2"
    )
    with connection.cursor() as cur:
        cur.execute(sql, [*where.values(), start, end, start.timestamp(), span, count, count])
        return cur.fetchall()


#: Per-bucket aggregates of :func:`downsample`, in SQL (NaN counts as missing, like the numpy path).
_HISTORY_AGGREGATES = (
    "avg(NULLIF(ema, 'NaN'))", "max(NULLIF(z, 'NaN'))", "avg(NULLIF(p50, 'NaN'))", "max(NULLIF(p99, 'NaN'))",
    "min(NULLIF(weight, 'NaN'))", "(array_agg(samples ORDER BY at DESC))[1]", "(array_agg(state ORDER BY at DESC))[1]",
    "max(NULLIF(evidence, 'NaN'))",
)
_BASELINE_AGGREGATES = ("avg(NULLIF(baseline, 'NaN'))", "avg(NULLIF(spread, 'NaN'))", "min(peers)")


def downsample(rows: list[tuple], start: datetime, end: datetime, max_points: int = MAX_POINTS) -> list[Point]:
    """``rows``: ``(at, ema, z, p50, p99, weight, samples, state, evidence)`` sorted by ``at``. Returns at most
    ``max_points`` points (rows are returned unchanged when they already fit). See module docstring."""
    if max_points < 1:
        raise ValueError(f"max_points must be >= 1, got {max_points}")
    if len(rows) <= max_points:
        return [Point(_when(r[0]), _clean(r[1]), _clean(r[2]), _clean(r[3]), _clean(r[4]), float(r[5]), int(r[6]),
                      r[7], _clean(r[8])) for r in rows]
    ts = _epochs(rows)
    bucket = _buckets(ts, start, end, max_points)

    def col(i: int) -> np.ndarray:
        return np.array([np.nan if r[i] is None else r[i] for r in rows], dtype=float)

    ema, z, p50, p99, weight, evidence = col(1), col(2), col(3), col(4), col(5), col(8)
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
    evidence_max = nan_to_none(np.fmax.reduceat(evidence, starts))
    w_min = [0.0 if v is None else v for v in nan_to_none(np.fmin.reduceat(weight, starts))]
    ema_mean, p50_mean = mean(ema), mean(p50)
    out: list[Point] = []
    for k, last_i in enumerate(lasts.tolist()):
        last = rows[last_i]
        out.append(Point(_when(last[0]), ema_mean[k], z_max[k], p50_mean[k], p99_max[k], w_min[k], int(last[6]),
                         last[7], evidence_max[k]))
    return out


def node_timeline(
    node: Node, start: datetime, end: datetime, *, signal: str = "norm", max_points: int = MAX_POINTS
) -> list[Point]:
    """Downsampled history of ``node`` for ``signal`` in ``[start, end)``: :func:`downsample` of its
    rows; on PostgreSQL a range with more rows than ``max_points`` is aggregated by the database with
    the same buckets and rules (``tests/outlier_admin/history/test_timeline_sql.py`` checks they agree)."""
    if max_points < 1:
        raise ValueError(f"max_points must be >= 1, got {max_points}")
    where = {"node": node.pk, "signal": signal}
    if connection.vendor == "postgresql":
        buckets = _sql_buckets(NodeHistory, _HISTORY_AGGREGATES, start, end, max_points, **where)
        if sum(b[0] for b in buckets) > max_points:
            return [Point(_when(b[1]), _clean(b[2]), _clean(b[3]), _clean(b[4]), _clean(b[5]),
                          0.0 if b[6] is None else float(b[6]), int(b[7]), b[8], _clean(b[9])) for b in buckets]
    rows = _read_rows(NodeHistory, FIELDS, start, end, **where)
    return downsample(rows, start, end, max_points)


@dataclass(frozen=True)
class BaselinePoint:
    """The detector's peer baseline of a group at ``at`` (``None``: too few peers to compute it)."""

    at: datetime
    baseline: float | None
    spread: float | None
    peers: int

    def to_dict(self) -> dict[str, Any]:
        return {"at": self.at.isoformat(), "baseline": self.baseline, "spread": self.spread, "peers": self.peers}


def group_baseline(
    group_id: int, start: datetime, end: datetime, *, signal: str = "norm", max_points: int = BASELINE_POINTS
) -> list[BaselinePoint]:
    """The stored detector baseline of a group in ``[start, end)``, downsampled to at most
    ``max_points`` equal time buckets: per non-empty bucket its last time, the mean of the finite
    baselines and spreads (``None`` if there is none) and the fewest peers."""
    if max_points < 1:
        raise ValueError(f"max_points must be >= 1, got {max_points}")
    where = {"group": group_id, "signal": signal}
    if connection.vendor == "postgresql":
        buckets = _sql_buckets(GroupBaseline, _BASELINE_AGGREGATES, start, end, max_points, **where)
        if sum(b[0] for b in buckets) > max_points:
            return [BaselinePoint(_when(b[1]), _clean(b[2]), _clean(b[3]), int(b[4])) for b in buckets]
    rows = _read_rows(GroupBaseline, ("at", "baseline", "spread", "peers"), start, end, **where)
    if len(rows) <= max_points:
        return [BaselinePoint(_when(r[0]), _clean(r[1]), _clean(r[2]), int(r[3])) for r in rows]
    bucket = _buckets(_epochs(rows), start, end, max_points)
    starts = np.flatnonzero(np.r_[True, bucket[1:] != bucket[:-1]])
    lasts = np.r_[starts[1:], len(rows)] - 1
    out = []
    for k, (a, b) in enumerate(zip(starts.tolist(), (lasts + 1).tolist(), strict=True)):
        chunk = rows[a:b]
        base = [r[1] for r in chunk if r[1] is not None and math.isfinite(r[1])]
        spread = [r[2] for r in chunk if r[2] is not None and math.isfinite(r[2])]
        out.append(BaselinePoint(
            _when(rows[lasts[k]][0]), float(np.mean(base)) if base else None,
            float(np.mean(spread)) if spread else None, min(int(r[3]) for r in chunk),
        ))
    return out


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
        try:
            value = parse_datetime(raw)  # raises ValueError for a well-formed impossible date (02-30)
            if value is None:
                raise ValueError
            # In UTC: PostgreSQL refuses offsets over 15:59 that Python accepts (up to 24 h).
            return (make_aware(value) if is_naive(value) else value).astimezone(UTC)
        except (ValueError, OverflowError):
            raise RangeError(f"{name}: {raw!r} is not an ISO 8601 date-time in range "
                             "(e.g. 2026-01-31T12:00:00Z)") from None

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
        try:
            start = end - timedelta(hours=hours)
        except OverflowError:  # an end within hours of year 1
            raise RangeError(f"end: {params.get('end')!r} minus {hours:g} hours is before year 1") from None
    if start >= end:
        raise RangeError("start must be before end")
    if end - start > MAX_RANGE:
        raise RangeError(f"the range may span at most {MAX_RANGE.days} days")
    return start, end
