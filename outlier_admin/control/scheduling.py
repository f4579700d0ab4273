"""Fair tick scheduling: when workers cannot keep up, every group still gets its turn, oldest first.

Gateways ignore a group's weights document once it is ``WEIGHTS_STALE_AFTER_S`` old, so what
matters under overload is the *worst* group's publish age, not the total tick rate. The beat
(``control.tick_all_groups``, every ``TICK_INTERVAL_MS``) used to enqueue one tick per group, in the
same order every time, each expiring after two intervals: when the groups' ticks took longer than
an interval in total, the ticks at the end of every batch expired and the same groups starved (an
untouched group fell from 1.0 to 0.18 ticks/s; its document reached 35 s).

Now the beat, for the groups it lists:

1. skips a group whose tick is queued (marker :func:`contract.keys.tick_queued`, ``SET NX`` with a
   lease of ``TICK_LOCK_TTL_MS``) or running (its tick lock is held). The queue holds at most one
   tick per group, so neither many groups nor a slow one can fill it, and a waiting tick keeps its
   place instead of expiring and going to the back;
2. enqueues the others oldest first, by the time their last completed tick started (sorted set
   ``outlier:tick:last``; never-ticked groups first). Workers take tasks in queue order, so the most
   overdue group is ticked next: under overload the groups are ticked round robin, each at least once
   per ``groups x tick time / workers`` (plus an interval), the best any order can do for the worst group.

The tick task (:func:`start` / :func:`finish`) clears the marker once it has run and records the
start time. A task queued before the group's last tick started is a duplicate (queued after its
marker lapsed while the first one waited) and returns at once. A task lost with its worker leaves a
marker that lapses within a lease; the group is then enqueued again. A queued tick expires after
``WEIGHTS_STALE_AFTER_S`` (a newer one has been queued since), so with no worker consuming the
backlog stays bounded. All times are Redis ``TIME``: one clock for the beat and every worker.
"""

from __future__ import annotations

import contextlib
import logging
import math
import time
from collections.abc import Sequence
from typing import Any

import redis
from django.conf import settings

from contract import keys
from contract.topology import is_cluster
from outlier_admin.control.redis_conn import get_redis

log = logging.getLogger(__name__)


def redis_now(r: redis.Redis) -> float:
    """Redis server time (seconds): the one clock the beat and every worker share."""
    sec, usec = r.time()
    return sec + usec / 1e6


def _token(queued_at: float) -> str:
    return f"{queued_at:.6f}"


def oldest_first(names: Sequence[str], last_started: Sequence[float | None]) -> list[str]:
    """``names`` ordered by their last tick's start, never-ticked first (ties by name, for stable tests)."""
    key = {n: -math.inf if t is None else float(t) for n, t in zip(names, last_started, strict=True)}
    return sorted(names, key=lambda n: (key[n], n))


def claim_due(r: redis.Redis, names: Sequence[str], *, prune: bool = False) -> tuple[list[str], float]:
    """Mark as queued, and return most overdue first, the groups of ``names`` with no tick queued or
    running; also returns the Redis time to pass to their tasks as ``queued_at``. With ``prune``
    (``names`` is the complete list), groups no longer listed are dropped from ``outlier:tick:last``."""
    now = redis_now(r)
    names = list(dict.fromkeys(names))
    if prune:
        listed = set(names)
        gone = [m for m in (x.decode() for x in r.zrange(keys.TICK_LAST, 0, -1)) if m not in listed]
        if gone:
            r.zrem(keys.TICK_LAST, *gone)
    if not names:
        return [], now
    ordered = oldest_first(names, r.zmscore(keys.TICK_LAST, names))
    pipe = r.pipeline(transaction=False)
    for name in ordered:
        pipe.exists(keys.tick_lock(name))
    idle = [name for name, running in zip(ordered, pipe.execute(), strict=True) if not running]
    pipe = r.pipeline(transaction=False)
    for name in idle:
        pipe.set(keys.tick_queued(name), _token(now), nx=True, px=settings.TICK_LOCK_TTL_MS)
    return [name for name, claimed in zip(idle, pipe.execute(), strict=True) if claimed], now


def start(r: redis.Redis, group: str, queued_at: float | None) -> float | None:
    """The Redis time this tick of ``group`` starts, or None when the task is a duplicate: the group
    has had a tick that started after this task was queued (a task of an older deployment, without
    ``queued_at``, always runs)."""
    now = redis_now(r)
    if queued_at is None:
        return now
    last = r.zscore(keys.TICK_LAST, group)
    if last is None or last < queued_at:
        return now
    # Free the group for the next beat if the marker is still this task's (its lease not yet lapsed).
    key = keys.tick_queued(group)
    current = r.get(key)
    if current is not None and current.decode() == _token(queued_at):
        r.delete(key)
    return None


