"""A node cut at quarantine strength whose samples stop coming is probed to confirm it
(``detector.ejection.probes_due``): cut to the floor weight in a quiet group, it otherwise waits
minutes for the request that would quarantine it."""

from __future__ import annotations

import math
from itertools import pairwise

import numpy as np

from detector.group import GroupDetector
from detector.states import NodeState
from detector.thresholds import Thresholds
from harness.fleet import Fleet

TICK = 0.25


def step(gd, fleet, t, *, silent=(), slow_rows=None):
    """One scrape period: every node's rows but the silent ones'; ``slow_rows``: that node streams
    at its ``fleet.slow`` factor (e.g. a probe running on it)."""
    b = fleet.progress(t, TICK, running=True)
    keep = [i for i in range(fleet.n) if i not in silent or i == slow_rows]
    gd.ingest_progress(b.take(np.array(keep)))
    return gd.evaluate(t)


def test_a_starved_cut_node_gets_a_confirmation_probe_and_its_stream_quarantines_it():
    fleet = Fleet(8, seed=21)
    gd = GroupDetector(Thresholds(), fleet.nodes)
    t = 0.0
    for _ in range(160):
        t += TICK
        step(gd, fleet, t)
    fleet.slow[3] = 4.0
    for _ in range(3):  # its one request, slow: cut at quarantine strength, and over before 1 s
        t += TICK
        ev = step(gd, fleet, t)
    assert ev.states[3] == NodeState.DEGRADED
    due_at = []
    for _ in range(24):  # 6 s without a request (the floor weight of a quiet group)
        t += TICK
        ev = step(gd, fleet, t, silent={3})
        assert ev.states[3] == NodeState.DEGRADED  # nothing to quarantine it on
        assert set(ev.probes_due) <= {fleet.nodes[3]}
        if fleet.nodes[3] in ev.probes_due:
            due_at.append(t)
    persistence = gd.thresholds.quarantine_persistence_s
    assert due_at and due_at[0] - 163 * TICK >= persistence - 1e-9
    assert all(b - a >= persistence - 1e-9 for a, b in pairwise(due_at))
    for _ in range(8):  # the probe runs on it: 2 s of its slow stream
        t += TICK
        ev = step(gd, fleet, t, silent={3}, slow_rows=3)
        if ev.states[3] == NodeState.QUARANTINED:
            break
    assert ev.states[3] == NodeState.QUARANTINED


def test_a_confirmation_probe_answer_is_a_sample_not_a_verdict():
    fleet = Fleet(8, seed=22)
    fleet.logs_ttft = True
    gd = GroupDetector(Thresholds(), fleet.nodes)
    t = 0.0
    for _ in range(200):
        gd.ingest(fleet.batch(t, TICK))
        t += TICK
        gd.evaluate(t)
    gd.a.state[2] = NodeState.DEGRADED  # as a cut leaves it
    before = int(gd.ewma["norm"].count[2])
    assert gd.record_probe(fleet.nodes[2], t, 10, 32, 80.0, 900.0, True) is None
    gd.evaluate(t + TICK)
    assert int(gd.ewma["norm"].count[2]) == before + 1
    assert gd.record_probe(fleet.nodes[2], t, 10, 32, None, None, False) is None  # a failed one: nothing
    assert math.isfinite(gd.ewma["norm"].mean[2])
