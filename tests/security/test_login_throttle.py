"""Login throttling (django-axes, ``outlier_admin.fleet.login_throttle``): failures counted per username
and client address together (issue 36, finding 2); the client address read from ``X-Forwarded-For`` only when the
connecting peer is in ``TRUSTED_PROXIES``; and CSRF on every form.

Every address is on 127.0.0.0/8: ``127.0.0.10`` plays the TLS proxy, ``127.0.0.2x`` the clients behind
it. The knobs are the defaults (``LOGIN_MAX_FAILURES`` 5, ``LOGIN_LOCKOUT_S`` 900) unless a test says.
"""

from __future__ import annotations

import io
import os
import re
import secrets
import subprocess
import sys
from datetime import timedelta
from pathlib import Path

import pytest
import time_machine
from django.contrib.auth.backends import ModelBackend
from django.core.management import CommandError
from django.test import Client, RequestFactory
from django.utils import timezone

pytestmark = [pytest.mark.django_db, pytest.mark.services]
LOGIN = "/accounts/login/"
ADMIN_LOGIN = "/admin/login/?next=/admin/"
PROXY = "127.0.0.10"
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def oncall(db, settings):
    from django.contrib.auth.models import User

    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
    return User.objects.create_user("oncall", password="correct horse", is_staff=True)


@pytest.fixture
def checks(monkeypatch) -> list[str]:
    """Usernames whose password was actually checked (ModelBackend reached), in order."""
    seen: list[str] = []
    original = ModelBackend.authenticate

    def counting(self, request, username=None, password=None, **kwargs):
        seen.append(username)
        return original(self, request, username=username, password=password, **kwargs)

    monkeypatch.setattr(ModelBackend, "authenticate", counting)
    return seen


def _post(client: Client, password: str, *, username: str = "oncall", peer: str = "127.0.0.21",
          xff: str | None = None, path: str = LOGIN):
    extra = {"REMOTE_ADDR": peer}
    if xff is not None:
        extra["HTTP_X_FORWARDED_FOR"] = xff
    return client.post(path, {"username": username, "password": password}, **extra)


def _logged_in(client: Client) -> bool:
    return "_auth_user_id" in client.session


# (a) -----------------------------------------------------------------------------------------------------
def test_a_a_spray_of_invented_usernames_from_a_shared_address_locks_nobody_else_out(oncall, checks):
    """Issue 36, finding 2: with the app seeing one address (the proxy's, or a shared NAT), failed
    logins with invented usernames locked that address, and the on-call's and a viewer's right
    passwords got 429 for 15 minutes. The key is the (username, address) pair: they log in."""
    from django.contrib.auth.models import User

    User.objects.create_user("viewer", password="viewer pass")
    client = Client()
    codes = [_post(client, "Winter2026!", username=f"user{i:02d}", peer="127.0.0.1").status_code for i in range(40)]
    assert codes == [200] * 40, "one failure per username: no pair reaches the limit"
    assert len(checks) == 40
    oncall_browser, viewer_browser = Client(), Client()
    assert _post(oncall_browser, "correct horse", peer="127.0.0.1").status_code == 302
    assert _post(viewer_browser, "viewer pass", username="viewer", peer="127.0.0.1").status_code == 302
    assert _logged_in(oncall_browser) and _logged_in(viewer_browser)


def test_a_guessing_one_username_locks_that_username_at_that_address_only(oncall, checks):
    client = Client()
    codes = [_post(client, f"guess{i}", peer="127.0.0.21").status_code for i in range(8)]
    assert codes == [200] * 4 + [429] * 4  # the 5th failure locks the pair; 3 more refused unchecked
    assert len(checks) == 5
    assert _post(client, "correct horse", peer="127.0.0.21").status_code == 429
    assert not _logged_in(client)
    # Another username at that address is not locked, nor the on-call at another address.
    assert _post(Client(), "wrong", username="someone-else", peer="127.0.0.21").status_code == 200
    other = Client()
    assert _post(other, "correct horse", peer="127.0.0.22").status_code == 302 and _logged_in(other)


# (b) -----------------------------------------------------------------------------------------------------
def test_b_behind_the_proxy_failures_from_x_do_not_lock_the_oncall_out_at_y(oncall, settings, checks):
    """Every request comes from the proxy 127.0.0.10; X-Forwarded-For names the client. Client X
    (127.0.0.21) fails 5 times as ``oncall``; the on-call at Y (127.0.0.22) logs in first time."""
    settings.TRUSTED_PROXIES = [PROXY]
    attacker = Client()
    codes = [_post(attacker, f"guess{i}", peer=PROXY, xff="127.0.0.21").status_code for i in range(5)]
    assert codes == [200, 200, 200, 200, 429]
    assert _post(attacker, "correct horse", peer=PROXY, xff="127.0.0.21").status_code == 429
    assert len(checks) == 5

    oncall_browser = Client()
    resp = _post(oncall_browser, "correct horse", peer=PROXY, xff="127.0.0.22")
    assert resp.status_code == 302 and _logged_in(oncall_browser)


