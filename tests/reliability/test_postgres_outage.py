"""PostgreSQL unavailable for a while: ticks keep deciding and publishing from Redis; the history and
transitions of those ticks are written once it returns — none lost, none duplicated.

The outage is a closed port (see ``postgres_down``): the real PostgreSQL stays up for the others."""

from __future__ import annotations

import time

import numpy as np
import orjson
import pytest
from django.db.models import Count

from contract import keys
from harness.records import make_records
from outlier_admin.control import outage_store
from outlier_admin.control.models import GroupBaseline, NodeHistory, QuarantineProposal, Transition
from outlier_admin.control.publish import read_weights
from outlier_admin.control.tasks import tick_all_groups
from outlier_admin.control.tick import run_tick
from outlier_admin.fleet.models import ModelGroup
from outlier_admin.ingest.pipeline import submit
from tests.reliability.conftest import postgres_down

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.services, pytest.mark.timeout(60)]
SLOW = "127.0.0.1:9003"


@pytest.fixture(autouse=True)
def group_g1(transactional_db) -> ModelGroup:
    """Group ``g1`` and the 8 nodes of ``make_records``, made by an operator: ingest creates no group
    (only names matching ``AUTO_CREATE_GROUPS``)."""
    from outlier_admin.control.actions import do_create_group, do_register_node

    group = do_create_group("g1", actor="test")
    for i in range(8):
        do_register_node(group, f"127.0.0.1:{9000 + i}", actor="test")
    return group


def _rows(recs: list[dict]) -> list[list]:
    return [[r["node"], r["ts"], r["prompt_tokens"], r["completion_tokens"], r["ttft_ms"], r["total_ms"], r["status"]]
            for r in recs]


def test_ticks_publish_from_redis_during_outage_and_outbox_drains_exactly_once(redis_client):
    rng = np.random.default_rng(11)
    t0 = time.time()
    # Healthy warm-up with PostgreSQL up: the group, its nodes, the snapshot and the detector state.
    for k in range(3):
        recs = make_records(t0 + k, rng=rng)
        assert submit([(i + 1, r, None) for i, r in enumerate(recs)], source="test").accepted == len(recs)
        assert run_tick("g1", now=t0 + k + 0.5) is not None
    before_version = read_weights("g1")["version"]
    rows_before = Transition.objects.count(), NodeHistory.objects.count(), GroupBaseline.objects.count()

    degraded_results = []
    with postgres_down():
        for k in range(3, 12):
            # Gateways keep pushing (the stream is Redis): node 3 turns gray during the outage.
            recs = make_records(t0 + k, rng=rng, slow={3: 3.0})
            redis_client.xadd(keys.stream("g1"), {"rows": orjson.dumps(_rows(recs))})
            res = run_tick("g1", now=t0 + k + 0.5)
            assert res is not None, "the tick must keep running without PostgreSQL"
            degraded_results.append(res)
        # The beat still lists groups (from Redis) and enqueues their ticks.
        assert tick_all_groups.run() == 1
        outbox_items = outage_store.outbox_length(redis_client, "g1")

    versions = [r.version for r in degraded_results]
    assert versions == list(range(before_version + 1, before_version + 10)), "published every tick, monotonic"
    assert degraded_results[-1].states[SLOW] == "quarantined"
    doc = read_weights("g1")
    assert doc["version"] == versions[-1] and doc["generated_at"] == pytest.approx(t0 + 11.5, abs=1e-3)
    assert {n["node"]: n["weight"] for n in doc["nodes"]}[SLOW] == 0
    assert outbox_items >= 1
    assert sum(r.samples for r in degraded_results) == 9 * 8 * 40, "every streamed sample applied once"
    assert redis_client.xpending(keys.stream("g1"), "ticks")["pending"] == 0, "entries acknowledged"
    checkpoint = redis_client.hget(keys.state("g1"), "last_id")
    kept = [eid for eid, _ in redis_client.xrange(keys.stream("g1"))]
    assert all(eid > checkpoint for eid in kept), "entries the checkpoint covers are deleted"
    expected_transitions = sum(r.transitions for r in degraded_results)
    assert expected_transitions >= 1
    # Nothing reached PostgreSQL during the outage.
    assert (Transition.objects.count(), NodeHistory.objects.count(), GroupBaseline.objects.count()) == rows_before

    # PostgreSQL is back: the next tick drains the outbox first, then ticks normally.
    res = run_tick("g1", now=t0 + 12.5)
    assert res.version == versions[-1] + 1, "the version continues from what outage ticks published"
    assert ModelGroup.objects.get(name="g1").weights_version == res.version
    assert outage_store.outbox_length(redis_client, "g1") == 0
    assert Transition.objects.count() == rows_before[0] + expected_transitions + res.transitions
    assert Transition.objects.filter(node__name=SLOW, to_state="quarantined").count() == 1
    assert NodeHistory.objects.count() > rows_before[1]
    assert GroupBaseline.objects.count() > rows_before[2]
    # No row twice (natural keys).
    dup_t = Transition.objects.values("node", "at", "from_state", "to_state").annotate(n=Count("id")).filter(n__gt=1)
    dup_h = NodeHistory.objects.values("node", "signal", "at").annotate(n=Count("id")).filter(n__gt=1)
    assert not dup_t.exists() and not dup_h.exists()


