"""The Redis primary dies (``kill -9``) under load, with Sentinel: one primary, one replica, three
Sentinels, all real processes on loopback (tests/reliability/sentinel_cluster.py), the control plane on
``redis+sentinel://`` with ``REDIS_MIN_REPLICAS_ACK=1``.

Records come at a fixed rate through the real ingest path (the view, ``submit``, the replica
acknowledgement), each with a ``request_id``; a body answered 503 is sent again, as a shipper does.
Ticks run throughout, a gateway client polls. After the failover the dead node is started again as a
replica of the new primary (what an operator, or an orchestrator, does). Then: every record answered
200 is in the surviving detector exactly once (0 lost, 0 applied twice), documents kept being
published (the longest gap, well under ``stale_after_s``), versions never went back, and the gateway
client follows the new primary."""

from __future__ import annotations

import time

import numpy as np
import orjson
import pytest

from outlier_admin.control import redis_conn, tick
from outlier_admin.control.actions import do_register_node
from outlier_admin.control.tick import run_tick
from outlier_admin.fleet.models import ModelGroup
from outlier_admin.gateway_client import GatewayClient
from tests.outlier_admin.helpers import make_records
from tests.reliability.sentinel_cluster import sentinel_cluster  # noqa: F401 - the fixture

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.services, pytest.mark.slow,
              pytest.mark.timeout(90)]
URL = "/api/v1/ingest/requests"
BODY_EVERY_S = 0.1  # 10 bodies/s of 8 records: a fixed rate
TICK_EVERY_S = 0.25
LOAD_BEFORE_S = 2.0  # load before the kill
RESTART_AFTER_S = 1.0  # the dead node is back (as a replica) this long after the failover


def test_primary_killed_under_load_nothing_lost_nothing_twice(sentinel_cluster, settings, client,  # noqa: F811
                                                              ingest_token, make_group):
    from outlier_admin.ingest.pipeline import directory

    cluster = sentinel_cluster
    settings.REDIS_URL = cluster.url()
    settings.REDIS_MIN_REPLICAS_ACK, settings.REDIS_REPLICA_ACK_TIMEOUT_MS = 1, 300
    settings.TICK_LOCK_TTL_MS = 2000
    redis_conn.set_redis(None)
    redis_conn._local.__dict__.clear()
    directory.clear()
    tick._HELD.clear()
    group = make_group("g1")
    for i in range(4):
        do_register_node(group, f"127.0.0.1:{9000 + i}", actor="test")
    gateway = GatewayClient.from_url(cluster.url(), "g1")
    rng = np.random.default_rng(28)

    pending: list[list[dict]] = []  # bodies not yet answered 200 (retried in order)
    answered = accepted = duplicates = refused = 0
    ids: set[str] = set()
    seen_docs: list[tuple[float, int, float]] = []  # (wall time the gateway took it, version, generated_at)
    tick_errors = not_replicated = 0
    killed_at = failover_at = restarted_at = None
    old_primary = cluster.primary_port
    t_start = time.time()
    next_body = next_tick = t_start
    body_no = 0

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

    while True:
        now = time.time()
        if killed_at is None and now - t_start >= LOAD_BEFORE_S:
            cluster.kill_primary()
            killed_at = time.time()
        if killed_at is not None and failover_at is None:
            try:
                new_primary = cluster.wait_failover(old_primary, timeout_s=0.01)
                failover_at = time.time()
            except RuntimeError:
                pass
        if failover_at is not None and restarted_at is None and now - failover_at >= RESTART_AFTER_S:
            cluster.start_node(old_primary, replica_of=new_primary)  # back empty, as a replica
            restarted_at = time.time()
        load_until = (restarted_at or now + 1) + 1.0
        if now >= next_body and now < load_until:
            body = make_records(now, nodes=4, per_node=2, rng=rng)
            for k, rec in enumerate(body):
                rec["request_id"] = f"b{body_no}-{k}"
                ids.add(rec["request_id"])
            body_no += 1
            pending.append(body)
            next_body += BODY_EVERY_S
        while pending:  # oldest first; stop at the first refusal (the retry comes next turn)
            try:
                status = post(pending[0])
            except Exception:
                status = 599
            if status != 200:
                refused += 1
                break
            pending.pop(0)
        if now >= next_tick:
            try:
                res = run_tick("g1")
                if res is None:
                    not_replicated += 1  # lock held by a lost tick, or not confirmed by a replica
            except Exception:
                tick_errors += 1
            next_tick = time.time() + TICK_EVERY_S
        if gateway.refresh():
            seen_docs.append((time.time(), gateway.document.version, gateway.document.generated_at))
        if restarted_at is not None and now >= load_until and not pending:
            break
        assert now - t_start < 60, "the load did not finish"
        time.sleep(0.01)

    # Drain: tick until the stream holds nothing new for the detector.
    for _ in range(40):
        res = run_tick("g1")
        if res is not None and res.samples == 0 and res.entries == 0:
            break
        time.sleep(0.05)
    r = redis_conn.get_redis()
    tick._HELD.pop("g1", None)  # what Redis holds, not this process's copy
    gd = tick._load_detector(r, ModelGroup.objects.get(name="g1"), time.time())[0]

    assert killed_at and failover_at and restarted_at
    assert refused > 0, "the load met the failover (503s while no replica acknowledged)"
    assert answered == body_no, "every body was answered 200 in the end"
    # A body refused after the primary took it (the replica held it, the acknowledgement died with the
    # primary) comes back as duplicates on its retry: never counted twice, never missing.
    assert accepted <= len(ids) <= accepted + duplicates
    assert gd.accepted_total == len(ids), f"surviving detector holds {gd.accepted_total} of {len(ids)} records"
    # The gateway client follows the new primary and keeps taking documents.
    assert gateway.redis_client.connection_pool.get_master_address()[1] == new_primary
    assert seen_docs[-1][0] > restarted_at
    keys = [(v, g) for _, v, g in seen_docs]
    assert keys == sorted(keys), "(version, generated_at) never went back at the gateway"
    gaps = np.diff([t for t, _, _ in seen_docs] + [time.time()])
    longest = float(gaps.max())
    print(f"failover: promoted {failover_at - killed_at:.2f} s after the kill; longest gap between documents "
          f"{longest:.2f} s (stale_after_s {settings.WEIGHTS_STALE_AFTER_S}); {len(ids)} records, {refused} "
          f"refusals retried, {duplicates} duplicates on retry, {tick_errors} tick errors, {not_replicated} ticks "
          "dropped")
    assert longest < settings.WEIGHTS_STALE_AFTER_S / 3, longest
