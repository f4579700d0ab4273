"""A starved-group scenario on a real Celery worker and beat: 24 groups whose ticks each take 100 ms
more than usual (a sleep inside the group's lock, patched into the worker process by the test's
launcher, not by a hook in the code), one worker, default timing (beat every 1 s, lease 5 s,
stale_after_s 30 s): several seconds of tick work per 1 s beat. Every group must still publish at
least every ``stale_after_s / 2``; the former scheduler never ticked some of them."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import orjson
import pytest
from django.db import connection

from contract import keys
from outlier_admin.fleet.models import ModelGroup

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.services, pytest.mark.slow, pytest.mark.serial,
              pytest.mark.timeout(90)]
ROOT = Path(__file__).resolve().parents[3]
GROUPS = 24
SLOW_TICK_S = 0.1
OBSERVE_S = 16.0  # longer than stale_after_s / 2 (15 s), so a group that is never ticked fails

# A Celery worker whose every tick sleeps inside the group's lock before running (test-only patch).
SLOW_WORKER = """
import os, sys, time
import django
django.setup()
from outlier_admin.control import tick
delay = float(os.environ["TEST_SLOW_TICK_S"])
real = tick._tick_locked
def slow(*args, **kwargs):
    time.sleep(delay)
    return real(*args, **kwargs)
tick._tick_locked = slow
from celery.__main__ import main
sys.argv = ["celery", "-A", "outlier_admin", "worker", "--pool", "solo", "--loglevel", "WARNING",
            "--without-gossip", "--without-mingle", "--without-heartbeat", "-n", "slow@%h"]
main()
"""


def _env(settings) -> dict[str, str]:
    db = connection.settings_dict
    env = {k: v for k, v in os.environ.items()
           if k not in ("TICK_INTERVAL_MS", "TICK_LOCK_TTL_MS", "WEIGHTS_STALE_AFTER_S", "CELERY_BROKER_URL")}
    env.update(DJANGO_SETTINGS_MODULE="outlier_admin.settings", REDIS_URL=settings.REDIS_URL, OUTLIER_TESTING="1",
               DATABASE_URL=f"postgres://{db['USER']}@{db['HOST']}:{db['PORT']}/{db['NAME']}",
               TEST_SLOW_TICK_S=str(SLOW_TICK_S), LOG_LEVEL="WARNING",
               WORKER_METRICS_PORT="0")
    return env


@pytest.fixture
def slow_worker_and_beat(redis_client, settings, tmp_path):
    env = _env(settings)
    procs = [
        subprocess.Popen([sys.executable, "-m", "celery", "-A", "outlier_admin", "beat", "--loglevel", "WARNING",
                          "-s", str(tmp_path / "beat-schedule")], cwd=ROOT, env=env,
                         stdout=subprocess.DEVNULL, stderr=open(tmp_path / "beat.log", "w")),  # noqa: SIM115
        subprocess.Popen([sys.executable, "-c", SLOW_WORKER], cwd=ROOT, env=env,
                         stdout=subprocess.DEVNULL, stderr=open(tmp_path / "worker.log", "w")),  # noqa: SIM115
    ]
    yield procs
    for proc in procs:
        proc.kill()
        proc.wait(timeout=10)


def test_every_group_publishes_within_half_of_stale_after_on_an_overloaded_worker(
        redis_client, settings, slow_worker_and_beat):
    names = [f"load-{i:02d}" for i in range(GROUPS)]
    ModelGroup.objects.bulk_create([ModelGroup(name=n, slug=n) for n in names])  # bulk_create skips save()'s slug
    documents = [keys.weights(n) for n in names]
    stale_after_s = settings.WEIGHTS_STALE_AFTER_S

    deadline = time.time() + 30
    while not any(redis_client.mget(documents)):
        assert time.time() < deadline, "the worker published nothing within 30 s"
        time.sleep(0.1)
    start = time.time()
    worst: dict[str, float] = dict.fromkeys(names, 0.0)
    versions: dict[str, int] = dict.fromkeys(names, 0)
    while (now := time.time()) < start + OBSERVE_S:
        for name, raw in zip(names, redis_client.mget(documents), strict=True):
            doc = orjson.loads(raw) if raw else None
            # A group's publish age as its gateways see it; no document yet counts from the start.
            age = now - max(doc["generated_at"], start) if doc else now - start
            worst[name] = max(worst[name], age)
            versions[name] = doc["version"] if doc else 0
        time.sleep(0.25)

    worst_group = max(worst, key=worst.get)
    print(f"\n{GROUPS} groups, ticks +{SLOW_TICK_S * 1000:.0f} ms, one solo worker, default timing, {OBSERVE_S:.0f} s: "
          f"worst publish age {worst[worst_group]:.1f} s ({worst_group}), median "
          f"{sorted(worst.values())[GROUPS // 2]:.1f} s, ticks per group min {min(versions.values())} "
          f"max {max(versions.values())} (stale_after_s {stale_after_s} s)")
    starved = {n: round(a, 1) for n, a in worst.items() if a >= stale_after_s / 2}
    assert not starved, f"groups whose document got stale_after_s/2 old or older: {starved}"
