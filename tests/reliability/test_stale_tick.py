"""A tick that stalls past its lock lease and then resumes must not write its older detector state over
its successor's (found by bench/chaos_probe.py: SIGSTOP a worker mid-tick for 7 s, longer than the
5 s lease; the successor applied and acknowledged the entries, the resumed tick stored its state from
before them: 250 of 30,000 records un-applied)."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest
from django.db import connection

from contract import keys
from harness.records import make_records
from outlier_admin.control import tick
from outlier_admin.ingest.pipeline import submit

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.services]


def accepted_total(r, group: str) -> int:
    """Samples in the group's stored detector: its checkpoint plus the entries applied since."""
    from outlier_admin.fleet.models import ModelGroup

    tick._HELD.pop(group, None)  # what Redis holds, not this process's copy
    return tick._load_detector(r, ModelGroup.objects.get(name=group), 0.0)[0].accepted_total


def feed(t: float, rng) -> int:
    recs = make_records(t, rng=rng, per_node=10)
    assert submit([(i + 1, rec, None) for i, rec in enumerate(recs)], source="test").accepted == len(recs)
    return len(recs)


def test_a_resumed_stale_tick_does_not_overwrite_its_successors_state(redis_client, make_group, monkeypatch):
    make_group("g1")
    rng = np.random.default_rng(1)
    t0 = time.time()
    applied = feed(t0, rng)
    tick.run_tick("g1", now=t0 + 0.5)
    assert accepted_total(redis_client, "g1") == applied
    applied += feed(t0 + 1, rng)  # entries the stale tick has loaded nothing of yet

    entered, resume = threading.Event(), threading.Event()
    real_sync = tick._sync_nodes

    def stalling_sync(*args, **kwargs):
        if threading.current_thread().name == "stale":
            entered.set()  # the state is loaded: stall here, as under SIGSTOP
            resume.wait(20)
        return real_sync(*args, **kwargs)

    monkeypatch.setattr(tick, "_sync_nodes", stalling_sync)
    outcome: list = []

    def stale() -> None:
        try:
            outcome.append(tick.run_tick("g1", now=t0 + 1.5, consumer="stale"))
        finally:
            connection.close()

    thread = threading.Thread(target=stale, name="stale")
    thread.start()
    assert entered.wait(20)
    redis_client.delete(keys.tick_lock("g1"))  # its lease ran out while it was stopped
    successor = tick.run_tick("g1", now=t0 + 1.6, consumer="successor")
    assert successor is not None and accepted_total(redis_client, "g1") == applied
    resume.set()
    thread.join(30)
    assert outcome == [None]  # the stale tick dropped its writes (LeaseLost)
    assert accepted_total(redis_client, "g1") == applied  # nothing un-applied
    assert redis_client.xlen(keys.stream("g1")) == 0
