"""Redis restarted mid-ingest (a private redis-server, never the shared one): the ingest endpoint
answers 503 + Retry-After instead of accepting and dropping; gateways keep the last good weights and
then fall back to base weights once the document is stale; ticks resume; after recovery the
accounting balances: records accepted = samples processed by ticks, and every refused body was
accepted on retry."""

from __future__ import annotations

import time

import numpy as np
import orjson
import pytest
import redis

from agent.client import MODE_FAIL_OPEN, MODE_LIVE, GatewayClient
from harness.records import make_records
from outlier_admin.control.tick import run_tick

pytestmark = [pytest.mark.django_db, pytest.mark.services, pytest.mark.timeout(60)]
URL = "/api/v1/ingest/requests"


def _post(client, token: str, records: list[dict]):
    return client.post(URL, data=orjson.dumps(records), content_type="application/json",
                       HTTP_AUTHORIZATION=f"Bearer {token}")


def test_ingest_refuses_while_redis_is_down_and_nothing_is_lost(client, ingest_token, private_redis, settings,
                                                                make_group):
    make_group("g1")
    rng = np.random.default_rng(4)
    t0 = time.time()
    sent = accepted = rejected = processed = 0
    refused_bodies: list[list[dict]] = []

    batch = make_records(t0, rng=rng)
    batch.append({"node": "127.0.0.1:9000", "group": "g1", "ts": "not a time", "total_ms": 5})  # one bad record
    resp = _post(client, ingest_token, batch)
    assert resp.status_code == 200
    sent += len(batch)
    accepted += resp.json()["accepted"]
    rejected += resp.json()["rejected"]
    processed += run_tick("g1", now=t0 + 0.5).samples
    # Accepted but not yet ticked when Redis goes away: must survive the restart.
    batch = make_records(t0 + 1, rng=rng)
    resp = _post(client, ingest_token, batch)
    sent += len(batch)
    accepted += resp.json()["accepted"]

    gateway = GatewayClient.from_url(private_redis.url, "g1")
    assert gateway.refresh()
    last_good = gateway.effective(now=t0 + 1)
    assert last_good.mode == MODE_LIVE

    private_redis.stop()
    for k in range(3):
        body = make_records(t0 + 2 + k, rng=rng)
        resp = _post(client, ingest_token, body)
        assert resp.status_code == 503, resp.content
        assert int(resp["Retry-After"]) > 0
        assert "retry" in resp.json()["detail"]
        refused_bodies.append(body)
    # The gateway keeps the last good document while it is fresh, then falls back to base weights.
    assert gateway.refresh() is False and gateway.stats.redis_errors == 1
    assert gateway.effective(now=t0 + 2).version == last_good.version
    assert gateway.effective(now=t0 + 2).mode == MODE_LIVE
    stale = gateway.effective(now=t0 + 0.5 + settings.WEIGHTS_STALE_AFTER_S + 1)
    assert stale.mode == MODE_FAIL_OPEN
    assert all(n.weight == n.base_weight for n in stale.nodes)
    # A tick during the outage fails loudly (no lock, no state) and publishes nothing half-done.
    with pytest.raises(redis.exceptions.ConnectionError):  # the injected fault's kind (or a subclass), no other
        run_tick("g1", now=t0 + 3)

    private_redis.start()
    for body in refused_bodies:  # the client retries what was refused
        resp = _post(client, ingest_token, body)
        assert resp.status_code == 200
        sent += len(body)
        accepted += resp.json()["accepted"]
    res = run_tick("g1", now=t0 + 6)
    assert res is not None and res.version > last_good.version, "ticks resume, version monotonic"
    processed += res.samples
    while (res := run_tick("g1", now=t0 + 6.5)).samples:
        processed += res.samples

    assert rejected == 1
    assert sent == accepted + rejected
    assert processed == accepted, "every accepted record was processed exactly once"
    assert gateway.refresh() and gateway.effective(now=t0 + 6.5).version == res.version