def test_redrain_after_a_crash_between_commit_and_trim_writes_nothing_twice(redis_client):
    rng = np.random.default_rng(5)
    t0 = time.time()
    recs = make_records(t0, rng=rng)
    submit([(i + 1, r, None) for i, r in enumerate(recs)], source="test")
    run_tick("g1", now=t0 + 0.5)
    with postgres_down():
        redis_client.xadd(keys.stream("g1"), {"rows": orjson.dumps(_rows(make_records(t0 + 20, rng=rng)))})
        assert run_tick("g1", now=t0 + 20.5) is not None  # new history slot: every node's rows outboxed
    items = redis_client.lrange(keys.outbox("g1"), 0, -1)
    assert len(items) == 1
    group = ModelGroup.objects.get(name="g1")
    first = outage_store.drain(redis_client, group)
    assert first == len(orjson.loads(items[0])["rows"]) > 0
    history = NodeHistory.objects.count()
    # The crash: the same item is still in the list after the commit.
    redis_client.rpush(keys.outbox("g1"), items[0])
    assert outage_store.drain(redis_client, group) == 0
    assert NodeHistory.objects.count() == history
    assert outage_store.outbox_length(redis_client, "g1") == 0


def test_approval_policy_proposal_opened_during_outage_is_created_once(redis_client):
    from outlier_admin.control.actions import do_set_group_policy

    rng = np.random.default_rng(2)
    t0 = time.time()
    recs = make_records(t0, rng=rng)
    submit([(i + 1, r, None) for i, r in enumerate(recs)], source="test")
    do_set_group_policy(ModelGroup.objects.get(name="g1"), "approval", actor="test", reason="needs a human")
    run_tick("g1", now=t0 + 0.5)
    with postgres_down():
        for k in range(1, 10):
            recs = make_records(t0 + k, rng=rng, slow={3: 3.0})
            redis_client.xadd(keys.stream("g1"), {"rows": orjson.dumps(_rows(recs))})
            res = run_tick("g1", now=t0 + k + 0.5)
    assert res.states[SLOW] == "pending_approval"
    assert res.weights[SLOW] > 0, "approval policy: not taken out without a human"
    run_tick("g1", now=t0 + 10.5)
    assert QuarantineProposal.objects.filter(node__name=SLOW, status="pending").count() == 1


def test_a_group_never_ticked_with_postgres_up_is_skipped_not_crashed(redis_client):
    with postgres_down():
        assert run_tick("never-seen") is None


def test_postgres_failing_during_the_sql_write_keeps_the_rows_and_applies_inputs_once(redis_client, monkeypatch):
    """The outage starts inside a normal tick, after the publish and the state store: that tick's
    transitions and history go to the outbox, the override it applied is not applied again."""
    from outlier_admin.control.actions import do_quarantine
    from outlier_admin.control.models import Override
    from outlier_admin.fleet.models import Node

    rng = np.random.default_rng(3)
    t0 = time.time()
    recs = make_records(t0, rng=rng)
    submit([(i + 1, r, None) for i, r in enumerate(recs)], source="test")
    run_tick("g1", now=t0 + 0.5)
    node = Node.objects.get(name=SLOW)
    do_quarantine(node, actor="alice", reason="drain for maintenance")
    transitions_before = Transition.objects.count()

    outage = postgres_down()
    real_store = outage_store.store_snapshot

    def store_then_fail(pipe, group, nodes, **kw):  # the state MULTI is queued: PostgreSQL goes away now
        real_store(pipe, group, nodes, **kw)
        outage.__enter__()

    monkeypatch.setattr(outage_store, "store_snapshot", store_then_fail)
    from detector.group import GroupDetector

    forced: list[str] = []
    real_force = GroupDetector.force_quarantine

    def counting_force(self, name, *a, **kw):
        forced.append(name)
        return real_force(self, name, *a, **kw)

    monkeypatch.setattr(GroupDetector, "force_quarantine", counting_force)
    try:
        res = run_tick("g1", now=t0 + 20.5)
    finally:
        outage.__exit__(None, None, None)
    monkeypatch.setattr(outage_store, "store_snapshot", real_store)
    assert res is not None and res.states[SLOW] == "forced_quarantine" and res.transitions >= 1
    assert read_weights("g1")["version"] == res.version
    assert outage_store.outbox_length(redis_client, "g1") == 1
    assert Override.objects.get().applied_at is None  # the write failed with the rest

    res2 = run_tick("g1", now=t0 + 21.5)  # drains, then ticks: the override must not be applied twice
    assert Override.objects.get().applied_at is not None
    assert forced == [SLOW], "the operator's override was applied exactly once"
    assert res2.states[SLOW] == "forced_quarantine"
    assert Transition.objects.count() == transitions_before + res.transitions + res2.transitions
    assert Transition.objects.filter(node__name=SLOW, to_state="forced_quarantine").count() == 1


