"""agent.client: validation, ordering, fail static / fail open, real Redis pub/sub."""

from __future__ import annotations

import json
import threading
import time
from itertools import pairwise

import pytest
import redis
from hypothesis import given
from hypothesis import strategies as st

from agent.base import ApplyError
from agent.client import MODE_FAIL_OPEN, MODE_LIVE, GatewayClient, effective_weights
from contract.weights_document import DocumentError, check_document, parse_document, split_address
from harness.gateways import publish, weights_document

SERVERS = {"a": "127.0.0.1:8000", "b": "127.0.0.2:8000", "c": "[::1]:8001"}


def doc_json(**kw) -> str:
    return json.dumps(weights_document("g", kw.pop("version", 1), SERVERS, **kw))


def test_parse_valid_document():
    doc = parse_document(doc_json(quarantined=("b",), weights={"a": 35}, generated_at=1000.0))
    assert doc.group == "g" and doc.version == 1 and doc.generated_at == 1000.0
    by = {n.node: n for n in doc.nodes}
    assert (by["a"].weight, by["a"].quarantined) == (35, False)
    assert (by["b"].weight, by["b"].state, by["b"].quarantined) == (0, "quarantined", True)
    assert (by["c"].host, by["c"].port) == ("::1", 8001)


def test_document_without_base_weight_uses_default_scale():
    raw = json.dumps({"group": "g", "version": 3, "generated_at": 1.0, "stale_after_s": 30, "safeguard": False,
                      "nodes": [{"node": "x", "address": "127.0.0.9:80", "weight": 150, "state": "healthy"},
                                {"node": "y", "address": "127.0.0.8:80", "weight": 40, "state": "degraded"}]})
    by = {n.node: n for n in parse_document(raw).nodes}
    assert by["x"].base_weight == 150 and by["y"].base_weight == 100


@pytest.mark.parametrize(
    ("mutate", "reason"),
    [
        (lambda d: d.pop("version"), "missing field 'version'"),
        (lambda d: d.update(version=True), "version"),
        (lambda d: d.update(stale_after_s=0), "stale_after_s"),
        (lambda d: d.update(group="other"), "expected 'g'"),
        (lambda d: d.update(nodes={}), "nodes"),
        (lambda d: [n.update(weight=-1) for n in d["nodes"]], "no valid node"),
    ],
)
def test_parse_rejects_with_reason(mutate, reason):
    d = json.loads(doc_json())
    mutate(d)
    with pytest.raises(DocumentError, match=reason):
        parse_document(json.dumps(d), expected_group="g")


@pytest.mark.parametrize(
    ("mutate", "skipped", "reason"),
    [
        (lambda d: d["nodes"][0].update(weight=101), "a", "outside 0..100"),
        (lambda d: d["nodes"][0].update(weight=-1), "a", "outside 0..100"),
        (lambda d: d["nodes"][0].update(weight=33.5), "a", "not an integer"),
        (lambda d: d["nodes"][0].update(address="127.0.0.1"), "a", "not host:port"),
        (lambda d: d["nodes"][0].update(address="<script>alert('xss')</script>"), "a", "not host:port"),
        (lambda d: d["nodes"][0].update(address="127.0.0.1:8000;include /etc/passwd"), "a", "not host:port"),
        (lambda d: d["nodes"][0].update(address="http://127.0.0.1:8000"), "a", "not host:port"),
        (lambda d: d["nodes"][1].update(address="127.0.0.1:8000"), "b", "duplicate"),
    ],
)
def test_one_invalid_node_is_skipped_with_its_reason_and_the_rest_applied(mutate, skipped, reason, caplog):
    """Finding: one bad node (``<script>...`` published at weight 12) made the client refuse the whole
    group's document, so a quarantined node of that group kept its traffic. Now the node is skipped,
    with a logged reason, and the others are applied."""
    d = json.loads(doc_json(quarantined=("c",)))
    mutate(d)
    doc = parse_document(json.dumps(d), expected_group="g")
    names = {n.node for n in doc.nodes}
    assert names == {"a", "b", "c"} - {skipped}
    assert len(doc.skipped) == 1 and f"({skipped!r})" in doc.skipped[0] and reason in doc.skipped[0]
    client = GatewayClient(redis.Redis(), "g")
    with caplog.at_level("WARNING", logger="agent.client"):
        assert client.offer(json.dumps(d))
    assert client.effective(now=d["generated_at"]).nodes == doc.nodes
    assert client.stats.skipped_nodes == 1 and reason in caplog.text
    assert next(n for n in doc.nodes if n.node == "c").quarantined  # the quarantine still reaches gateways


