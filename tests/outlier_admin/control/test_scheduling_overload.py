"""A starved-group scenario, in process: the real beat task (``control.tick_all_groups``) and the real
tick task (``control.tick_group``) over a FIFO queue with Celery's expiry, one worker, and ticks that
take 25 ms inside the group's lock (the detector itself is replaced: scheduling is under test).
Only the scheduling's public entry points are used, so the same scenario runs on the former scheduler
(where it fails: the same groups' ticks expired every time)."""

from __future__ import annotations

import collections
import threading
import time

import pytest

from contract import keys
from outlier_admin.control import tasks
from outlier_admin.control.redis_conn import GroupLock
from outlier_admin.control.tick import TickResult
from outlier_admin.fleet.models import ModelGroup

pytestmark = [pytest.mark.services, pytest.mark.django_db]

GROUPS = 16
TICK_S = 0.025  # one tick; 16 groups = 0.4 s of work per 0.1 s beat: 4x more than one worker can do
RUN_S = 4.0


class Broker:
    """A FIFO queue with Celery's ``expires`` semantics (a task not started in time is discarded)."""

    def __init__(self) -> None:
        self.queue: collections.deque = collections.deque()
        self.enqueued = self.expired = 0

    def apply_async(self, args=(), kwargs=None, expires=None, **_options) -> None:
        self.queue.append((time.monotonic(), expires, list(args), dict(kwargs or {})))
        self.enqueued += 1

    def work(self, task, stop: threading.Event) -> None:
        while not stop.is_set():
            if not self.queue:
                time.sleep(0.001)
                continue
            at, expires, args, kwargs = self.queue.popleft()
            if expires is not None and time.monotonic() - at > expires:
                self.expired += 1
                continue
            task.run(*args, **kwargs)


def _run_overloaded(monkeypatch, settings, redis_client) -> dict[str, list[float]]:
    """Beat every 100 ms, one worker, ticks of 25 ms (inside the group's lock): publish times per group."""
    settings.TICK_INTERVAL_MS, settings.TICK_LOCK_TTL_MS, settings.WEIGHTS_STALE_AFTER_S = 100, 500, 2
    names = [f"g{i:02d}" for i in range(GROUPS)]
    ModelGroup.objects.bulk_create([ModelGroup(name=n, slug=n) for n in names])  # bulk_create skips save()'s slug
    published: dict[str, list[float]] = {n: [] for n in names}

    def slow_tick(group, *, now=None, consumer="tick"):
        lock = GroupLock(redis_client, keys.tick_lock(group), settings.TICK_LOCK_TTL_MS)
        if not lock.acquire():
            return None
        try:
            time.sleep(TICK_S)
            published[group].append(time.monotonic())
            return TickResult(group=group, at=time.time(), version=len(published[group]))
        finally:
            lock.release()

    monkeypatch.setattr("outlier_admin.control.tick.run_tick", slow_tick)
    broker, real_task = Broker(), tasks.tick_group
    monkeypatch.setattr(tasks, "tick_group", broker)
    stop = threading.Event()
    worker = threading.Thread(target=broker.work, args=(real_task, stop), daemon=True)
    worker.start()
    start = time.monotonic()
    try:
        while time.monotonic() - start < RUN_S:
            tasks.tick_all_groups.run()
            time.sleep(settings.TICK_INTERVAL_MS / 1000.0)
    finally:
        stop.set()
        worker.join(timeout=5)
    end = time.monotonic()
    # The longest time each group went without a publish, from the start of the run to its end.
    gaps = {n: max(b - a for a, b in zip([start, *ts], [*ts, end], strict=True)) for n, ts in published.items()}
    print(f"\n{GROUPS} groups x {TICK_S * 1000:.0f} ms ticks, one worker, beat every 100 ms, {RUN_S:.0f} s: "
          f"ticks per group min {min(map(len, published.values()))} max {max(map(len, published.values()))}, "
          f"worst publish gap {max(gaps.values()):.2f} s (stale_after_s/2 = 1.0 s), "
          f"{broker.enqueued} enqueued, {broker.expired} expired")
    return gaps


def test_overloaded_worker_still_ticks_every_group_within_half_of_stale_after(monkeypatch, settings, redis_client):
    """4x more tick work than the worker can do: every group is still ticked round robin, none goes
    longer than ``stale_after_s / 2`` without a publish. (The former scheduler enqueued every group in
    the same order, each tick expiring after two intervals: the same groups expired every time and
    were never ticked.)"""
    gaps = _run_overloaded(monkeypatch, settings, redis_client)
    starved = {n: round(g, 2) for n, g in gaps.items() if g >= settings.WEIGHTS_STALE_AFTER_S / 2}
    assert not starved, f"groups without a publish for stale_after_s/2 or longer: {starved}"
