"""Level-triggered alerts (observability.alerts.sync_alerts through the event scan): what holds is re-sent
to Alertmanager every ALERT_RESEND_S with endsAt = now + 4 x resend, what ended is resolved once with the
labels it fired with, webhooks get the edges only."""

from __future__ import annotations

import time

import orjson
from django.utils import timezone

from detector.states import NodeState
from outlier_admin.control import publish
from outlier_admin.control.actions import do_approve_proposal, do_propose_quarantine, do_quarantine
from outlier_admin.control.models import Transition
from outlier_admin.fleet.models import Node
from outlier_admin.observability import alerts
from outlier_admin.observability.events import scan_events

T0 = 1_800_000_000.0


def _transition(group, node, frm, to, reason, *, shadow=False, z=5.1):
    return Transition.objects.create(group=group, node=node, at=timezone.now(), from_state=frm, to_state=to,
                                     reason=reason, signal="norm", z=z, baseline=1.0, ema=2.4, shadow=shadow)


def _state(node, state, weight=0):
    """What the tick writes on the node row after a transition."""
    Node.objects.filter(pk=node.pk).update(state=state, weight=weight)


def _configure(settings, receiver):
    settings.ALERTMANAGER_URLS = [receiver.url + "/am"]
    settings.ALERTMANAGER_WEBHOOK_URLS = [receiver.url + "/am-webhook"]
    settings.ALERT_WEBHOOK_URLS = [receiver.url + "/generic"]
    settings.ALERT_EXTERNAL_URL = "http://127.0.0.1:8000"
    settings.ALERT_RETRIES = 0
    settings.ALERT_RESEND_S = 60


def _by_path(receiver):
    out = {}
    for path, body in receiver.received:
        out.setdefault(path, []).append(body)
    receiver.received.clear()
    return out


def test_node_state_alerts_name_real_states():
    labels = {s.label for s in NodeState}
    assert set(alerts.NODE_STATE_ALERTS) <= labels


def test_active_alerts_are_resent_and_resolved_with_the_same_labels(settings, fleet, redis_client, receiver):
    _configure(settings, receiver)
    _group, nodes = fleet
    assert scan_events(now=T0).alerts == []
    _state(nodes[1], "quarantined")
    _state(nodes[2], "forced_quarantine")
    _state(nodes[0], "recovering", weight=25)
    _state(nodes[3], "degraded", weight=40)  # weight cut, in service: no alert

    res = scan_events(now=T0 + 1)
    assert sorted((a.name, a.node) for a in res.alerts) == [
        ("OutlierCanaryRecovery", "n0"), ("OutlierNodeQuarantined", "n1"), ("OutlierNodeQuarantined", "n2")]
    assert res.active == 3
    got = _by_path(receiver)
    [am] = got["/am/api/v2/alerts"]
    by_node = {a["labels"]["node"]: a for a in am}
    assert by_node["n1"]["labels"] == {"alertname": "OutlierNodeQuarantined", "severity": "warning",
                                       "group": "obs-g", "service": "outlier-admin", "node": "n1",
                                       "cause": "detector"}
    assert by_node["n2"]["labels"]["cause"] == "operator"
    assert by_node["n0"]["labels"]["severity"] == "info"
    assert by_node["n1"]["generatorURL"] == f"http://127.0.0.1:8000/nodes/{nodes[1].pk}/"
    assert by_node["n1"]["startsAt"] == alerts.rfc3339(T0 + 1)
    assert by_node["n1"]["endsAt"] == alerts.rfc3339(T0 + 1 + 4 * 60)
    [hook] = got["/am-webhook"]
    assert hook["version"] == "4" and hook["status"] == "firing" and len(hook["alerts"]) == 3
    assert hook["commonLabels"]["group"] == "obs-g"
    assert sorted(g["node"] for g in got["/generic"]) == ["n0", "n1", "n2"]

    # Within the resend interval: nothing is sent.
    assert scan_events(now=T0 + 30).alerts == [] and receiver.received == []
    # The node moves on inside its episode (quarantined -> probing): the same alert, not a new one.
    _state(nodes[1], "probing")
    assert scan_events(now=T0 + 45).alerts == [] and receiver.received == []
    # One resend interval later: the whole set again, same startsAt, endsAt pushed forward; no webhook.
    res = scan_events(now=T0 + 61)
    assert res.alerts == [] and res.active == 3
    got = _by_path(receiver)
    assert list(got) == ["/am/api/v2/alerts"]
    again = {a["labels"]["node"]: a for a in got["/am/api/v2/alerts"][0]}
    assert again["n1"]["labels"] == by_node["n1"]["labels"]
    assert again["n1"]["startsAt"] == alerts.rfc3339(T0 + 1)
    assert again["n1"]["endsAt"] == alerts.rfc3339(T0 + 61 + 240)

    # Released: resolved once, with exactly the labels it fired with.
    _state(nodes[1], "healthy", weight=100)
    res = scan_events(now=T0 + 70)
    [resolved] = res.alerts
    assert (resolved.name, resolved.status, resolved.node) == ("OutlierNodeQuarantined", "resolved", "n1")
    got = _by_path(receiver)
    [am] = got["/am/api/v2/alerts"]
    assert [(a["labels"], a["endsAt"]) for a in am] == [(by_node["n1"]["labels"], alerts.rfc3339(T0 + 70))]
    assert [g["status"] for g in got["/generic"]] == ["resolved"]
    assert redis_client.hlen(alerts.ACTIVE_KEY) == 2
    # Nothing more about it afterwards.
    scan_events(now=T0 + 140)
    [am] = _by_path(receiver)["/am/api/v2/alerts"]
    assert sorted(a["labels"]["node"] for a in am) == ["n0", "n2"]