def test_check_document_leaves_invalid_nodes_out_as_a_gateway_would():
    d = json.loads(doc_json())
    d["nodes"].append({"node": "bad", "address": "<script>alert('xss')</script>", "weight": 12, "state": "healthy",
                       "base_weight": 100})
    kept, skipped = check_document(d)
    assert [n["node"] for n in kept["nodes"]] == ["a", "b", "c"] and len(skipped) == 1 and "'bad'" in skipped[0]
    assert parse_document(json.dumps(kept)).skipped == ()
    with pytest.raises(DocumentError, match="stale_after_s"):
        check_document({**d, "stale_after_s": -1})


def test_parse_rejects_non_json():
    with pytest.raises(DocumentError, match="not JSON"):
        parse_document(b"{nope")


def test_fail_open_after_stale_after_s():
    doc = parse_document(doc_json(quarantined=("b",), weights={"a": 35}, generated_at=1000.0,
                                  stale_after_s=30, safeguard=True))
    live = effective_weights(doc, now=1030.0)  # exactly at the limit: still live
    assert live.mode == MODE_LIVE and live.safeguard
    assert [n.weight for n in live.nodes] == [35, 0, 100]
    stale = effective_weights(doc, now=1030.5)
    assert stale.mode == MODE_FAIL_OPEN and not stale.safeguard
    assert [(n.weight, n.state) for n in stale.nodes] == [(100, "ready")] * 3
    assert stale.age_s == pytest.approx(30.5)


def test_offer_keeps_newest_and_accepts_restamped_same_version():
    client = GatewayClient(redis.Redis(), "g")
    assert client.offer(doc_json(version=5, generated_at=100.0))
    assert not client.offer(doc_json(version=4, generated_at=200.0))  # older version, newer stamp
    assert client.document.version == 5
    assert client.offer(doc_json(version=5, generated_at=110.0))  # heartbeat re-stamp
    assert client.document.generated_at == 110.0
    assert not client.offer("garbage")
    assert client.stats.rejected_documents == 1 and client.document.version == 5


def test_refresh_from_real_redis(redis_client, group):
    client = GatewayClient(redis_client, group)
    assert client.refresh() is False and client.effective() is None  # no document yet
    publish(redis_client, weights_document(group, 7, SERVERS, quarantined=("a",)))
    assert client.refresh() is True
    eff = client.effective()
    assert eff.version == 7 and eff.mode == MODE_LIVE
    assert [n.weight for n in eff.nodes] == [0, 100, 100]


def test_unreachable_redis_keeps_last_good_then_fails_open(redis_client, group):
    now = [1000.0]
    client = GatewayClient(redis_client, group, clock=lambda: now[0])
    publish(redis_client, weights_document(group, 3, SERVERS, quarantined=("a",), generated_at=1000.0,
                                           stale_after_s=60))
    assert client.refresh()
    # Point the client at a port where nothing listens: every read fails from now on.
    client.redis_client = redis.Redis(host="127.0.0.1", port=1, socket_connect_timeout=0.5)
    now[0] = 1059.0
    assert client.refresh() is False
    assert client.stats.redis_errors == 1 and "ConnectionError" in client.stats.last_error
    eff = client.effective()
    assert eff.mode == MODE_LIVE and [n.weight for n in eff.nodes] == [0, 100, 100]  # fail static
    now[0] = 1061.0
    eff = client.effective()
    assert eff.mode == MODE_FAIL_OPEN and [n.weight for n in eff.nodes] == [100, 100, 100]  # fail open


def test_notification_filtering():
    client = GatewayClient(redis.Redis(), "g")
    client.offer(doc_json(version=5))
    assert client.notification_is_news(json.dumps({"group": "g", "version": 6}))
    assert not client.notification_is_news(json.dumps({"group": "other", "version": 99}))
    assert not client.notification_is_news(json.dumps({"group": "g", "version": 4}))
    assert client.notification_is_news(b"not json")  # unreadable: pull and see


