"""Every URL the project routes x every method x {anonymous, ingest token, revoked token, viewer}:
nobody without a role reads anything, an ``ingest`` token reaches only the ingest endpoint, a viewer
changes nothing, and no combination answers 500. (Who of operator/oncall may do which mutation is
tested per endpoint in ``tests/outlier_admin/api/test_permissions.py``.)"""

from __future__ import annotations

import re

import pytest
from django.urls import URLPattern, URLResolver, get_resolver, reverse

from outlier_admin.control.actions import do_create_token, do_revoke_token

pytestmark = [pytest.mark.django_db, pytest.mark.timeout(120)]

# Answer anonymous requests on purpose: health probes, the Prometheus scrape (protect it at the
# network level: it names groups and nodes), the login pages and the dashboard's logout.
PUBLIC = {"healthz", "readyz", "metrics", "dashboard:login", "admin:login", "dashboard:logout", "admin:logout"}
# Read-only dashboard pages that render for any method instead of answering 405 (harmless: they
# change nothing, which the viewer test checks through the audit log).
READ_PAGES_IGNORING_METHOD = {"dashboard:overview", "dashboard:group", "dashboard:node", "dashboard:approvals",
                              "dashboard:canary", "dashboard:audit", "dashboard:thresholds"}  # thresholds: preview
DENIED = {301, 302, 401, 403, 404, 405}
METHODS = ("get", "post", "put", "patch", "delete")


def _routes() -> list[tuple[str, str]]:
    """``(route name, path)`` of every named pattern, its arguments filled with real objects' keys
    (format-suffix variants and the admin's per-model pages are the same views: left out)."""
    from outlier_admin.fleet.models import ModelGroup, Node

    group = ModelGroup.objects.first()
    node = Node.objects.first()
    values = {"name": group.name, "slug": group.slug, "pk": str(node.pk), "object_id": str(node.pk), "app_label": "auth"}
    out = []

    def walk(patterns, ns: str) -> None:
        for p in patterns:
            if isinstance(p, URLResolver):
                walk(p.url_patterns, f"{ns}{p.namespace}:" if p.namespace else ns)
            elif isinstance(p, URLPattern) and p.name:
                params = set(p.pattern.regex.groupindex)
                if "format" in params or p.name in {"view_on_site"} or re.search(r"_(changelist|add|change|delete|history)$", p.name):
                    continue
                if not params <= values.keys():
                    continue
                name = f"{ns}{p.name}"
                out.append((name, reverse(name, kwargs={k: values[k] for k in params})))

    walk(get_resolver().url_patterns, "")
    return sorted(set(out))


def _call(client, method: str, path: str, **extra):
    if method == "get":
        return client.get(path, **extra)
    return getattr(client, method)(path, data={}, content_type="application/json", **extra)


def test_the_matrix_covers_the_api_the_dashboard_and_ingest(fleet):
    names = {n for n, _ in _routes()}
    for expected in ("group-list", "node-release", "proposal-approve", "audit-list", "dashboard:override",
                     "dashboard:thresholds", "ingest-requests", "schema", "admin:index"):
        assert expected in names
    assert len(names) > 30


def test_anonymous_reaches_nothing_but_public_pages(client, fleet):
    for name, path in _routes():
        for method in METHODS:
            resp = _call(client, method, path)
            assert resp.status_code != 500, (name, method)
            if name not in PUBLIC:
                assert resp.status_code in DENIED, (name, method, resp.status_code)
                if resp.status_code == 302:
                    assert "login" in resp["Location"], (name, method)


@pytest.mark.parametrize("kind", ["ingest", "revoked-api"])
def test_ingest_and_revoked_tokens_reach_nothing_else(client, fleet, users, kind):
    if kind == "ingest":
        _, plaintext = do_create_token(name="gw", scope="ingest", actor="test")
    else:
        token, plaintext = do_create_token(name="ops", scope="api", actor="test", user=users["oncall"])
        assert client.get("/api/v1/groups/", HTTP_AUTHORIZATION=f"Bearer {plaintext}").status_code == 200
        do_revoke_token(token, actor="test", reason="leaked")
    auth = {"HTTP_AUTHORIZATION": f"Bearer {plaintext}"}
    for name, path in _routes():
        if name in PUBLIC or (kind == "ingest" and name in ("ingest-requests", "ingest-requests-slash")):
            continue
        for method in METHODS:
            resp = _call(client, method, path, **auth)
            assert resp.status_code in DENIED, (kind, name, method, resp.status_code)
    resp = client.post("/api/v1/ingest/requests", data=[], content_type="application/json", **auth)
    assert resp.status_code == (200 if kind == "ingest" else 401)  # ingest: its one endpoint


def test_viewer_reads_but_changes_nothing(client, fleet, users):
    from outlier_admin.control.models import AuditEvent

    client.force_login(users["viewer"])
    audit_before = AuditEvent.objects.count()
    reads: dict[str, int] = {}
    for name, path in _routes():
        if name.startswith("admin:") or name in PUBLIC:
            continue
        resp = _call(client, "get", path)
        # 403: the GET of an action's form/confirmation page (it needs the action's role).
        assert resp.status_code in {200, 403, 404, 405}, (name, resp.status_code)
        reads[name] = resp.status_code
        for method in METHODS[1:]:
            resp = _call(client, method, path)
            if name in READ_PAGES_IGNORING_METHOD and resp.status_code == 200:
                continue  # renders the page again; the audit check below proves nothing changed
            # 400: a read-with-a-body (the threshold preview) refusing an empty body.
            assert resp.status_code in DENIED | {400}, (name, method, resp.status_code)
    assert AuditEvent.objects.count() == audit_before, "no change was made"
    for name in ("group-list", "node-list", "audit-list", "dashboard:overview", "dashboard:audit", "schema"):
        assert reads[name] == 200, name
