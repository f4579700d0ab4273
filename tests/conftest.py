"""Shared fixtures. Tests use the real PostgreSQL (DATABASE_URL) and Redis (REDIS_URL) of the
machine; each test that touches Redis starts from an empty database number (FLUSHDB of the number
in REDIS_URL only, never FLUSHALL)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from hypothesis import HealthCheck
from hypothesis import settings as hypothesis_settings

FIXTURES = Path(__file__).parent / "fixtures"

# Property tests run beside four other engineers' suites on two cores: a per-example deadline (the
# default is 200 ms) measures the machine, not the code, so there is none; examples come from a fixed
# seed, so a failure reproduces; each test keeps its own max_examples. HYPOTHESIS_PROFILE=explore
# draws fresh random examples, ten times as many, to look for new failures.
hypothesis_settings.register_profile("outlier", deadline=None, derandomize=True,
                                     suppress_health_check=[HealthCheck.too_slow])
hypothesis_settings.register_profile("explore", parent=hypothesis_settings.get_profile("outlier"),
                                     derandomize=False, max_examples=1000)
hypothesis_settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "outlier"))


@pytest.fixture
def redis_client(settings):
    import redis

    from outlier_admin.control import redis_conn
    from outlier_admin.ingest.pipeline import directory

    client = redis.Redis.from_url(settings.REDIS_URL)
    client.flushdb()
    redis_conn.set_redis(None)
    directory.clear()
    yield client
    client.flushdb()
    directory.clear()


@pytest.fixture(autouse=True)
def _fresh_preview_buckets(settings):
    """Every test starts with full threshold-preview token buckets (history.preview.admit_preview): user ids
    repeat between runs of the suite, and a bucket outlives its test by up to a minute."""
    import redis

    from contract import keys

    try:
        client = redis.Redis.from_url(settings.REDIS_URL, socket_connect_timeout=0.5, socket_timeout=0.5)
        buckets = list(client.scan_iter(match=keys.preview_ratelimit("*"), count=1000))
        if buckets:
            client.delete(*buckets)
    except redis.RedisError:
        pass  # a test without the machine's Redis
    yield


@pytest.fixture
def ingest_token(db):
    from outlier_admin.control.actions import do_create_token

    _, plaintext = do_create_token(name="gw-test", scope="ingest", actor="test")
    return plaintext


@pytest.fixture
def make_group(db):
    """``make_group(name, **kw)``: an operator-created group (ingest never creates groups), reused
    when it already exists."""
    from outlier_admin.control.actions import do_create_group
    from outlier_admin.fleet.models import ModelGroup

    def make(name: str = "g1", **kw):
        return ModelGroup.objects.filter(name=name).first() or do_create_group(name, actor="test", **kw)

    return make
