"""The operator's report on the API: a node's ``z``/``ema`` are on the signal the detector decides on
and say which (``?signal=`` picks another), a node is addressed by name as well as by id, and the
other endpoints' ``?node=`` takes names and ``?actor=`` matches exactly. Real PostgreSQL, no mocks."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone
from rest_framework.test import APIClient

from detector.signals import SIGNALS
from outlier_admin.control.actions import audit, do_create_group, do_register_node
from outlier_admin.control.models import GroupBaseline, NodeHistory, Override, Transition

pytestmark = pytest.mark.django_db


def as_user(user) -> APIClient:
    c = APIClient()
    c.force_authenticate(user)
    return c


def problem(resp, status: int) -> dict:
    assert resp.status_code == status, resp.content
    assert resp["Content-Type"] == "application/problem+json"
    return resp.json()


def write(node, at, deciding: str | None, **z_by_signal: float | None) -> None:
    """One history write of ``node`` at ``at`` as a tick writes it: every signal's row, ``z`` as given
    (missing: NULL), EMA ``1 + z / 10`` (each signal's own, so a test can tell them apart), the row of
    the signal the detector judged the node on (``deciding``) flagged."""
    NodeHistory.objects.bulk_create([
        NodeHistory(node=node, signal=s, at=at, z=z_by_signal.get(s), p50=1.0 if s == "norm" else None,
                    ema=None if z_by_signal.get(s) is None else 1 + z_by_signal[s] / 10, samples=500,
                    weight=100, state=node.state, p99=2.0 if s == "norm" else None, deciding=s == deciding)
        for s in SIGNALS])


def baselines(group, at, **by_signal: float | None) -> None:
    GroupBaseline.objects.bulk_create([GroupBaseline(group=group, signal=s, at=at, baseline=by_signal.get(s),
                                                     spread=0.1, peers=8) for s in SIGNALS])


@pytest.fixture
def decode_fleet(db):
    """Group ``h100`` judged on the queue-free signals (decode and prefill_time baselines stored): node
    ``h100-03`` pending approval at decode Z 12.2 while its norm Z is -2.04; ``h100-04`` slow in prefill
    time only; ``h100-01`` healthy. An older write (decode Z 0.1) must not show. Group ``a100`` has no
    queue-free baseline: its nodes are judged on norm or prefill, the larger. The rows and the groups'
    deciding signals are written as the tick writes them."""
    now = timezone.now()
    h100 = do_create_group("h100", actor="setup", policy="approval")
    a100 = do_create_group("a100", actor="setup")
    n = {name: do_register_node(h100, f"127.0.1.{i}:8000", name=name, actor="setup")
         for i, name in enumerate(("h100-01", "h100-03", "h100-04"), start=1)}
    n.update({name: do_register_node(a100, f"127.0.2.{i}:8000", name=name, actor="setup")
              for i, name in enumerate(("a100-01", "a100-02"), start=1)})
    n["h100-03"].state = "pending_approval"
    n["h100-03"].save()
    h100.decision_signal = "decode"
    h100.save()
    old, last = now - timedelta(seconds=60), now - timedelta(seconds=10)
    baselines(h100, old, norm=1.0, prefill=1.0, decode=1.0, prefill_time=1.0)
    baselines(h100, last, norm=1.0, prefill=1.0, decode=1.0, prefill_time=1.0)
    baselines(a100, last, norm=1.0, prefill=1.0)
    write(n["h100-03"], old, "prefill_time", norm=0.2, decode=0.1, prefill_time=0.3)
    write(n["h100-03"], last, "decode", norm=-2.04, prefill=-1.0, decode=12.2, prefill_time=0.4)
    write(n["h100-04"], last, "prefill_time", norm=0.5, prefill=6.0, decode=0.2, prefill_time=5.1)
    write(n["h100-01"], last, "decode", norm=0.1, prefill=0.0, decode=-0.3, prefill_time=None)
    write(n["a100-01"], last, "prefill", norm=1.5, prefill=2.5)
    write(n["a100-02"], last, "norm", norm=0.7, prefill=-0.2)
    return n


def test_a_nodes_z_is_on_its_deciding_signal_and_names_it(decode_fleet, users):
    c = as_user(users["viewer"])
    n = decode_fleet
    body = c.get(f"/api/v1/nodes/{n['h100-03'].pk}/").json()
    assert (body["signal"], body["z"], body["ema"]) == ("decode", 12.2, pytest.approx(2.22))
    assert (body["p50"], body["p99"]) == (1.0, 2.0)  # the tail window's, on the norm rows
    # Judged on the larger of the queue-free Z: prefill time here, not its prefill (TTFT) Z of 6.
    assert (c.get(f"/api/v1/nodes/{n['h100-04'].pk}/").json()["signal"],
            c.get(f"/api/v1/nodes/{n['h100-04'].pk}/").json()["z"]) == ("prefill_time", 5.1)
    # A group without a queue-free baseline: the larger of norm and prefill.
    assert (c.get(f"/api/v1/nodes/{n['a100-01'].pk}/").json()["signal"],
            c.get(f"/api/v1/nodes/{n['a100-02'].pk}/").json()["signal"]) == ("prefill", "norm")

    listed = c.get("/api/v1/nodes/", {"group": "h100", "ordering": "-latest_z"}).json()["results"]
    assert [(r["name"], r["signal"], r["z"]) for r in listed] == [
        ("h100-03", "decode", 12.2), ("h100-04", "prefill_time", 5.1), ("h100-01", "decode", -0.3)]
    assert [r["name"] for r in c.get("/api/v1/nodes/", {"ordering": "-latest_z"}).json()["results"]][:2] == [
        "h100-03", "h100-04"]


def test_signal_selects_another_and_an_unknown_one_is_a_400_naming_the_allowed(decode_fleet, users):
    c = as_user(users["viewer"])
    pk = decode_fleet["h100-03"].pk
    body = c.get(f"/api/v1/nodes/{pk}/", {"signal": "norm"}).json()
    assert (body["signal"], body["z"]) == ("norm", -2.04)
    listed = c.get("/api/v1/nodes/", {"signal": "prefill_time", "group": "h100", "ordering": "name"})
    assert listed.status_code == 200, listed.content
    assert [(r["signal"], r["z"]) for r in listed.json()["results"]] == [
        ("prefill_time", None), ("prefill_time", 0.4), ("prefill_time", 5.1)]
    for path in (f"/api/v1/nodes/{pk}/", "/api/v1/nodes/", f"/api/v1/nodes/{pk}/timeline/",
                 "/api/v1/groups/h100/nodes/h100-03/"):
        err = problem(c.get(path, {"signal": "queue"}), 400)
        assert err["errors"][0]["attr"] == "signal"
        assert all(s in err["errors"][0]["detail"] for s in SIGNALS), err


def test_the_timeline_defaults_to_the_deciding_signal(decode_fleet, users):
    c = as_user(users["viewer"])
    body = c.get(f"/api/v1/nodes/{decode_fleet['h100-03'].pk}/timeline/", {"hours": 1}).json()
    assert body["signal"] == "decode"
    assert [p["z"] for p in body["points"]] == [0.1, 12.2]
    assert [b["baseline"] for b in body["baseline"]] == [1.0, 1.0]


def test_the_schema_documents_the_signal_field_and_parameter(users):
    schema = as_user(users["viewer"]).get("/api/schema/", {"format": "json"}).json()
    node = schema["components"]["schemas"]["Node"]["properties"]
    assert node["signal"]["readOnly"] and "deciding" in node["signal"]["description"]
    assert "signal" in node["z"]["description"] and "signal" in node["ema"]["description"]
    for path in ("/api/v1/nodes/", "/api/v1/nodes/{id}/", "/api/v1/nodes/{id}/timeline/",
                 "/api/v1/groups/{slug}/nodes/{node_name}/"):
        params = {p["name"]: p for p in schema["paths"][path]["get"]["parameters"]}
        assert sorted(params["signal"]["schema"]["enum"]) == sorted(SIGNALS), path
        assert "deciding" in params["signal"]["description"], path
    detail = {p["name"]: p for p in schema["paths"]["/api/v1/nodes/{id}/"]["get"]["parameters"]}
    assert detail["id"]["schema"]["type"] == "string"  # an id or a name


def test_a_node_is_addressed_by_name_within_its_group(decode_fleet, users):
    c = as_user(users["viewer"])
    other = do_register_node(decode_fleet["h100-03"].group.__class__.objects.get(name="a100"), "127.0.2.9:8000",
                             name="h100-01", actor="setup")  # the same name in another group
    body = c.get("/api/v1/groups/h100/nodes/h100-03/").json()
    assert (body["id"], body["group"], body["signal"], body["z"]) == (decode_fleet["h100-03"].pk, "h100", "decode", 12.2)
    assert c.get("/api/v1/groups/a100/nodes/h100-01/").json()["id"] == other.pk
    assert c.get("/api/v1/groups/h100/nodes/h100-01/").json()["id"] == decode_fleet["h100-01"].pk
    # Unambiguous: by name at /nodes/ too; a name with dots and a colon routes.
    assert c.get("/api/v1/nodes/h100-03/").json()["id"] == decode_fleet["h100-03"].pk
    dotted = do_register_node(decode_fleet["h100-03"].group, "127.0.1.77:8000", actor="setup")
    assert c.get("/api/v1/nodes/127.0.1.77:8000/").json()["id"] == dotted.pk
    assert c.get("/api/v1/groups/h100/nodes/127.0.1.77:8000/").json()["id"] == dotted.pk
    # Nowhere: 404; in another group only: 404 there; in two groups: 400 naming both paths.
    problem(c.get("/api/v1/nodes/h100-99/"), 404)
    problem(c.get(f"/api/v1/nodes/{'9' * 30}/"), 404)
    problem(c.get("/api/v1/groups/a100/nodes/h100-03/"), 404)
    problem(c.get("/api/v1/groups/nosuch/nodes/h100-03/"), 404)
    err = problem(c.get("/api/v1/nodes/h100-01/"), 400)
    assert err["errors"][0]["code"] == "ambiguous_node"
    assert "/api/v1/groups/h100/nodes/h100-01/" in err["detail"] and "/api/v1/groups/a100/nodes/h100-01/" in err["detail"]


def test_an_override_by_an_ambiguous_name_touches_no_node(decode_fleet, users):
    c = as_user(users["oncall"])
    do_register_node(decode_fleet["h100-03"].group.__class__.objects.get(name="a100"), "127.0.2.9:8000",
                     name="h100-01", actor="setup")
    problem(c.post("/api/v1/nodes/h100-01/quarantine/", {"reason": "slow"}, format="json"), 400)
    assert not Override.objects.exists()
    resp = c.post("/api/v1/nodes/h100-04/quarantine/", {"reason": "slow prefill"}, format="json")
    assert resp.status_code == 201, resp.content
    assert Override.objects.get().node == decode_fleet["h100-04"]


def test_audit_filters_by_node_name_and_actor_exactly(decode_fleet, users):
    c = as_user(users["viewer"])
    n = decode_fleet
    a100 = n["a100-02"].group
    twin = do_register_node(n["h100-03"].group, "127.0.1.50:8000", name="a100-02", actor="setup")
    audit("node.note", "demo", node=n["a100-02"], group=a100, reason="by demo")
    audit("node.note", "system:demo", node=n["a100-02"], group=a100, reason="by the demo loader")
    audit("node.note", "demo", node=twin, group=twin.group, reason="the twin in h100")
    audit("node.note", "demo", node=n["a100-01"], group=a100, reason="another node")

    def reasons(**params) -> list[str]:
        resp = c.get("/api/v1/audit/", {"action": "node.note", **params})
        assert resp.status_code == 200, resp.content
        return sorted(e["reason"] for e in resp.json()["results"])

    assert reasons(node="a100-02", group="a100") == ["by demo", "by the demo loader"]
    assert reasons(node="a100-02", group="h100") == ["the twin in h100"]
    assert reasons(node=str(twin.pk)) == ["the twin in h100"]  # a number is still an id
    assert reasons(node="h100-99") == [] and reasons(node="9" * 30) == []  # an id beyond bigint: none, not a 500
    err = problem(c.get("/api/v1/audit/", {"node": "a100-02"}), 400)
    assert err["errors"][0]["code"] == "ambiguous_node" and "a100, h100" in err["errors"][0]["detail"]
    assert reasons(actor="demo", group="a100") == ["another node", "by demo"]
    assert reasons(actor="system:demo") == ["by the demo loader"]
    assert reasons(actor="dem") == []


def test_other_lists_take_node_names_too(decode_fleet, users):
    c = as_user(users["viewer"])
    n = decode_fleet
    for name in ("h100-03", "h100-04"):
        Transition.objects.create(group=n[name].group, node=n[name], at=timezone.now(), from_state="healthy",
                                  to_state="degraded", reason="z_degrade", signal="decode", z=3.0)
    rows = c.get("/api/v1/transitions/", {"node": "h100-03"}).json()["results"]
    assert [(r["node_name"], r["signal"]) for r in rows] == [("h100-03", "decode")]


def test_the_node_page_defaults_to_the_signal_the_node_was_judged_on(decode_fleet, users):
    """As the API does: h100-04 was judged on prefill time (the tick flagged that row), so its page
    shows prefill time by default although the group decides on decode; h100-03's shows decode."""
    from django.test import Client

    c = Client()
    c.force_login(users["viewer"])
    page = c.get(f"/nodes/{decode_fleet['h100-04'].pk}/").content.decode()
    assert "Z-score vs peers (prefill_time)" in page
    assert "Z-score vs peers (decode)" in c.get(f"/nodes/{decode_fleet['h100-03'].pk}/").content.decode()
    assert "Z-score vs peers (decode)" in c.get(f"/nodes/{decode_fleet['h100-04'].pk}/", {"signal": "decode"}).content.decode()
