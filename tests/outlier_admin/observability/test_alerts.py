from __future__ import annotations

import time

import orjson
from django.utils import timezone

from outlier_admin.control import publish
from outlier_admin.control.actions import do_approve_proposal, do_propose_quarantine, do_quarantine
from outlier_admin.control.models import Transition
from outlier_admin.observability import alerts
from outlier_admin.observability.events import scan_events


def _transition(group, node, frm, to, reason, *, shadow=False, z=5.1):
    return Transition.objects.create(group=group, node=node, at=timezone.now(), from_state=frm, to_state=to,
                                     reason=reason, signal="norm", z=z, baseline=1.0, ema=2.4, shadow=shadow)


def _configure(settings, receiver):
    settings.ALERTMANAGER_URLS = [receiver.url + "/am"]
    settings.ALERTMANAGER_WEBHOOK_URLS = [receiver.url + "/am-webhook"]
    settings.ALERT_WEBHOOK_URLS = [receiver.url + "/generic"]
    settings.ALERT_EXTERNAL_URL = "http://dash.example"
    settings.ALERT_RETRIES = 0


def test_quarantine_and_canary_recovery_reach_all_three_receiver_kinds(settings, fleet, redis_client, receiver):
    _configure(settings, receiver)
    group, nodes = fleet
    first = scan_events()  # first scan: cursors start at the current end, nothing replayed
    assert first.alerts == []
    _transition(group, nodes[1], "degraded", "quarantined", "z_quarantine")
    _transition(group, nodes[2], "healthy", "degraded", "z_degrade", z=2.3)  # logged, no alert
    _transition(group, nodes[3], "healthy", "quarantined", "z_quarantine", shadow=True)  # shadow: no alert
    _transition(group, nodes[0], "probing", "recovering", "probes_passed")

    res = scan_events()
    assert res.transitions == 4
    assert [(a.name, a.status, a.node) for a in res.alerts] == [
        ("OutlierNodeQuarantined", "firing", "n1"), ("OutlierCanaryRecovery", "firing", "n0")]
    by_path = {}
    for path, body in receiver.received:
        by_path.setdefault(path, []).append(body)
    # Alertmanager API v2: one POST with the list of alerts.
    [am] = by_path["/am/api/v2/alerts"]
    assert [a["labels"]["alertname"] for a in am] == ["OutlierNodeQuarantined", "OutlierCanaryRecovery"]
    assert am[0]["labels"] == {"alertname": "OutlierNodeQuarantined", "severity": "warning",
                               "model_group": "obs-g", "service": "outlier-admin", "node": "n1",
                               "reason": "z_quarantine"}
    assert am[0]["generatorURL"] == "http://dash.example/groups/obs-g/nodes/n1/"
    assert "endsAt" not in am[0] and "endsAt" in am[1]  # an event alert resolves by itself
    # Alertmanager webhook format, version 4.
    [hook] = by_path["/am-webhook"]
    assert hook["version"] == "4" and hook["status"] == "firing" and len(hook["alerts"]) == 2
    assert hook["commonLabels"]["model_group"] == "obs-g"
    # Generic JSON: one POST per alert.
    generic = by_path["/generic"]
    assert [(g["alert"], g["node"], g["status"]) for g in generic] == [
        ("OutlierNodeQuarantined", "n1", "firing"), ("OutlierCanaryRecovery", "n0", "firing")]
    # A second scan sends nothing new.
    receiver.received.clear()
    assert scan_events().alerts == [] and receiver.received == []

    _transition(group, nodes[1], "recovering", "healthy", "recovered")
    [resolved] = scan_events().alerts
    assert (resolved.name, resolved.status) == ("OutlierNodeQuarantined", "resolved")


def test_proposal_waiting_fires_then_resolves_when_decided(settings, fleet, redis_client, receiver):
    _configure(settings, receiver)
    _group, nodes = fleet
    scan_events()
    proposal = do_propose_quarantine(nodes[2], actor="system:detector", source="detector", reason="z_quarantine")
    [a] = scan_events().alerts
    assert (a.name, a.status, a.node, a.labels["proposal"]) == ("OutlierProposalWaiting", "firing", "n2",
                                                               str(proposal.pk))
    do_approve_proposal(proposal, actor="alice", reason="confirmed by DCGM")
    res = scan_events()
    [a] = res.alerts
    assert (a.name, a.status) == ("OutlierProposalWaiting", "resolved")
    assert res.audits == 1  # the approval's audit event was logged


def test_safeguard_edges_alert_once_each(settings, fleet, redis_client, receiver):
    _configure(settings, receiver)
    group, nodes = fleet
    scan_events()
    view = [{"node": n.name, "address": n.address, "weight": 100, "state": "healthy"} for n in nodes]
    publish.publish_weights(group, view, safeguard=True, now=time.time())
    assert [(a.name, a.status) for a in scan_events().alerts] == [("OutlierSafeguardTripped", "firing")]
    publish.publish_weights(group, view, safeguard=True, now=time.time())
    assert scan_events().alerts == []  # still tripped: no repeat
    publish.publish_weights(group, view, safeguard=False, now=time.time())
    assert [(a.name, a.status) for a in scan_events().alerts] == [("OutlierSafeguardTripped", "resolved")]


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


def test_a_failing_receiver_loses_nothing(settings, fleet, redis_client, receiver):
    settings.ALERT_WEBHOOK_URLS = [receiver.url + "/generic"]
    settings.ALERT_RETRIES = 1
    group, nodes = fleet
    scan_events()
    receiver.status = 503
    _transition(group, nodes[1], "degraded", "quarantined", "z_quarantine")
    res = scan_events()
    assert res.delivered == {"sent": 0, "failed": 1}
    assert len(receiver.received) == 3  # first try + 1 retry + the re-delivery attempt in the same scan
    assert redis_client.llen(alerts.FAILED_KEY) == 1
    kept = orjson.loads(redis_client.lindex(alerts.FAILED_KEY, 0))
    assert kept["body"]["node"] == "n1"
    receiver.status = 200
    receiver.received.clear()
    assert scan_events().alerts == []  # nothing new ...
    assert [b["node"] for _, b in receiver.received] == ["n1"]  # ... but the kept alert was re-delivered
    assert redis_client.llen(alerts.FAILED_KEY) == 0
