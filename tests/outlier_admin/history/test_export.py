"""CSV exports of the audit log and the transitions (issue 26 item 6): the pages' filters, every row,
and no cell a spreadsheet would run as a formula."""

from __future__ import annotations

import csv
import io
from datetime import timedelta

import pytest
from django.test import Client

from outlier_admin.control.actions import do_pin_weight
from outlier_admin.control.models import Transition
from outlier_admin.history.export import cell

pytestmark = pytest.mark.django_db


def viewer(users) -> Client:
    c = Client()
    c.force_login(users["viewer"])
    return c


def read_csv(resp) -> list[dict[str, str]]:
    assert resp.status_code == 200 and resp["Content-Type"].startswith("text/csv")
    assert resp["Content-Disposition"].startswith('attachment; filename="outlier-admin-')
    return list(csv.DictReader(io.StringIO(b"".join(resp.streaming_content).decode())))


def test_the_audit_export_takes_the_pages_filters(fleet, users):
    nodes = fleet["nodes"]
    do_pin_weight(nodes[2], 50, actor="alice", reason="=HYPERLINK(\"http://127.0.0.1/x\",\"click\")")
    do_pin_weight(nodes[3], 40, actor="bob", reason="second")
    rows = read_csv(viewer(users).get("/audit/export.csv?actor=alice"))
    assert [(r["actor"], r["action"], r["node"]) for r in rows] == [("alice", "node.pin", nodes[2].name)]
    assert rows[0]["reason"].startswith("'=HYPERLINK")  # text, never a live formula
    every = read_csv(viewer(users).get("/audit/export.csv"))
    assert {"alice", "bob", "setup"} <= {r["actor"] for r in every}


def test_the_transition_export_is_every_nodes_history_newest_first(fleet, users):
    group, nodes, now = fleet["group"], fleet["nodes"], fleet["now"]
    Transition.objects.create(group=group, node=nodes[3], at=now - timedelta(seconds=5), from_state="healthy",
                              to_state="degraded", reason="z_degrade", signal="decode", z=2.7,
                              explanation={"detail": "evidence 9.1 sd over 1.15x the baseline"})
    rows = read_csv(viewer(users).get("/transitions/export.csv"))
    assert len(rows) == Transition.objects.count() == 3
    newest = rows[0]
    assert (newest["node"], newest["to_state"], newest["signal"], newest["z"]) == (nodes[3].name, "degraded", "decode", "2.7")
    assert newest["detail"] == "evidence 9.1 sd over 1.15x the baseline"
    mine = read_csv(viewer(users).get(f"/transitions/export.csv?node={nodes[0].name}"))
    assert [r["to_state"] for r in mine] == ["quarantined", "degraded"]


def test_a_bad_filter_is_a_400_naming_it_and_anonymous_users_are_sent_to_log_in(fleet, users):
    resp = viewer(users).get("/transitions/export.csv?since=yesterday")
    assert resp.status_code == 400 and b"since" in resp.content
    assert Client().get("/audit/export.csv").status_code in (302, 401, 403)


def test_cells_a_spreadsheet_would_run_stay_text():
    assert [cell(v) for v in ("=1+1", "+3", "-2", "@SUM(A1)", "\tx", "ok", None, 1.5, -2.04)] == \
        ["'=1+1", "'+3", "'-2", "'@SUM(A1)", "'\tx", "ok", "", 1.5, -2.04]
