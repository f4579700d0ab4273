"""Silences through the API (``/api/v1/proposals/{id}/reject/`` with ``silence_s``, ``/api/v1/silences/``)
and the dashboard's approvals page (listed, expirable)."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import Group

from outlier_admin.control.actions import do_create_group, do_propose_quarantine, do_register_node
from outlier_admin.control.models import AuditEvent, Silence

pytestmark = pytest.mark.django_db


@pytest.fixture
def people(django_user_model, settings):
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
    out = {}
    for role in ("viewer", "operator"):
        user = django_user_model.objects.create_user(role, password="pw-" + role + "-12345")
        user.groups.add(Group.objects.get_or_create(name=role)[0])
        out[role] = user
    return out


@pytest.fixture
def proposal():
    group = do_create_group("meta-llama/Llama-3.1-70B-Instruct@h100", actor="setup", policy="approval")
    node = do_register_node(group, "127.0.0.7:8000", actor="setup")
    return do_propose_quarantine(node, actor="system:dcgm", source="gpu_fault", reason="GPU hard fault: xid_79")


def test_reject_with_silence_then_list_and_expire(client, people, proposal):
    client.force_login(people["operator"])
    bad = client.post(f"/api/v1/proposals/{proposal.pk}/reject/", {"reason": "driver reload", "silence_s": 30},
                      content_type="application/json")
    assert bad.status_code == 400 and "silence_s" in bad.content.decode()
    resp = client.post(f"/api/v1/proposals/{proposal.pk}/reject/", {"reason": "driver reload", "silence_s": 600},
                       content_type="application/json")
    assert resp.status_code == 200, resp.content
    assert resp.json()["status"] == "rejected" and resp.json()["outcome"] is None  # the tick has not run

    listed = client.get("/api/v1/silences/?active=true").json()
    [s] = listed["results"] if isinstance(listed, dict) else listed
    assert (s["node_name"], s["group"], s["cause"], s["active"], s["actor"], s["proposal"]) == (
        "127.0.0.7:8000", "meta-llama/Llama-3.1-70B-Instruct@h100", "gpu_fault", True, "operator", proposal.pk)
    silence = Silence.objects.get(pk=s["id"])
    assert (silence.expires_at - silence.created_at).total_seconds() == 600

    client.force_login(people["viewer"])
    assert client.post(f"/api/v1/silences/{s['id']}/expire/", {"reason": "x"},
                       content_type="application/json").status_code == 403
    client.force_login(people["operator"])
    assert client.post(f"/api/v1/silences/{s['id']}/expire/", {}, content_type="application/json").status_code == 400
    done = client.post(f"/api/v1/silences/{s['id']}/expire/", {"reason": "rack fixed"},
                       content_type="application/json")
    assert done.status_code == 200 and done.json()["active"] is False and done.json()["expired_by"] == "operator"
    again = client.post(f"/api/v1/silences/{s['id']}/expire/", {"reason": "twice"}, content_type="application/json")
    assert again.status_code == 400 and "already ended" in again.content.decode()
    ended = client.get("/api/v1/silences/?active=false").json()
    assert [x["id"] for x in (ended["results"] if isinstance(ended, dict) else ended)] == [s["id"]]
    assert list(AuditEvent.objects.filter(action__startswith="silence.").values_list("action", "actor")) == [
        ("silence.expire", "operator")]
    rejected = AuditEvent.objects.get(action="proposal.rejected")
    assert (rejected.detail["silence"], rejected.detail["silence_s"]) == (s["id"], 600)


def test_dashboard_lists_silences_and_expires_them(client, people, proposal):
    client.force_login(people["operator"])
    page = client.get("/approvals/").content.decode()
    assert 'name="silence_s"' in page and '<option value="3600" selected>1 hour</option>' in page
    resp = client.post(f"/approvals/{proposal.pk}/decide/", {"decision": "reject", "reason": "known",
                                                             "silence_s": "14400"})
    assert resp.status_code == 302
    silence = Silence.objects.get(proposal=proposal)
    assert (silence.expires_at - silence.created_at).total_seconds() == 14400
    page = client.get("/approvals/").content.decode()
    assert f'action="/silences/{silence.pk}/expire/"' in page and "127.0.0.7:8000" in page
    client.force_login(people["viewer"])
    assert 'action="/silences/' not in client.get("/approvals/").content.decode()
    assert client.post(f"/silences/{silence.pk}/expire/", {"reason": "x"}).status_code == 403
    client.force_login(people["operator"])
    client.post(f"/silences/{silence.pk}/expire/", {"reason": "fixed"})
    silence.refresh_from_db()
    assert not silence.is_active() and silence.expired_by == "operator"
    assert "No silence in force." in client.get("/approvals/").content.decode()
