"""The tick on real PostgreSQL + Redis: slow node out, manual release, surge, weights contract."""

from __future__ import annotations

import time

import numpy as np
import orjson
import pytest

from contract import keys
from detector.signals import SIGNALS
from harness.records import make_records
from outlier_admin.control.actions import do_release, do_set_group_policy
from outlier_admin.control.models import AuditEvent, NodeHistory, Transition
from outlier_admin.control.publish import read_weights
from outlier_admin.control.tick import run_tick
from outlier_admin.fleet.models import ModelGroup, Node
from outlier_admin.ingest.pipeline import submit

pytestmark = [pytest.mark.django_db, pytest.mark.services]
SLOW = "127.0.0.1:9003"


@pytest.fixture(autouse=True)
def g1(make_group):
    return make_group("g1")


def feed(t: float, rng: np.random.Generator, **kw) -> None:
    recs = make_records(t, rng=rng, **kw)
    out = submit([(i + 1, r, None) for i, r in enumerate(recs)], source="test")
    assert out.accepted == len(recs)


def test_slow_node_is_quarantined_and_release_restores_it(redis_client):
    rng = np.random.default_rng(7)
    t0 = time.time()
    states = []
    for k in range(8):
        feed(t0 + k, rng, slow={3: 3.0} if k >= 3 else {})
        res = run_tick("g1", now=t0 + k + 0.5)
        states.append(res.states[SLOW])
    assert states[:3] == ["healthy"] * 3
    assert states[-1] == "quarantined"
    doc = read_weights("g1")
    by_node = {n["node"]: n for n in doc["nodes"]}
    assert by_node[SLOW] == {"node": SLOW, "address": SLOW, "weight": 0, "state": "quarantined", "base_weight": 100}
    assert all(n["weight"] == 100 for name, n in by_node.items() if name != SLOW)
    quarantine = Transition.objects.get(node__name=SLOW, to_state="quarantined")
    assert quarantine.explanation["to_state"] == "quarantined" and quarantine.reason
    assert Node.objects.get(name=SLOW).state == "quarantined"
    # The evidence that gated the weight cut is on the history rows of one signal, the deciding one:
    # decode, once every node has its 5 samples of it (1.25 s of pooled requests: the first two ticks
    # decide on norm).
    with_evidence = NodeHistory.objects.filter(node__group__name="g1", evidence__isnull=False)
    for at in with_evidence.values_list("at", flat=True).distinct():
        assert with_evidence.filter(at=at).values_list("signal", flat=True).distinct().count() == 1
    cut_at = Transition.objects.get(node__name=SLOW, to_state="degraded").at
    assert set(with_evidence.filter(at__gte=cut_at).values_list("signal", flat=True)) == {"decode"}
    assert max(with_evidence.filter(node__name=SLOW).values_list("evidence", flat=True)) > 0

    do_release(Node.objects.get(name=SLOW), actor="alice", reason="GPU swapped")
    res = run_tick("g1", now=t0 + 8.5)
    assert res.states[SLOW] == "healthy" and res.weights[SLOW] == 100
    assert read_weights("g1")["version"] == res.version
    assert AuditEvent.objects.filter(action="node.release", actor="alice").count() == 1


def test_surge_of_all_nodes_quarantines_nobody(redis_client):
    rng = np.random.default_rng(3)
    t0 = time.time()
    for k in range(10):
        feed(t0 + k, rng, scale=1.0 if k < 3 else 3.0)
        res = run_tick("g1", now=t0 + k + 0.5)
    # Transient degradation from noise is allowed; taking a node out of service is not.
    assert set(res.states.values()) <= {"healthy", "degraded"}
    assert not Transition.objects.filter(to_state__in=["quarantined", "pending_approval", "probing"]).exists()
    assert all(w > 0 for w in res.weights.values())


def test_weights_document_and_notification(redis_client):
    pubsub = redis_client.pubsub()
    pubsub.subscribe(keys.LEGACY_WEIGHTS_CHANNEL)
    pubsub.get_message(timeout=1)  # subscribe confirmation
    feed(time.time(), np.random.default_rng(1), nodes=4)
    res = run_tick("g1")
    raw = redis_client.get(keys.weights("g1"))
    doc = orjson.loads(raw)
    assert set(doc) == {"group", "version", "generated_at", "stale_after_s", "safeguard", "nodes"}
    assert doc["group"] == "g1" and doc["version"] == res.version == 1
    assert all(isinstance(n["weight"], int) for n in doc["nodes"]) and len(doc["nodes"]) == 4
    # Pub/sub channels span Redis databases: other test runs' groups (a "g1" too) share this server.
    deadline, notes = time.time() + 2, []
    while {"group": "g1", "version": 1} not in notes and time.time() < deadline:
        if (msg := pubsub.get_message(timeout=0.2)) is not None:
            notes.append(orjson.loads(msg["data"]))
    assert {"group": "g1", "version": 1} in notes
    assert run_tick("g1").version == 2  # monotonic, one per publish
    # the tick wrote one history row per node and signal (first slot)
    assert NodeHistory.objects.filter(node__group__name="g1").count() == 4 * len(SIGNALS)
    pubsub.close()


