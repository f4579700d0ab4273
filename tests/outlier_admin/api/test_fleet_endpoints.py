"""Groups and nodes created and edited through the API (audited, through the ``do_*`` actions), ``?name=``
filtering by name, unknown filters refused, JSON-only bodies, and every error one RFC 9457 problem."""

from __future__ import annotations

import pytest
from rest_framework.test import APIClient

from outlier_admin.control.models import AuditEvent
from outlier_admin.fleet.models import ModelGroup, Node

pytestmark = pytest.mark.django_db


def as_user(user) -> APIClient:
    c = APIClient()
    c.force_authenticate(user)
    return c


def assert_problem(resp, status: int, code: str | None = None, attr: str | None = None) -> dict:
    """The body is an RFC 9457 problem of ``status`` (and, if given, one of its errors has ``code`` /
    ``attr``)."""
    assert resp.status_code == status, resp.content
    assert resp["Content-Type"] == "application/problem+json"
    body = resp.json()
    assert body["type"] == "about:blank" and body["status"] == status and body["title"]
    assert isinstance(body["detail"], str) and body["detail"]
    assert all(set(e) == {"code", "detail", "attr"} for e in body["errors"]) and body["errors"]
    if code is not None:
        assert code in {e["code"] for e in body["errors"]}, body
    if attr is not None:
        assert attr in {e["attr"] for e in body["errors"]}, body
    return body


def test_create_and_edit_a_group_audited(users):
    c = as_user(users["operator"])
    resp = c.post("/api/v1/groups/", {"name": "meta-llama/Llama-3.1-8B", "policy": "approval", "model_name": "8B",
                                      "tensor_parallel_size": 2, "auto_register_allow": ["127.0.0.0/8"],
                                      "reason": "new pool"}, format="json")
    assert resp.status_code == 201, resp.content
    body = resp.json()
    assert (body["name"], body["policy"], body["tensor_parallel_size"]) == ("meta-llama/Llama-3.1-8B", "approval", 2)
    group = ModelGroup.objects.get(name="meta-llama/Llama-3.1-8B")
    assert group.auto_register_allow == ["127.0.0.0/8"] and group.thresholds_version == 1
    created = AuditEvent.objects.get(action="group.create", group=group)
    assert (created.actor, created.reason) == ("operator", "new pool")

    edit = c.patch(f"/api/v1/groups/{group.slug}/", {"hardware_class": "H100", "tensor_parallel_size": 4,
                                                     "reason": "moved to H100"}, format="json")
    assert edit.status_code == 200, edit.content
    assert (edit.json()["hardware_class"], edit.json()["tensor_parallel_size"]) == ("H100", 4)
    event = AuditEvent.objects.get(action="group.update", group=group)
    assert event.reason == "moved to H100"
    assert event.detail["diff"] == {"hardware_class": ["", "H100"], "tensor_parallel_size": [2, 4]}

    assert_problem(c.post("/api/v1/groups/", {"name": "meta-llama/Llama-3.1-8B", "reason": "again"}, format="json"),
                   400, code="refused")
    assert_problem(c.post("/api/v1/groups/", {"name": "bad name!", "reason": "x"}, format="json"), 400)
    assert_problem(c.patch(f"/api/v1/groups/{group.slug}/", {"model_name": "x"}, format="json"), 400,
                   code="required", attr="reason")
    assert_problem(c.patch(f"/api/v1/groups/{group.slug}/", {"reason": "nothing"}, format="json"), 400,
                   code="refused")
    # A field that is not editable here is refused, not dropped while the rest is applied.
    assert_problem(c.patch(f"/api/v1/groups/{group.slug}/", {"policy": "shadow", "model_name": "y", "reason": "x"},
                           format="json"), 400, code="unknown_field", attr="policy")
    assert_problem(c.patch(f"/api/v1/groups/{group.slug}/", {"auto_register_allow": ["not a cidr!"],
                                                             "reason": "x"}, format="json"), 400)
    assert ModelGroup.objects.count() == 1 and AuditEvent.objects.filter(action="group.update").count() == 1


