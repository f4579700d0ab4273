"""Alert delivery: Alertmanager (API v2 and webhook format) and a generic JSON webhook.

Receivers are configured per deployment (comma-separated URLs, see README "Alerts"):

* ``ALERTMANAGER_URLS`` — base URLs of Alertmanager; alerts are POSTed to ``<url>/api/v2/alerts``
  as Alertmanager's own list of ``{labels, annotations, startsAt, endsAt, generatorURL}``, so
  routing, grouping, silences and inhibition stay Alertmanager's job.
* ``ALERTMANAGER_WEBHOOK_URLS`` — receivers that consume Alertmanager *notifications*
  (``webhook_config``): one POST per batch in the webhook format, ``"version": "4"``.
* ``ALERT_WEBHOOK_URLS`` — generic JSON: one POST per alert, a flat object (see :func:`generic_payload`).

A delivery is retried ``ALERT_RETRIES`` times with exponential back-off (0.5 s, 1 s, ...); one that
still fails is logged with its reason, counted (``outlier_alerts_total{result="failed"}``) and kept in
Redis (``outlier:alerts:failed``, the last 1000) so :func:`redeliver_failed` tries it again at the next
scan — an unreachable receiver loses nothing.
"""

from __future__ import annotations

import hashlib
import logging
import time
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import orjson
from django.conf import settings

from outlier_admin.observability import metrics

log = logging.getLogger("outlier_admin.alerts")

FAILED_KEY = "outlier:alerts:failed"
FAILED_KEEP = 1000
KINDS = ("alertmanager", "alertmanager_webhook", "generic")
# Alertmanager treats an alert as resolved once endsAt passes: instantaneous events (a canary
# recovery) are sent with a short life so they do not stay "firing" forever.
EVENT_TTL = timedelta(minutes=5)


@dataclass
class Alert:
    """One alert. ``name`` is the ``alertname`` (``OutlierNodeQuarantined``, ...)."""

    name: str
    status: str  # "firing" | "resolved"
    severity: str
    group: str
    summary: str
    description: str = ""
    node: str | None = None
    starts_at: str = ""  # RFC 3339
    ends_at: str | None = None
    labels: dict[str, str] = field(default_factory=dict)
    annotations: dict[str, str] = field(default_factory=dict)

    def all_labels(self) -> dict[str, str]:
        out = {"alertname": self.name, "severity": self.severity, "model_group": self.group,
               "service": "outlier-admin"}
        if self.node:
            out["node"] = self.node
        out.update(self.labels)
        return out

    def fingerprint(self) -> str:
        items = sorted(self.all_labels().items())
        return hashlib.sha256(orjson.dumps(items)).hexdigest()[:16]

    def generator_url(self) -> str:
        base = (getattr(settings, "ALERT_EXTERNAL_URL", "") or "").rstrip("/")
        if not base:
            return ""
        return f"{base}/groups/{self.group}/" + (f"nodes/{self.node}/" if self.node else "")


