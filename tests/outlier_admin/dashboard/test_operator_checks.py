"""What an operator types is judged before "Yes", reasons are bounded in the API as in the forms,
audit details read as words, and an action done with a token is recorded as that token."""

from __future__ import annotations

import pytest
from django.test import Client
from rest_framework.test import APIClient

from outlier_admin.control.actions import REASON_MAX, do_create_token, do_set_auto_register
from outlier_admin.control.models import AuditEvent, Override

pytestmark = pytest.mark.django_db


def logged_in(user) -> Client:
    c = Client()
    c.force_login(user)
    return c


@pytest.mark.parametrize(("post", "error"), [
    ({"action": "pin", "weight": "101"}, "weight must be in [0, 100]"),
    ({"action": "quarantine", "expires_in_s": "99999999"}, "expires_in_s must be in (0, 2592000]"),
    ({"action": "pin", "weight": "50", "expires_in_s": "3000000"}, "expires_in_s must be in (0, 2592000]"),
])
def test_pin_and_expiry_are_refused_before_the_confirmation(fleet, users, post, error):
    node = fleet["nodes"][2]
    resp = logged_in(users["oncall"]).post(f"/nodes/{node.pk}/override/", {**post, "reason": "test"})
    body = resp.content.decode()
    assert resp.status_code == 400 and "Yes," not in body and error in body
    assert not Override.objects.filter(node=node).exists()


def test_a_valid_pin_reaches_the_confirmation_and_then_applies(fleet, users):
    node = fleet["nodes"][2]
    c = logged_in(users["oncall"])
    first = c.post(f"/nodes/{node.pk}/override/", {"action": "pin", "weight": "100", "reason": "test"})
    assert first.status_code == 200 and "Yes, pin" in first.content.decode()
    done = c.post(f"/nodes/{node.pk}/override/", {"action": "pin", "weight": "100", "reason": "test",
                                                  "confirmed": "True"})
    assert done.status_code == 302 and Override.objects.get(node=node).weight == 100


@pytest.mark.parametrize("length", [REASON_MAX + 1, 100_000])
def test_the_api_refuses_a_reason_over_2000_characters(fleet, users, length):
    api = APIClient()
    api.force_authenticate(users["oncall"])
    node = fleet["nodes"][2]
    resp = api.post(f"/api/v1/nodes/{node.pk}/quarantine/", {"reason": "x" * length}, format="json")
    assert resp.status_code == 400 and "2000" in resp.content.decode()
    operator = APIClient()
    operator.force_authenticate(users["operator"])
    resp = operator.post(f"/api/v1/proposals/{fleet['proposal'].pk}/reject/", {"reason": "x" * length}, format="json")
    assert resp.status_code == 400
    assert not Override.objects.exists() and not AuditEvent.objects.filter(reason__startswith="xxx").exists()
    ok = api.post(f"/api/v1/nodes/{node.pk}/quarantine/", {"reason": "y" * REASON_MAX}, format="json")
    assert ok.status_code == 201


def test_an_override_by_token_is_recorded_as_the_token(fleet, users):
    _, token = do_create_token(name="pagerduty", scope="api", actor="test", user=users["oncall"])
    api = APIClient()
    node = fleet["nodes"][3]
    resp = api.post(f"/api/v1/nodes/{node.pk}/quarantine/", {"reason": "paged"}, format="json",
                    HTTP_AUTHORIZATION=f"Bearer {token}")
    assert resp.status_code == 201 and resp.json()["actor"] == "token:pagerduty"
    event = AuditEvent.objects.get(action="node.quarantine")
    assert (event.actor, event.user) == ("token:pagerduty", users["oncall"])
    # A logged-in person is still recorded by name.
    session = APIClient()
    session.force_authenticate(users["oncall"])
    session.post(f"/api/v1/nodes/{node.pk}/release/", {"reason": "fine"}, format="json")
    assert AuditEvent.objects.get(action="node.release").actor == "oncall"


def test_audit_details_are_words_not_python_reprs(fleet, users):
    do_set_auto_register(fleet["group"], ["127.0.0.0/24", "pool-a.test"], actor="ops", reason="new pool")
    do_create_token(name="ci", scope="api", actor="ops")
    body = logged_in(users["viewer"]).get("/audit/").content.decode()
    assert "<del>none</del> → <ins>127.0.0.0/24, pool-a.test</ins>" in body
    assert "<li>scope: api</li>" in body and "<li>token: " in body
    for repr_mark in ("{&#x27;", "[&#x27;", "None", "&#x27;scope&#x27;"):
        assert repr_mark not in body, repr_mark
