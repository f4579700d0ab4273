"""The event scan: new transitions and audit events -> JSON log lines; the alerts that hold now -> the
receivers. The log lines are an outbox read with cursors, so the pipeline needs no hook and nothing
is logged twice; alerts are level-triggered (:func:`outlier_admin.observability.alerts.sync_alerts`).

Every scan (Celery beat ``observability.scan_events`` every ``EVENT_SCAN_INTERVAL_S``; the demo
calls :func:`scan_events` itself):

1. takes the lock ``outlier:obs:lock`` (one scanner at a time across workers);
2. reads ``Transition`` and ``AuditEvent`` rows with an id above the cursors
   ``outlier:obs:cursor:{transition,audit}``; on the very first scan (no cursor) the cursors start
   at the current maximum ids, so deploying does not replay old history;
3. logs each transition and each audit event (overrides, approvals, threshold changes) as one
   JSON line on logger ``outlier_admin.events``; counts each transition by its new state
   (``outlier_transitions_total``), except the canary's cycles within an incident (probe due, probe
   failed, restore step failed: :data:`~outlier_admin.control.incidents.CANARY_CYCLE`), which are
   probe outcomes (``outlier_canary_cycles_total``): one incident's quarantine counts once;
4. brings the alert receivers up to date with the conditions that hold now (quarantined nodes,
   canary recoveries, waiting proposals, tripped safeguards: the table in
   :mod:`outlier_admin.observability.alerts`), re-sending the active set to Alertmanager every
   ``ALERT_RESEND_S`` and resolving what ended with the labels it fired with; re-delivers kept
   webhook failures; then advances the cursors.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Any

from django.db.models import Max

from contract import keys
from outlier_admin.control.incidents import CANARY_CYCLE
from outlier_admin.control.models import AuditEvent, Transition
from outlier_admin.control.redis_conn import GroupLock, get_redis
from outlier_admin.observability import alerts, metrics
from outlier_admin.observability.alerts import Alert, rfc3339

log = logging.getLogger("outlier_admin.events")

PREFIX = keys.OBS_PREFIX
LOCK_KEY = PREFIX + "lock"
BATCH = 1000


@dataclass
class ScanResult:
    transitions: int = 0
    audits: int = 0
    alerts: list[Alert] = field(default_factory=list)  # started or resolved in this scan
    active: int = 0  # alerts holding after this scan
    delivered: dict[str, int] = field(default_factory=dict)
    skipped: bool = False


def _cursor(r: Any, name: str, model: Any) -> int:
    """The id after which rows are new. A cursor past the table's last id belongs to another database
    (a fresh demo SQLite on the same Redis: its ids start again at 1, and every row would be skipped
    until they passed the old cursor): it starts again at the last id, like a first scan."""
    raw = r.get(PREFIX + "cursor:" + name)
    last = model.objects.aggregate(m=Max("id"))["m"] or 0
    if raw is not None and int(raw) <= last:
        return int(raw)
    r.set(PREFIX + "cursor:" + name, last)
    return last


def _fmt(v: float | None) -> str:
    return "-" if v is None else f"{v:.3g}"


def _log_transition(t: Transition) -> None:
    event = {
        "kind": "transition", "id": t.pk, "at": rfc3339(t.at), "group": t.group.name, "node": t.node.name,
        "from": t.from_state, "to": t.to_state, "reason": t.reason, "signal": t.signal, "z": t.z,
        "ema": t.ema, "baseline": t.baseline, "spread": t.spread, "samples": t.samples, "shadow": t.shadow,
        "weight": t.explanation.get("weight"), "safeguard": t.explanation.get("safeguard"),
    }
    log.info("transition %s/%s %s -> %s (%s)", t.group.name, t.node.name, t.from_state, t.to_state, t.reason,
             extra={"event": event})


def _log_audit(a: AuditEvent) -> None:
    event = {
        "kind": "audit", "id": a.pk, "at": rfc3339(a.at), "action": a.action, "actor": a.actor,
        "group": a.group.name if a.group else None, "node": a.node.name if a.node else None,
        "reason": a.reason, "detail": a.detail,
    }
    log.info("audit %s by %s", a.action, a.actor, extra={"event": event})


def scan_events(*, now: float | None = None, deliver: bool = True) -> ScanResult:
    """Run one scan (see module docstring). Returns what was found and sent; ``skipped`` when
    another process holds the scan lock."""
    now = time.time() if now is None else now
    r = get_redis()
    lock = GroupLock(r, LOCK_KEY, 60_000)
    if not lock.acquire():
        return ScanResult(skipped=True)
    try:
        result = ScanResult()
        t_cur = _cursor(r, "transition", Transition)
        a_cur = _cursor(r, "audit", AuditEvent)
        rows = list(Transition.objects.filter(pk__gt=t_cur).select_related("group", "node").order_by("pk")[:BATCH])
        for t in rows:
            _log_transition(t)
            if t.reason in CANARY_CYCLE:  # a probe outcome within its incident
                metrics.CANARY_CYCLES.labels(t.group.name, t.reason).inc()
            else:
                metrics.TRANSITIONS.labels(t.group.name, t.to_state).inc()
        result.transitions = len(rows)
        audits = list(AuditEvent.objects.filter(pk__gt=a_cur).select_related("group", "node").order_by("pk")[:BATCH])
        for a in audits:
            _log_audit(a)
        result.audits = len(audits)
        if deliver:
            synced = alerts.sync_alerts(now)
            result.alerts, result.active, result.delivered = synced.started + synced.resolved, synced.active, \
                synced.delivered
            for alert in result.alerts:
                log.warning("alert %s %s: %s", alert.name, alert.status, alert.summary,
                            extra={"event": {"kind": "alert", **alerts.generic_payload(alert)}})
            alerts.redeliver_failed()
        # Cursors move only after delivery was attempted (failed POSTs are kept by alerts.deliver).
        pipe = r.pipeline()
        if rows:
            pipe.set(PREFIX + "cursor:transition", rows[-1].pk)
        if audits:
            pipe.set(PREFIX + "cursor:audit", audits[-1].pk)
        pipe.execute()
        return result
    finally:
        lock.release()
