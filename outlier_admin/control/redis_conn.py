"""The one place that opens Redis connections (so the demo can swap in fakeredis).

Key layout (all prefixed ``outlier:``; the gateway contract keys are fixed by the issue):

- ``outlier:weights:<group>``      published weights document (JSON string)  [gateway contract]
- ``outlier:weights``              pub/sub channel, ``{"group", "version"}``  [gateway contract]
- ``outlier:stream:<group>``       Redis Stream of ingest batches (consumer group ``ticks``)
- ``outlier:state:<group>``        hash: ``detector`` (``GroupDetector.to_bytes()``), ``last_id``
                                   (last stream id applied), ``thresholds_version``
- ``outlier:lock:tick:<group>``    per-group tick lock (token, PX lease)
- ``outlier:dedup:<group>:<n>``    request_id sets per de-duplication window
- ``outlier:probes:<group>``       hash node -> JSON of a canary probe due (written by the tick)
- ``outlier:probe-inflight:<group>:<node>``  NX guard: one probe at a time per node
- ``outlier:config:<group>``       the group's snapshot for ticks while PostgreSQL is down (degraded)
- ``outlier:outbox:<group>``       list of a degraded tick's SQL rows, written when PostgreSQL returns
- ``outlier:degraded:<group>``     the version a degraded tick published (cleared by the drain)
"""

from __future__ import annotations

import threading
from typing import Any

import redis
from django.conf import settings

_local = threading.local()
_override: Any = None


def get_redis() -> redis.Redis:
    """A client for ``settings.REDIS_URL`` (one per thread; redis-py pools connections)."""
    if _override is not None:
        return _override
    url = settings.REDIS_URL
    client = getattr(_local, "client", None)
    if client is None or getattr(_local, "url", None) != url:
        client = redis.Redis.from_url(url, socket_timeout=5, socket_connect_timeout=2, health_check_interval=30)
        _local.client, _local.url = client, url
    return client


def set_redis(client: Any) -> None:
    """Use ``client`` (e.g. ``fakeredis.FakeRedis()``) for every caller; ``None`` restores REDIS_URL."""
    global _override
    _override = client


def weights_key(group: str) -> str:
    return f"outlier:weights:{group}"


WEIGHTS_CHANNEL = "outlier:weights"


def stream_key(group: str) -> str:
    return f"outlier:stream:{group}"


def itl_key(group: str) -> str:
    """Hash node -> the last model-server scrape's inter-token histogram ``[ts, sum_s, count]``."""
    return f"outlier:itl:{group}"


def state_key(group: str) -> str:
    return f"outlier:state:{group}"


def lock_key(group: str) -> str:
    return f"outlier:lock:tick:{group}"


def probes_key(group: str) -> str:
    return f"outlier:probes:{group}"


def snapshot_key(group: str) -> str:
    return f"outlier:config:{group}"


def outbox_key(group: str) -> str:
    return f"outlier:outbox:{group}"


def degraded_key(group: str) -> str:
    """Set by a degraded tick to the version it published; cleared by ``degraded.drain``."""
    return f"outlier:degraded:{group}"


class GroupLock:
    """A per-group lease: ``SET key token NX PX ttl``; released only by its holder.

    Release and extension use WATCH/MULTI (no Lua: fakeredis without ``lupa`` cannot run scripts).
    A holder that outlives its lease loses the lock; the tick therefore keeps ticks far below the
    lease (``TICK_LOCK_TTL_MS``) and stream entries are applied idempotently (``last_id``).
    """

    def __init__(self, client: redis.Redis, key: str, ttl_ms: int) -> None:
        import secrets

        self.client, self.key, self.ttl_ms = client, key, ttl_ms
        self.token = secrets.token_hex(8)
        self.held = False

    def acquire(self) -> bool:
        self.held = bool(self.client.set(self.key, self.token, nx=True, px=self.ttl_ms))
        return self.held

    def release(self) -> None:
        if not self.held:
            return
        with self.client.pipeline() as pipe:
            try:
                pipe.watch(self.key)
                current = pipe.get(self.key)
                if current is not None and current.decode() == self.token:
                    pipe.multi()
                    pipe.delete(self.key)
                    pipe.execute()
                else:
                    pipe.unwatch()
            except redis.WatchError:
                pass  # changed under us: someone else holds it now
        self.held = False

    def __enter__(self) -> GroupLock:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()

