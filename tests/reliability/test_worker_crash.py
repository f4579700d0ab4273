"""A worker killed (SIGKILL, a real process) in the middle of a tick: the group's lock expires,
another worker takes over, the stream's pending entries are reclaimed, no sample is counted twice.
Also: duplicate deliveries and out-of-order timestamps are counted once / handled on purpose."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from django.db import connection

from detector import GroupDetector
from outlier_admin.control.redis_conn import lock_key, state_key, stream_key
from outlier_admin.control.tick import CONSUMER_GROUP, run_tick
from outlier_admin.ingest.pipeline import submit
from tests.outlier_admin.helpers import make_records

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.services, pytest.mark.timeout(60)]
ROOT = Path(__file__).resolve().parents[2]
LEASE_MS = 1000

# Run one tick in a separate process and SIGKILL it at ``die_at`` (a patched function): the process
# holds the group lock and has read the stream entries, exactly as a worker killed mid-tick.
DOOMED = """
import os, signal, sys, django
django.setup()
import redis
from outlier_admin.control import publish, tick
def die(*a, **k):
    os.kill(os.getpid(), signal.SIGKILL)
if sys.argv[1] == "before_publish":
    publish.publish_weights = die          # decided, nothing stored yet
else:
    redis.Redis.xack = die                 # state and SQL committed, entries not acknowledged
tick.run_tick("g1", now=float(sys.argv[2]), consumer="doomed-worker")
"""


def _feed(t: float, rng: np.random.Generator, **kw) -> int:
    recs = make_records(t, rng=rng, **kw)
    assert submit([(i + 1, r, None) for i, r in enumerate(recs)], source="test").accepted == len(recs)
    return len(recs)


def _kill_mid_tick(where: str, now: float, settings) -> None:
    db = connection.settings_dict
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "outlier_admin.settings", "REDIS_URL": settings.REDIS_URL,
           "DATABASE_URL": f"postgres://{db['USER']}@{db['HOST']}:{db['PORT']}/{db['NAME']}",
           "TICK_LOCK_TTL_MS": str(LEASE_MS)}
    proc = subprocess.run([sys.executable, "-c", DOOMED, where, str(now)], cwd=ROOT, env=env, timeout=30)
    assert proc.returncode == -9, "the worker must have been killed mid-tick"


def _applied_samples(redis_client) -> int:
    gd = GroupDetector.from_bytes(redis_client.hget(state_key("g1"), "detector"))
    return int(gd.evaluate(time.time()).counts.sum())


@pytest.mark.parametrize("where", ["before_publish", "before_ack"])
def test_killed_worker_lock_expires_entries_reclaimed_counted_once(redis_client, settings, where):
    settings.TICK_LOCK_TTL_MS = LEASE_MS
    rng = np.random.default_rng(9)
    t0 = time.time()
    fed = _feed(t0, rng)
    first = run_tick("g1", now=t0 + 0.5)
    assert first.samples == fed
    fed += _feed(t0 + 1, rng)

    _kill_mid_tick(where, t0 + 1.5, settings)
    assert redis_client.exists(lock_key("g1")), "the dead worker's lock is still held"
    pending = redis_client.xpending(stream_key("g1"), CONSUMER_GROUP)
    assert pending["pending"] == 1 and pending["consumers"][0]["name"] == b"doomed-worker"
    assert run_tick("g1", now=t0 + 1.6, consumer="survivor") is None, "lock held: the tick is skipped"

    time.sleep(LEASE_MS / 1000 + 0.2)  # the lease expires; the survivor takes over
    res = run_tick("g1", now=t0 + 2.5, consumer="survivor")
    assert res is not None
    # Killed before storing state: the survivor applies the entry. Killed after: it only acks it.
    assert res.samples == (fed - first.samples if where == "before_publish" else 0)
    assert redis_client.xpending(stream_key("g1"), CONSUMER_GROUP)["pending"] == 0
    assert redis_client.xlen(stream_key("g1")) == 0
    assert _applied_samples(redis_client) == fed, "every sample applied exactly once"


def test_duplicate_deliveries_are_counted_once(redis_client, client, ingest_token):
    rng = np.random.default_rng(1)
    recs = make_records(time.time(), rng=rng, nodes=4, per_node=10)
    for i, r in enumerate(recs):
        r["request_id"] = f"req-{i}"
    body = recs + recs[:5]  # a gateway retry inside one batch
    first = client.post("/api/v1/ingest/requests", data=body, content_type="application/json",
                        HTTP_AUTHORIZATION=f"Bearer {ingest_token}").json()
    again = client.post("/api/v1/ingest/requests", data=recs, content_type="application/json",
                        HTTP_AUTHORIZATION=f"Bearer {ingest_token}").json()
    assert (first["accepted"], first["duplicates"]) == (40, 5)
    assert (again["accepted"], again["duplicates"]) == (0, 40)
    assert run_tick("g1").samples == 40


def test_out_of_order_and_late_samples_are_handled_on_purpose(redis_client, settings):
    """Within the retention window a late sample is applied (the EMA is order-insensitive at this
    scale); older than ``INGEST_RETENTION_S`` or beyond ``INGEST_MAX_FUTURE_S`` it is rejected and
    stored with its reason."""
    from outlier_admin.ingest.models import RejectedInput

    now = time.time()
    rng = np.random.default_rng(2)
    recs = make_records(now, rng=rng, nodes=4, per_node=10)
    recs.reverse()  # newest first
    recs[0] = {**recs[0], "ts": now - 120}  # two minutes late: kept
    late = {**recs[1], "ts": now - settings.INGEST_RETENTION_S - 60}
    future = {**recs[2], "ts": now + settings.INGEST_MAX_FUTURE_S + 60}
    items = [(i + 1, r, None) for i, r in enumerate([*recs, late, future])]
    out = submit(items, source="test", now=now)
    assert out.accepted == 40 and out.rejected == 2
    reasons = set(RejectedInput.objects.values_list("reason", flat=True))
    assert len(reasons) == 2 and all(reasons)
    assert run_tick("g1", now=now + 0.5).samples == 40
