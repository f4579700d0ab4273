"""The permission matrix: every mutating endpoint x every role (and anonymous, and an ingest token).

Expected: anonymous 401/403; ``norole`` 403; reads for every role; thresholds/policy/proposal
decisions and creating/editing groups and nodes for ``operator`` only; manual quarantine/release/pin/unpin/activate for ``oncall`` only.
An allowed request must have had its effect (an audit event), a refused one must have none.
"""

from __future__ import annotations

import pytest
from rest_framework.test import APIClient

from outlier_admin.control.actions import do_create_token
from outlier_admin.control.models import AuditEvent

pytestmark = pytest.mark.django_db

ROLES = ("anonymous", "norole", "viewer", "operator", "oncall")


def endpoints(fleet):
    g, n0, p = fleet["group"].name, fleet["nodes"][0].pk, fleet["proposal"].pk
    return [
        # (method, url, body, capability)
        ("patch", f"/api/v1/groups/{g}/thresholds/", {"changes": {"quarantine_z": 4.0}, "reason": "r"}, "operator"),
        ("post", f"/api/v1/groups/{g}/policy/", {"policy": "auto", "reason": "r"}, "operator"),
        ("post", f"/api/v1/proposals/{p}/approve/", {"reason": "r"}, "operator"),
        ("post", f"/api/v1/proposals/{p}/reject/", {"reason": "r"}, "operator"),
        ("post", f"/api/v1/nodes/{n0}/quarantine/", {"reason": "r", "expires_in_s": 600}, "oncall"),
        ("post", f"/api/v1/nodes/{n0}/release/", {"reason": "r"}, "oncall"),
        ("post", f"/api/v1/nodes/{n0}/pin/", {"reason": "r", "weight": 10}, "oncall"),
        ("post", f"/api/v1/nodes/{n0}/unpin/", {"reason": "r"}, "oncall"),
        ("post", f"/api/v1/nodes/{n0}/activate/", {"reason": "r"}, "oncall"),
        ("post", "/api/v1/groups/", {"name": "matrix-new", "reason": "r"}, "operator"),
        ("patch", f"/api/v1/groups/{g}/", {"model_name": "llama-3-70b", "reason": "r"}, "operator"),
        ("post", "/api/v1/nodes/", {"group": g, "address": "127.0.9.1:8000", "reason": "r"}, "operator"),
        ("patch", f"/api/v1/nodes/{n0}/", {"base_weight": 50, "reason": "r"}, "operator"),
    ]


def client_for(users, role):
    c = APIClient()
    if users[role] is not None:
        c.force_authenticate(users[role])
    return c


@pytest.mark.parametrize("role", ROLES)
@pytest.mark.parametrize("index", range(13))
def test_mutating_endpoint_matrix(fleet, users, role, index):
    method, url, body, allowed_role = endpoints(fleet)[index]
    before = AuditEvent.objects.count()
    resp = getattr(client_for(users, role), method)(url, body, format="json")
    if role == allowed_role:
        assert resp.status_code in (200, 201), resp.content
        assert AuditEvent.objects.count() == before + 1
        assert AuditEvent.objects.latest("at").actor == role
    else:
        assert resp.status_code == (401 if role == "anonymous" else 403), resp.content
        assert AuditEvent.objects.count() == before
        assert resp.json()["detail"]


READ_URLS = ["/api/v1/groups/", "/api/v1/nodes/", "/api/v1/audit/", "/api/v1/transitions/", "/api/v1/proposals/",
             "/api/v1/overrides/", "/api/v1/probes/", "/api/v1/gpu-readings/", "/api/v1/incidents/",
             "/api/v1/incidents/export/", "/api/schema/?format=json"]


@pytest.mark.parametrize("role", ROLES)
def test_reads_need_a_role(fleet, users, role):
    expected = {"anonymous": 401, "norole": 403}.get(role, 200)
    client = client_for(users, role)
    assert {url: client.get(url).status_code for url in READ_URLS} == dict.fromkeys(READ_URLS, expected)


def test_api_token_acts_as_its_user(fleet, users):
    _, token = do_create_token(name="bot", scope="api", actor="test", user=users["oncall"])
    c = APIClient()
    c.credentials(HTTP_AUTHORIZATION=f"Bearer {token}")
    n0 = fleet["nodes"][0].pk
    assert c.post(f"/api/v1/nodes/{n0}/release/", {"reason": "canary ok"}, format="json").status_code == 201
    ev = AuditEvent.objects.get(action="node.release")
    # Audited as the token (issue 16: which credential acted), linked to the user it acts for.
    assert (ev.actor, ev.user, ev.reason) == ("token:bot", users["oncall"], "canary ok")
    # ... and with that user's role only: an oncall may not approve proposals.
    p = fleet["proposal"].pk
    assert c.post(f"/api/v1/proposals/{p}/approve/", {"reason": "x"}, format="json").status_code == 403


def test_ingest_token_can_only_push(fleet):
    _, token = do_create_token(name="gw", scope="ingest", actor="test")
    c = APIClient()
    c.credentials(HTTP_AUTHORIZATION=f"Bearer {token}")
    resp = c.get("/api/v1/nodes/")
    assert resp.status_code == 403 and "ingest" in resp.json()["detail"]
    n0 = fleet["nodes"][0].pk
    assert c.post(f"/api/v1/nodes/{n0}/quarantine/", {"reason": "x"}, format="json").status_code == 403


def test_unknown_token_is_401(fleet):
    c = APIClient()
    c.credentials(HTTP_AUTHORIZATION="Bearer oa_nope")
    resp = c.get("/api/v1/nodes/")
    assert resp.status_code == 401 and "token" in resp.json()["detail"].lower()
