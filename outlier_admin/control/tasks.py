"""Celery tasks of the control loop: thin wrappers around plain functions.

Ticks are scheduled fairly (:mod:`outlier_admin.control.scheduling`): the beat enqueues, oldest
first, only the groups with no tick queued or running, so under overload every group is still
ticked once per round of the queue instead of the same groups' ticks expiring every time.
"""

from __future__ import annotations

import logging
import socket

from celery import shared_task
from django.conf import settings

from outlier_admin.control.signals import tick_done
from outlier_admin.fleet.models import ModelGroup

log = logging.getLogger(__name__)


@shared_task(name="control.tick_all_groups", ignore_result=True)
def tick_all_groups() -> int:
    """Enqueue a tick of every group that has none queued or running, most overdue first (beat,
    every ``TICK_INTERVAL_MS``). Returns how many were enqueued."""
    from outlier_admin.control import outage_store, scheduling
    from outlier_admin.control.redis_conn import get_redis

    r = get_redis()
    if scheduling.tickers_alive(r):
        return 0  # event-driven tickers own every group (scheduling.Ticker); the beat is their fallback
    try:
        names = list(ModelGroup.objects.filter(retired=False).values_list("name", flat=True))
        complete = True
    except outage_store.DB_ERRORS as exc:
        # PostgreSQL down: tick the groups Redis knows, so gateways keep fresh weights.
        log.warning("listing groups from Redis, PostgreSQL unreachable: %s", exc)
        names, complete = outage_store.known_groups(r), False
    due, queued_at = scheduling.claim_due(r, names, prune=complete)
    for name in due:
        # Expiry only bounds the backlog while no worker consumes: by then a newer tick of the group
        # has been queued (its marker lapsed), and this one's document would be stale anyway.
        tick_group.apply_async(args=[name, queued_at], expires=settings.WEIGHTS_STALE_AFTER_S)
    return len(due)


@shared_task(name="control.tick_group", ignore_result=True)
def tick_group(group: str, queued_at: float | None = None) -> dict | None:
    """Tick ``group`` (``queued_at``: the beat's Redis time, to recognise a duplicate)."""
    from outlier_admin.control import scheduling
    from outlier_admin.control.redis_conn import get_redis
    from outlier_admin.control.tick import run_tick

    r = get_redis()
    started = scheduling.start(r, group, queued_at)
    if started is None:
        return None
    result = None
    try:
        result = run_tick(group, consumer=socket.gethostname())
    except ModelGroup.DoesNotExist:
        return None
    finally:
        scheduling.finish(r, group, started, ticked=result is not None)
    if result is None:
        return None
    tick_done.send(sender=tick_group, result=result)
    return {"group": result.group, "samples": result.samples, "version": result.version,
            "tick_ms": round(result.tick_ms, 2)}


@shared_task(name="control.run_due_canaries", ignore_result=True)
def run_due_canaries() -> int:
    from outlier_admin.control.canary import run_due_probes

    return run_due_probes()


@shared_task(name="control.retention", ignore_result=True)
def retention() -> dict:
    from outlier_admin.control.retention import apply_retention

    return apply_retention()
