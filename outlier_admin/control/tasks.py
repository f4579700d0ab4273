"""Celery tasks of the control loop: thin wrappers around plain functions."""

from __future__ import annotations

import logging
import socket

from celery import shared_task
from django.conf import settings

from outlier_admin.fleet.models import ModelGroup

log = logging.getLogger(__name__)


@shared_task(name="control.tick_all_groups", ignore_result=True)
def tick_all_groups() -> int:
    """Enqueue one tick per group (beat, every ``TICK_INTERVAL_MS``). A tick not started within two
    intervals expires instead of piling up behind a slow worker."""
    from outlier_admin.control import degraded
    from outlier_admin.control.redis_conn import get_redis

    expires = 2 * settings.TICK_INTERVAL_MS / 1000.0
    try:
        names = list(ModelGroup.objects.values_list("name", flat=True))
    except degraded.DB_ERRORS as exc:
        # PostgreSQL down: tick the groups Redis knows, so gateways keep fresh weights.
        log.warning("listing groups from Redis, PostgreSQL unreachable: %s", exc)
        names = degraded.known_groups(get_redis())
    for name in names:
        tick_group.apply_async(args=[name], expires=expires)
    return len(names)


@shared_task(name="control.tick_group", ignore_result=True)
def tick_group(group: str) -> dict | None:
    from outlier_admin.control.tick import run_tick

    try:
        result = run_tick(group, consumer=socket.gethostname())
    except ModelGroup.DoesNotExist:
        return None
    if result is None:
        return None
    from outlier_admin.observability.hooks import observe_tick

    observe_tick(result)
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
