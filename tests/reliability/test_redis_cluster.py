"""The control plane on a Redis Cluster of three primaries (real ``redis-server --cluster-enabled yes``
processes on loopback, harness/redis_cluster.py), ``REDIS_URL=redis+cluster://...``: a start-up
check that names what is wrong; ticks and ingest of groups whose slots sit on different primaries; a
gateway client that follows the weights through the sharded notification; and a resharding that moves a
group's slot to another primary while records arrive at a fixed rate and ticks run: every record answered
200 is in the detector exactly once (0 lost, 0 applied twice), the redirections were followed by redis-py
and counted."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import orjson
import pytest
from prometheus_client import generate_latest
from redis.exceptions import TryAgainError

from agent.base import ApplyResult
from agent.client import GatewayClient
from agent.core import Agent
from agent.metrics import make_registry
from contract import keys
from contract.topology import REDIRECTIONS, cluster_problem, is_cluster
from harness import redis_cluster
from harness.records import make_records
from harness.redis_cluster import RedisClusterProcs, slot_of
from outlier_admin.control import redis_conn, tick
from outlier_admin.control.actions import do_register_node
from outlier_admin.control.tick import run_tick
from outlier_admin.fleet.models import ModelGroup
from outlier_admin.observability.metrics import REDIS_REDIRECTIONS
from tests.outlier_admin.control.test_redis_sentinel import _settings_of

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.services, pytest.mark.slow,
              pytest.mark.timeout(120)]
URL = "/api/v1/ingest/requests"
BODY_EVERY_S = 0.1  # 10 bodies/s of 8 records: a fixed rate
TICK_EVERY_S = 0.25


@pytest.fixture
def cluster(tmp_path) -> Iterator[RedisClusterProcs]:
    if not redis_cluster.available():
        pytest.skip("redis-server / redis-cli not installed")
    procs = RedisClusterProcs(tmp_path)
    try:
        procs.start()
        yield procs
    finally:
        procs.stop()


@pytest.fixture
def on_cluster(cluster, settings) -> Iterator[RedisClusterProcs]:
    """The control plane's REDIS_URL is the cluster (this process's clients rebuilt)."""
    from outlier_admin.ingest.pipeline import directory

    settings.REDIS_URL = cluster.url()
    settings.TICK_LOCK_TTL_MS = 2000
    redis_conn.set_redis(None)
    redis_conn._local.__dict__.clear()
    directory.clear()
    tick._HELD.clear()
    yield cluster
    redis_conn._local.__dict__.clear()
    tick._HELD.clear()


class _Recorder:
    """A gateway that takes every apply (the agent's metrics need one)."""

    name = "recorder"

    def apply(self, weights: Any) -> ApplyResult:
        return ApplyResult(changes=[f"v{weights.version}"])

    def set_safeguard(self, active: bool) -> None:
        pass


def _groups_on_two_primaries(cluster: RedisClusterProcs) -> tuple[str, str]:
    """Two group names whose slots two different primaries serve."""
    first = "ga"
    owner = cluster.owner_of_slot(slot_of(keys.stream(first)))
    other = next(f"g{i}" for i in range(100) if cluster.owner_of_slot(slot_of(keys.stream(f"g{i}"))) != owner)
    return first, other


def _register(make_group, name: str, nodes: int = 4) -> ModelGroup:
    group = make_group(name)
    for i in range(nodes):
        do_register_node(group, f"127.0.0.1:{9000 + i}", actor="test")
    return group


def test_a_cluster_with_an_unreachable_or_foreign_node_is_named_at_start(cluster, tmp_path):
    assert cluster_problem(cluster.url()) is None
    started = time.monotonic()
    dead = cluster_problem(cluster.url() + ",127.0.0.1:1", timeout_s=1.0)
    assert dead is not None and "node 127.0.0.1:1 unreachable" in dead
    # A hang guard (loaded CI hosts): a wait for the connect timeout per retry would take minutes.
    assert time.monotonic() - started < 30, "an unreachable node is an error at once, not a hang"
    # The machine's own Redis is no cluster node: named as such.
    plain = cluster_problem("redis+cluster://127.0.0.1:6379")
    assert plain is not None and "127.0.0.1:6379 is not a cluster node" in plain
    assert "database 0" in cluster_problem("redis+cluster://127.0.0.1:6379/3")
    # The agent: one line naming the URL and why, exit 1, no traceback and no hang.
    agent = subprocess.run([sys.executable, "-m", "agent", "--gateway", "envoy", "--group", "g1",
                            "--envoy-eds-path", str(tmp_path / "eds.json"), "--once",
                            "--redis-url", "redis+cluster://127.0.0.1:1"], capture_output=True, text=True, timeout=60)
    assert agent.returncode == 1 and "Traceback" not in agent.stderr
    assert agent.stderr.strip() == ("--redis-url: redis+cluster://127.0.0.1:1: Redis Cluster cannot be connected. "
                                    "Please provide at least one reachable node: Error 111 connecting to "
                                    "127.0.0.1:1. Connection refused.")


def test_cluster_settings_and_what_a_process_refuses_to_start_with(cluster):
    nodes = ",".join(f"127.0.0.1:{p}" for p in cluster.ports)
    broker = {"CELERY_BROKER_URL": "redis://127.0.0.1:6379/8"}
    got = _settings_of({"REDIS_CLUSTER_NODES": nodes, **broker})
    assert got["REDIS_URL"] == f"redis+cluster://{nodes}" and got["CELERY_BROKER_URL"] == broker["CELERY_BROKER_URL"]
    no_broker = _settings_of({"REDIS_CLUSTER_NODES": nodes})
    assert "set CELERY_BROKER_URL" in no_broker["error"]
    wait = _settings_of({"REDIS_CLUSTER_NODES": nodes, "REDIS_MIN_REPLICAS_ACK": "1", **broker})
    assert "REDIS_MIN_REPLICAS_ACK is not supported with a Redis Cluster" in wait["error"]
    dead = _settings_of({"REDIS_URL": f"redis+cluster://{nodes},127.0.0.1:1", **broker})
    assert "control.E002" in dead["error"] and "node 127.0.0.1:1 unreachable" in dead["error"]


def test_ticks_ingest_and_a_gateway_on_a_cluster(on_cluster, make_group):
    from outlier_admin.ingest.pipeline import submit

    cluster = on_cluster
    ga, gb = _groups_on_two_primaries(cluster)
    for name in (ga, gb):
        _register(make_group, name)
    r = redis_conn.get_redis()
    assert is_cluster(r)
    t0 = time.time()
    rng = np.random.default_rng(3)
    records = make_records(t0, group=ga, nodes=4, per_node=10, rng=rng) + \
        make_records(t0, group=gb, nodes=4, per_node=10, rng=rng)
    for k, rec in enumerate(records):
        rec["request_id"] = f"r{k}"
    out = submit([(i + 1, rec, None) for i, rec in enumerate(records)], source="test")
    assert out.accepted == 80 and out.by_group == {ga: 40, gb: 40}
    again = submit([(i + 1, rec, None) for i, rec in enumerate(records[:10])], source="test")
    assert again.accepted == 0 and again.duplicates == 10, "request ids are de-duplicated per group on a cluster"

    gateway = GatewayClient.from_url(cluster.url(), gb, poll_interval_s=60.0)  # only a notification is fast
    seen: list[int] = []
    stop = threading.Event()
    watcher = threading.Thread(target=gateway.run, args=(lambda eff: seen.append(eff.version), stop), daemon=True)
    watcher.start()
    try:
        for name in (ga, gb):
            res = run_tick(name, now=t0 + 1)
            assert res is not None and res.samples == 40 and res.version == 1
        doc = orjson.loads(r.get(keys.weights(gb)))
        assert doc["group"] == gb and len(doc["nodes"]) == 4
        assert r.get(keys.legacy_weights(gb)) is None, "the legacy key is a single-Redis migration aid only"
        deadline = time.monotonic() + 5
        while 1 not in seen and time.monotonic() < deadline:
            time.sleep(0.02)
        assert 1 in seen
        res = run_tick(gb, now=t0 + 2)
        assert res is not None and res.version == 2
        deadline = time.monotonic() + 5
        while 2 not in seen and time.monotonic() < deadline:
            time.sleep(0.02)
        assert 2 in seen, "the sharded notification (SPUBLISH) reached the gateway before its 60 s poll"
    finally:
        stop.set()
        watcher.join(timeout=5)
    assert gateway.stats.rejected_documents == 0


def test_resharding_a_groups_slot_mid_load_loses_nothing_and_applies_nothing_twice(
        on_cluster, make_group, client, ingest_token):
    cluster = on_cluster
    group = "g1"
    _register(make_group, group)
    slot = slot_of(keys.stream(group))
    source = cluster.owner_of_slot(slot)
    target = next(p for p in cluster.ports if p != source)
    rng = np.random.default_rng(28)
    moved_before = dict(REDIRECTIONS)
    metric_before = sum(REDIS_REDIRECTIONS.labels(k)._value.get() for k in ("moved", "ask"))

    refusals: list[int] = []  # the status of every answer other than 200
    pending: list[list[dict]] = []  # bodies not yet answered 200 (retried in order, as a shipper does)
    answered = accepted = duplicates = refused = 0
    tick_errors: list[BaseException] = []  # every exception a tick raised (asserted: the migration's kind only)
    post_errors: list[BaseException] = []  # every exception an ingest call raised (asserted: none)
    ids: set[str] = set()
    body_no = 0
    moving: threading.Thread | None = None
    keys_moved: list[int] = []

    def post(body: list[dict]) -> int:
        nonlocal accepted, duplicates, answered
        resp = client.post(URL, data=orjson.dumps(body), content_type="application/json",
                           HTTP_AUTHORIZATION=f"Bearer {ingest_token}")
        if resp.status_code == 200:
            out = resp.json()
            accepted += out["accepted"]
            duplicates += out["duplicates"]
            answered += 1
        return resp.status_code

    # A gateway that hears of new versions only through the sharded notification (its poll is 60 s): Redis
    # ends its SSUBSCRIBE when the slot moves, and it must subscribe again on the new primary.
    gateway = GatewayClient.from_url(cluster.url(), group, poll_interval_s=60.0)
    seen: list[int] = []
    stop = threading.Event()
    watcher = threading.Thread(target=gateway.run, args=(lambda eff: seen.append(eff.version), stop), daemon=True)
    watcher.start()

    t_start = time.time()
    next_body = next_tick = t_start
    while True:
        now = time.time()
        if moving is None and now - t_start >= 1.5:  # reshard after 1.5 s of load, one key at a time
            moving = threading.Thread(
                target=lambda: keys_moved.append(cluster.move_slot(slot, target, batch=1, pause_s=0.3)))
            moving.start()
        if now >= next_body and now - t_start < 4.0:
            body = make_records(now, group=group, nodes=4, per_node=2, rng=rng)
            for k, rec in enumerate(body):
                rec["request_id"] = f"b{body_no}-{k}"
                ids.add(rec["request_id"])
            body_no += 1
            pending.append(body)
            next_body += BODY_EVERY_S
        while pending:
            try:
                status = post(pending[0])
            except Exception as exc:
                post_errors.append(exc)
                status = 599
            if status != 200:
                refused += 1
                refusals.append(status)
                break
            pending.pop(0)
        if now >= next_tick:
            try:
                run_tick(group)
            except Exception as exc:
                tick_errors.append(exc)
            next_tick = time.time() + TICK_EVERY_S
        if now - t_start >= 4.0 and not pending and moving is not None and not moving.is_alive():
            break
        assert now - t_start < 60, "the load did not finish"
        time.sleep(0.01)
    moving.join(timeout=30)

    for _ in range(40):  # drain
        res = run_tick(group)
        if res is not None and res.samples == 0 and res.entries == 0:
            break
        time.sleep(0.05)
    r = redis_conn.get_redis()
    tick._HELD.pop(group, None)  # what Redis holds, not this process's copy
    gd = tick._load_detector(r, ModelGroup.objects.get(name=group), time.time())[0]
    last = run_tick(group)
    deadline = time.monotonic() + 10
    while (not seen or seen[-1] < last.version) and time.monotonic() < deadline:
        time.sleep(0.05)
    stop.set()
    watcher.join(timeout=5)
    assert seen and seen[-1] == last.version, f"the gateway follows the document on the new primary: {gateway.stats}"

    assert cluster.owner_of_slot(slot) == target and keys_moved[0] >= 3, "the group's keys moved primaries"
    assert answered == body_no, "every body was answered 200 in the end"
    assert accepted <= len(ids) <= accepted + duplicates
    lost, twice = max(0, len(ids) - gd.accepted_total), max(0, gd.accepted_total - len(ids))
    redirections = {k: REDIRECTIONS[k] - moved_before[k] for k in REDIRECTIONS}
    metric = sum(REDIS_REDIRECTIONS.labels(k)._value.get() for k in ("moved", "ask")) - metric_before
    print(f"resharding: slot {slot} moved {source} -> {target} ({keys_moved[0]} keys) under load; records sent "
          f"{len(ids)}, accepted {accepted} (+{duplicates} duplicates on retry), applied {gd.accepted_total}, "
          f"lost {lost}, twice {twice}; {refused} refusals retried, {len(tick_errors)} tick errors; redirections "
          f"{redirections} (metric +{metric:.0f})")
    assert lost == 0 and twice == 0
    # A slot moving is no fault of a client that follows MOVED and ASK: no ingest call raised, and a tick
    # raised only what Redis answers a multi-key command while the slot's keys are split between two
    # nodes (TRYAGAIN; the next tick, 250 ms later, runs it again: nothing lost, nothing twice, above).
    assert post_errors == [], [repr(e) for e in post_errors]
    assert all(isinstance(e, TryAgainError) for e in tick_errors), [repr(e) for e in tick_errors]
    # The agent exports the redirections its process followed (its /metrics).
    text = generate_latest(make_registry(Agent(gateway, _Recorder()))).decode()
    for kind in ("moved", "ask"):
        assert f'outlier_agent_redis_redirections_total{{gateway="recorder",group="{group}",kind="{kind}"}} ' \
               f"{float(REDIRECTIONS[kind])}" in text
    assert set(refusals) <= {503}, "a slot in migration is storage unavailable (503, retry), not an error of ours"
    assert redirections["moved"] + redirections["ask"] > 0 and metric > 0, "redirections followed and counted"