def _scrape(client) -> dict[tuple[str, tuple], float]:
    from prometheus_client.parser import text_string_to_metric_families

    resp = client.get("/metrics")
    assert resp.status_code == 200, resp.status_code
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for fam in text_string_to_metric_families(resp.content.decode()) for s in fam.samples}


def test_api_and_dashboard_answer_503_with_retry_after_and_metrics_keep_the_event_series(client, redis_client):
    """During the outage: the API (bearer token, session) and the dashboard (a page, a sign-in) answer
    503 with ``Retry-After`` (not 500); ``/metrics`` answers 200 with the ingest counters and the Redis-derived
    weights gauges, without the SQL-backed series, and says so (``outlier_metrics_sql_up 0``)."""
    from django.contrib.auth.models import User
    from django.test import Client

    from outlier_admin.control.actions import do_create_token

    # A superuser: the roles' groups made by the migrations do not survive the flush of earlier
    # transactional tests, and which role does not matter while nothing can be read.
    user = User.objects.create_superuser("ops", password="pw-ops-long-enough")
    _, api_token = do_create_token(name="ops-cli", scope="api", actor="test", user=user)
    _, ingest_token = do_create_token(name="gw-outage", scope="ingest", actor="test")
    t0 = time.time()
    recs = make_records(t0, rng=np.random.default_rng(7))
    resp = client.post("/api/v1/ingest/requests", data=orjson.dumps(recs), content_type="application/json",
                       HTTP_AUTHORIZATION=f"Bearer {ingest_token}")
    assert resp.status_code == 200 and resp.json()["accepted"] == 8 * 40
    assert run_tick("g1", now=t0 + 0.5) is not None  # publishes a weights document, registers g1 in Redis
    version = read_weights("g1")["version"]
    up = _scrape(client)
    accepted_key = ("outlier_ingest_records_total", (("result", "accepted"), ("source", "http")))
    assert up[("outlier_metrics_sql_up", ())] == 1 and up[accepted_key] >= 8 * 40
    assert ("outlier_group_nodes", (("group", "g1"), ("state", "warming"))) in up
    dashboard = Client()
    dashboard.force_login(user)

    with postgres_down():
        api = client.get("/api/v1/groups/", HTTP_AUTHORIZATION=f"Bearer {api_token}")
        by_session = dashboard.get("/api/v1/nodes/")
        anonymous = client.get("/api/v1/transitions/")
        page = dashboard.get("/")
        sign_in = Client().post("/accounts/login/", {"username": "ops", "password": "pw-ops-long-enough"})
        down = _scrape(client)

    # Nothing to look up without credentials: refused as usual, without SQL.
    assert anonymous.status_code in (401, 403)
    for resp in (api, by_session):
        assert resp.status_code == 503 and resp["Retry-After"] == "5"  # outage.RETRY_AFTER_S
        body = resp.json()  # the API's RFC 9457 problem: one sentence in "detail", a code in "errors"
        assert resp["Content-Type"] == "application/problem+json"
        assert body["errors"][0]["code"] == "database_unavailable" and "database is unavailable" in body["detail"]
        assert body["retry_after_s"] == 5
    for resp in (page, sign_in):
        assert resp.status_code == 503 and resp["Retry-After"] == "5"
        assert resp["Content-Type"].startswith("text/html") and b"Database unavailable" in resp.content
    assert down[("outlier_metrics_sql_up", ())] == 0
    assert down[accepted_key] == up[accepted_key], "the ingest counters are still served"
    assert down[("outlier_weights_version", (("group", "g1"),))] == version, "Redis-derived gauges too"
    assert not [k for k in down if k[0] in ("outlier_node_state", "outlier_group_nodes", "outlier_node_weight")]

    # PostgreSQL is back: the same requests are served again, nothing to restart.
    assert client.get("/api/v1/groups/", HTTP_AUTHORIZATION=f"Bearer {api_token}").status_code == 200
    assert dashboard.get("/").status_code == 200
    assert _scrape(client)[("outlier_metrics_sql_up", ())] == 1
