"""The demo's Redis stand-in: with no Redis reachable, ``make demo`` runs on fakeredis
(:func:`outlier_admin.demo.runner`), so the tick must work there too. fakeredis refuses a read of a
stream that does not exist yet with its own words ("requires the key to exist"), not Redis's
``NOGROUP``: the first tick of every group crashed the demo on a machine without Redis."""

from __future__ import annotations

import time

import pytest

from outlier_admin.control import redis_conn, tick
from outlier_admin.control.actions import do_register_node
from outlier_admin.control.tick import run_tick

fakeredis = pytest.importorskip("fakeredis")


@pytest.mark.django_db
def test_the_first_tick_of_a_new_group_runs_on_the_demos_stand_in(make_group):
    group = make_group("fake-g")
    for i in range(4):
        do_register_node(group, f"127.0.0.1:{9100 + i}", actor="test")
    redis_conn.set_redis(fakeredis.FakeRedis())
    tick._HELD.clear()
    try:
        first = run_tick("fake-g", now=time.time())
        second = run_tick("fake-g", now=time.time() + 1)
    finally:
        redis_conn.set_redis(None)
        tick._HELD.clear()
    assert first is not None and second is not None
    assert second.version > first.version
