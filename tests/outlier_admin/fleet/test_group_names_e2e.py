"""Group names as users have them (Hugging Face model ids), through ingest, the tick, the weights
document, every page, the API and /metrics; invalid node addresses refused at auto-registration and
never published; nodes retired from the API and the dashboard, audited as who did it."""

from __future__ import annotations

import time

import orjson
import pytest
from django.test import Client

from outlier_admin.control.actions import do_create_token, do_register_node
from outlier_admin.control.models import AuditEvent
from outlier_admin.control.publish import read_weights
from outlier_admin.control.tick import run_tick
from outlier_admin.fleet.models import ModelGroup, Node
from outlier_admin.ingest.models import RejectedInput
from tests.outlier_admin.api.conftest import _fast_password_hasher, users  # noqa: F401

pytestmark = [pytest.mark.django_db, pytest.mark.services]
NAMES = ["llama3-70b/h800", "meta-llama/Llama-3.1-70B-Instruct@h100"]
SLUGS = {"llama3-70b/h800": "_llama3-70b-h800",  # derived slugs are marked: no group name starts with "_"
         "meta-llama/Llama-3.1-70B-Instruct@h100": "_meta-llama-Llama-3-1-70B-Instruct-h100"}
GOOD = ["127.0.0.1:8000", "127.0.0.2:8000", "127.0.0.3:8000"]
BAD = {  # node id -> why auto-registration refuses it
    "gpu-node-03": "bad_address",           # a valid id, but not host:port: nothing to send traffic to
    "127.0.0.4:0": "bad_address",
    "169.254.169.254:80": "forbidden_address",  # the cloud metadata service
    "<script>alert('xss')</script>": "bad_node",  # not even an id: refused with the record
}


def records(group: str) -> list[dict]:
    now = time.time()
    return [{"ts": now, "node": node, "group": group, "prompt_tokens": 100, "completion_tokens": 50,
             "ttft_ms": 120.0, "total_ms": 900.0, "status": 200} for node in [*GOOD, *BAD]]


@pytest.fixture
def groups(make_group):
    return [make_group(name) for name in NAMES]


@pytest.mark.parametrize("name", NAMES)
def test_a_model_id_group_through_ingest_tick_pages_api_and_metrics(name, groups, client, ingest_token,
                                                                    redis_client, users):  # noqa: F811
    group = ModelGroup.objects.get(name=name)
    assert group.slug == SLUGS[name]
    resp = client.post("/api/v1/ingest/requests", data=orjson.dumps(records(name)),
                       content_type="application/json", HTTP_AUTHORIZATION=f"Bearer {ingest_token}")
    assert resp.status_code == 200, resp.content
    body = resp.json()
    assert body["accepted"] == len(GOOD)
    assert sorted(e["reason"] for e in body["errors"]) == sorted(BAD.values())
    assert set(RejectedInput.objects.values_list("reason", flat=True)) == set(BAD.values())
    assert sorted(Node.objects.filter(group=group).values_list("name", flat=True)) == GOOD

    assert run_tick(name) is not None
    doc = read_weights(name)
    assert doc["group"] == name and sorted(n["address"] for n in doc["nodes"]) == GOOD

    viewer = Client()
    viewer.force_login(users["viewer"])
    overview = viewer.get("/").content.decode()
    assert f'href="/groups/{group.slug}/"' in overview
    page = viewer.get(f"/groups/{group.slug}/")
    assert page.status_code == 200 and name in page.content.decode()
    assert viewer.get(f"/groups/{group.slug}/thresholds/").status_code == 200
    node = Node.objects.get(group=group, name=GOOD[0])
    assert viewer.get(f"/nodes/{node.pk}/").status_code == 200

    assert viewer.get(f"/api/v1/groups/{group.slug}/").json()["name"] == name
    assert viewer.get(f"/api/v1/groups/{group.slug}/thresholds/").status_code == 200
    listed = viewer.get("/api/v1/nodes/", {"group": name}).json()
    assert sorted(n["name"] for n in listed["results"]) == GOOD and {n["group"] for n in listed["results"]} == {name}

    metrics = Client().get("/metrics").content.decode()
    assert f'group="{name}"' in metrics


def test_slugs_of_colliding_names_are_numbered(make_group):
    a, b = make_group("org/model.x"), make_group("org/model-x")
    assert (a.slug, b.slug) == ("_org-model-x", "_org-model-x-2")


