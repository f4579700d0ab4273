"""API behaviour: filters, timeline downsampling, thresholds with validation and history, overrides,
proposals, audit, schema, and JSON errors."""

from __future__ import annotations

from datetime import timedelta

import pytest
from rest_framework.test import APIClient

from outlier_admin.control.models import AuditEvent, Override, QuarantineProposal
from outlier_admin.fleet.models import ThresholdChange
from tests.outlier_admin.api.conftest import write_history

pytestmark = pytest.mark.django_db


def as_user(user) -> APIClient:
    c = APIClient()
    c.force_authenticate(user)
    return c


def test_nodes_filter_by_group_and_state(fleet, users):
    from outlier_admin.control.actions import do_create_group, do_register_node

    other = do_create_group("mistral", actor="setup")
    do_register_node(other, "127.9.0.1:8000", actor="setup")
    c = as_user(users["viewer"])
    body = c.get("/api/v1/nodes/?group=llama").json()
    assert body["count"] == 8
    item = body["results"][0]
    assert {"id", "address", "group", "state", "weight", "ema", "z", "p50", "p99"} <= set(item)
    assert {r["group"] for r in body["results"]} == {"llama"}
    q = c.get("/api/v1/nodes/?group=llama&state=quarantined").json()
    assert [r["address"] for r in q["results"]] == ["127.0.0.0:8000"]
    # latest figures come from the newest history row (z 4.2, ema 2.0 for the quarantined node)
    assert (q["results"][0]["z"], q["results"][0]["ema"]) == (4.2, 2.0)
    assert c.get("/api/v1/nodes/?group=mistral").json()["count"] == 1


def test_pagination_limit_offset(fleet, users):
    body = as_user(users["viewer"]).get("/api/v1/nodes/?limit=3&offset=3").json()
    assert body["count"] == 8 and len(body["results"]) == 3 and body["next"] and body["previous"]


def test_timeline_range_and_transitions(fleet, users):
    node = fleet["nodes"][0]
    body = as_user(users["viewer"]).get(f"/api/v1/nodes/{node.pk}/timeline/?hours=1").json()
    assert len(body["points"]) == 180  # fits: returned as stored
    assert max(p["z"] for p in body["points"]) == 4.2
    assert [t["to_state"] for t in body["transitions"]] == ["degraded", "quarantined"]


def test_timeline_downsamples_24h_to_at_most_2000_points(fleet, users):
    node = fleet["nodes"][2]
    start = fleet["now"] - timedelta(hours=24)
    # 8,640 rows (every 10 s); a single spike of Z 9 and a weight dip to 0 must survive downsampling.
    write_history(node, start=start, count=8640, z=lambda i: 9.0 if i == 4321 else 0.2,
                  state=lambda i: "quarantined" if i == 5000 else "healthy")
    body = as_user(users["viewer"]).get(f"/api/v1/nodes/{node.pk}/timeline/?hours=24.5").json()
    pts = body["points"]
    assert 1000 < len(pts) <= 2000
    assert max(p["z"] for p in pts) == 9.0
    assert min(p["weight"] for p in pts) == 0.0
    assert [p["at"] for p in pts] == sorted(p["at"] for p in pts)


@pytest.mark.parametrize(("query", "field"), [("hours=abc", "hours"), ("hours=-1", "hours"),
                                              ("start=yesterday", "start"), ("max_points=0", "max_points"),
                                              ("signal=ttft", "signal")])
def test_timeline_bad_query_is_400_with_message(fleet, users, query, field):
    resp = as_user(users["viewer"]).get(f"/api/v1/nodes/{fleet['nodes'][0].pk}/timeline/?{query}")
    assert resp.status_code == 400 and field in resp.json()["detail"]


def test_thresholds_read_update_and_history(fleet, users):
    g = fleet["group"].name
    c = as_user(users["operator"])
    body = c.get(f"/api/v1/groups/{g}/thresholds/").json()
    assert body["values"]["quarantine_z"] == 3.5 and body["ranges"]["quarantine_z"] == "[0.5, 100]"
    resp = c.patch(f"/api/v1/groups/{g}/thresholds/", {"changes": {"quarantine_z": 4.0}, "reason": "too eager"},
                   format="json")
    assert resp.status_code == 200 and resp.json()["diff"] == {"quarantine_z": [3.5, 4.0]}
    history = c.get(f"/api/v1/groups/{g}/thresholds/history/").json()["results"]
    assert history[0]["version"] == resp.json()["version"] and history[0]["reason"] == "too eager"


