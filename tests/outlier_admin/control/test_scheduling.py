"""Fair tick scheduling (``control.scheduling``): one queued tick per group, most overdue first, so a
group's ticks cannot be starved by other groups when the workers cannot keep up. The overload
scenarios: ``test_scheduling_overload.py`` (in process) and ``test_scheduling_worker.py`` (real Celery)."""

from __future__ import annotations

import time

import pytest

from contract import keys
from outlier_admin.control import scheduling

pytestmark = [pytest.mark.services]


def test_oldest_first_puts_never_ticked_groups_first():
    assert scheduling.oldest_first(["c", "a", "b", "d"], [5.0, None, 2.0, None]) == ["a", "d", "b", "c"]


def test_claim_skips_queued_and_running_groups_most_overdue_first(redis_client, settings):
    settings.TICK_LOCK_TTL_MS = 5000
    redis_client.zadd(keys.TICK_LAST, {"a": 30.0, "b": 10.0, "c": 20.0})
    due, queued_at = scheduling.claim_due(redis_client, ["a", "b", "c", "new"])
    assert due == ["new", "b", "c", "a"]
    assert redis_client.get(keys.tick_queued("b")).decode() == f"{queued_at:.6f}"
    assert 0 < redis_client.pttl(keys.tick_queued("b")) <= 5000

    # Queued ticks are not queued again; nor is a group whose tick is running (its lock is held).
    assert scheduling.claim_due(redis_client, ["a", "b", "c", "new"])[0] == []
    redis_client.delete(*(keys.tick_queued(g) for g in "abc"))
    redis_client.set(keys.tick_lock("c"), "someone", px=5000)
    assert scheduling.claim_due(redis_client, ["a", "b", "c"])[0] == ["b", "a"]


def test_a_tick_frees_its_group_and_a_duplicate_returns_at_once(redis_client, settings):
    settings.TICK_LOCK_TTL_MS = 5000
    (group,), first_queued = scheduling.claim_due(redis_client, ["g"])
    started = scheduling.start(redis_client, group, first_queued)
    assert started is not None and started >= first_queued
    scheduling.finish(redis_client, group, started, ticked=True)
    assert redis_client.zscore(keys.TICK_LAST, "g") == pytest.approx(started)
    assert not redis_client.exists(keys.tick_queued("g")), "the next beat may queue it again"

    # A task queued before that tick started (its marker had lapsed while it waited) is a duplicate.
    assert scheduling.start(redis_client, "g", started - 1.0) is None
    # Queued after it: a real tick. A task without queued_at (an older deployment's) always runs.
    assert scheduling.start(redis_client, "g", started + 0.001) is not None
    assert scheduling.start(redis_client, "g", None) is not None


def test_a_lost_task_delays_its_group_by_one_lease_only(redis_client, settings):
    settings.TICK_LOCK_TTL_MS = 300
    assert scheduling.claim_due(redis_client, ["g"])[0] == ["g"]  # its worker dies with the task
    assert scheduling.claim_due(redis_client, ["g"])[0] == []
    time.sleep(0.4)
    assert scheduling.claim_due(redis_client, ["g"])[0] == ["g"]


def test_groups_no_longer_listed_are_forgotten(redis_client):
    redis_client.zadd(keys.TICK_LAST, {"kept": 1.0, "deleted": 2.0})
    scheduling.claim_due(redis_client, ["kept"], prune=False)
    assert redis_client.zcard(keys.TICK_LAST) == 2, "a partial list (from Redis) prunes nothing"
    scheduling.claim_due(redis_client, ["kept"], prune=True)
    assert [m.decode() for m in redis_client.zrange(keys.TICK_LAST, 0, -1)] == ["kept"]


# --- event-driven tickers ---------------------------------------------------------------------------------


def test_rendezvous_ownership_moves_only_the_groups_of_a_ticker_that_leaves():
    groups = [f"g{i}" for i in range(200)]
    three = {g: scheduling.owner_of(g, ["a", "b", "c"]) for g in groups}
    two = {g: scheduling.owner_of(g, ["a", "c"]) for g in groups}
    assert {t: sum(o == t for o in three.values()) for t in "abc"} == pytest.approx({"a": 67, "b": 67, "c": 67}, abs=20)
    moved = [g for g in groups if three[g] != two[g]]
    assert moved and all(three[g] == "b" for g in moved), "only the leaver's groups move"
    assert scheduling.owner_of("g1", []) is None


def test_a_ticker_ticks_a_group_on_new_rows_before_its_heartbeat(redis_client, settings):
    settings.TICK_INTERVAL_MS = 60_000  # a heartbeat far away: a second tick can only be event-driven
    ticked: list[str] = []
    ticker = scheduling.Ticker("t1", redis_client, tick=lambda g, c: ticked.append(g),
                               list_groups=lambda: ["ga", "gb"])
    ticker.step()  # registers, owns both, ticks both once (new to it)
    assert sorted(ticked) == ["ga", "gb"] and scheduling.tickers_alive(redis_client) == ["t1"]
    assert ticker.step() == 0  # nothing new: waits (briefly, until its renewal) and ticks nothing
    redis_client.xadd(keys.stream("gb"), {"rows": b"[]"})
    # The heartbeat is a minute away and the loop gives up after 5 s (a guard against a hang only):
    # a tick in it can only be the row's.
    deadline = time.monotonic() + 5
    while len(ticked) < 3 and time.monotonic() < deadline:
        ticker.step()
    assert ticked[2:] == ["gb"], "only the group with a new row"
    ticker.leave()
    assert scheduling.tickers_alive(redis_client) == []


def test_the_beat_enqueues_nothing_while_a_ticker_is_alive(redis_client, make_group):
    from outlier_admin.control.tasks import tick_all_groups

    make_group("g1")
    redis_client.zadd(scheduling.TICKERS_KEY, {"t1": scheduling.redis_now(redis_client) + 60})
    assert tick_all_groups.run() == 0
    redis_client.zadd(scheduling.TICKERS_KEY, {"t1": scheduling.redis_now(redis_client) - 1})  # lapsed
    assert tick_all_groups.run() == 1
