"""A worker killed (SIGKILL, a real process) in the middle of a tick: the group's lock expires,
another worker takes over, the stream's pending entries are reclaimed, no sample is counted twice —
and, with the default timing, the group publishes again long before its gateways fail open. The tick
lease is renewed while a tick runs, but not forever. Also: duplicate deliveries and out-of-order
timestamps are counted once / handled on purpose."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from django.db import connection

from contract import keys
from harness.records import make_records
from outlier_admin.control.actions import do_create_group, do_register_node
from outlier_admin.control.publish import read_weights
from outlier_admin.control.redis_conn import GroupLock
from outlier_admin.control.tick import CONSUMER_GROUP, run_tick
from outlier_admin.ingest.pipeline import submit
from tests.reliability.conftest import wait_for

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
    publish.queue_document = die           # decided, nothing stored yet (the fenced MULTI not sent)
else:
    redis.Redis.xack = die                 # state and SQL committed, entries not acknowledged
tick.run_tick("g1", now=float(sys.argv[2]), consumer="doomed-worker")
"""


def _group(name: str, nodes: int) -> None:
    """Ingest accepts records only for a group an operator created, from its registered nodes."""
    group = do_create_group(name, actor="test")
    for i in range(nodes):
        do_register_node(group, f"127.0.0.1:{9000 + i}", actor="test")


@pytest.fixture
def g1(db) -> None:
    _group("g1", nodes=8)


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
    """Samples in the stored detector: its checkpoint plus the entries applied since (replayed)."""
    from outlier_admin.control import tick
    from outlier_admin.fleet.models import ModelGroup

    tick._HELD.pop("g1", None)  # what Redis holds, not this process's copy
    gd = tick._load_detector(redis_client, ModelGroup.objects.get(name="g1"), time.time())[0]
    return int(gd.evaluate(time.time()).counts.sum())


@pytest.mark.parametrize("where", ["before_publish", "before_ack"])
def test_killed_worker_lock_expires_entries_reclaimed_counted_once(redis_client, settings, g1, where):
    settings.TICK_LOCK_TTL_MS = LEASE_MS
    rng = np.random.default_rng(9)
    t0 = time.time()
    fed = _feed(t0, rng)
    first = run_tick("g1", now=t0 + 0.5)
    assert first.samples == fed
    fed += _feed(t0 + 1, rng)

    _kill_mid_tick(where, t0 + 1.5, settings)
    assert redis_client.exists(keys.tick_lock("g1")), "the dead worker's lock is still held"
    pending = redis_client.xpending(keys.stream("g1"), CONSUMER_GROUP)
    assert pending["pending"] == 1 and pending["consumers"][0]["name"] == b"doomed-worker"
    assert run_tick("g1", now=t0 + 1.6, consumer="survivor") is None, "lock held: the tick is skipped"

    time.sleep(LEASE_MS / 1000 + 0.2)  # the lease expires; the survivor takes over
    res = run_tick("g1", now=t0 + 2.5, consumer="survivor")
    assert res is not None
    # Killed before storing state: the survivor applies the entry. Killed after: it only acks it.
    assert res.samples == (fed - first.samples if where == "before_publish" else 0)
    assert redis_client.xpending(keys.stream("g1"), CONSUMER_GROUP)["pending"] == 0
    assert redis_client.xlen(keys.stream("g1")) == 0
    assert _applied_samples(redis_client) == fed, "every sample applied exactly once"


def test_duplicate_deliveries_are_counted_once(redis_client, client, ingest_token, g1):
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


def test_out_of_order_and_late_samples_are_handled_on_purpose(redis_client, settings, g1):
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


# --- the lease: renewed while the tick runs, for at most half of stale_after_s -----------------------------


def test_lease_is_renewed_while_its_holder_works(redis_client):
    lock = GroupLock(redis_client, keys.tick_lock("test"), 300, max_hold_ms=10_000)
    assert lock.acquire()
    time.sleep(1.0)  # three leases: renewed every 100 ms
    assert redis_client.get(keys.tick_lock("test")) == lock.token.encode()
    assert not GroupLock(redis_client, keys.tick_lock("test"), 300).acquire()
    lock.release()
    assert not redis_client.exists(keys.tick_lock("test"))


def test_a_hung_holder_loses_its_lease_after_max_hold(redis_client):
    """Alive, renewing, making no progress: its group must go to another worker before gateways fail open."""
    hung = GroupLock(redis_client, keys.tick_lock("test"), 300, max_hold_ms=900)
    assert hung.acquire()
    time.sleep(0.6)
    assert redis_client.exists(keys.tick_lock("test")), "renewed past its first lease"
    time.sleep(0.6)
    assert not redis_client.exists(keys.tick_lock("test")), "never extended beyond max_hold_ms"
    other = GroupLock(redis_client, keys.tick_lock("test"), 300)
    assert other.acquire()
    hung.release()  # too late: it must not release the new holder's lock
    assert redis_client.get(keys.tick_lock("test")) == other.token.encode()
    other.release()


