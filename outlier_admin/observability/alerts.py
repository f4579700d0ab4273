"""Alerts: what holds now (:func:`active_alerts`), kept alive in Alertmanager (:func:`sync_alerts`),
and their delivery to Alertmanager (API v2 and webhook format) and a generic JSON webhook.

Alerts are **level-triggered**, as Alertmanager expects of a Prometheus-like client: every scan
computes the set of conditions that hold now from the database and the weights documents,

==============================  ===============================================================
``OutlierNodeQuarantined``       a node is out of service: ``cause="detector"`` (``quarantined``,
                                 ``probing``) or ``cause="operator"`` (``forced_quarantine``)
``OutlierCanaryRecovery``        a node passed its canary probes and is in its stepwise restore
                                 (``recovering``); ``info``
``OutlierProposalWaiting``       a quarantine proposal waits for a human (``source`` label)
``OutlierSafeguardTripped``      a group's weights document has ``safeguard`` set; ``critical``
``OutlierNodeHardwareCheck``     a node held ``degraded`` (cut, not quarantined) for longer than
                                 its group's ``degraded_alert_s`` (:func:`held_degraded_since`): a
                                 GPU that stays slow must get repaired, not only avoided
==============================  ===============================================================

(a ``shadow`` group publishes its nodes ``healthy``, so its decisions raise no alert). A node alert
carries its open incident (:mod:`outlier_admin.control.incidents`) in its annotations: ``incident``
(its id), ``since`` (its start) and ``cause`` (its deciding cause, with signal and units), which do
not move while the canary probes the node: ``quarantined`` and ``probing`` hold one alert, so one
incident fires one ``OutlierNodeQuarantined``. Every alert in
the set is re-sent to Alertmanager every ``ALERT_RESEND_S`` with ``endsAt = now + 4 x ALERT_RESEND_S``
(Alertmanager would otherwise end it ``resolve_timeout`` after receipt, 5 min by default, while the
node is still out; four intervals let three sends in a row be lost before it lapses). An alert that
leaves the set is sent once as resolved with ``endsAt = now`` and **the labels it fired with** (they
are kept in Redis, ``outlier:alerts:active``), so Alertmanager resolves the same alert instead of
opening a second one; until that send succeeds it is retried at every scan. Labels identify the
condition only (``alertname``, ``severity``, ``group``, ``node``, ``cause``/``source``, ``service``);
what changes while it holds (reason, Z, the proposal's id) is in the annotations. ``generatorURL`` is
the node's (or the group's) dashboard page under ``ALERT_EXTERNAL_URL``.

The webhook receivers below get notifications, not state: each alert once when it starts firing
and once when it resolves.

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
from datetime import UTC, datetime
from typing import Any

import httpx
import orjson
from django.conf import settings

from contract import keys
from contract.weights_document import DocumentError, WeightsDocument
from detector.states import CANARY_STATES, OPERATOR_STATES, OUT_OF_SERVICE
from outlier_admin.observability import metrics

log = logging.getLogger("outlier_admin.alerts")

FAILED_KEY = keys.ALERTS_FAILED
FAILED_KEEP = 1000
KINDS = ("alertmanager", "alertmanager_webhook", "generic")
#: The alerts that fired and have not been resolved at Alertmanager yet: fingerprint -> JSON.
ACTIVE_KEY = keys.ALERTS_ACTIVE
#: When the whole active set was last re-sent to Alertmanager (epoch seconds).
RESENT_KEY = keys.ALERTS_RESENT_AT
#: An alert lives ``ENDS_AFTER_RESENDS`` resend intervals past each send (see module docstring).
ENDS_AFTER_RESENDS = 4


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
    path: str = ""  # the dashboard page of the node (or group), for generatorURL

    def all_labels(self) -> dict[str, str]:
        # "group", as in every metric series (outlier_node_state{group=...}), so rules, silences and
        # routes written against the metrics match the alerts too.
        out = {"alertname": self.name, "severity": self.severity, "group": self.group,
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
        if not base or not self.path:
            return ""
        return base + self.path


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


# --- level-triggered alerts -------------------------------------------------------------------------

#: Node state label -> (alertname, severity, cause label) of the alert it holds up: every state that
#: drains the node (:data:`detector.states.OUT_OF_SERVICE`: quarantined, probing — still out while the
#: canary probes it —, forced_quarantine) holds up ``OutlierNodeQuarantined``, its cause the operator
#: for an operator's state (:data:`~detector.states.OPERATOR_STATES`); the rest of the canary's cycle
#: (:data:`~detector.states.CANARY_STATES`: recovering) ``OutlierCanaryRecovery``.
NODE_STATE_ALERTS: dict[str, tuple[str, str, str | None]] = {
    **{s.label: ("OutlierNodeQuarantined", "warning", "operator" if s in OPERATOR_STATES else "detector")
       for s in sorted(OUT_OF_SERVICE)},
    **{s.label: ("OutlierCanaryRecovery", "info", None) for s in CANARY_STATES if s not in OUT_OF_SERVICE},
}


def _node_path(pk: int) -> str:
    from django.urls import reverse

    return reverse("dashboard:node", kwargs={"pk": pk})


def _group_path(group: Any) -> str:
    from django.urls import NoReverseMatch, reverse

    try:
        return reverse("dashboard:group", kwargs={"slug": getattr(group, "slug", None) or group.name})
    except NoReverseMatch:  # a name that is no slug: the overview is the nearest page
        return reverse("dashboard:overview")


def held_degraded_since(state: str, since: datetime | None, degraded_alert_s: float,
                        now: datetime | None = None) -> bool:
    """Whether a node in ``state`` since ``since`` (its transition into it) has been held degraded
    for longer than ``degraded_alert_s`` (the group's threshold): the one rule behind the
    ``OutlierNodeHardwareCheck`` alert and the first screen's "needs hardware check" line."""
    if state != "degraded" or since is None:
        return False
    return ((now or datetime.now(UTC)) - since).total_seconds() > degraded_alert_s


def _degraded_since(nodes: list[Any]) -> dict[int, datetime]:
    """Each node's last transition into ``degraded`` (one query)."""
    from django.db.models import Max

    from outlier_admin.control.models import Transition

    rows = (Transition.objects.filter(node__in=[n.pk for n in nodes], to_state="degraded")
            .values("node_id").annotate(at=Max("at")))
    return {r["node_id"]: r["at"] for r in rows}


def active_alerts(now: float | None = None) -> list[Alert]:
    """Every alert whose condition holds now (see module docstring), ``starts_at`` empty (the first
    send sets it). Reads live nodes, pending proposals and the weights documents."""
    from outlier_admin.control.incidents import cause_text
    from outlier_admin.control.models import Incident, ProposalStatus, QuarantineProposal
    from outlier_admin.control.redis_conn import get_redis, mget
    from outlier_admin.fleet.models import ModelGroup, Node

    out: list[Alert] = []
    nodes = list(Node.objects.filter(retired=False, state__in=list(NODE_STATE_ALERTS))
                 .select_related("group").order_by("group__name", "name"))
    incidents = {i.node_id: i for i in Incident.objects.filter(node__in=[n.pk for n in nodes], ended_at__isnull=True)}
    for n in nodes:
        name, severity, cause = NODE_STATE_ALERTS[n.state]
        g = n.group.name
        if name == "OutlierCanaryRecovery":
            summary = f"{g}/{n.name} passed its canary probes; stepwise restore at weight {n.weight}"
        elif cause == "operator":
            summary = f"{g}/{n.name} is held out of service by an operator"
        else:
            summary = f"{g}/{n.name} is quarantined by the detector ({n.state})"
        # The incident it belongs to (one per episode out of full service): its start and deciding
        # cause stay put while the canary probes the node.
        inc = incidents.get(n.pk)
        told = {"incident": str(inc.pk), "since": rfc3339(inc.started_at), "cause": cause_text(inc)} if inc else {}
        out.append(Alert(name, "firing", severity, g, summary, f"state {n.state}, weight {n.weight}"
                         + (f"; {told['cause']}, since {told['since']}" if told else ""),
                         node=n.name, labels={"cause": cause} if cause else {},
                         annotations={"state": n.state, **told}, path=_node_path(n.pk)))
    degraded = list(Node.objects.filter(retired=False, state="degraded").select_related("group")
                    .order_by("group__name", "name"))
    since = _degraded_since(degraded) if degraded else {}
    at = datetime.fromtimestamp(now, UTC) if now is not None else datetime.now(UTC)
    for n in degraded:
        limit = n.group.thresholds().degraded_alert_s
        start = since.get(n.pk)
        if held_degraded_since(n.state, start, limit, at):
            g = n.group.name
            out.append(Alert("OutlierNodeHardwareCheck", "firing", "warning", g,
                             f"{g}/{n.name} needs a hardware check: held degraded for "
                             f"{(at - start).total_seconds() / 60:.0f} min",
                             f"cut to weight {n.weight}/{n.base_weight} since {start:%Y-%m-%d %H:%M:%S} UTC, "
                             f"longer than degraded_alert_s ({limit:g} s): it stays slow without being bad "
                             "enough to quarantine; check its GPU (clocks, throttling, PCIe link, ECC).",
                             node=n.name, annotations={"state": n.state, "since": rfc3339(start)},
                             path=_node_path(n.pk)))
    pending = (QuarantineProposal.objects.filter(status=ProposalStatus.PENDING, node__retired=False)
               .select_related("group", "node").order_by("created_at"))
    for p in pending:
        out.append(Alert("OutlierProposalWaiting", "firing", "warning", p.group.name,
                         f"quarantine of {p.group.name}/{p.node.name} waits for approval",
                         f"{p.source}: {p.reason}", node=p.node.name, labels={"source": p.source},
                         annotations={"proposal": str(p.pk)}, path=_node_path(p.node_id)))
    groups = list(ModelGroup.objects.order_by("name"))
    docs = mget(get_redis(), [keys.weights(g.name) for g in groups])
    for g, raw in zip(groups, docs, strict=True):
        try:
            tripped = raw is not None and WeightsDocument.from_json(raw).safeguard
        except DocumentError:
            tripped = False
        if tripped:
            out.append(Alert("OutlierSafeguardTripped", "firing", "critical", g.name,
                             f"{g.name}: safeguard tripped, quarantines held back",
                             "More nodes look slow than the group may lose (max_quarantine_fraction): "
                             "suspect a group-wide cause (traffic surge, bad deploy) rather than single nodes.",
                             path=_group_path(g)))
    return out


@dataclass
class SyncResult:
    started: list[Alert] = field(default_factory=list)  # began firing in this sync
    resolved: list[Alert] = field(default_factory=list)  # left the active set in this sync
    active: int = 0  # alerts active after this sync
    resent: bool = False  # the whole active set went to Alertmanager
    delivered: dict[str, int] = field(default_factory=lambda: {"sent": 0, "failed": 0})


def resend_interval() -> float:
    return float(getattr(settings, "ALERT_RESEND_S", 60))


def _compare(wanted: dict[str, Alert], kept: dict[str, Any], at: str,
             result: SyncResult) -> tuple[dict[str, Alert], dict[str, Alert]]:
    """The active alerts (``wanted``) against those stored (``kept``, by fingerprint): ``(firing,
    resolving)``. A firing alert keeps the start it was stored with, or starts ``at`` (new, or firing
    again after a resolve: in ``result.started``). A stored alert no longer active resolves with
    exactly the labels it fired with, ending ``at`` or when it was first marked resolved (only then,
    in ``result.resolved``: its resolve is news)."""
    firing: dict[str, Alert] = {}
    for fp, alert in wanted.items():
        old = kept.get(fp)
        if old is None or old.get("resolved_at"):
            alert.starts_at = at
            result.started.append(alert)
        else:
            alert.starts_at = old["alert"]["starts_at"]
        firing[fp] = alert
    resolving: dict[str, Alert] = {}
    for fp, old in kept.items():
        if fp in wanted:
            continue
        alert = Alert(**old["alert"])  # exactly the labels it fired with
        alert.status, alert.ends_at = "resolved", old.get("resolved_at") or at
        resolving[fp] = alert
        if not old.get("resolved_at"):
            result.resolved.append(alert)
    return firing, resolving


def _post_to_alertmanagers(to_am: list[Receiver], body: list[dict[str, Any]], client: httpx.Client | None,
                           result: SyncResult) -> bool:
    """POST ``body`` to every Alertmanager receiver (``ALERT_RETRIES`` retries each), counted in
    ``result.delivered`` and the metrics, a failure logged. Returns whether every one took it (then
    the resolves it carries were delivered)."""
    delivered = True
    retries = int(getattr(settings, "ALERT_RETRIES", 2))
    own = client is None
    http = client or httpx.Client(timeout=float(getattr(settings, "ALERT_TIMEOUT_S", 5)))
    try:
        for receiver in to_am:
            error = _post(http, receiver.url, body, retries)
            outcome = "sent" if error is None else "failed"
            result.delivered[outcome] += 1
            metrics.ALERTS.labels(receiver.kind, outcome).inc()
            if error is not None:
                delivered = False
                log.error("alert delivery to %s failed: %s", receiver.url, error,
                          extra={"event": {"kind": "alert_failed", "receiver": receiver.url, "error": error}})
    finally:
        if own:
            http.close()
    return delivered


def _store_active(r: Any, firing: dict[str, Alert], resolving: dict[str, Alert], kept: dict[str, Any], *,
                  resolves_delivered: bool, resent: bool, now: float) -> None:
    """Write the new active set to ``ACTIVE_KEY`` in one transaction: every firing alert; a resolved
    one removed once its resolve was delivered, else kept, marked resolved, to be sent again; the
    time of a full send (``RESENT_KEY``)."""
    pipe = r.pipeline()
    for fp, alert in firing.items():
        pipe.hset(ACTIVE_KEY, fp, orjson.dumps({"alert": asdict(alert)}))
    for fp, alert in resolving.items():
        if resolves_delivered:
            pipe.hdel(ACTIVE_KEY, fp)
        else:  # told nobody yet: keep it, marked, and send the resolve again at the next sync
            old = kept[fp]["alert"]
            pipe.hset(ACTIVE_KEY, fp, orjson.dumps({"alert": old, "resolved_at": alert.ends_at}))
    if resent:
        pipe.set(RESENT_KEY, repr(now))
    pipe.execute()


def sync_alerts(now: float | None = None, *, receivers: list[Receiver] | None = None,
                client: httpx.Client | None = None) -> SyncResult:
    """Bring every receiver up to date with :func:`active_alerts` (see module docstring).

    Call under the event scan's lock (one caller at a time). Alertmanager receivers get the whole
    active set when ``ALERT_RESEND_S`` has passed since the last full send or an alert started, and
    every resolved alert; a failed POST is not kept (the next send carries the state again), a
    resolved alert stays in ``ACTIVE_KEY`` until a resolve was delivered. Webhook receivers get the
    started and resolved alerts through :func:`deliver`."""
    from outlier_admin.control.redis_conn import get_redis

    now = time.time() if now is None else now
    r = get_redis()
    result = SyncResult()
    wanted = {a.fingerprint(): a for a in active_alerts(now)}
    kept = {k.decode(): orjson.loads(v) for k, v in r.hgetall(ACTIVE_KEY).items()}
    firing, resolving = _compare(wanted, kept, rfc3339(now), result)
    resend = resend_interval()
    last = float(r.get(RESENT_KEY) or 0)
    result.resent = bool(firing) and (bool(result.started) or now - last >= resend or now < last)
    for alert in firing.values():
        alert.ends_at = rfc3339(now + ENDS_AFTER_RESENDS * resend)
    receivers = configured_receivers() if receivers is None else receivers
    to_am = [x for x in receivers if x.kind == "alertmanager"]
    body = [alertmanager_alert(a) for a in (list(firing.values()) if result.resent else []) + list(resolving.values())]
    resolves_delivered = not to_am
    if body and to_am:
        resolves_delivered = _post_to_alertmanagers(to_am, body, client, result)
    edges = result.started + result.resolved
    others = [x for x in receivers if x.kind != "alertmanager"]
    if edges and others:
        for k, v in deliver(edges, others, client=client).items():
            result.delivered[k] += v
    _store_active(r, firing, resolving, kept, resolves_delivered=resolves_delivered, resent=result.resent, now=now)
    result.active = len(firing)
    return result
