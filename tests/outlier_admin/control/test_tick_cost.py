"""What a steady-state tick costs (nothing decided, no operator input, same history slot): one SQL
read, one SQL write and eight Redis round trips (``control/tick.py``'s docstring; docs/scale.md)."""

from __future__ import annotations

import numpy as np
import pytest
import redis
from django.db import connection
from django.test.utils import CaptureQueriesContext

from outlier_admin.control.tick import run_tick
from tests.outlier_admin.control.test_tick_fastpath import _slot_start, _writes, feed

pytestmark = [pytest.mark.django_db, pytest.mark.services]


@pytest.fixture(autouse=True)
def g1(make_group):
    return make_group("g1")


class RoundTrips:
    """Counts what redis-py sends to the server: one packed send is one round trip (a pipeline's
    MULTI/EXEC or a batch of reads is one send)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.count = 0
        original = redis.connection.AbstractConnection.send_packed_command

        def counted(conn, command, check_health=True):
            self.count += 1
            return original(conn, command, check_health)

        monkeypatch.setattr(redis.connection.AbstractConnection, "send_packed_command", counted)


def test_a_steady_state_tick_is_one_sql_read_one_sql_write_and_eight_redis_round_trips(redis_client, monkeypatch):
    rng = np.random.default_rng(6)
    t0 = _slot_start()
    for k in range(3):  # first tick (checkpoint, every node row written), then steady state
        feed(t0 + k, rng)
        run_tick("g1", now=t0 + k + 0.5)
    feed(t0 + 3, rng)
    trips = RoundTrips(monkeypatch)
    with CaptureQueriesContext(connection) as queries:
        res = run_tick("g1", now=t0 + 3.5)
    assert res is not None and res.entries and not res.checkpoint  # it applied new rows, nothing decided
    assert set(res.states.values()) == {"healthy"}
    # (SAVEPOINT / RELEASE: the test's own transaction around the tick's atomic block, BEGIN / COMMIT
    # outside a test; Django does not log those.)
    sql = [q["sql"] for q in queries.captured_queries if "SAVEPOINT" not in q["sql"]]
    writes = _writes(queries)
    assert len(writes) == 1, writes
    assert len(sql) - len(writes) == 1, sql
    assert trips.count == 8
