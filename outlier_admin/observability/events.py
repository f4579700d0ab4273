"""The event scan: new transitions, audit events, proposals and safeguard edges -> JSON log lines and
alerts. An outbox read with cursors, so the pipeline needs no hook and nothing is sent twice.

Every scan (Celery beat ``observability.scan_events`` every ``EVENT_SCAN_INTERVAL_S``; the demo
calls :func:`scan_events` itself):

1. takes the lock ``outlier:obs:lock`` (one scanner at a time across workers);
2. reads ``Transition`` and ``AuditEvent`` rows with an id above the cursors
   ``outlier:obs:cursor:{transition,audit,proposal}``; on the very first scan (no cursor) the
   cursors start at the current maximum ids, so deploying does not replay old history as alerts;
3. logs each transition and each audit event (overrides, approvals, threshold changes) as one
   JSON line on logger ``outlier_admin.events``;
4. builds alerts:

   ==============================  =====================================================
   ``OutlierNodeQuarantined``       firing: a node entered ``quarantined`` (not after a failed probe:
                                    it is already out) or ``forced_quarantine``; resolved: back to
                                    ``healthy``
   ``OutlierCanaryRecovery``        canary probes passed (``probing -> recovering``): stepwise restore
   ``OutlierProposalWaiting``       a quarantine proposal waits for a human; resolved once decided
   ``OutlierSafeguardTripped``      the weights document's ``safeguard`` flag went up / down
   ==============================  =====================================================

   Shadow-mode transitions are logged but do not alert (nothing was published);
5. delivers them (:func:`outlier_admin.observability.alerts.deliver`) and re-delivers kept
   failures, then advances the cursors.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Any

import orjson
from django.db.models import Max

from detector.states import OUT_OF_SERVICE_LABELS
from outlier_admin.control.models import AuditEvent, ProposalStatus, QuarantineProposal, Transition
from outlier_admin.control.redis_conn import GroupLock, get_redis, weights_key
from outlier_admin.fleet.models import ModelGroup
from outlier_admin.observability import alerts, metrics
from outlier_admin.observability.alerts import Alert, rfc3339

log = logging.getLogger("outlier_admin.events")

PREFIX = "outlier:obs:"
LOCK_KEY = PREFIX + "lock"
OPEN_PROPOSALS_KEY = PREFIX + "proposals_open"
SAFEGUARD_KEY = PREFIX + "safeguard"
BATCH = 1000
# A quarantine episode lasts from leaving service (the traffic table's DRAIN states) until the stepwise
# restore ends: its alert resolves when the node is healthy again from any of these.
OUT_STATES = OUT_OF_SERVICE_LABELS | {"recovering"}


@dataclass
class ScanResult:
    transitions: int = 0
    audits: int = 0
    alerts: list[Alert] = field(default_factory=list)
    delivered: dict[str, int] = field(default_factory=dict)
    skipped: bool = False


def _cursor(r: Any, name: str, model: Any) -> int:
    raw = r.get(PREFIX + "cursor:" + name)
    if raw is not None:
        return int(raw)
    start = model.objects.aggregate(m=Max("id"))["m"] or 0
    r.set(PREFIX + "cursor:" + name, start)
    return start


def transition_alert(t: Transition) -> Alert | None:
    """The alert a transition row raises, if any (see module docstring)."""
    if t.shadow:
        return None
    group, node = t.group.name, t.node.name
    at = rfc3339(t.at)
    detail = f"reason {t.reason}, signal {t.signal or '-'}, Z {_fmt(t.z)}, EMA {_fmt(t.ema)}, baseline {_fmt(t.baseline)}"
    if t.to_state in ("quarantined", "forced_quarantine") and t.from_state != "probing":
        return Alert("OutlierNodeQuarantined", "firing", "warning", group,
                     f"{group}/{node} quarantined ({t.reason})",
                     f"{t.from_state} -> {t.to_state}: {detail}", node=node, starts_at=at,
                     labels={"reason": t.reason})
    if t.to_state == "recovering" and t.from_state == "probing":
        return Alert("OutlierCanaryRecovery", "firing", "info", group,
                     f"{group}/{node} passed its canary probes; stepwise restore started",
                     detail, node=node, starts_at=at, ends_at=rfc3339(t.at + alerts.EVENT_TTL))
    if t.to_state == "healthy" and t.from_state in OUT_STATES:
        return Alert("OutlierNodeQuarantined", "resolved", "warning", group,
                     f"{group}/{node} back in service", f"{t.from_state} -> healthy ({t.reason})",
                     node=node, starts_at=at, ends_at=at)
    return None


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


def _proposal_alerts(r: Any, new: list[QuarantineProposal]) -> list[Alert]:
    out = []
    for p in new:
        if p.status != ProposalStatus.PENDING:
            continue
        r.sadd(OPEN_PROPOSALS_KEY, p.pk)
        out.append(Alert("OutlierProposalWaiting", "firing", "warning", p.group.name,
                         f"quarantine of {p.group.name}/{p.node.name} waits for approval",
                         f"{p.source}: {p.reason}", node=p.node.name, starts_at=rfc3339(p.created_at),
                         labels={"proposal": str(p.pk)}))
    open_ids = [int(x) for x in r.smembers(OPEN_PROPOSALS_KEY)]
    if open_ids:
        decided = (QuarantineProposal.objects.filter(pk__in=open_ids).exclude(status=ProposalStatus.PENDING)
                   .select_related("group", "node"))
        for p in decided:
            r.srem(OPEN_PROPOSALS_KEY, p.pk)
            out.append(Alert("OutlierProposalWaiting", "resolved", "warning", p.group.name,
                             f"quarantine proposal for {p.group.name}/{p.node.name} {p.status}",
                             f"decided by {p.decided_actor}: {p.decision_reason}", node=p.node.name,
                             starts_at=rfc3339(p.created_at), ends_at=rfc3339(p.decided_at or p.created_at),
                             labels={"proposal": str(p.pk)}))
        gone = set(open_ids) - set(QuarantineProposal.objects.filter(pk__in=open_ids).values_list("pk", flat=True))
        for pk in gone:
            r.srem(OPEN_PROPOSALS_KEY, pk)
    return out


def _safeguard_alerts(r: Any, now: float) -> list[Alert]:
    out = []
    names = list(ModelGroup.objects.values_list("name", flat=True))
    if not names:
        return out
    docs = r.mget([weights_key(n) for n in names])
    known = {k.decode(): v.decode() for k, v in r.hgetall(SAFEGUARD_KEY).items()}
    for name, raw in zip(names, docs, strict=True):
        if raw is None:
            continue
        try:
            flag = "1" if orjson.loads(raw).get("safeguard") else "0"
        except (orjson.JSONDecodeError, AttributeError):
            continue
        before = known.get(name, "0")
        if flag == before:
            continue
        r.hset(SAFEGUARD_KEY, name, flag)
        at = rfc3339(now)
        if flag == "1":
            out.append(Alert("OutlierSafeguardTripped", "firing", "critical", name,
                             f"{name}: safeguard tripped, quarantines held back",
                             "More nodes look slow than the group may lose (max_quarantine_fraction): "
                             "suspect a group-wide cause (traffic surge, bad deploy) rather than single nodes.",
                             starts_at=at))
        else:
            out.append(Alert("OutlierSafeguardTripped", "resolved", "critical", name,
                             f"{name}: safeguard released", "", starts_at=at, ends_at=at))
    return out


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
        p_cur = _cursor(r, "proposal", QuarantineProposal)
        rows = list(Transition.objects.filter(pk__gt=t_cur).select_related("group", "node").order_by("pk")[:BATCH])
        for t in rows:
            _log_transition(t)
            metrics.TRANSITIONS.labels(t.group.name, t.to_state).inc()
            alert = transition_alert(t)
            if alert is not None:
                result.alerts.append(alert)
        result.transitions = len(rows)
        audits = list(AuditEvent.objects.filter(pk__gt=a_cur).select_related("group", "node").order_by("pk")[:BATCH])
        for a in audits:
            _log_audit(a)
        result.audits = len(audits)
        props = list(QuarantineProposal.objects.filter(pk__gt=p_cur).select_related("group", "node")
                     .order_by("pk")[:BATCH])
        result.alerts += _proposal_alerts(r, props)
        result.alerts += _safeguard_alerts(r, now)
        for alert in result.alerts:
            log.warning("alert %s %s: %s", alert.name, alert.status, alert.summary,
                        extra={"event": {"kind": "alert", **alerts.generic_payload(alert)}})
        if deliver:
            result.delivered = alerts.deliver(result.alerts)
            alerts.redeliver_failed()
        # Cursors move only after delivery was attempted (failed POSTs are kept by alerts.deliver).
        pipe = r.pipeline()
        if rows:
            pipe.set(PREFIX + "cursor:transition", rows[-1].pk)
        if audits:
            pipe.set(PREFIX + "cursor:audit", audits[-1].pk)
        if props:
            pipe.set(PREFIX + "cursor:proposal", props[-1].pk)
        pipe.execute()
        return result
    finally:
        lock.release()
