"""The start-up check on tick timing (``control.checks``): a crashed worker's groups must publish
again well before gateways fail open, so a lock lease as long as ``stale_after_s`` is refused."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.core.management import call_command
from django.core.management.base import SystemCheckError

from outlier_admin.control.checks import (
    CHECK_ID,
    check_tick_timing,
    refuse_bad_tick_timing,
    tick_timing_problem,
)

ROOT = Path(__file__).resolve().parents[3]


DEFAULTS = {"TICK_LOCK_TTL_MS": 5000, "TICK_INTERVAL_MS": 1000, "WEIGHTS_STALE_AFTER_S": 30}


def test_defaults_are_accepted(settings):
    assert tick_timing_problem(5000, 1000, 30) is None  # 7000 ms <= 15000 ms
    for name, default in DEFAULTS.items():
        if name not in os.environ:  # a value set on this machine is not the default
            assert getattr(settings, name) == default
    assert check_tick_timing() == []
    refuse_bad_tick_timing()


@pytest.mark.parametrize(("ttl_ms", "interval_ms", "stale_s", "ok"), [
    (30_000, 1000, 30, False),  # the former default: lease = stale_after_s (a 31.6 s gap was measured)
    (40_000, 1000, 30, False),  # lease > stale_after_s
    (14_000, 1000, 30, False),  # under stale_after_s but not under half of it
    (13_000, 1000, 30, True),   # 13000 + 2000 = 15000: exactly the budget
    (13_001, 1000, 30, False),
    (5000, 6000, 30, False),    # a slow beat counts too
    (5000, 1000, 10, False),    # a short stale_after_s needs a shorter lease
    (3000, 1000, 10, True),
])
def test_rule_lease_plus_two_intervals_within_half_of_stale_after(ttl_ms, interval_ms, stale_s, ok):
    problem = tick_timing_problem(ttl_ms, interval_ms, stale_s)
    assert (problem is None) is ok
    if not ok:
        assert str(ttl_ms) in problem and "WEIGHTS_STALE_AFTER_S" in problem


def test_lease_as_long_as_stale_after_is_an_error(settings):
    settings.TICK_LOCK_TTL_MS = 30_000
    settings.WEIGHTS_STALE_AFTER_S = 30
    errors = check_tick_timing()
    assert [e.id for e in errors] == [CHECK_ID] and errors[0].is_serious()
    with pytest.raises(ImproperlyConfigured, match=CHECK_ID):
        refuse_bad_tick_timing()
    # Registered with Django's check framework: `manage.py check` fails.
    with pytest.raises(SystemCheckError, match=CHECK_ID):
        call_command("check")


def _env(settings, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in DEFAULTS}
    env.update(DJANGO_SETTINGS_MODULE="outlier_admin.settings", REDIS_URL=settings.REDIS_URL,
               CELERY_BROKER_URL=settings.REDIS_URL, OUTLIER_TESTING="1", **extra)
    return env


def test_manage_py_check_refuses_and_accepts_defaults(settings):
    bad = subprocess.run([sys.executable, "manage.py", "check"], cwd=ROOT, capture_output=True, text=True,
                         env=_env(settings, TICK_LOCK_TTL_MS="30000"), timeout=60)
    assert bad.returncode != 0 and CHECK_ID in bad.stderr
    good = subprocess.run([sys.executable, "manage.py", "check"], cwd=ROOT, capture_output=True, text=True,
                          env=_env(settings), timeout=60)
    assert good.returncode == 0, good.stderr


def test_web_refuses_to_start(settings):
    """gunicorn loads ``outlier_admin.wsgi``, which runs no system check: the app itself refuses."""
    proc = subprocess.run([sys.executable, "-c", "import outlier_admin.wsgi"], cwd=ROOT, capture_output=True,
                          text=True, env=_env(settings, TICK_LOCK_TTL_MS="30000"), timeout=60)
    assert proc.returncode != 0 and CHECK_ID in proc.stderr


def test_celery_worker_refuses_to_start(settings):
    """Celery's Django fixup runs the system checks but ignores their errors: the app refuses instead.
    The worker points at this test's Redis database and is killed if it starts anyway."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "celery", "-A", "outlier_admin", "worker", "--pool", "solo", "--loglevel", "WARNING",
         "--without-gossip", "--without-mingle", "--without-heartbeat"],
        cwd=ROOT, env=_env(settings, TICK_LOCK_TTL_MS="30000"), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        out, _ = proc.communicate(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, _ = proc.communicate(timeout=10)
        pytest.fail(f"the worker started with a 30 s lease: {out[-2000:]}")
    assert proc.returncode != 0 and CHECK_ID in out