# (c) -----------------------------------------------------------------------------------------------------
def test_c_x_forwarded_for_from_an_untrusted_peer_is_ignored(oncall, settings):
    """127.0.0.30 is not a trusted proxy: a fresh X-Forwarded-For per attempt does not make it a fresh
    client; all failures count against 127.0.0.30."""
    settings.TRUSTED_PROXIES = [PROXY]
    client = Client()
    codes = [_post(client, "wrong", peer="127.0.0.30", xff=f"127.0.0.{100 + i}").status_code for i in range(6)]
    assert codes == [200, 200, 200, 200, 429, 429]
    from axes.models import AccessAttempt

    assert set(AccessAttempt.objects.values_list("ip_address", flat=True)) == {"127.0.0.30"}


def test_c_no_trusted_proxies_by_default_means_xff_is_never_read(oncall, settings):
    assert settings.TRUSTED_PROXIES == []
    client = Client()
    for i in range(5):
        _post(client, "wrong", peer="127.0.0.1", xff=f"127.0.0.{100 + i}")
    assert _post(client, "correct horse", peer="127.0.0.1", xff="127.0.0.99").status_code == 429


@pytest.mark.parametrize(
    ("peer", "xff", "expected"),
    [
        ("127.0.0.30", "127.0.0.21", "127.0.0.30"),  # untrusted peer: its own address
        (PROXY, None, PROXY),  # trusted peer without the header: the peer
        (PROXY, "127.0.0.21", "127.0.0.21"),
        (PROXY, "127.0.0.99, 127.0.0.21", "127.0.0.21"),  # a client-sent entry left of the proxy's is ignored
        (PROXY, "127.0.0.21, 127.0.0.11", "127.0.0.21"),  # a chain of trusted proxies is walked
        (PROXY, "127.0.0.21, not-an-ip", PROXY),  # garbage where the proxy writes: stop at the proxy
        (PROXY, "  127.0.0.21:5123 ", "127.0.0.21"),  # port suffix (some proxies add it)
        (PROXY, "", PROXY),
        ("::ffff:127.0.0.10", "127.0.0.21", "127.0.0.21"),  # IPv4-mapped peer matches the IPv4 entry
    ],
)
def test_client_ip(settings, peer, xff, expected):
    from outlier_admin.fleet.login_throttle import client_ip

    settings.TRUSTED_PROXIES = [PROXY, "127.0.0.11/32"]
    extra = {"REMOTE_ADDR": peer} if xff is None else {"REMOTE_ADDR": peer, "HTTP_X_FORWARDED_FOR": xff}
    assert client_ip(RequestFactory().get("/", **extra)) == expected


# (d) -----------------------------------------------------------------------------------------------------
def test_d_the_admin_login_is_throttled_too(oncall):
    client = Client()
    codes = [_post(client, "wrong", peer="127.0.0.41", path=ADMIN_LOGIN).status_code for _ in range(5)]
    assert codes == [200, 200, 200, 200, 429]
    resp = _post(client, "correct horse", peer="127.0.0.41", path=ADMIN_LOGIN)
    assert resp.status_code == 429 and 0 < int(resp["Retry-After"]) <= 900
    assert not _logged_in(client)
    # The dashboard login from that address is locked too: one count for every password login path.
    assert _post(client, "correct horse", peer="127.0.0.41").status_code == 429
    other = Client()
    resp = _post(other, "correct horse", peer="127.0.0.42", path=ADMIN_LOGIN)
    assert resp.status_code == 302 and resp["Location"] == "/admin/"


# (e) -----------------------------------------------------------------------------------------------------
def test_e_locked_out_answers_429_with_retry_after_until_the_window_ends(oncall):
    start = timezone.now()
    with time_machine.travel(start, tick=False) as clock:
        client = Client()
        for _ in range(5):
            resp = _post(client, "wrong")
        assert resp.status_code == 429
        assert resp["Retry-After"] == "900"
        assert b"Too many failed logins" in resp.content
        assert b'name="password"' in resp.content  # the login page itself, not a bare error
        clock.shift(timedelta(seconds=600))
        resp = _post(client, "correct horse")
        assert resp.status_code == 429 and resp["Retry-After"] == "300"
        clock.shift(timedelta(seconds=301))
        resp = _post(client, "correct horse")
        assert resp.status_code == 302 and _logged_in(client)


