"""The threshold preview: operator or oncall only (not viewers), and bounded — window, nodes, history
rows — with a 400 that names the bound instead of a silent truncation. The ``fleet`` fixture's group
has 8 nodes x 180 history rows = 1,440 rows in the last hour."""

from __future__ import annotations

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from rest_framework.test import APIClient

from outlier_admin.control.models import NodeHistory
from outlier_admin.fleet.models import Node, ThresholdChange
from tests.outlier_admin.api.conftest import make_user

pytestmark = pytest.mark.django_db
CHANGES = {"changes": {"quarantine_z": 2.5}}


def as_user(user) -> APIClient:
    c = APIClient()
    c.force_authenticate(user)
    return c


def url(fleet) -> str:
    return f"/api/v1/groups/{fleet['group'].name}/thresholds/preview/"


def test_viewer_may_not_preview(fleet, users):
    resp = as_user(users["viewer"]).post(url(fleet), CHANGES, format="json")
    assert resp.status_code == 403
    assert "needs the role oncall or operator" in resp.json()["detail"]
    assert as_user(users["norole"]).post(url(fleet), CHANGES, format="json").status_code == 403
    assert APIClient().post(url(fleet), CHANGES, format="json").status_code in (401, 403)


@pytest.mark.parametrize("role", ["operator", "oncall"])
def test_operator_and_oncall_preview_the_whole_hour(fleet, users, role):
    resp = as_user(users[role]).post(url(fleet), CHANGES, format="json")
    assert resp.status_code == 200
    assert (resp.json()["rows"], resp.json()["nodes"]) == (8 * 180, 8)


def test_a_viewer_with_an_api_token_may_not_preview_either(client, fleet, users):
    from outlier_admin.control.actions import do_create_token

    _, viewer_token = do_create_token(name="viewer-cli", scope="api", actor="test", user=users["viewer"])
    _, operator_token = do_create_token(name="operator-cli", scope="api", actor="test", user=users["operator"])
    for token, expected in ((viewer_token, 403), (operator_token, 200)):
        resp = client.post(url(fleet), CHANGES, content_type="application/json", HTTP_AUTHORIZATION=f"Bearer {token}")
        assert resp.status_code == expected


def test_a_window_over_the_bound_is_a_400_naming_it(fleet, users):
    c = as_user(users["operator"])
    resp = c.post(url(fleet), {**CHANGES, "window_s": 7200}, format="json")
    assert resp.status_code == 400
    body = resp.json()
    assert body["errors"][0]["attr"] == "window_s"
    assert "window_s=7200 is over PREVIEW_MAX_WINDOW_S=3600" in body["detail"]
    assert c.post(url(fleet), {**CHANGES, "window_s": 3600}, format="json").status_code == 200


def test_a_group_over_the_node_bound_is_refused_before_reading_history(fleet, users, settings):
    settings.PREVIEW_MAX_NODES = 7
    with CaptureQueriesContext(connection) as queries:
        resp = as_user(users["operator"]).post(url(fleet), CHANGES, format="json")
    assert resp.status_code == 400
    assert "has 8 nodes, over PREVIEW_MAX_NODES=7" in resp.json()["detail"]
    assert resp.json()["errors"][0]["attr"] == "group"
    history_table = NodeHistory._meta.db_table
    assert not [q for q in queries.captured_queries if history_table in q["sql"]], "no history row was read"
    settings.PREVIEW_MAX_NODES = 8
    assert as_user(users["operator"]).post(url(fleet), CHANGES, format="json").status_code == 200


def test_the_default_node_bound_refuses_1001_nodes(fleet, users):
    group = fleet["group"]
    Node.objects.bulk_create([Node(group=group, name=f"extra-{i}", address=f"127.1.{i // 250}.{i % 250}:8000")
                              for i in range(1001 - 8)])
    resp = as_user(users["operator"]).post(url(fleet), CHANGES, format="json")
    assert resp.status_code == 400
    assert "has 1001 nodes, over PREVIEW_MAX_NODES=1000" in resp.json()["detail"]


def test_a_history_over_the_row_bound_is_refused_without_loading_rows(fleet, users, settings):
    settings.PREVIEW_MAX_ROWS = 1000
    with CaptureQueriesContext(connection) as queries:
        resp = as_user(users["operator"]).post(url(fleet), CHANGES, format="json")
    assert resp.status_code == 400
    assert "more than PREVIEW_MAX_ROWS=1000 history rows" in resp.json()["detail"]
    history_table = NodeHistory._meta.db_table
    reads = [q["sql"] for q in queries.captured_queries if f'FROM "{history_table}"' in q["sql"]]
    # One count, capped in the database at the bound + 1; no row is loaded to be refused.
    assert len(reads) == 1 and reads[0].startswith("SELECT COUNT(*)") and "LIMIT 1001" in reads[0], reads
    settings.PREVIEW_MAX_ROWS = 8 * 180  # exactly the rows of the window: served, nothing cut
    resp = as_user(users["operator"]).post(url(fleet), CHANGES, format="json")
    assert resp.status_code == 200 and resp.json()["rows"] == 8 * 180


def _login(user):
    from django.test import Client

    c = Client()
    c.force_login(user)
    return c


def test_dashboard_preview_is_for_operator_and_oncall(fleet, users):
    page = f"/groups/{fleet['group'].name}/thresholds/"
    viewer = _login(users["viewer"])
    assert b'name="preview"' not in viewer.get(page).content  # no button it may not use
    resp = viewer.post(page, {"quarantine_z": "2.8", "preview": "1"})
    assert resp.status_code == 403 and b"preview thresholds" in resp.content
    assert b"oncall or operator" in resp.content
    oncall = _login(make_user("oncall2", "oncall"))
    assert b'name="preview"' in oncall.get(page).content
    resp = oncall.post(page, {"quarantine_z": "2.8", "preview": "1"})
    assert resp.status_code == 200 and b"1440 history rows of 8 nodes replayed" in resp.content
    assert not ThresholdChange.objects.filter(group=fleet["group"]).exists()


def test_dashboard_preview_over_a_bound_shows_the_bound(fleet, users, settings):
    settings.PREVIEW_MAX_NODES = 5
    resp = _login(users["operator"]).post(f"/groups/{fleet['group'].name}/thresholds/",
                                          {"quarantine_z": "2.8", "preview": "1"})
    assert resp.status_code == 400
    assert "has 8 nodes, over PREVIEW_MAX_NODES=5" in resp.content.decode().replace("&#x27;", "'")