def rfc3339(ts: float | datetime) -> str:
    dt = ts if isinstance(ts, datetime) else datetime.fromtimestamp(ts, tz=UTC)
    return dt.astimezone(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def alertmanager_alert(alert: Alert) -> dict[str, Any]:
    """One alert in Alertmanager's API v2 shape (``postableAlert``)."""
    doc: dict[str, Any] = {
        "labels": alert.all_labels(),
        "annotations": {"summary": alert.summary, "description": alert.description, **alert.annotations},
        "startsAt": alert.starts_at,
        "generatorURL": alert.generator_url(),
    }
    if alert.ends_at:
        doc["endsAt"] = alert.ends_at
    return doc


def alertmanager_webhook_payload(alerts: list[Alert], *, receiver: str = "outlier-admin") -> dict[str, Any]:
    """A notification in Alertmanager's ``webhook_config`` format (version 4)."""
    firing = any(a.status == "firing" for a in alerts)
    common = dict(set.intersection(*(set(a.all_labels().items()) for a in alerts))) if alerts else {}
    return {
        "version": "4",
        "groupKey": f"{{}}:{{alertname={alerts[0].name!r}}}" if alerts else "{}",
        "truncatedAlerts": 0,
        "status": "firing" if firing else "resolved",
        "receiver": receiver,
        "groupLabels": {"alertname": alerts[0].name} if alerts else {},
        "commonLabels": common,
        "commonAnnotations": {},
        "externalURL": getattr(settings, "ALERT_EXTERNAL_URL", "") or "",
        "alerts": [
            {
                "status": a.status,
                "labels": a.all_labels(),
                "annotations": {"summary": a.summary, "description": a.description, **a.annotations},
                "startsAt": a.starts_at,
                "endsAt": a.ends_at or "0001-01-01T00:00:00Z",
                "generatorURL": a.generator_url(),
                "fingerprint": a.fingerprint(),
            }
            for a in alerts
        ],
    }


def generic_payload(alert: Alert) -> dict[str, Any]:
    """The generic JSON body: the alert's fields flat, plus all labels."""
    return {
        "alert": alert.name,
        "status": alert.status,
        "severity": alert.severity,
        "group": alert.group,
        "node": alert.node,
        "summary": alert.summary,
        "description": alert.description,
        "starts_at": alert.starts_at,
        "ends_at": alert.ends_at,
        "labels": alert.all_labels(),
        "annotations": alert.annotations,
        "url": alert.generator_url(),
        "fingerprint": alert.fingerprint(),
    }


@dataclass(frozen=True)
class Receiver:
    kind: str  # one of KINDS
    url: str


def configured_receivers() -> list[Receiver]:
    out = [Receiver("alertmanager", u.rstrip("/") + "/api/v2/alerts")
           for u in getattr(settings, "ALERTMANAGER_URLS", [])]
    out += [Receiver("alertmanager_webhook", u) for u in getattr(settings, "ALERTMANAGER_WEBHOOK_URLS", [])]
    out += [Receiver("generic", u) for u in getattr(settings, "ALERT_WEBHOOK_URLS", [])]
    return out


def _bodies(receiver: Receiver, alerts: list[Alert]) -> list[Any]:
    if receiver.kind == "alertmanager":
        return [[alertmanager_alert(a) for a in alerts]]
    if receiver.kind == "alertmanager_webhook":
        return [alertmanager_webhook_payload(alerts)]
    return [generic_payload(a) for a in alerts]


def _post(client: httpx.Client, url: str, body: Any, retries: int) -> str | None:
    """POST with retries; None on success, else the last error."""
    error = None
    for attempt in range(retries + 1):
        if attempt:
            time.sleep(min(0.5 * 2 ** (attempt - 1), 5.0))
        try:
            resp = client.post(url, content=orjson.dumps(body), headers={"Content-Type": "application/json"})
        except httpx.HTTPError as exc:
            error = f"{type(exc).__name__}: {exc}"
            continue
        if 200 <= resp.status_code < 300:
            return None
        error = f"HTTP {resp.status_code}: {resp.text[:200]}"
        if 400 <= resp.status_code < 500 and resp.status_code != 429:
            break  # the receiver refuses this body: retrying the same bytes will not help
    return error


def deliver(alerts: list[Alert], receivers: list[Receiver] | None = None, *, client: httpx.Client | None = None
            ) -> dict[str, int]:
    """Send ``alerts`` to every receiver; returns ``{"sent": n, "failed": n}`` (POSTs)."""
    receivers = configured_receivers() if receivers is None else receivers
    result = {"sent": 0, "failed": 0}
    if not alerts or not receivers:
        return result
    retries = int(getattr(settings, "ALERT_RETRIES", 2))
    own = client is None
    client = client or httpx.Client(timeout=float(getattr(settings, "ALERT_TIMEOUT_S", 5)))
    try:
        for receiver in receivers:
            for body in _bodies(receiver, alerts):
                error = _post(client, receiver.url, body, retries)
                outcome = "sent" if error is None else "failed"
                result[outcome] += 1
                metrics.ALERTS.labels(receiver.kind, outcome).inc()
                if error is not None:
                    log.error("alert delivery to %s failed: %s", receiver.url, error,
                              extra={"event": {"kind": "alert_failed", "receiver": receiver.url, "error": error}})
                    _keep_failed(receiver, body)
    finally:
        if own:
            client.close()
    return result


def _keep_failed(receiver: Receiver, body: Any) -> None:
    from outlier_admin.control.redis_conn import get_redis

    try:
        r = get_redis()
        r.lpush(FAILED_KEY, orjson.dumps({"receiver": asdict(receiver), "body": body, "at": time.time()}))
        r.ltrim(FAILED_KEY, 0, FAILED_KEEP - 1)
    except Exception:
        log.exception("could not keep a failed alert for re-delivery")


def redeliver_failed(*, client: httpx.Client | None = None, limit: int = 100) -> dict[str, int]:
    """Try the kept failed deliveries once more (oldest first); still failing ones are kept."""
    from outlier_admin.control.redis_conn import get_redis

    r = get_redis()
    result = {"sent": 0, "failed": 0}
    own = client is None
    client = client or httpx.Client(timeout=float(getattr(settings, "ALERT_TIMEOUT_S", 5)))
    try:
        for _ in range(limit):
            raw = r.rpop(FAILED_KEY)
            if raw is None:
                break
            item = orjson.loads(raw)
            receiver = Receiver(**item["receiver"])
            error = _post(client, receiver.url, item["body"], retries=0)
            if error is None:
                result["sent"] += 1
                metrics.ALERTS.labels(receiver.kind, "sent").inc()
            else:
                result["failed"] += 1
                r.lpush(FAILED_KEY, raw)  # back in the queue, at the new end
                break  # the receiver is still down: try again at the next scan
    finally:
        if own:
            client.close()
    return result