def test_tick_lease_defaults(redis_client, settings):
    from outlier_admin.control.redis_conn import tick_lock

    lock = tick_lock(redis_client, "g1")
    assert (lock.key, lock.ttl_ms) == (keys.tick_lock("g1"), settings.TICK_LOCK_TTL_MS)
    assert lock.max_hold_ms == settings.WEIGHTS_STALE_AFTER_S * 1000 // 2


# --- a real Celery worker killed mid-tick, default timing ----------------------------------------------------

# A Celery worker (solo pool) that, once the file argv[1] exists, hangs inside its next publish — the
# group's lock held, its stream entries read and unacknowledged — writing argv[2] so the test knows.
# Test-only: the patch lives in this launcher, not in the code under test.
HANGING_WORKER = """
import os, sys, time
import django
django.setup()
from outlier_admin.control import publish
flag, hung, name = sys.argv[1:4]
real = publish.queue_document
def publish_or_hang(*args, **kwargs):
    if os.path.exists(flag):
        open(hung, "w").close()
        time.sleep(3600)
    return real(*args, **kwargs)
publish.queue_document = publish_or_hang
from celery.__main__ import main
sys.argv = ["celery", "-A", "outlier_admin", "worker", "--pool", "solo", "--loglevel", "WARNING",
            "--without-gossip", "--without-mingle", "--without-heartbeat", "-n", name + "@%h"]
main()
"""


@pytest.fixture
def celery_procs(redis_client, settings, tmp_path):
    """Start Celery processes with this test's database and Redis and the *default* tick timing;
    every one still alive is killed at teardown."""
    db = connection.settings_dict
    env = {k: v for k, v in os.environ.items()
           if k not in ("TICK_INTERVAL_MS", "TICK_LOCK_TTL_MS", "WEIGHTS_STALE_AFTER_S", "CELERY_BROKER_URL")}
    env.update(DJANGO_SETTINGS_MODULE="outlier_admin.settings", REDIS_URL=settings.REDIS_URL,
               DATABASE_URL=f"postgres://{db['USER']}@{db['HOST']}:{db['PORT']}/{db['NAME']}",
               OUTLIER_TESTING="1", LOG_LEVEL="WARNING", WORKER_METRICS_PORT="0")
    procs: list[subprocess.Popen] = []

    def start(*args: str, log: str) -> subprocess.Popen:
        with open(tmp_path / log, "w") as out:
            proc = subprocess.Popen([sys.executable, *args], cwd=ROOT, env=env, stdout=out, stderr=out)
        procs.append(proc)
        return proc

    yield start
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
        proc.wait(timeout=10)


@pytest.mark.slow
@pytest.mark.parametrize("fate", ["killed", "hung"])
def test_worker_lost_mid_tick_group_publishes_again_before_stale_after(redis_client, settings, tmp_path,
                                                                       celery_procs, fate):
    """A worker stops inside a tick (lock held, entries read): ``killed`` (kill -9) or ``hung`` (alive,
    its lease renewer still running). Another worker is started. The time between the last document
    published before and the next one stays under ``stale_after_s``. With the former 30 s lease
    (= stale_after_s) it was over 30 s: gateways failed open."""
    _group("crash", nodes=4)
    rng = np.random.default_rng(3)
    _feed(time.time(), rng, group="crash", nodes=4)
    flag, hung = tmp_path / "hang", tmp_path / "hung"
    celery_procs("-m", "celery", "-A", "outlier_admin", "beat", "--loglevel", "WARNING",
                 "-s", str(tmp_path / "beat-schedule"), log="beat.log")
    doomed = celery_procs("-c", HANGING_WORKER, str(flag), str(hung), "doomed", log="doomed.log")
    assert wait_for(lambda: (read_weights("crash") or {}).get("version", 0) >= 2, 40), "worker never published"

    _feed(time.time(), rng, group="crash", nodes=4)  # the hanging tick reads these entries
    flag.touch()
    assert wait_for(hung.exists, 10), "the worker never reached its hanging tick"
    last = read_weights("crash")  # the hung tick publishes nothing: this is the gateways' last document
    assert redis_client.exists(keys.tick_lock("crash")), "the hung worker holds the group's lock"
    if fate == "killed":
        doomed.kill()  # kill -9
        doomed.wait(timeout=10)
    lost_at = time.time()
    flag.unlink()  # the next worker runs the same launcher: it must not hang
    celery_procs("-c", HANGING_WORKER, str(flag), str(hung), "survivor", log="survivor.log")

    stale_after_s = last["stale_after_s"]
    nxt = wait_for(lambda: (d := read_weights("crash")) and d["version"] > last["version"] and d,
                last["generated_at"] + stale_after_s + 5 - time.time())
    gap = None if nxt is None else nxt["generated_at"] - last["generated_at"]
    print(f"\nworker {fate} mid-tick: last document {lost_at - last['generated_at']:.1f} s old then, "
          f"next one {'never' if nxt is None else f'{gap:.1f} s after it'} (stale_after_s {stale_after_s} s, "
          f"lease {settings.TICK_LOCK_TTL_MS} ms)")
    assert gap is not None and gap < stale_after_s, "the gateways failed open: no document within stale_after_s"
    # The lost tick's entries were reclaimed and acknowledged by the survivor.
    assert wait_for(lambda: redis_client.xpending(keys.stream("crash"), CONSUMER_GROUP)["pending"] == 0, 10)