def test_register_and_edit_a_node_audited(fleet, users):
    c = as_user(users["operator"])
    group = fleet["group"]
    resp = c.post("/api/v1/nodes/", {"group": group.name, "address": "127.0.5.1:8000", "name": "gpu-51",
                                     "base_weight": 50, "labels": {"rack": "r7"},
                                     "metrics_url": "http://127.0.5.1:8000/metrics", "reason": "new box"},
                  format="json")
    assert resp.status_code == 201, resp.content
    body = resp.json()
    assert (body["name"], body["group"], body["base_weight"], body["state"]) == ("gpu-51", "llama", 50, "warming")
    node = Node.objects.get(group=group, name="gpu-51")
    assert node.labels == {"rack": "r7"} and node.metrics_url == "http://127.0.5.1:8000/metrics"
    assert AuditEvent.objects.get(action="node.register", node=node).reason == "new box"

    edit = c.patch(f"/api/v1/nodes/{node.pk}/", {"address": "127.0.5.2:8001", "base_weight": 80, "metrics_url": "",
                                                 "reason": "re-cabled"}, format="json")
    assert edit.status_code == 200, edit.content
    assert (edit.json()["address"], edit.json()["base_weight"], edit.json()["metrics_url"]) == ("127.0.5.2:8001", 80, "")
    event = AuditEvent.objects.get(action="node.update", node=node)
    assert event.detail["diff"] == {"address": ["127.0.5.1:8000", "127.0.5.2:8001"], "base_weight": [50, 80],
                                    "metrics_url": ["http://127.0.5.1:8000/metrics", ""]}

    # Refused, nothing changed: each names its input.
    assert_problem(c.post("/api/v1/nodes/", {"group": "no-such", "address": "127.0.5.3:8000", "reason": "x"},
                          format="json"), 400, code="unknown_group", attr="group")
    assert_problem(c.post("/api/v1/nodes/", {"group": group.name, "address": "127.0.5.9:8000", "name": "gpu-51",
                                             "reason": "x"}, format="json"), 400, code="refused")
    assert_problem(c.post("/api/v1/nodes/", {"group": group.name, "address": "not an address", "reason": "x"},
                          format="json"), 400)
    assert_problem(c.patch(f"/api/v1/nodes/{node.pk}/", {"base_weight": 0, "reason": "x"}, format="json"), 400,
                   attr="base_weight")
    assert_problem(c.patch(f"/api/v1/nodes/{node.pk}/", {"name": "renamed", "base_weight": 3, "reason": "x"},
                           format="json"), 400, code="unknown_field", attr="name")
    assert_problem(c.patch(f"/api/v1/nodes/{node.pk}/", {"metrics_url": "ftp://127.0.0.1/x", "reason": "x"},
                           format="json"), 400)
    assert_problem(c.patch("/api/v1/nodes/999999/", {"base_weight": 3, "reason": "x"}, format="json"), 404,
                   code="not_found")
    node.refresh_from_db()
    assert (node.address, node.base_weight) == ("127.0.5.2:8001", 80)
    assert AuditEvent.objects.filter(action="node.update").count() == 1


def test_name_filters_by_name_and_unknown_filters_are_400(fleet, users):
    c = as_user(users["viewer"])
    target = fleet["nodes"][3]
    hit = c.get(f"/api/v1/nodes/?name={target.name}").json()
    assert hit["count"] == 1 and hit["results"][0]["id"] == target.pk
    assert c.get("/api/v1/nodes/?name=no-such-node").json()["count"] == 0
    assert c.get("/api/v1/nodes/").json()["count"] == len(fleet["nodes"])
    assert c.get("/api/v1/groups/?name=llama").json()["count"] == 1
    assert c.get("/api/v1/groups/?name=other").json()["count"] == 0
    # Pagination and ordering are not filters, and still work.
    assert len(c.get("/api/v1/nodes/?limit=2&offset=1&ordering=-name").json()["results"]) == 2

    body = assert_problem(c.get("/api/v1/nodes/?nmae=x"), 400, code="unknown_filter", attr="nmae")
    assert "name" in body["detail"] and "group" in body["detail"]  # says what the endpoint takes
    assert_problem(c.get("/api/v1/audit/?policy=auto"), 400, code="unknown_filter", attr="policy")


def test_actions_read_json_only(fleet, users):
    c = as_user(users["oncall"])
    node = fleet["nodes"][2]
    form = c.post(f"/api/v1/nodes/{node.pk}/quarantine/", {"reason": "form"})  # multipart, the test default
    assert_problem(form, 415, code="unsupported_media_type")
    urlencoded = c.post(f"/api/v1/nodes/{node.pk}/quarantine/", "reason=form",
                        content_type="application/x-www-form-urlencoded")
    assert_problem(urlencoded, 415)
    assert not AuditEvent.objects.filter(action="node.quarantine").exists()
    assert c.post(f"/api/v1/nodes/{node.pk}/quarantine/", {"reason": "json"}, format="json").status_code == 201


def test_errors_share_one_problem_shape_across_drf_plain_views_and_ingest(client, users):
    body = assert_problem(APIClient().get("/api/v1/nodes/"), 401)  # no credentials (DRF)
    assert body["instance"] == "/api/v1/nodes/"
    assert_problem(as_user(users["norole"]).get("/api/v1/nodes/"), 403, code="permission_denied")
    assert_problem(as_user(users["viewer"]).get("/api/v1/nodes/abc/"), 404)  # the API's own 404 view
    assert_problem(as_user(users["viewer"]).get("/api/v1/nodes/12345/"), 404, code="not_found")
    ingest = client.post("/api/v1/ingest/requests", data=b"[]", content_type="application/json")
    body = assert_problem(ingest, 401, code="not_authenticated")  # the plain Django ingest view
    assert body["instance"] == "/api/v1/ingest/requests" and ingest["WWW-Authenticate"] == "Bearer"


def test_retire_a_group_with_its_nodes_audited_and_its_records_refused(fleet, users, client):
    from outlier_admin.ingest.pipeline import directory

    group = fleet["group"]
    assert_problem(as_user(users["viewer"]).post(f"/api/v1/groups/{group.slug}/retire/", {"reason": "x"},
                                                 format="json"), 403)
    c = as_user(users["operator"])
    resp = c.post(f"/api/v1/groups/{group.slug}/retire/", {"reason": "pool decommissioned"}, format="json")
    assert resp.status_code == 200, resp.content
    assert resp.json()["retired"] is True
    assert not Node.objects.filter(group=group, retired=False).exists()
    event = AuditEvent.objects.get(action="group.retire", group=group)
    assert (event.reason, len(event.detail["nodes_retired"])) == ("pool decommissioned", 8)
    assert_problem(c.post(f"/api/v1/groups/{group.slug}/retire/", {"reason": "again"}, format="json"), 400,
                   code="refused")
    assert [g["name"] for g in c.get("/api/v1/groups/?retired=false").json()["results"]] == []
    # Ingest no longer knows it: its records are refused, never re-creating nodes in it.
    assert directory.group("llama", fresh=True) is None