def test_a_derived_slug_never_squats_a_later_groups_name(make_group, client, users):  # noqa: F811
    """Issue 29 finding 10: ``a.b`` took the slug ``a-b``, so a group created later as ``a-b`` got
    ``a-b-2`` and its URL was not its name. A name that is a slug keeps it, whichever came first; the
    derived slugs (and their numbered forms) start with ``_``, which no name can."""
    dotted, at = make_group("a.b"), make_group("a@b")
    plain = make_group("a-b")
    numbered = make_group("a-b-2")  # the name the old numbering would have handed to a-b
    assert (dotted.slug, at.slug, plain.slug, numbered.slug) == ("_a-b", "_a-b-2", "a-b", "a-b-2")
    viewer = Client()
    viewer.force_login(users["viewer"])
    assert "a-b" in viewer.get("/groups/a-b/").content.decode()
    assert viewer.get("/api/v1/groups/a-b/").json()["name"] == "a-b"
    assert viewer.get("/api/v1/groups/_a-b/").json()["name"] == "a.b"


def test_a_name_whose_slug_an_old_group_holds_gets_a_marked_slug(make_group):
    """A group created before the rule may hold a derived slug without the mark (``a.b`` -> ``a-b``);
    a new ``a-b`` then takes the marked form, outside the names' space, never ``a-b-2``."""
    ModelGroup.objects.create(name="a.b", slug="a-b")
    assert make_group("a-b").slug == "_a-b"
    assert make_group("a-b-2").slug == "a-b-2"


def test_an_invalid_stored_address_is_left_out_of_the_published_document(groups, redis_client, caplog):
    """A node stored before addresses were validated (or written around the actions) never reaches
    a gateway: the publisher checks the document against the contract and leaves it out, with the
    reason logged; the other nodes are published."""
    group = groups[0]
    for addr in GOOD:
        do_register_node(group, addr, actor="test")
    Node.objects.create(group=group, name="bogus", address="<script>alert('xss')</script>", base_weight=100)
    with caplog.at_level("ERROR", logger="outlier_admin.control.publish"):
        assert run_tick(group.name) is not None
    doc = read_weights(group.name)
    assert sorted(n["node"] for n in doc["nodes"]) == GOOD
    assert "'bogus'" in caplog.text and "not host:port" in caplog.text


def test_retire_from_the_api_with_a_token_is_audited_as_the_token(groups, client, redis_client, users):  # noqa: F811
    group = groups[1]
    nodes = [do_register_node(group, addr, actor="test") for addr in GOOD]
    run_tick(group.name)
    _, token = do_create_token(name="pager-bot", scope="api", actor="test", user=users["oncall"])
    auth = {"HTTP_AUTHORIZATION": f"Bearer {token}"}
    resp = client.post(f"/api/v1/nodes/{nodes[0].pk}/retire/", data={"reason": "bogus node"},
                       content_type="application/json", **auth)
    assert resp.status_code == 200 and resp.json()["retired"] is True
    event = AuditEvent.objects.get(action="node.retire")
    assert (event.actor, event.user, event.reason) == ("token:pager-bot", users["oncall"], "bogus node")
    run_tick(group.name)
    assert sorted(n["node"] for n in read_weights(group.name)["nodes"]) == GOOD[1:]
    again = client.post(f"/api/v1/nodes/{nodes[0].pk}/retire/", data={"reason": "again"},
                        content_type="application/json", **auth)
    assert again.status_code == 400 and "already retired" in again.content.decode()
    # A viewer's token may not retire.
    _, viewer_token = do_create_token(name="dash", scope="api", actor="test", user=users["viewer"])
    denied = client.post(f"/api/v1/nodes/{nodes[1].pk}/retire/", data={"reason": "x"},
                         content_type="application/json", HTTP_AUTHORIZATION=f"Bearer {viewer_token}")
    assert denied.status_code == 403 and not Node.objects.get(pk=nodes[1].pk).retired


def test_retire_from_the_dashboard_asks_for_confirmation(groups, users):  # noqa: F811
    node = do_register_node(groups[0], GOOD[0], actor="test")
    c = Client()
    c.force_login(users["oncall"])
    assert "Retire…" in c.get(f"/nodes/{node.pk}/").content.decode()
    first = c.post(f"/nodes/{node.pk}/retire/", {"reason": "decommissioned"})
    assert first.status_code == 200 and "Yes, retire" in first.content.decode()
    assert not Node.objects.get(pk=node.pk).retired
    done = c.post(f"/nodes/{node.pk}/retire/", {"reason": "decommissioned", "confirmed": "True"})
    assert done.status_code == 302 and done["Location"] == f"/groups/{groups[0].slug}/"
    assert Node.objects.get(pk=node.pk).retired
    assert AuditEvent.objects.get(action="node.retire").actor == "oncall"
    viewer = Client()
    viewer.force_login(users["viewer"])
    assert viewer.post(f"/nodes/{node.pk}/retire/", {"reason": "x", "confirmed": "True"}).status_code == 403