def test_a_resolve_is_retried_until_alertmanager_took_it(settings, fleet, redis_client, receiver):
    _configure(settings, receiver)
    settings.ALERTMANAGER_WEBHOOK_URLS, settings.ALERT_WEBHOOK_URLS = [], []
    _group, nodes = fleet
    _state(nodes[1], "quarantined")
    scan_events(now=T0)
    receiver.received.clear()
    _state(nodes[1], "healthy", weight=100)
    receiver.status = 503
    res = scan_events(now=T0 + 5)
    assert res.delivered == {"sent": 0, "failed": 1} and [a.status for a in res.alerts] == ["resolved"]
    receiver.status = 200
    receiver.received.clear()
    res = scan_events(now=T0 + 10)
    assert res.alerts == []  # not a new resolve: the same one, sent again
    [am] = _by_path(receiver)["/am/api/v2/alerts"]
    assert [(a["labels"]["node"], a["endsAt"]) for a in am] == [("n1", alerts.rfc3339(T0 + 5))]
    assert redis_client.hlen(alerts.ACTIVE_KEY) == 0
    scan_events(now=T0 + 100)
    assert receiver.received == []


def test_proposal_waiting_fires_then_resolves_when_decided(settings, fleet, redis_client, receiver):
    _configure(settings, receiver)
    _group, nodes = fleet
    scan_events(now=T0)
    proposal = do_propose_quarantine(nodes[2], actor="system:detector", source="detector", reason="z_quarantine")
    [a] = scan_events(now=T0 + 1).alerts
    assert (a.name, a.status, a.node, a.labels) == ("OutlierProposalWaiting", "firing", "n2", {"source": "detector"})
    assert a.annotations["proposal"] == str(proposal.pk)
    do_approve_proposal(proposal, actor="alice", reason="confirmed by DCGM")
    res = scan_events(now=T0 + 2)
    [a] = res.alerts
    assert (a.name, a.status) == ("OutlierProposalWaiting", "resolved")
    assert res.audits == 1  # the approval's audit event was logged


def test_safeguard_fires_while_the_flag_is_up(settings, fleet, redis_client, receiver):
    _configure(settings, receiver)
    group, nodes = fleet
    scan_events(now=T0)
    view = [{"node": n.name, "address": n.address, "weight": 100, "state": "healthy"} for n in nodes]
    publish.publish_weights(group, view, safeguard=True, now=time.time())
    [a] = scan_events(now=T0 + 1).alerts
    assert (a.name, a.status, a.node, a.severity) == ("OutlierSafeguardTripped", "firing", None, "critical")
    assert a.generator_url() == f"http://127.0.0.1:8000/groups/{group.slug}/"
    publish.publish_weights(group, view, safeguard=True, now=time.time())
    assert scan_events(now=T0 + 2).alerts == []  # still tripped: held, not repeated
    publish.publish_weights(group, view, safeguard=False, now=time.time())
    assert [(a.name, a.status) for a in scan_events(now=T0 + 3).alerts] == [("OutlierSafeguardTripped", "resolved")]


