"""Issue 36, finding 4: node routes have one meaning for a run of digits, a NUL byte anywhere in a route,
query or form is a 400 (never a psycopg 500), and the one CSV writer leaves no cell a spreadsheet runs,
whatever invisible characters precede it and whatever separator the spreadsheet splits on."""

from __future__ import annotations

import csv
import io

import pytest
from django.test import Client

from outlier_admin.control.actions import ActionError, do_create_group, do_register_node
from outlier_admin.history.export import cell, csv_response

pytestmark = pytest.mark.django_db


def _client(user) -> Client:
    c = Client(raise_request_exception=False)
    c.force_login(user)
    return c


def test_a_node_name_of_digits_is_refused_at_registration_with_a_clear_error(fleet, users):
    with pytest.raises(ActionError, match="all digits"):
        do_register_node(fleet["group"], "127.0.0.9:8000", name="3", actor="setup")
    resp = _client(users["operator"]).post(
        "/api/v1/nodes/", {"group": "llama", "address": "127.0.0.9:8000", "name": "0003", "reason": "r"},
        content_type="application/json")
    assert resp.status_code == 400 and b"all digits" in resp.content, resp.content
    # A name with digits and something else is still a name.
    assert do_register_node(fleet["group"], "127.0.0.9:8000", name="node-3", actor="setup").name == "node-3"


def test_digits_in_a_node_route_are_an_id_in_one_spelling_only(fleet, users):
    """Before: /nodes/0003/ was node 3, and a node *named* 3 (registered before the rule) was shadowed
    by node id 3 of another group; now digits are always an id, written without leading zeros, and
    the legacy name is reached within its group."""
    from outlier_admin.fleet.models import Node

    other = do_create_group("other", actor="setup")
    target = fleet["nodes"][3]
    legacy = Node.objects.create(group=other, name=str(target.pk), address="127.0.0.50:8000")
    client = _client(users["viewer"])
    assert client.get(f"/api/v1/nodes/{target.pk}/").json()["id"] == target.pk
    assert client.get(f"/api/v1/nodes/0{target.pk}/").status_code == 404
    resp = client.get(f"/api/v1/groups/{other.slug}/nodes/{legacy.name}/")
    assert resp.status_code == 200 and resp.json()["id"] == legacy.pk
    oncall = _client(users["oncall"])
    assert oncall.post(f"/api/v1/nodes/00{target.pk}/quarantine/", {"reason": "r"},
                       content_type="application/json").status_code == 404


@pytest.mark.parametrize("path", [
    "/api/v1/nodes/1%00/", "/api/v1/nodes/a%00b/quarantine/", "/api/v1/groups/llama%00/",
    "/api/v1/nodes/?name=x%00", "/api/v1/audit/?node=a%00", "/nodes/1/?signal=%00",
    "/audit/export.csv?actor=%00", "/api/v1/nodes/%00/timeline/",
])
def test_a_nul_byte_in_a_route_or_query_is_a_400_not_a_500(fleet, users, path):
    client = _client(users["oncall"])
    method = client.post if path.endswith("quarantine/") else client.get
    resp = method(path)
    assert resp.status_code in (400, 404), (path, resp.status_code)
    if path.startswith("/api/"):
        assert resp["Content-Type"] == "application/problem+json"


def test_a_nul_byte_in_a_login_form_is_a_400_and_counts_nothing(users):
    from axes.models import AccessAttempt

    resp = Client(raise_request_exception=False).post("/accounts/login/", {"username": "a\x00b", "password": "x"})
    assert resp.status_code == 400
    assert not AccessAttempt.objects.exists()


@pytest.mark.parametrize(("value", "expected"), [
    ("\ufeff=1+1", "'\ufeff=1+1"),
    ("\u200b=1+1", "'\u200b=1+1"),
    ("\u200d\u2060 @SUM(A1)", "'\u200d\u2060 @SUM(A1)"),
    ("x;=cmd|' /C calc'!A0;", "x;'=cmd|' /C calc'!A0;"),
    ("a,\ufeff+1", "a,'\ufeff+1"),
    ("ok; fine", "ok; fine"),
    ("drain - maintenance", "drain - maintenance"),
])
def test_formula_cells_are_neutralised_after_invisible_characters_and_separators(value, expected):
    assert cell(value) == expected


def test_every_text_cell_holding_a_separator_is_quoted_so_a_semicolon_reader_sees_one_cell():
    resp = csv_response("t.csv", ["reason", "z"], [["x;=cmd|' /C calc'!A0;", -2.5], ["\ufeff=1", 1]])
    text = b"".join(resp.streaming_content).decode()
    for delimiter in (",", ";"):
        rows = list(csv.reader(io.StringIO(text), delimiter=delimiter))
        cells = [c for row in rows[1:] for c in row]
        assert not any(c.lstrip(" \ufeff\u200b").startswith(("=", "+", "@")) for c in cells), (delimiter, rows)
    assert list(csv.reader(io.StringIO(text)))[1] == ["x;'=cmd|' /C calc'!A0;", "-2.5"]
