"""``/api/v1/incidents/`` (issue 35): filterable by group, node, open and time, CSV through the audit
log's writer, in the OpenAPI schema."""

from __future__ import annotations

import csv
import io
from datetime import timedelta

import pytest
from django.utils import timezone
from rest_framework.test import APIClient

from outlier_admin.control.models import Incident, IncidentOutcome


@pytest.fixture
def incidents(fleet):
    group, nodes, now = fleet["group"], fleet["nodes"], timezone.now()
    open_ = Incident.objects.create(group=group, node=nodes[0], started_at=now - timedelta(minutes=20),
                                    first_state="degraded", worst_state="quarantined", reason="z_degrade",
                                    signal="decode", unit="ms/token", z=18.4, ema=30.87, baseline=16.07,
                                    probes_failed=3)
    ended = Incident.objects.create(group=group, node=nodes[3], started_at=now - timedelta(hours=2),
                                    ended_at=now - timedelta(hours=2) + timedelta(seconds=53),
                                    first_state="degraded", worst_state="degraded", reason="z_degrade",
                                    signal="prefill_time", unit="x expected", z=3.1, ema=1.71, baseline=0.93,
                                    outcome=IncidentOutcome.NO_FAULT_FOUND)
    return open_, ended


def _client(users):
    c = APIClient()
    c.force_authenticate(users["viewer"])
    return c


def test_incidents_filter_by_open_node_and_time(incidents, users, fleet):
    open_, ended = incidents
    c = _client(users)
    body = c.get("/api/v1/incidents/").json()
    assert [r["id"] for r in body["results"]] == [open_.pk, ended.pk]
    first = body["results"][0]
    assert first["open"] is True and first["probes_failed"] == 3 and first["unit"] == "ms/token"
    assert first["cause"] == ("slower than its peers on decode time per token: Z 18.4, "
                              "EMA 30.9 ms/token vs peer baseline 16.1 ms/token (1.92x)")
    assert [r["id"] for r in c.get("/api/v1/incidents/?open=false").json()["results"]] == [ended.pk]
    assert [r["id"] for r in c.get(f"/api/v1/incidents/?node={fleet['nodes'][3].name}").json()["results"]] == [ended.pk]
    since = (timezone.now() - timedelta(hours=1)).isoformat()
    assert [r["id"] for r in c.get("/api/v1/incidents/", {"since": since}).json()["results"]] == [open_.pk]
    assert [r["id"] for r in c.get("/api/v1/incidents/", {"until": since}).json()["results"]] == [ended.pk]
    assert c.get("/api/v1/incidents/?outcome=no_fault_found").json()["results"][0]["outcome"] == "no_fault_found"


def test_incidents_export_as_csv_with_the_audit_logs_writer(incidents, users):
    resp = _client(users).get("/api/v1/incidents/export/?open=false")
    assert resp.status_code == 200 and resp["Content-Type"].startswith("text/csv")
    rows = list(csv.reader(io.StringIO(b"".join(resp.streaming_content).decode())))
    assert rows[0][:4] == ["started_at", "ended_at", "group", "node"]
    assert len(rows) == 2 and rows[1][-1] == "no_fault_found" and "prefill time" in rows[1][12]


@pytest.mark.django_db
def test_incidents_are_in_the_openapi_schema():
    from drf_spectacular.generators import SchemaGenerator

    paths = SchemaGenerator().get_schema(request=None, public=True)["paths"]
    assert "/api/v1/incidents/" in paths and "/api/v1/incidents/{id}/" in paths
    assert "/api/v1/incidents/export/" in paths
    params = {p["name"] for p in paths["/api/v1/incidents/"]["get"]["parameters"]}
    assert {"group", "node", "open", "since", "until", "outcome"} <= params