def finish(r: redis.Redis, group: str, started: float, *, ticked: bool) -> None:
    """After a tick task ran (``ticked``: it completed a tick): record its start, let the beat queue
    the group again. The marker is cleared whoever set it: a newer marker stands for a duplicate,
    which this tick has made redundant. (On a Redis Cluster the two keys are in two slots: sent in this
    order without MULTI; a marker left by a crash in between lapses with its lease.)"""
    pipe = r.pipeline(transaction=not is_cluster(r))
    if ticked:
        pipe.zadd(keys.TICK_LAST, {group: started}, gt=True)
    pipe.delete(keys.tick_queued(group))
    pipe.execute()


# --- event-driven ticks, groups sharded over worker processes ---------------------------------------------
#
# The beat above ticks every group once per ``TICK_INTERVAL_MS`` through the Celery queue, so a row
# written just after a tick waits up to an interval plus the queue. A :class:`Ticker` (one per worker
# process, ``manage.py run_ticker``) instead blocks on its groups' streams (``XREAD BLOCK``) and ticks a
# group as soon as it has new rows — at most once per ``EVENT_MIN_GAP_S``, so a scrape round's entries
# are applied together — and at least every ``TICK_INTERVAL_MS`` as a heartbeat (the document is
# also the gateways' liveness signal). The group lock, the fenced state write and the consumer group
# keep ticks of one group in order and every entry applied once, whichever process runs them.
#
# Sharding: live tickers register in ``outlier:tickers`` (sorted set, id -> lease expiry in Redis time,
# renewed every ``lease / 3``); each owns the groups whose rendezvous hash (:func:`owner_of`) picks it
# among the live ones. A dead ticker's lease lapses within ``TICKER_LEASE_MS`` and its groups go to the
# others at their next renewal — only its groups move. While at least one ticker lives the beat
# enqueues nothing (:func:`tickers_alive`): the Celery path stays the fallback.

#: How often a ticker on a Redis Cluster looks for new rows (it cannot block on many groups' streams).
CLUSTER_POLL_S = 0.05
TICKERS_KEY = keys.TICKERS
TICKER_GROUPS_KEY = keys.TICKER_GROUPS  # hash ticker id -> groups it owns (for operators, tests)
EVENT_MIN_GAP_S = 0.05


