"""Start-up check: a dead worker's groups must publish again long before gateways fail open.

Gateways ignore a weights document older than ``WEIGHTS_STALE_AFTER_S`` and fall back to base
weights (fail open). When a worker dies mid-tick, its group publishes nothing until the tick lock's
lease lapses (``TICK_LOCK_TTL_MS`` after its last renewal), the beat enqueues the group again (up to
one ``TICK_INTERVAL_MS`` later) and a tick runs (budgeted within one interval). The gap between two
documents is then at most about::

    TICK_LOCK_TTL_MS + 2 * TICK_INTERVAL_MS

The rule keeps that within **half** of ``WEIGHTS_STALE_AFTER_S``: the other half is margin for an
overloaded queue (:mod:`outlier_admin.control.scheduling` ticks every group at least once per round),
a replacement worker that is still starting, and clock skew between the control plane and gateways.

    TICK_LOCK_TTL_MS + 2 * TICK_INTERVAL_MS <= WEIGHTS_STALE_AFTER_S * 1000 / 2

Defaults: 5000 + 2 * 1000 = 7000 ms <= 15000 ms. The former default lease (30000 ms, equal to the
30 s ``stale_after_s``) failed it: a killed worker's group published nothing for 31.6 s.

A configuration breaking the rule is refused at start-up: ``ControlConfig.ready`` calls
:func:`refuse_bad_tick_timing`, so every process that loads Django stops with ``ImproperlyConfigured``
— gunicorn and the Celery worker and beat, which run no system check of their own (Celery's Django
fixup runs the checks but ignores errors), and every ``manage.py`` command. The same rule is the
Error-level system check ``control.E001``, for settings changed after start-up (``manage.py check``
under a settings override).
"""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core import checks
from django.core.exceptions import ImproperlyConfigured

CHECK_ID = "control.E001"


def tick_timing_problem(lock_ttl_ms: int, tick_interval_ms: int, stale_after_s: float) -> str | None:
    """Why this timing could let gateways fail open after a worker crash, or None when it is safe."""
    worst_gap_ms = lock_ttl_ms + 2 * tick_interval_ms
    budget_ms = stale_after_s * 1000 / 2
    if worst_gap_ms <= budget_ms:
        return None
    return (
        f"TICK_LOCK_TTL_MS ({lock_ttl_ms}) + 2 x TICK_INTERVAL_MS ({tick_interval_ms}) = {worst_gap_ms} ms "
        f"exceeds WEIGHTS_STALE_AFTER_S / 2 ({budget_ms:g} ms): after a worker crash its groups could "
        f"publish nothing until gateways fail open"
    )


def _current_problem() -> str | None:
    return tick_timing_problem(settings.TICK_LOCK_TTL_MS, settings.TICK_INTERVAL_MS,
                               settings.WEIGHTS_STALE_AFTER_S)


def check_tick_timing(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """Django system check (registered by ``ControlConfig.ready``)."""
    problem = _current_problem()
    if problem is None:
        return []
    return [checks.Error(
        problem,
        hint="Lower TICK_LOCK_TTL_MS (default 5000) or TICK_INTERVAL_MS, or raise WEIGHTS_STALE_AFTER_S.",
        id=CHECK_ID,
    )]


def refuse_bad_tick_timing() -> None:
    """Raise ``ImproperlyConfigured`` when the rule is broken (for processes that run no system check)."""
    problem = _current_problem()
    if problem is not None:
        raise ImproperlyConfigured(f"{CHECK_ID}: {problem}")


# --- Redis with Sentinel ----------------------------------------------------------------------------------
#
# A misconfigured Sentinel (an unknown master name, no Sentinel reachable) must stop a process at start
# with what is wrong, not leave it retrying or waiting on its first command. Asked only for a
# ``redis+sentinel://`` REDIS_URL (a plain Redis is left to the first command, as before), each Sentinel
# with a 1 s timeout: at most a second per listed Sentinel when none answers. The same for a Redis Cluster
# (``redis+cluster://``): every listed node must answer as a member of a cluster serving all 16384 slots.

SENTINEL_CHECK_ID = "control.E002"
SENTINEL_TIMEOUT_S = 1.0


def _sentinel_problem() -> str | None:
    """The sentinel URL's problem, or a cluster URL's (a node unreachable or not serving every slot)."""
    from contract.topology import cluster_problem, sentinel_problem

    return (sentinel_problem(settings.REDIS_URL, timeout_s=SENTINEL_TIMEOUT_S)
            or cluster_problem(settings.REDIS_URL, timeout_s=SENTINEL_TIMEOUT_S))


@checks.register("redis")
def check_redis_sentinel(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """Django system check: the Sentinels of a ``redis+sentinel://`` REDIS_URL name a primary."""
    problem = _sentinel_problem()
    if problem is None:
        return []
    return [checks.Error(
        problem,
        hint="REDIS_SENTINELS lists the Sentinels (host:port,...), REDIS_SENTINEL_MASTER the name in their "
             "'sentinel monitor <name> ...' line; or REDIS_URL=redis+sentinel://host:port,.../<name>/<db>. "
             "A cluster: REDIS_CLUSTER_NODES (host:port,...) lists nodes of one cluster whose slots are all served.",
        id=SENTINEL_CHECK_ID,
    )]


def refuse_bad_sentinel() -> None:
    """Raise ``ImproperlyConfigured`` when a sentinel REDIS_URL names no reachable primary (for the
    processes that run no system check: gunicorn, the Celery worker and beat)."""
    problem = _sentinel_problem()
    if problem is not None:
        raise ImproperlyConfigured(f"{SENTINEL_CHECK_ID}: {problem}")
