"""Login throttling per username + client IP (counted in Redis), and CSRF on every form."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from django.test import Client

pytestmark = [pytest.mark.django_db, pytest.mark.services]
LOGIN = "/accounts/login/"


@pytest.fixture
def alice(db, settings):
    from django.contrib.auth.models import User

    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
    return User.objects.create_user("alice", password="correct horse")


def _login(client: Client, password: str, ip: str = "10.1.1.1", username: str = "alice"):
    return client.post(LOGIN, {"username": username, "password": password}, REMOTE_ADDR=ip)


def test_lockout_after_max_failures_even_with_the_right_password(client, alice, redis_client, settings):
    settings.LOGIN_MAX_FAILURES = 3
    for _ in range(3):
        assert _login(client, "wrong").status_code == 200  # the form again, with an error
    resp = _login(client, "correct horse")
    assert resp.status_code == 429
    assert 0 < int(resp["Retry-After"]) <= settings.LOGIN_LOCKOUT_S
    assert b"Too many failed logins" in resp.content
    assert "_auth_user_id" not in client.session
    # Another address is not locked out (an attacker cannot lock a real operator out).
    other = Client()
    assert _login(other, "correct horse", ip="10.2.2.2").status_code == 302
    # The window expires: the lock is lifted.
    for key in redis_client.scan_iter("outlier:login-fail:*"):
        redis_client.delete(key)
    assert _login(client, "correct horse").status_code == 302


def test_success_clears_the_failure_count(client, alice, redis_client, settings):
    settings.LOGIN_MAX_FAILURES = 3
    _login(client, "wrong")
    _login(client, "wrong")
    assert _login(client, "correct horse").status_code == 302
    client.logout()
    _login(client, "wrong")
    _login(client, "wrong")
    assert _login(client, "correct horse").status_code == 302, "count restarted after the success"


def test_throttle_fails_open_when_redis_is_unreachable(client, alice, settings):
    from outlier_admin.control import redis_conn

    settings.REDIS_URL = "redis://127.0.0.1:1/0"  # nothing listens on port 1
    redis_conn.set_redis(None)
    assert _login(client, "wrong").status_code == 200
    assert _login(client, "correct horse").status_code == 302


TEMPLATES = Path(__file__).resolve().parents[2] / "templates"


def test_every_post_form_in_the_templates_carries_the_csrf_token():
    forms = 0
    for path in TEMPLATES.rglob("*.html"):
        text = path.read_text()
        for m in re.finditer(r"<form\b[^>]*method=\"post\"[^>]*>(.*?)</form>", text, re.S | re.I):
            forms += 1
            assert "{% csrf_token %}" in m.group(1), path.name
    assert forms >= 4


def test_dashboard_posts_without_the_csrf_token_are_refused(fleet, users):
    client = Client(enforce_csrf_checks=True)
    client.force_login(users["oncall"])
    group, node, proposal = fleet["group"], fleet["nodes"][2], fleet["proposal"]
    for path in (f"/nodes/{node.pk}/override/", f"/groups/{group.name}/thresholds/",
                 f"/groups/{group.name}/policy/", f"/approvals/{proposal.pk}/decide/", "/accounts/logout/"):
        resp = client.post(path, {"reason": "csrf test", "action": "quarantine"})
        assert resp.status_code == 403, path
        assert b"CSRF" in resp.content, path
    # Session-authenticated API writes need it too (DRF SessionAuthentication enforces CSRF).
    resp = client.post(f"/api/v1/nodes/{node.pk}/quarantine/", {"reason": "csrf"}, content_type="application/json")
    assert resp.status_code == 403
    node.refresh_from_db()
    assert node.state == "healthy"


def test_the_admin_login_is_throttled_too(client, alice, redis_client, settings):
    """The lockout lives in the authentication backend: every password login path counts."""
    alice.is_staff = True
    alice.save()
    settings.LOGIN_MAX_FAILURES = 2
    for _ in range(2):
        client.post("/admin/login/", {"username": "alice", "password": "wrong"}, REMOTE_ADDR="10.3.3.3")
    resp = client.post("/admin/login/?next=/admin/", {"username": "alice", "password": "correct horse"},
                       REMOTE_ADDR="10.3.3.3")
    assert resp.status_code == 200 and "_auth_user_id" not in client.session  # refused
    assert client.post("/admin/login/?next=/admin/", {"username": "alice", "password": "correct horse"},
                       REMOTE_ADDR="10.4.4.4").status_code == 302
