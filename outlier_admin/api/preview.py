"""Threshold preview: which transitions new thresholds would have produced over recorded history.

Replays the stored per-node history (the signal the detector decides on — ``decode`` once the gateway
logs TTFT, else ``norm`` —: EMA, Z, evidence, recorded state; P50/P99 of the tail window) of a group
against two :class:`detector.Thresholds` — the current ones and the proposed ones — and returns the
simulated transitions of each, so an operator sees what a change *would have done* before saving it.

Rules replayed (the detector's, on the history cadence of ``HISTORY_EVERY_S`` seconds):

- degrade: ``Z >= degrade_z`` (robust mode also needs ``EMA >= degrade_materiality * baseline`` and
  the recorded evidence ``>= degrade_evidence``, unless the row is of quarantine strength);
  back to healthy when ``Z < degrade_z - degrade_hysteresis``;
- quarantine: ``Z >= quarantine_z`` (robust: ``EMA >= quarantine_materiality * baseline``) for
  ``quarantine_persistence`` rows in a row, or ``P99/P50 >= tail_ratio`` for ``tail_windows`` rows in
  a row, or ``P50 >= cross_p50_ratio * median peer P50`` for ``tail_windows`` rows in a row;
- without TTFT (``norm`` decides, its latency includes the queue): latency quarantines only a node
  degraded for at least ``queue_drain_s``, counting its rows from then on;
- safeguard: a quarantine is refused (``safeguard_blocked``) when it would put more than
  ``floor(max_quarantine_fraction * nodes)`` nodes out of service; the node stays degraded.

``baseline`` at a timestamp is the detector's own, stored by the tick with the history rows
(:class:`~outlier_admin.control.models.GroupBaseline`, same ``at``); for rows written without one
(history older than that table) it falls back to the median EMA of the nodes recorded
healthy/degraded at that timestamp.

Approximations, stated so nobody over-reads the preview: the evidence is replayed as recorded, i.e.
as accumulated under the materiality and allowance in force then (a new ``degrade_evidence`` line is
replayed exactly, a new ``degrade_materiality`` only through the EMA test); persistence is counted per history row (the
detector counts per evaluation, i.e. per tick, so real quarantines come sooner); recovery needs canary
probes, which are not replayed, so a simulated quarantine lasts to the end of the window; nodes the
history shows warming, probing, recovering or forced by an operator are not judged at those rows.

Who and how much: a preview reads a whole group's history into memory and replays it twice, so it
is for the roles that act on thresholds and nodes (:data:`PREVIEW_CAPABILITIES`: operator, oncall),
and it is bounded — a window of at most ``PREVIEW_MAX_WINDOW_S`` seconds, a group of at most
``PREVIEW_MAX_NODES`` nodes, at most ``PREVIEW_MAX_ROWS`` history rows read (per query). Over a bound
the preview is refused with :class:`PreviewTooLarge` naming it (a 400), never silently truncated: a
replay of part of the history would show transitions that differ from what the detector would do.
Unbounded, 10,000 nodes x 60 rows took 10-16 s and +379 MB of one web worker per request (refused
now in 0.02 s); at the default bounds' limit, 1,000 nodes x an hour (~340,000 rows), 4-14 s and
+215 MB on the shared 2-core development machine.
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

import numpy as np
from django.conf import settings
from django.utils import timezone

from detector.thresholds import Thresholds
from outlier_admin.api.permissions import CAPABILITIES, user_can
from outlier_admin.api.queries import decision_signal
from outlier_admin.control.models import GroupBaseline, NodeHistory
from outlier_admin.fleet.models import ModelGroup

#: Thresholds whose effect the replay can show (they act on stored figures).
PREVIEW_FIELDS = (
    "degrade_z", "degrade_hysteresis", "quarantine_z", "quarantine_persistence", "degrade_materiality",
    "quarantine_materiality", "degrade_evidence", "queue_drain_s", "tail_ratio", "cross_p50_ratio",
    "tail_windows", "max_quarantine_fraction",
)
OUT_OF_SERVICE = frozenset({"quarantined", "probing", "forced_quarantine"})
JUDGED = frozenset({"healthy", "degraded", "pending_approval"})
#: Recorded states the replay always follows (membership and operator decisions, not thresholds).
FOLLOWED = frozenset({"warming", "forced_quarantine", "forced_active"})
#: Capabilities that allow a preview (any one): ``tune`` (operator) and ``override`` (oncall).
PREVIEW_CAPABILITIES = ("tune", "override")
#: The window the dashboard replays (the API's default is the serializer's, also an hour).
DEFAULT_WINDOW_S = 3600.0


def may_preview(user: Any) -> bool:
    """True if ``user`` may run a threshold preview (see :data:`PREVIEW_CAPABILITIES`)."""
    return any(user_can(user, cap) for cap in PREVIEW_CAPABILITIES)


def preview_roles() -> list[str]:
    """The role names that may preview, sorted (for the 403 messages)."""
    return sorted(set().union(*(CAPABILITIES[cap] for cap in PREVIEW_CAPABILITIES)))


class PreviewTooLarge(ValueError):
    """A preview over one of its bounds; ``field`` is the input at fault (``window_s``, or ``group``
    for the group's size and history)."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field


@dataclass(frozen=True)
class SimTransition:
    node: str
    at: datetime
    from_state: str
    to_state: str
    rule: str

    def to_dict(self) -> dict[str, Any]:
        return {"node": self.node, "at": self.at.isoformat(), "from_state": self.from_state,
                "to_state": self.to_state, "rule": self.rule}


@dataclass
class Preview:
    rows: int
    nodes: int
    start: datetime
    end: datetime
    current: list[SimTransition] = field(default_factory=list)
    proposed: list[SimTransition] = field(default_factory=list)
    signal: str = "norm"  # the history replayed: the signal the detector decides on

    @staticmethod
    def _keys(ts: list[SimTransition]) -> set[tuple[str, str, str]]:
        return {(t.node, t.to_state, t.rule) for t in ts}

    @property
    def added(self) -> list[SimTransition]:
        """Transitions the proposed thresholds produce that the current ones do not (by node/state/rule)."""
        old = self._keys(self.current)
        return [t for t in self.proposed if (t.node, t.to_state, t.rule) not in old]

    @property
    def removed(self) -> list[SimTransition]:
        new = self._keys(self.proposed)
        return [t for t in self.current if (t.node, t.to_state, t.rule) not in new]

    def to_dict(self) -> dict[str, Any]:
        return {
            "rows": self.rows, "nodes": self.nodes, "signal": self.signal,
            "start": self.start.isoformat(), "end": self.end.isoformat(),
            "current": [t.to_dict() for t in self.current], "proposed": [t.to_dict() for t in self.proposed],
            "added": [t.to_dict() for t in self.added], "removed": [t.to_dict() for t in self.removed],
        }


# at, node, z, ema, p50, p99, state, evidence
Row = tuple[datetime, str, float | None, float | None, float | None, float | None, str, float | None]


def replay(
    rows: list[Row], t: Thresholds, node_count: int, baselines: dict[datetime, float] | None = None, *,
    queue_laden: bool = False,
) -> list[SimTransition]:
    """Simulated transitions of ``rows`` (sorted by ``at``) under thresholds ``t``. Pure function.

    ``node_count`` sizes the safeguard (the group's nodes, not only those with history);
    ``baselines``: the detector's stored baseline per timestamp (missing: median-EMA estimate);
    ``queue_laden``: the rows are of ``norm`` in a group without TTFT, whose latency includes the
    queue: as the detector does (robust mode), latency quarantines only a node cut (degraded) for at
    least ``queue_drain_s``, counting its rows from then on."""
    baselines = baselines or {}
    drain = queue_laden and t.baseline_mode == "robust"
    cut_since: dict[str, datetime] = {}
    by_at: dict[datetime, list[Row]] = defaultdict(list)
    for r in rows:
        by_at[r[0]].append(r)
    state: dict[str, str] = {}
    held: set[str] = set()
    z_streak: dict[str, int] = defaultdict(int)
    tail_streak: dict[str, int] = defaultdict(int)
    p50_streak: dict[str, int] = defaultdict(int)
    max_out = math.floor(t.max_quarantine_fraction * node_count + 1e-9)
    robust = t.baseline_mode == "robust"
    out: list[SimTransition] = []
    for at in sorted(by_at):
        batch = by_at[at]
        peers = [r for r in batch if r[6] in ("healthy", "degraded")]
        emas = [r[3] for r in peers if r[3] is not None]
        p50s = [r[4] for r in peers if r[4] is not None]
        baseline = baselines.get(at)
        if baseline is None:
            baseline = float(np.median(emas)) if emas else None
        median_p50 = float(np.median(p50s)) if p50s else None
        for _, node, z, ema, p50, p99, recorded, evidence in batch:
            if node in held:
                continue  # quarantined by the simulation: canaries are not replayed
            cur = state.get(node)
            if recorded not in JUDGED:
                # Warming, forced by an operator, or in the detector's quarantine path: no fresh
                # figure to judge. Follow the record, except that a node the simulation keeps in
                # service stays there (the new thresholds might not have quarantined it).
                if cur is None or cur not in JUDGED or recorded in FOLLOWED:
                    state[node] = recorded
                continue
            if cur is None or cur not in JUDGED:
                cur = state[node] = "degraded" if recorded == "pending_approval" else recorded
            if cur == "degraded":
                cut_since.setdefault(node, at)
            else:
                cut_since.pop(node, None)
            drained = not drain or (node in cut_since and (at - cut_since[node]).total_seconds() >= t.queue_drain_s)
            zq = z is not None and z >= t.quarantine_z and (
                not robust or baseline is None or (ema is not None and ema >= t.quarantine_materiality * baseline))
            z_streak[node] = z_streak[node] + 1 if zq and drained else 0
            tail = drained and p50 is not None and p99 is not None and p50 > 0 and p99 / p50 >= t.tail_ratio
            tail_streak[node] = tail_streak[node] + 1 if tail else 0
            slow50 = drained and p50 is not None and median_p50 is not None and median_p50 > 0 and (
                p50 >= t.cross_p50_ratio * median_p50)
            p50_streak[node] = p50_streak[node] + 1 if slow50 else 0
            rule = ("z_quarantine" if z_streak[node] >= t.quarantine_persistence
                    else "tail_ratio" if tail_streak[node] >= t.tail_windows
                    else "cross_p50" if p50_streak[node] >= t.tail_windows else None)
            if rule is not None:
                n_out = sum(1 for s in state.values() if s in OUT_OF_SERVICE)
                if n_out + 1 <= max_out:
                    out.append(SimTransition(node, at, cur, "quarantined", rule))
                    state[node] = "quarantined"
                    held.add(node)
                    continue
                if cur != "degraded":
                    out.append(SimTransition(node, at, cur, "degraded", "safeguard_blocked"))
                    state[node] = "degraded"
                continue
            zd = z is not None and z >= t.degrade_z and (
                not robust or baseline is None or (ema is not None and ema >= t.degrade_materiality * baseline))
            # Robust mode cuts only on evidence too (rows from before it was recorded have none).
            zd = zd and (not robust or zq or evidence is None or evidence >= t.degrade_evidence * (1 - 1e-9))
            if cur == "healthy" and zd:
                out.append(SimTransition(node, at, cur, "degraded", "z_degrade"))
                state[node] = "degraded"
                cut_since[node] = at
            elif cur == "degraded" and (z is None or z < t.degrade_z - t.degrade_hysteresis):
                out.append(SimTransition(node, at, cur, "healthy", "z_recovered"))
                state[node] = "healthy"
                cut_since.pop(node, None)
    return out


def history_rows(
    group: ModelGroup, start: datetime, end: datetime, signal: str = "norm", *, max_rows: int | None = None
) -> list[Row]:
    """The group's ``signal`` history rows in ``[start, end)`` as replay input, sorted by time. The
    tail window's P50/P99 are recorded on the ``norm`` rows: other signals' rows take them from there.
    ``max_rows``: raise :class:`PreviewTooLarge` rather than read more than that many rows per query.
    A count capped at ``max_rows + 1`` (in the database) refuses before any row is loaded — reading
    rows only to refuse cost 2.2 s and +62 MB at 100,000 rows —, and the read itself is capped as
    well, for rows written by a tick between the count and the read."""
    def rows(sig: str) -> list[Row]:
        in_window = NodeHistory.objects.filter(node__group=group, signal=sig, at__gte=start, at__lt=end)
        qs = in_window.order_by("at", "node_id").values_list(
            "at", "node__name", "z", "ema", "p50", "p99", "state", "evidence")
        if max_rows is None:
            return list(qs)
        too_many = PreviewTooLarge(
            "group", f"the preview would read more than PREVIEW_MAX_ROWS={max_rows} history rows of "
                     f"group {group.name!r} ({sig} rows in the window): preview a shorter window")
        if in_window.order_by()[: max_rows + 1].count() > max_rows:
            raise too_many
        out = list(qs[: max_rows + 1])
        if len(out) > max_rows:
            raise too_many
        return out

    out = rows(signal)
    if signal != "norm":
        tail = {(r[0], r[1]): (r[4], r[5]) for r in rows("norm")}
        out = [(r[0], r[1], r[2], r[3], *tail.get((r[0], r[1]), (None, None)), r[6], r[7]) for r in out]
    return out


def stored_baselines(group: ModelGroup, start: datetime, end: datetime, signal: str = "norm") -> dict[datetime, float]:
    """``{at: baseline}`` of the detector's stored ``signal`` baselines of ``group`` in ``[start, end)``."""
    return dict(GroupBaseline.objects.filter(group=group, signal=signal, at__gte=start, at__lt=end,
                                             baseline__isnull=False).values_list("at", "baseline"))


def preview_thresholds(
    group: ModelGroup, changes: dict[str, Any], *, window_s: float | None = None, now: datetime | None = None
) -> Preview:
    """Replay the last ``window_s`` seconds (default: an hour, or ``PREVIEW_MAX_WINDOW_S`` if shorter)
    of ``group``'s history under its current thresholds and under ``current.replace(**changes)``.
    Raises ``ThresholdError`` for an invalid change, :class:`PreviewTooLarge` over a bound (each is
    checked before any history row is loaded)."""
    max_window = settings.PREVIEW_MAX_WINDOW_S
    if window_s is None:
        window_s = min(DEFAULT_WINDOW_S, max_window)
    if window_s > max_window:
        raise PreviewTooLarge("window_s", f"window_s={window_s:g} is over PREVIEW_MAX_WINDOW_S={max_window} "
                                          "seconds: preview a shorter window")
    current = group.thresholds()
    proposed = current.replace(**changes)
    n = group.nodes.filter(retired=False).count()
    if n > settings.PREVIEW_MAX_NODES:
        raise PreviewTooLarge("group", f"group {group.name!r} has {n} nodes, over PREVIEW_MAX_NODES="
                                       f"{settings.PREVIEW_MAX_NODES}: too large to replay here")
    end = now or timezone.now()
    start = end - timedelta(seconds=window_s)
    signal = decision_signal(group)
    rows = history_rows(group, start, end, signal, max_rows=settings.PREVIEW_MAX_ROWS)
    baselines = stored_baselines(group, start, end, signal)
    return Preview(
        rows=len(rows), nodes=len({r[1] for r in rows}), start=start, end=end,
        current=replay(rows, current, n, baselines, queue_laden=signal == "norm"),
        proposed=replay(rows, proposed, n, baselines, queue_laden=signal == "norm"), signal=signal,
    )