def test_run_loop_reacts_to_pubsub_and_to_the_clock(redis_client, group):
    """The loop delivers a published version within a fraction of the poll interval, and delivers
    the fail-open transition when the document ages past stale_after_s without any message."""
    updates = []
    client = GatewayClient(redis_client, group, poll_interval_s=30.0)
    publish(redis_client, weights_document(group, 1, SERVERS, stale_after_s=1.5))
    stop = threading.Event()
    thread = threading.Thread(target=client.run, args=(updates.append, stop), daemon=True)
    thread.start()
    try:
        _wait(lambda: len(updates) >= 1)
        publish(redis_client, weights_document(group, 2, SERVERS, quarantined=("b",), stale_after_s=1.5))
        # Delivered while the next poll is 30 s away (the wait gives up after 3 s): only the
        # pub/sub notification can have brought it.
        _wait(lambda: any(u.version == 2 for u in updates))
        _wait(lambda: updates[-1].mode == MODE_FAIL_OPEN, timeout=4.0)
        assert [n.weight for n in updates[-1].nodes] == [100, 100, 100]
    finally:
        stop.set()
        thread.join(timeout=5)
    assert not thread.is_alive()


def test_run_loop_backs_off_while_the_same_weights_keep_failing(redis_client, group):
    """A gateway that is down is retried with exponential backoff, not at every heartbeat version; new
    weights are tried at once; a success resets the backoff."""
    calls: list[tuple[float, int]] = []
    healthy = threading.Event()

    def on_update(eff):
        calls.append((time.monotonic(), eff.version))
        if not healthy.is_set():
            raise ApplyError("gateway down")

    client = GatewayClient(redis_client, group, poll_interval_s=30.0)
    publish(redis_client, weights_document(group, 1, SERVERS))
    stop = threading.Event()
    thread = threading.Thread(target=client.run, args=(on_update, stop),
                              kwargs={"retry_backoff_s": 0.2, "max_retry_backoff_s": 0.8}, daemon=True)
    thread.start()
    try:
        t0 = time.monotonic()
        version = 1
        while time.monotonic() - t0 < 2.5:  # heartbeats: same weights, a new version every 20 ms
            version += 1
            publish(redis_client, weights_document(group, version, SERVERS))
            time.sleep(0.02)
        # Without backoff every heartbeat (~100) would be an attempt; with it: 0, 0.2, 0.6, 1.4, 2.2 s.
        assert 3 <= len(calls) <= 6, [round(t - t0, 2) for t, _ in calls]
        gaps = [b - a for (a, _), (b, _) in pairwise(calls)]
        assert gaps[0] >= 0.19 and gaps[1] >= 0.39 and all(g <= 2.0 for g in gaps)
        n = len(calls)
        publish(redis_client, weights_document(group, version + 1, SERVERS, quarantined=("b",)))  # new weights
        _wait(lambda: len(calls) > n, timeout=0.5)  # tried at once, not after the backoff
        healthy.set()
        _wait(lambda: calls[-1][1] == version + 1 and len(calls) >= n + 2, timeout=3.0)
    finally:
        stop.set()
        thread.join(timeout=5)


def _wait(cond, timeout: float = 3.0) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        if cond():
            return
        time.sleep(0.01)
    raise AssertionError("condition not reached in time")


@given(st.integers(0, 65535))
def test_split_address_port_range(port):
    if port == 0:
        with pytest.raises(DocumentError):
            split_address(f"h:{port}")
    else:
        assert split_address(f"h:{port}") == ("h", port)


def test_pending_approval_keeps_its_floor_weight_and_is_not_drained():
    """Finding: the detector publishes a node awaiting approval at the floor weight (kept sampled until a
    human decides), but the client treated ``pending_approval`` as a quarantine state, so HAProxy and
    nginx took the node out before anyone approved. One traffic table now decides both."""
    d = json.loads(doc_json())
    d["nodes"][1].update(state="pending_approval", weight=5)
    d["nodes"][2].update(state="a-state-from-a-newer-control-plane", weight=40)
    by = {n.node: n for n in parse_document(json.dumps(d)).nodes}
    assert (by["b"].weight, by["b"].quarantined) == (5, False)
    assert (by["c"].weight, by["c"].quarantined) == (40, False)  # an unknown label follows its weight
    for state in ("quarantined", "probing", "forced_quarantine"):
        d["nodes"][1].update(state=state, weight=5)
        assert {n.node: n for n in parse_document(json.dumps(d)).nodes}["b"].quarantined, state