def ticker_lease_ms() -> int:
    """A ticker's registration lease: half the tick lock's, so a dead ticker's groups move (lease +
    one renewal period) before or about when its tick locks lapse."""
    return max(settings.TICK_LOCK_TTL_MS // 2, 500)


def owner_of(group: str, tickers: Sequence[str]) -> str | None:
    """Rendezvous (highest random weight) hashing: the ticker with the largest ``hash(ticker, group)``.
    When a ticker joins or leaves only the groups it wins or held move; the others stay put."""
    import hashlib

    if not tickers:
        return None
    return max(tickers, key=lambda t: hashlib.blake2b(f"{t}\0{group}".encode(), digest_size=8).digest())


def tickers_alive(r: redis.Redis) -> list[str]:
    """Ids of the tickers whose lease has not lapsed (Redis time)."""
    return sorted(m.decode() for m in r.zrangebyscore(TICKERS_KEY, redis_now(r), "+inf"))


class Ticker:
    """One worker process's event-driven tick loop over its share of the groups (see above).

    ``list_groups`` returns every group name (default: PostgreSQL, else the groups Redis knows);
    ``tick(name, consumer)`` runs one tick (default :func:`outlier_admin.control.tick.run_tick`)."""

    def __init__(self, ticker_id: str, r: redis.Redis, *, tick: Any = None, list_groups: Any = None) -> None:
        self.id, self.r = ticker_id, r
        self._tick = tick or _run_tick
        self._list_groups = list_groups or all_groups
        self.lease_ms = ticker_lease_ms()
        self.interval_s = settings.TICK_INTERVAL_MS / 1000.0
        self.mine: list[str] = []
        self._next_renewal = 0.0
        self._due: dict[str, float] = {}  # group -> monotonic time of its next heartbeat tick
        self._woken: dict[str, float] = {}  # group -> earliest time an event tick may run
        self._last_tick: dict[str, float] = {}
        self._stream_ids: dict[str, bytes] = {}
        self.ticks = 0

    def renew(self) -> list[str]:
        """Renew this ticker's lease, drop lapsed ones, and recompute the groups it owns."""
        now = redis_now(self.r)
        pipe = self.r.pipeline(transaction=False)
        pipe.zadd(TICKERS_KEY, {self.id: now + self.lease_ms / 1000.0})
        pipe.zremrangebyscore(TICKERS_KEY, "-inf", now)
        pipe.execute()
        live = tickers_alive(self.r)
        mine = [g for g in self._list_groups() if owner_of(g, live) == self.id]
        gained = set(mine) - set(self.mine)
        for g in gained:  # a group new to this ticker is ticked at once (its owner may have died)
            self._due[g] = 0.0
        if lost := set(self.mine) - set(mine):
            from outlier_admin.control.tick import forget

            for g in lost:
                forget(g)  # its new owner ticks it now: this copy will not be current again
                for d in (self._due, self._woken, self._last_tick, self._stream_ids):
                    d.pop(g, None)
        self.mine = mine
        self.r.hset(TICKER_GROUPS_KEY, self.id, len(mine))
        self._next_renewal = time.monotonic() + self.lease_ms / 3000.0
        return mine

    def leave(self) -> None:
        """Deregister (a clean shutdown): the others take the groups at their next renewal."""
        self.r.zrem(TICKERS_KEY, self.id)
        self.r.hdel(TICKER_GROUPS_KEY, self.id)

    def _wait(self, timeout_s: float) -> None:
        """Block until one of this ticker's streams has a row after the last seen, or ``timeout_s``."""
        streams = {keys.stream(g): self._stream_ids.get(g, b"0-0") for g in self.mine}
        if not streams:
            time.sleep(timeout_s)
            return
        if is_cluster(self.r):
            got = self._poll_cluster(streams, timeout_s)
        else:
            got = self.r.xread(streams, count=1, block=max(int(timeout_s * 1000), 1))
        now = time.monotonic()
        for key, items in got or []:
            group = keys.group_of(key)
            if group is None:
                continue
            if items:
                self._stream_ids[group] = items[-1][0]
            self._woken.setdefault(group, self._last_tick.get(group, 0.0) + EVENT_MIN_GAP_S)
            self._woken[group] = max(self._woken[group], now)

    def _poll_cluster(self, streams: dict[str, bytes], timeout_s: float) -> list[Any]:
        """:meth:`_wait`'s ``XREAD`` on a Redis Cluster, which serves a multi-key command only within one
        slot (one group): one non-blocking ``XREAD`` per stream, pipelined (one round trip per primary),
        every ``CLUSTER_POLL_S`` until a row or ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        while True:
            pipe = self.r.pipeline(transaction=False)
            for key, last in streams.items():
                pipe.xread({key: last}, count=1)
            got = [item for reply in pipe.execute() for item in (reply or [])]
            left = deadline - time.monotonic()
            if got or left <= 0:
                return got
            time.sleep(min(CLUSTER_POLL_S, left))

    def step(self) -> int:
        """One round: renew if due, tick the groups due (events first, then heartbeats, most overdue
        first), else wait for rows until the next deadline. Returns the ticks run."""
        if time.monotonic() >= self._next_renewal:
            self.renew()
        now = time.monotonic()
        due = [g for g in self.mine if self._due.get(g, 0.0) <= now
               or (g in self._woken and self._woken[g] <= now)]
        if not due:
            deadlines = [self._next_renewal, *(self._due.get(g, 0.0) for g in self.mine), *self._woken.values()]
            self._wait(max(min(deadlines) - now, 0.001))
            return 0
        due.sort(key=lambda g: self._last_tick.get(g, 0.0))
        # The newest row of each group before its tick: rows after it wake this ticker again.
        pipe = self.r.pipeline(transaction=False)
        for g in due:
            pipe.xrevrange(keys.stream(g), count=1)
        for g, newest in zip(due, pipe.execute(), strict=True):
            if newest:
                self._stream_ids[g] = newest[0][0]
        ran = 0
        for g in due:
            started = time.monotonic()
            self._woken.pop(g, None)
            try:
                self._tick(g, self.id)
                ran += 1
            except Exception:  # one group's failure must not stop the others'
                log.exception("tick of %s failed in ticker %s", g, self.id)
            self._last_tick[g] = started
            self._due[g] = started + self.interval_s
        self.ticks += ran
        return ran

    def run(self, stop: Any = None, *, seconds: float | None = None) -> None:
        """Loop until ``stop`` (a ``threading.Event``) is set or ``seconds`` have passed."""
        deadline = None if seconds is None else time.monotonic() + seconds
        try:
            while not (stop is not None and stop.is_set()) and (deadline is None or time.monotonic() < deadline):
                try:
                    self.step()
                except redis.RedisError as exc:  # Redis restarting: retry; its lease lapses meanwhile
                    log.warning("ticker %s: %s", self.id, exc)
                    time.sleep(min(self.lease_ms / 3000.0, 1.0))
        finally:
            with contextlib.suppress(redis.RedisError):
                self.leave()


def _run_tick(group: str, consumer: str) -> Any:
    from outlier_admin.control.tick import run_tick

    r = get_redis()
    started = redis_now(r)  # the beat's clock: its fallback sees these ticks in ``outlier:tick:last``
    result = run_tick(group, consumer=consumer)
    if result is not None:
        finish(r, group, started, ticked=True)
    return result


def all_groups() -> list[str]:
    """Every group's name: from PostgreSQL, else (outage) the groups Redis knows."""
    from outlier_admin.control import outage_store
    from outlier_admin.fleet.models import ModelGroup

    try:
        return list(ModelGroup.objects.filter(retired=False).values_list("name", flat=True))
    except outage_store.DB_ERRORS:
        return outage_store.known_groups(get_redis())
