"""End to end on real PostgreSQL + Redis + a real ``celery -A outlier_admin worker --beat``:
HTTP push -> stream -> beat-driven ticks -> weights in Redis; release; surge."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import orjson
import pytest
from django.db import connection

from contract import keys
from harness.records import make_records
from outlier_admin.control.actions import do_release
from outlier_admin.fleet.models import Node

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.services, pytest.mark.slow]
ROOT = Path(__file__).resolve().parents[3]
SLOW = "127.0.0.1:9003"


@pytest.fixture
def worker(redis_client, settings, tmp_path):
    db = connection.settings_dict
    env = {
        **os.environ,
        "DATABASE_URL": f"postgres://{db['USER']}@{db['HOST']}:{db['PORT']}/{db['NAME']}",
        "REDIS_URL": settings.REDIS_URL,
        "TICK_INTERVAL_MS": "500",
    }
    proc = subprocess.Popen(
        [sys.executable, "-m", "celery", "-A", "outlier_admin", "worker", "--beat", "--pool", "solo",
         "--loglevel", "WARNING", "-s", str(tmp_path / "beat-schedule")],
        cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    yield proc
    proc.terminate()
    proc.wait(timeout=10)


def doc(redis_client, group):
    raw = redis_client.get(keys.weights(group))
    return None if raw is None else {n["node"]: n for n in orjson.loads(raw)["nodes"]}


def push(client, token, records):
    resp = client.post("/api/v1/ingest/requests", data=orjson.dumps(records), content_type="application/json",
                       HTTP_AUTHORIZATION=f"Bearer {token}")
    assert resp.status_code == 200 and resp.json()["rejected"] == 0


def wait_for(predicate, timeout_s, feed=None):
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        if feed:
            feed()
        if predicate():
            return True
        time.sleep(0.5)
    return False


def test_slow_node_out_release_and_surge(client, ingest_token, redis_client, worker, make_group):
    make_group("e2e")
    make_group("surge")
    rng = np.random.default_rng(5)

    def feed_gray():
        push(client, ingest_token, make_records(time.time(), group="e2e", slow={3: 3.0}, per_node=20, rng=rng))

    # Healthy start, so the group and its nodes exist before the node turns gray.
    push(client, ingest_token, make_records(time.time(), group="e2e", per_node=20, rng=rng))
    assert wait_for(lambda: doc(redis_client, "e2e") is not None, 15), "no tick published within 15 s"
    assert wait_for(lambda: doc(redis_client, "e2e")[SLOW]["state"] == "quarantined", 15, feed_gray)
    assert doc(redis_client, "e2e")[SLOW]["weight"] == 0

    do_release(Node.objects.get(group__name="e2e", name=SLOW), actor="oncall", reason="fixed")
    assert wait_for(lambda: doc(redis_client, "e2e")[SLOW]["weight"] == 100, 10)

    def feed_surge():
        push(client, ingest_token, make_records(time.time(), group="surge", scale=3.0, per_node=20, rng=rng))

    push(client, ingest_token, make_records(time.time(), group="surge", per_node=20, rng=rng))
    assert wait_for(lambda: doc(redis_client, "surge") is not None, 10)
    wait_for(lambda: False, 4, feed_surge)
    assert all(n["weight"] > 0 for n in doc(redis_client, "surge").values())