def test_retry_after_is_when_enough_failures_have_expired(oncall):
    """Failures at t=0,100,200,300,400 s of one username at one address (five user agents: five rows):
    the pair stays locked until the oldest failure it needs expires, t=900 s; at t=500 s that is 400 s
    away."""
    start = timezone.now()
    with time_machine.travel(start, tick=False) as clock:
        client = Client()
        for i in range(5):
            resp = client.post(LOGIN, {"username": "oncall", "password": "wrong"}, REMOTE_ADDR="127.0.0.21",
                               HTTP_USER_AGENT=f"agent-{i}")
            clock.shift(timedelta(seconds=100))
        assert resp.status_code == 429
        resp = _post(client, "correct horse")
        assert resp.status_code == 429 and resp["Retry-After"] == "400"
        clock.shift(timedelta(seconds=401))
        # t=901: the failure of t=0 has expired, 4 remain (< 5): the pair may try again.
        assert _post(client, "correct horse").status_code == 302


def test_success_clears_this_addresss_failures_for_that_username(oncall):
    client = Client()
    for _ in range(4):
        _post(client, "wrong")
    assert _post(client, "correct horse").status_code == 302
    client.logout()
    for _ in range(4):
        assert _post(client, "wrong").status_code == 200
    assert _post(client, "correct horse").status_code == 302, "count restarted after the success"


def test_a_long_username_is_counted_not_a_server_error(oncall):
    client = Client()
    for _ in range(5):
        resp = _post(client, "wrong", username="x" * 400)
    assert resp.status_code == 429


def test_login_does_not_need_redis(oncall, settings):
    """Failures live in PostgreSQL (axes' database handler); the old Redis counter is gone."""
    from outlier_admin.control import redis_conn

    settings.REDIS_URL = "redis://127.0.0.1:1/0"  # nothing listens on port 1
    redis_conn.set_redis(None)
    client = Client()
    for _ in range(5):
        resp = _post(client, "wrong")
    assert resp.status_code == 429
    assert _post(Client(), "correct horse", peer="127.0.0.22").status_code == 302
    redis_conn.set_redis(None)


@pytest.mark.django_db(transaction=True)
def test_postgres_outage_login_fails_without_counting_and_works_once_it_is_back(oncall):
    """Users, sessions and the failure counts all live in PostgreSQL: during an outage a login is a
    server error (the outage middleware's 503 where installed), never a lockout, and the attempts made
    meanwhile are not counted — the on-call retrying through the outage is not locked out after it."""
    from axes.models import AccessAttempt

    from tests.reliability.conftest import postgres_down

    client = Client(raise_request_exception=False)
    with postgres_down():
        codes = {_post(client, password).status_code for password in ["wrong"] * 6 + ["correct horse"]}
    assert codes and all(code >= 500 for code in codes), codes
    assert not AccessAttempt.objects.exists()
    assert _post(client, "correct horse").status_code == 302


# Settings ------------------------------------------------------------------------------------------------
def _production(**extra: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items()
           if k not in {"DJANGO_DEBUG", "OUTLIER_TESTING", "SECRET_KEY", "SECRET_KEY_FILE", "ALLOWED_HOSTS",
                        "TRUSTED_PROXIES", "SECURE_PROXY_SSL_HEADER"}}
    env.update(DJANGO_SETTINGS_MODULE="outlier_admin.settings", SECRET_KEY=secrets.token_urlsafe(50),
               ALLOWED_HOSTS="outlier.example.com", **extra)
    return subprocess.run([sys.executable, "manage.py", "check"], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=60)


@pytest.mark.timeout(120)
def test_production_behind_a_proxy_requires_trusted_proxies():
    """Behind a proxy every client has the proxy's address: without TRUSTED_PROXIES, the address key
    would lock everyone out after anyone's 5 failures. Refuse to start instead."""
    proc = _production(SECURE_PROXY_SSL_HEADER="1")
    assert proc.returncode != 0 and "TRUSTED_PROXIES" in proc.stderr
    assert _production(SECURE_PROXY_SSL_HEADER="1", TRUSTED_PROXIES="127.0.0.10, 127.0.1.0/24").returncode == 0
    proc = _production(TRUSTED_PROXIES="127.0.0.10,proxy.internal")
    assert proc.returncode != 0 and "proxy.internal" in proc.stderr


# CSRF ----------------------------------------------------------------------------------------------------
TEMPLATES = ROOT / "templates"


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


# Unlock and start-up checks (issue 36) ---------------------------------------------------------------------
def _lock(username: str = "oncall", peer: str = "127.0.0.21") -> Client:
    client = Client()
    for _ in range(5):
        resp = _post(client, "wrong", username=username, peer=peer)
    assert resp.status_code == 429
    return client


