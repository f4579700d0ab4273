"""Shared limits in Redis, for every web and ingest process and pod at once: a token bucket
(:func:`take`) and a counted set of leases (:func:`hold` / :func:`release`).

Both run as one Lua script each, on Redis' own clock (``TIME``: every process agrees), so concurrent
requests cannot both take the last token or the last slot. A lease expires by itself ``ttl_s`` after
it was taken (a worker killed mid-request gives its slot back). Redis unreachable: the caller's
choice (the preview and ingest both fail closed, as the detector needs Redis anyway).
"""

from __future__ import annotations

import uuid

from outlier_admin.control.redis_conn import get_redis

# Refill by the time elapsed since the last take, take ``cost`` if the bucket holds it, else answer how
# long until it does (a cost over the cap waits for a full bucket and takes it whole); the key lapses
# once the bucket is full again.
_TAKE = """
local cap, rate, cost = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1e6
local v = redis.call('HMGET', KEYS[1], 'tokens', 'at')
local tokens = math.min(cap, (tonumber(v[1]) or cap) + (now - (tonumber(v[2]) or now)) * rate)
local need = math.min(cost, cap)
local took = 0
if tokens >= need then tokens = tokens - need; took = 1 end
redis.call('HSET', KEYS[1], 'tokens', tostring(tokens), 'at', tostring(now))
redis.call('PEXPIRE', KEYS[1], math.ceil((cap - tokens) / rate * 1000) + 1000)
if took == 1 then return 0 end
return math.ceil((need - tokens) / rate * 1000)
"""
# Drop the leases that expired, then take one if fewer than ``limit`` are held: 1 taken, 0 not.
_HOLD = """
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1e6
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
if redis.call('ZCARD', KEYS[1]) >= tonumber(ARGV[1]) then return 0 end
redis.call('ZADD', KEYS[1], now + tonumber(ARGV[2]), ARGV[3])
redis.call('PEXPIRE', KEYS[1], math.ceil(tonumber(ARGV[2]) * 1000) + 1000)
return 1
"""


def take(key: str, *, cap: float, rate_per_s: float, cost: float = 1) -> int:
    """Take ``cost`` from the bucket at ``key`` (``cap`` at most, refilled at ``rate_per_s``): 0 when
    taken, else the milliseconds until it could be (nothing is taken then)."""
    return int(get_redis().eval(_TAKE, 1, key, cap, rate_per_s, cost))


def hold(key: str, *, limit: int, ttl_s: float) -> str | None:
    """One of ``limit`` leases at ``key`` for at most ``ttl_s``: its id (give it to :func:`release`),
    or None when ``limit`` are held."""
    lease = uuid.uuid4().hex
    return lease if int(get_redis().eval(_HOLD, 1, key, limit, ttl_s, lease)) else None


def release(key: str, lease: str) -> None:
    get_redis().zrem(key, lease)