def test_entries_are_acked_and_never_applied_twice(redis_client):
    feed(time.time(), np.random.default_rng(2), nodes=4, per_node=10)
    first = run_tick("g1")
    assert first.samples == 40
    assert first.checkpoint  # a first tick serialises the detector: its entries are deleted
    assert redis_client.xlen(keys.stream("g1")) == 0
    assert run_tick("g1").samples == 0


def test_between_checkpoints_entries_stay_as_the_log_and_a_new_process_replays_them(redis_client):
    """A tick that does not checkpoint acknowledges its entries and keeps them in the stream; a
    process without this one's copy of the detector (``_HELD`` cleared: another worker, a restart)
    restores the checkpoint and replays them, so every sample counts exactly once."""
    from outlier_admin.control import tick
    from outlier_admin.control.tick import _load_detector

    rng = np.random.default_rng(3)
    t0 = (time.time() // 10) * 10 - 20  # +0.5 .. +2.5 in one HISTORY_EVERY_S slot: no slot checkpoint
    feed(t0, rng, nodes=4, per_node=10)
    assert run_tick("g1", now=t0 + 0.5).checkpoint
    feed(t0 + 1, rng, nodes=4, per_node=10)
    second = run_tick("g1", now=t0 + 1.5)
    assert second.samples == 40 and not second.checkpoint
    assert redis_client.xpending(keys.stream("g1"), "ticks")["pending"] == 0
    assert redis_client.xlen(keys.stream("g1")) == 1  # acknowledged, kept until the next checkpoint
    tick._HELD.clear()
    gd, _, _ = _load_detector(redis_client, ModelGroup.objects.get(name="g1"), t0 + 2)
    assert gd.accepted_total == 80
    feed(t0 + 2, rng, nodes=4, per_node=10)
    tick._HELD.clear()
    third = run_tick("g1", now=t0 + 2.5)  # restores the checkpoint, replays entry 2, reads entry 3
    assert third.checkpoint and third.samples == 80
    gd, _, _ = _load_detector(redis_client, ModelGroup.objects.get(name="g1"), t0 + 3)
    assert gd.accepted_total == 120 and redis_client.xlen(keys.stream("g1")) == 0


def test_shadow_policy_publishes_base_weights_but_records_decisions(redis_client):
    rng = np.random.default_rng(7)
    t0 = time.time()
    feed(t0, rng)
    run_tick("g1", now=t0 + 0.5)
    do_set_group_policy(ModelGroup.objects.get(name="g1"), "shadow", actor="bob", reason="trial")
    for k in range(1, 8):
        feed(t0 + k, rng, slow={3: 3.0})
        res = run_tick("g1", now=t0 + k + 0.5)
    assert res.weights[SLOW] == 100
    assert {n["state"] for n in read_weights("g1")["nodes"]} == {"healthy"}
    row = Transition.objects.filter(node__name=SLOW, to_state="quarantined").get()
    assert row.shadow and row.explanation["published"] is False


def test_a_held_lock_skips_the_tick(redis_client, settings):
    feed(time.time(), np.random.default_rng(2), nodes=4, per_node=10)
    redis_client.set(keys.tick_lock("g1"), b"someone-else", px=5000)
    assert run_tick("g1") is None
    redis_client.delete(keys.tick_lock("g1"))
    assert run_tick("g1").samples == 40


def test_an_edited_base_weight_reaches_the_running_detector_and_the_document(redis_client):
    """The detector of a running group learns a node's new base weight at the next tick, not only
    when the node is first added: the document carries it and the node's weight is a share of it."""
    from outlier_admin.control.actions import do_update_node

    rng = np.random.default_rng(11)
    t0 = time.time()
    feed(t0, rng)
    run_tick("g1", now=t0 + 0.5)
    node = Node.objects.get(name=SLOW)
    do_update_node(node, {"base_weight": 40}, actor="alice", reason="smaller card")
    feed(t0 + 1, rng)
    res = run_tick("g1", now=t0 + 1.5)
    by_node = {n["node"]: n for n in read_weights("g1")["nodes"]}
    assert by_node[SLOW]["base_weight"] == 40 and res.weights[SLOW] == 40
    assert all(n["base_weight"] == 100 for name, n in by_node.items() if name != SLOW)
