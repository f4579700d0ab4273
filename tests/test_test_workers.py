"""`make test` runs the suite on pytest-xdist workers: each worker's Redis database number is its own
(outlier_admin/settings.py), as pytest-django makes each worker's PostgreSQL database its own, because
every test that touches Redis starts from FLUSHDB of its number. The processes a test starts read the
number they are given, never moving it again."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.timeout(60)


def _redis_url(worker: str | None, redis_url: str, *, under_pytest: bool) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in {"PYTEST_XDIST_WORKER", "REDIS_URL"}}
    env.update(DJANGO_SETTINGS_MODULE="outlier_admin.settings", DJANGO_DEBUG="1", REDIS_URL=redis_url)
    if worker is not None:
        env["PYTEST_XDIST_WORKER"] = worker
    code = ("import pytest; " if under_pytest else "") + (
        "import django, os; django.setup(); from django.conf import settings; "
        "print(settings.REDIS_URL, os.environ['REDIS_URL'])")
    return subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=60)


@pytest.mark.parametrize(("worker", "given", "expected"), [
    ("gw0", "redis://127.0.0.1:6379/0", "redis://127.0.0.1:6379/1"),
    ("gw2", "redis://127.0.0.1:6379/4", "redis://127.0.0.1:6379/7"),
    ("gw1", "redis://:secret@127.0.0.1:6379", "redis://:secret@127.0.0.1:6379/2"),
    (None, "redis://127.0.0.1:6379/4", "redis://127.0.0.1:6379/4"),  # not on a worker: as given
])
def test_each_worker_has_its_own_redis_database_and_passes_it_on(worker, given, expected):
    proc = _redis_url(worker, given, under_pytest=True)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == [expected, expected]  # the setting, and the environment children inherit
    # A process the test starts (not pytest) inherits the moved URL and the worker's name: it keeps it.
    child = _redis_url(worker, expected, under_pytest=False)
    assert child.returncode == 0, child.stderr
    assert child.stdout.split() == [expected, expected]


def test_a_worker_past_the_last_redis_database_is_refused():
    proc = _redis_url("gw15", "redis://127.0.0.1:6379/0", under_pytest=True)
    assert proc.returncode != 0
    assert "ImproperlyConfigured" in proc.stderr and "database 16" in proc.stderr