def test_transitions_and_overrides_are_logged_as_json_events(settings, fleet, redis_client, caplog):
    group, nodes = fleet
    scan_events(deliver=False)
    do_quarantine(nodes[0], actor="bob", reason="fan failure")
    _transition(group, nodes[0], "healthy", "forced_quarantine", "operator")
    with caplog.at_level("INFO", logger="outlier_admin.events"):
        scan_events(deliver=False)
    events = [r.event for r in caplog.records if hasattr(r, "event")]
    kinds = [e["kind"] for e in events]
    assert "transition" in kinds and "audit" in kinds
    audit = next(e for e in events if e["kind"] == "audit")
    assert (audit["action"], audit["actor"], audit["node"], audit["reason"]) == ("node.quarantine", "bob", "n0",
                                                                                "fan failure")
    tr = next(e for e in events if e["kind"] == "transition")
    assert (tr["from"], tr["to"], tr["z"]) == ("healthy", "forced_quarantine", 5.1)


def test_a_failing_webhook_loses_nothing(settings, fleet, redis_client, receiver):
    settings.ALERT_WEBHOOK_URLS = [receiver.url + "/generic"]
    settings.ALERT_RETRIES = 1
    _group, nodes = fleet
    scan_events(now=T0)
    receiver.status = 503
    _state(nodes[1], "quarantined")
    res = scan_events(now=T0 + 1)
    assert res.delivered == {"sent": 0, "failed": 1}
    assert len(receiver.received) == 3  # first try + 1 retry + the re-delivery attempt in the same scan
    assert redis_client.llen(alerts.FAILED_KEY) == 1
    kept = orjson.loads(redis_client.lindex(alerts.FAILED_KEY, 0))
    assert kept["body"]["node"] == "n1"
    receiver.status = 200
    receiver.received.clear()
    assert scan_events(now=T0 + 2).alerts == []  # nothing new ...
    assert [b["node"] for _, b in receiver.received] == ["n1"]  # ... but the kept alert was re-delivered
    assert redis_client.llen(alerts.FAILED_KEY) == 0


def test_a_node_held_degraded_past_degraded_alert_s_needs_a_hardware_check(settings, fleet, redis_client, receiver):
    """Issue 25: a GPU that stays slow (cut, never bad enough to quarantine) must get repaired, not only
    avoided. The alert fires once the node has been degraded for longer than its group's
    ``degraded_alert_s`` (600 s by default), and resolves when it leaves ``degraded``."""
    from datetime import UTC, datetime

    _configure(settings, receiver)
    group, nodes = fleet
    assert group.thresholds().degraded_alert_s == 600.0
    Transition.objects.create(group=group, node=nodes[1], at=datetime.fromtimestamp(T0, UTC), from_state="healthy",
                              to_state="degraded", reason="z_degrade", signal="decode", z=4.2, baseline=14.0, ema=19.6)
    _state(nodes[1], "degraded", weight=30)
    assert scan_events(now=T0 + 599).alerts == []
    [a] = scan_events(now=T0 + 601).alerts
    assert (a.name, a.status, a.node, a.severity) == ("OutlierNodeHardwareCheck", "firing", "n1", "warning")
    assert "needs a hardware check" in a.summary and "30/100" in a.description
    assert a.annotations["since"] == alerts.rfc3339(T0)
    _state(nodes[1], "healthy", weight=100)
    assert [(a.name, a.status) for a in scan_events(now=T0 + 602).alerts] == [("OutlierNodeHardwareCheck", "resolved")]


def test_held_degraded_since_is_the_one_rule():
    from datetime import UTC, datetime

    since = datetime.fromtimestamp(T0, UTC)
    at = datetime.fromtimestamp(T0 + 601, UTC)
    assert alerts.held_degraded_since("degraded", since, 600.0, at)
    assert not alerts.held_degraded_since("degraded", since, 601.0, at)
    assert not alerts.held_degraded_since("pending_approval", since, 600.0, at)  # its proposal alerts
    assert not alerts.held_degraded_since("degraded", None, 600.0, at)
