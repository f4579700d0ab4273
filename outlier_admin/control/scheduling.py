"""Fair tick scheduling: when workers cannot keep up, every group still gets its turn, oldest first.

Gateways ignore a group's weights document once it is ``WEIGHTS_STALE_AFTER_S`` old, so what
matters under overload is the *worst* group's publish age, not the total tick rate. The beat
(``control.tick_all_groups``, every ``TICK_INTERVAL_MS``) used to enqueue one tick per group, in the
same order every time, each expiring after two intervals: when the groups' ticks took longer than
an interval in total, the ticks at the end of every batch expired and the same groups starved (an
untouched group fell from 1.0 to 0.18 ticks/s; its document reached 35 s).

Now the beat, for the groups it lists:

1. skips a group whose tick is queued (marker ``outlier:tick:queued:<group>``, ``SET NX`` with a
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

import math
from collections.abc import Sequence

import redis
from django.conf import settings

from outlier_admin.control.redis_conn import TICK_LAST_KEY, lock_key, tick_queued_key


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
        gone = [m for m in (x.decode() for x in r.zrange(TICK_LAST_KEY, 0, -1)) if m not in listed]
        if gone:
            r.zrem(TICK_LAST_KEY, *gone)
    if not names:
        return [], now
    ordered = oldest_first(names, r.zmscore(TICK_LAST_KEY, names))
    pipe = r.pipeline(transaction=False)
    for name in ordered:
        pipe.exists(lock_key(name))
    idle = [name for name, running in zip(ordered, pipe.execute(), strict=True) if not running]
    pipe = r.pipeline(transaction=False)
    for name in idle:
        pipe.set(tick_queued_key(name), _token(now), nx=True, px=settings.TICK_LOCK_TTL_MS)
    return [name for name, claimed in zip(idle, pipe.execute(), strict=True) if claimed], now


def start(r: redis.Redis, group: str, queued_at: float | None) -> float | None:
    """The Redis time this tick of ``group`` starts, or None when the task is a duplicate: the group
    has had a tick that started after this task was queued (a task of an older deployment, without
    ``queued_at``, always runs)."""
    now = redis_now(r)
    if queued_at is None:
        return now
    last = r.zscore(TICK_LAST_KEY, group)
    if last is None or last < queued_at:
        return now
    # Free the group for the next beat if the marker is still this task's (its lease not yet lapsed).
    key = tick_queued_key(group)
    current = r.get(key)
    if current is not None and current.decode() == _token(queued_at):
        r.delete(key)
    return None


def finish(r: redis.Redis, group: str, started: float, *, ticked: bool) -> None:
    """After a tick task ran (``ticked``: it completed a tick): record its start, let the beat queue
    the group again. The marker is cleared whoever set it: a newer marker stands for a duplicate,
    which this tick has made redundant."""
    pipe = r.pipeline(transaction=True)
    if ticked:
        pipe.zadd(TICK_LAST_KEY, {group: started}, gt=True)
    pipe.delete(tick_queued_key(group))
    pipe.execute()
