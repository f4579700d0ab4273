"""The Content-Security-Policy in real headless Chromium: the main pages — dashboard, Swagger UI, admin —
render and run their scripts without a single CSP violation (neither a ``securitypolicyviolation``
event nor a "Content Security Policy" console message), and the policy is really enforced (an inline
script injected into a page is refused and reported).

The site is browsed as ``http://outlier.test:<port>`` (Chromium maps the name to the loopback live
server): some page code behaves differently on ``localhost``/``127.0.0.1`` — Swagger UI loads its
third-party validator badge only elsewhere — and production is elsewhere.
"""

from __future__ import annotations

import pytest
from django.contrib.auth.models import Group

from tests.browser.conftest import chromium_page
from tests.outlier_admin.api.conftest import make_user

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

HOST = "outlier.test"
RECORD_VIOLATIONS = """
window.__csp = [];
document.addEventListener("securitypolicyviolation", (e) => {
  window.__csp.push(e.effectiveDirective + " blocked " + (e.blockedURI || "inline") + " at " + e.sourceFile);
});
"""


@pytest.fixture
def page(settings):
    settings.ALLOWED_HOSTS = [*settings.ALLOWED_HOSTS, HOST]
    with chromium_page(f"--host-resolver-rules=MAP {HOST} 127.0.0.1") as pg:
        yield pg


def test_main_pages_raise_no_csp_violation(live_server, fleet, page):
    # Transactional tests flush the database, roles included; this file sorts after
    # test_dashboard_browser.py (which needs the migrated roles) and recreates the one it needs.
    Group.objects.get_or_create(name="viewer")
    user = make_user("csp", "viewer")
    user.is_staff = user.is_superuser = True  # to walk the admin too
    user.save()
    url = live_server.url.replace("localhost", HOST).replace("127.0.0.1", HOST)
    group, node = fleet["group"], fleet["nodes"][0]
    console: list[str] = []
    page.on("console", lambda msg: console.append(msg.text) if "Content Security Policy" in msg.text else None)
    page.add_init_script(RECORD_VIOLATIONS)
    seen: dict[str, list[str]] = {}

    def visit(path: str) -> None:
        page.goto(url + path)
        page.wait_for_load_state("networkidle")
        seen[path] = page.evaluate("window.__csp")

    visit("/accounts/login/")
    page.get_by_label("Username").fill("csp")
    page.get_by_label("Password").fill("pw-csp")
    page.get_by_role("button", name="Log in").click()
    page.wait_for_url(f"{url}/")
    for path in ("/", f"/groups/{group.name}/thresholds/", "/approvals/", "/canary/", "/audit/", "/admin/",
                 "/admin/auth/user/", f"/admin/auth/user/{user.pk}/change/", f"/nodes/{node.pk}/"):
        visit(path)
    assert page.locator("#z-chart svg path.series").count() == 1  # the inline SVG charts render

    # The group page's script runs and replaces the table in place (innerHTML of the partial).
    visit(f"/groups/{group.name}/")
    page.locator("#nodes[data-refreshed-at]").wait_for(timeout=15_000)
    seen["group refresh"] = page.evaluate("window.__csp")

    # Swagger UI: its nonced init script runs and renders the schema.
    visit("/api/docs/")
    page.get_by_text("outlier-admin API").first.wait_for()
    page.locator(".opblock").first.wait_for()
    seen["/api/docs/ rendered"] = page.evaluate("window.__csp")

    assert all(not v for v in seen.values()), {k: v for k, v in seen.items() if v}
    assert not console, console

    # Control: the policy is enforced, and a violation would have been seen.
    visit("/")
    ran = page.evaluate("""() => { const s = document.createElement("script");
        s.textContent = "window.__ran = 1"; document.body.appendChild(s); return window.__ran === 1; }""")
    page.wait_for_function("window.__csp.length > 0")
    assert ran is False
    assert page.evaluate("window.__csp")[0].startswith("script-src-elem blocked inline")