def test_an_admin_unlocks_a_login_with_manage_py_audited(oncall):
    from django.core.management import call_command

    from outlier_admin.control.models import AuditEvent

    client = _lock()
    _lock(peer="127.0.0.22")
    out = io.StringIO()
    call_command("unlock_login", "--list", stdout=out)
    assert sorted(line.split("\t")[1] for line in out.getvalue().splitlines()) == ["127.0.0.21", "127.0.0.22"]
    call_command("unlock_login", "oncall", "--ip", "127.0.0.21", "--reason", "INC-7: on-call locked out",
                 stdout=io.StringIO())
    assert _post(client, "correct horse").status_code == 302
    assert _post(Client(), "correct horse", peer="127.0.0.22").status_code == 429, "only that address's lock"
    event = AuditEvent.objects.get(action="login.unlock")
    assert (event.actor, event.reason) == ("cli:unlock_login", "INC-7: on-call locked out")
    assert event.detail == {"username": "oncall", "ip_address": "127.0.0.21", "addresses": ["127.0.0.21"],
                            "failures": 5}
    with pytest.raises(CommandError, match="reason"):
        call_command("unlock_login", "oncall")


def test_an_admin_unlocks_a_login_from_the_dashboard_and_nobody_else_may(oncall):
    from django.contrib.auth.models import User

    from outlier_admin.control.models import AuditEvent

    locked = _lock(peer="127.0.0.23")
    admin = User.objects.create_superuser("admin", password="admin pass")
    from tests.outlier_admin.api.conftest import make_user

    staff = Client()
    staff.force_login(make_user("operator-1", "operator", "oncall"))  # roles, not an administrator
    assert staff.get("/accounts/lockouts/").status_code == 403
    assert staff.post("/accounts/lockouts/", {"username": "oncall", "ip_address": "127.0.0.23",
                                              "reason": "me"}).status_code == 403
    assert _post(locked, "correct horse", peer="127.0.0.23").status_code == 429
    browser = Client()
    browser.force_login(admin)
    page = browser.get("/accounts/lockouts/")
    assert page.status_code == 200 and b"127.0.0.23" in page.content and b"oncall" in page.content
    resp = browser.post("/accounts/lockouts/", {"username": "oncall", "ip_address": "127.0.0.23", "reason": ""})
    assert resp.status_code == 302 and not AuditEvent.objects.filter(action="login.unlock").exists()
    browser.post("/accounts/lockouts/", {"username": "oncall", "ip_address": "127.0.0.23", "reason": "INC-8"})
    event = AuditEvent.objects.get(action="login.unlock")
    assert (event.actor, event.user, event.detail["failures"]) == ("admin", admin, 5)
    assert _post(locked, "correct horse", peer="127.0.0.23").status_code == 302


def test_a_start_up_check_warns_when_every_login_came_from_one_address(oncall, settings):
    from django.contrib.auth.models import User
    from django.core import checks

    User.objects.create_user("viewer", password="viewer pass")
    for username, password in (("oncall", "correct horse"), ("viewer", "viewer pass"), ("ghost", "x")):
        _post(Client(), password, username=username, peer="127.0.0.10")
    warnings = [m for m in checks.run_checks(databases=["default"]) if m.id == "fleet.W001"]
    assert len(warnings) == 1 and "127.0.0.10" in warnings[0].msg and "TRUSTED_PROXIES" in warnings[0].hint
    # The same logins through a declared proxy: three addresses, no warning.
    from axes.models import AccessAttempt, AccessLog

    AccessAttempt.objects.all().delete()
    AccessLog.objects.all().delete()
    settings.TRUSTED_PROXIES = [PROXY]
    for i, (username, password) in enumerate((("oncall", "correct horse"), ("viewer", "viewer pass"))):
        _post(Client(), password, username=username, peer=PROXY, xff=f"127.0.0.{60 + i}")
    assert not [m for m in checks.run_checks(databases=["default"]) if m.id == "fleet.W001"]


def test_a_start_up_check_warns_in_kubernetes_when_only_loopback_is_trusted(settings, monkeypatch):
    from outlier_admin.fleet.checks import check_trusted_proxies_in_kubernetes

    settings.TRUSTED_PROXIES = ["127.0.0.1"]
    assert check_trusted_proxies_in_kubernetes() == []
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "127.0.0.1")
    assert [m.id for m in check_trusted_proxies_in_kubernetes()] == ["fleet.W002"]
    settings.TRUSTED_PROXIES = ["127.0.0.1", "192.0.2.0/24"]  # TEST-NET-1: a setting, never sent to
    assert check_trusted_proxies_in_kubernetes() == []