def test_invalid_threshold_is_400_naming_field_and_range(fleet, users):
    g = fleet["group"].name
    c = as_user(users["operator"])
    resp = c.patch(f"/api/v1/groups/{g}/thresholds/", {"changes": {"max_quarantine_fraction": 1.5}, "reason": "x"},
                   format="json")
    assert resp.status_code == 400
    body = resp.json()
    assert body["errors"][0]["attr"] == "max_quarantine_fraction" and "[0, 1]" in body["detail"]
    missing = c.patch(f"/api/v1/groups/{g}/thresholds/", {"changes": {"quarantine_z": 4}}, format="json")
    assert missing.status_code == 400 and "reason" in missing.json()["detail"]
    assert not ThresholdChange.objects.filter(group=fleet["group"], version__gt=2).exists()


def test_preview_endpoint_changes_nothing(fleet, users):
    g = fleet["group"].name
    version = fleet["group"].thresholds_version
    resp = as_user(users["operator"]).post(f"/api/v1/groups/{g}/thresholds/preview/",
                                         {"changes": {"quarantine_z": 2.5, "quarantine_persistence": 3}},
                                         format="json")
    assert resp.status_code == 200
    body = resp.json()
    assert body["rows"] == 8 * 180 and body["nodes"] == 8
    fleet["group"].refresh_from_db()
    assert fleet["group"].thresholds_version == version


def test_overrides_validate_and_audit(fleet, users):
    node = fleet["nodes"][3]
    c = as_user(users["oncall"])
    resp = c.post(f"/api/v1/nodes/{node.pk}/quarantine/", {"reason": "ECC storm", "expires_in_s": 900}, format="json")
    assert resp.status_code == 201 and resp.json()["kind"] == "quarantine" and resp.json()["expires_at"]
    bad = c.post(f"/api/v1/nodes/{node.pk}/quarantine/", {"reason": "x", "expires_in_s": -1}, format="json")
    assert bad.status_code == 400 and "expires_in_s" in bad.json()["detail"]
    no_reason = c.post(f"/api/v1/nodes/{node.pk}/release/", {"reason": " "}, format="json")
    assert no_reason.status_code == 400 and "reason" in no_reason.json()["detail"]
    pin = c.post(f"/api/v1/nodes/{node.pk}/pin/", {"reason": "x", "weight": 99999}, format="json")
    assert pin.status_code == 400 and "[0, 100]" in pin.json()["detail"]
    assert Override.objects.filter(node=node).count() == 1
    missing = c.post("/api/v1/nodes/999999/release/", {"reason": "x"}, format="json")
    assert missing.status_code == 404 and missing.json()["detail"]


def test_proposal_approve_once(fleet, users):
    p = fleet["proposal"]
    c = as_user(users["operator"])
    assert c.get("/api/v1/proposals/?status=pending").json()["count"] == 1
    ok = c.post(f"/api/v1/proposals/{p.pk}/approve/", {"reason": "confirmed slow"}, format="json")
    assert ok.status_code == 200 and ok.json()["status"] == "approved"
    again = c.post(f"/api/v1/proposals/{p.pk}/reject/", {"reason": "no"}, format="json")
    assert again.status_code == 400 and "already approved" in again.json()["detail"]
    assert QuarantineProposal.objects.get(pk=p.pk).decided_actor == "operator"


def test_audit_lists_changes_with_reasons_and_filters(fleet, users):
    as_user(users["oncall"]).post(f"/api/v1/nodes/{fleet['nodes'][0].pk}/release/", {"reason": "fixed PCIe"},
                                  format="json")
    c = as_user(users["viewer"])
    rows = c.get("/api/v1/audit/?action=node.release").json()["results"]
    assert [(r["actor"], r["reason"], r["node"]["name"]) for r in rows] == [("oncall", "fixed PCIe", "127.0.0.0:8000")]
    assert c.get("/api/v1/audit/?actor=nobody").json()["count"] == 0
    assert AuditEvent.objects.count() == c.get("/api/v1/audit/").json()["count"]


def test_schema_and_docs(fleet, users):
    c = as_user(users["viewer"])
    schema = c.get("/api/schema/?format=json").json()
    assert schema["openapi"].startswith("3.")
    assert "/api/v1/nodes/{id}/quarantine/" in schema["paths"]
    assert "bearerToken" in schema["components"]["securitySchemes"]
    docs = c.get("/api/docs/")
    assert docs.status_code == 200 and b"swagger-ui" in docs.content.lower()
    assert b"cdn" not in docs.content.lower()
