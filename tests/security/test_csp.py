"""Content-Security-Policy (django-csp, ``settings.CONTENT_SECURITY_POLICY``) on the dashboard, the API,
the Swagger UI page and the admin; no inline script or style in our templates. The browser half (no
violation reported by Chromium on the main pages) is ``tests/browser/test_dashboard_csp_browser.py``."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from django.test import Client

pytestmark = [pytest.mark.django_db]
TEMPLATES = Path(__file__).resolve().parents[2] / "templates"
REQUIRED = {
    "default-src": "'self'",
    "object-src": "'none'",
    "base-uri": "'self'",
    "form-action": "'self'",
    "frame-ancestors": "'none'",
    "style-src": "'self'",
}


def _policy(resp) -> dict[str, str]:
    header = resp["Content-Security-Policy"]
    return {d.split()[0]: " ".join(d.split()[1:]) for d in header.split(";") if d.strip()}


def _assert_strict(resp) -> dict[str, str]:
    policy = _policy(resp)
    for directive, value in REQUIRED.items():
        assert policy[directive] == value, (directive, policy)
    assert "unsafe-inline" not in resp["Content-Security-Policy"]
    assert "unsafe-eval" not in resp["Content-Security-Policy"]
    return policy


@pytest.fixture
def viewer(fleet, users) -> Client:
    client = Client()
    client.force_login(users["viewer"])
    return client


def test_dashboard_pages_send_the_strict_policy_without_a_nonce(viewer, fleet):
    group, node = fleet["group"], fleet["nodes"][0]
    for path in ("/", f"/groups/{group.name}/", f"/groups/{group.name}/?partial=nodes",
                 f"/groups/{group.name}/thresholds/", f"/nodes/{node.pk}/", "/approvals/", "/canary/",
                 "/audit/"):
        resp = viewer.get(path)
        assert resp.status_code == 200, path
        policy = _assert_strict(resp)
        assert policy["script-src"] == "'self'", path  # no nonce: no page of ours has an inline script


def test_the_login_page_and_the_locked_out_page_send_it(db):
    assert _assert_strict(Client().get("/accounts/login/"))["script-src"] == "'self'"
    client = Client()
    for _ in range(5):
        resp = client.post("/accounts/login/", {"username": "nobody", "password": "x"}, REMOTE_ADDR="127.0.0.51")
    assert resp.status_code == 429
    _assert_strict(resp)


def test_the_api_sends_it(viewer):
    resp = viewer.get("/api/v1/groups/")
    assert resp.status_code == 200
    _assert_strict(resp)


def test_the_swagger_ui_page_runs_only_its_nonced_inline_script(viewer):
    resp = viewer.get("/api/docs/")
    assert resp.status_code == 200
    policy = _assert_strict(resp)
    m = re.fullmatch(r"'self' 'nonce-([A-Za-z0-9+/=]+)'", policy["script-src"])
    assert m, policy["script-src"]
    html = resp.content.decode()
    inline = re.findall(r"<script(?![^>]*\bsrc=)([^>]*)>", html)
    assert inline == [f' nonce="{m.group(1)}"'], "exactly one inline script, carrying this response's nonce"
    assert "<style" not in html and " style=" not in html
    assert "SwaggerUIBundle(" in html and "/static/dashboard/swagger.css" in html
    again = _policy(viewer.get("/api/docs/"))["script-src"]
    assert again != policy["script-src"], "a fresh nonce per response"


def test_the_admin_sends_it(db):
    resp = Client().get("/admin/login/")
    assert resp.status_code == 200
    _assert_strict(resp)


def test_no_inline_script_style_or_handler_in_our_templates():
    offences = []
    for path in TEMPLATES.rglob("*.html"):
        text = path.read_text()
        if path.relative_to(TEMPLATES).parts[0] == "drf_spectacular":
            # The Swagger UI override: its one inline script must carry the nonce.
            text = text.replace('<script nonce="{{ request.csp_nonce }}">', "")
        for pattern in (r"<script(?![^>]*\bsrc=)[^>]*>", r"<style\b", r"\sstyle\s*=", r"\son[a-z]+\s*=",
                        r"javascript:"):
            offences += [(path.name, hit) for hit in re.findall(pattern, text, re.I)]
    assert not offences, offences
