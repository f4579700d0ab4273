"""A held cut is re-judged by a probe at its peers' load (``detector.ejection.probes_due``, release
probes): cut to the floor weight, a node's own rows are too few, and read at too small a batch, to
take it back under the exit line, and the weight hold never gives back what they allow."""

from __future__ import annotations

import math

import numpy as np

from detector.group import GroupDetector
from detector.states import NodeState
from detector.thresholds import Thresholds
from harness.fleet import Fleet

TICK = 0.25
PROMPT, COMPLETION = 10, 32


def step(gd, fleet, t, *, silent=(), rows=False):
    """One tick: every node's requests in the gateway's log (``rows``: its engine's progress rows
    instead, a group whose log carries no token counts) but the silent ones'."""
    if rows:
        b = fleet.progress(t, TICK, running=True)
        gd.ingest_progress(b.take(np.array([i for i in range(fleet.n) if i not in silent])))
    else:
        b = fleet.batch(t - TICK, TICK)
        gd.ingest(b.take(~np.isin(b.node, [fleet.nodes[i] for i in silent])))
    return gd.evaluate(t)


def answer(fleet, i, factor=1.0):
    """A probe's (ttft_ms, total_ms) on node ``i``, as the fleet prices a request, times ``factor``."""
    f = float(fleet.speed[i]) * factor
    ttft = (PROMPT * fleet.prefill_ms + fleet.overhead_ms) * f
    return ttft, ttft + COMPLETION * fleet.decode_ms * f


def held_cut(seed, rows=False):
    """Node 3 read 1.3x slow until it was cut (within 10 s; under quarantine strength: 1.5x), then was back to its
    peers' speed, but cut to the floor weight it streams nothing its EMA could clear on."""
    fleet = Fleet(8, seed=seed)
    gd = GroupDetector(Thresholds(), fleet.nodes)
    t = 0.0
    for _ in range(160):
        t += TICK
        step(gd, fleet, t, rows=rows)
    fleet.slow[3] = 1.3
    for _ in range(40):
        t += TICK
        ev = step(gd, fleet, t, rows=rows)
        if ev.states[3] == NodeState.DEGRADED:
            break
    assert ev.states[3] == NodeState.DEGRADED
    fleet.slow.pop(3)
    return fleet, gd, t


def until_release_due(gd, fleet, t, node, rows=False):
    """Ticks with the node silent until its release probe is due; every tick it stays held."""
    cut_at = float(gd.a.cut_at[3])
    for _ in range(round(2 * gd.thresholds.degrade_exit_dwell_s / TICK)):
        t += TICK
        ev = step(gd, fleet, t, silent={3}, rows=rows)
        assert ev.states[3] == NodeState.DEGRADED
        assert ev.weights[3] < ev.base_weights[3]
        if node in ev.probes_due:
            return t, t - cut_at
    raise AssertionError("no release probe in twice the exit dwell")


def test_a_held_cut_whose_release_probe_passes_is_given_back_step_by_step():
    fleet, gd, t = held_cut(seed=31)
    node = fleet.nodes[3]
    t, waited = until_release_due(gd, fleet, t, node)
    dwell = gd.thresholds.degrade_exit_dwell_s
    assert dwell - 1e-9 <= waited < dwell + 1.0
    ttft, total = answer(fleet, 3)
    assert gd.record_probe(node, t, PROMPT, COMPLETION, ttft, total, True) is True
    flaps = int(gd.a.flaps[3])
    ev = step(gd, fleet, t + TICK)
    assert ev.states[3] == NodeState.RECOVERING
    assert flaps == 1  # its next cut needs twice the evidence
    steps = len(gd.thresholds.recovery_steps)
    seen = []
    for _ in range(round((steps + 2) * gd.thresholds.recovery_step_s / TICK)):
        t += TICK
        ev = step(gd, fleet, t)
        seen.append(ev.weights[3] / ev.base_weights[3])
        if ev.states[3] == NodeState.HEALTHY:
            break
    assert ev.states[3] == NodeState.HEALTHY
    assert ev.weights[3] == ev.base_weights[3]
    assert min(seen) <= gd.thresholds.recovery_steps[0] + 1e-9  # it went up the steps


def test_a_held_cut_whose_release_probe_is_slow_stays_held_and_is_asked_again_a_dwell_later():
    fleet, gd, t = held_cut(seed=32)
    node = fleet.nodes[3]
    t, _ = until_release_due(gd, fleet, t, node)
    ttft, total = answer(fleet, 3, factor=1.6)
    assert gd.record_probe(node, t, PROMPT, COMPLETION, ttft, total, True) is False
    first = t
    t, _ = until_release_due(gd, fleet, t, node)  # asserts it stays DEGRADED meanwhile
    assert t - first >= gd.thresholds.degrade_exit_dwell_s - 1e-9
    # A probe that errs or times out releases nothing and is no verdict.
    assert gd.record_probe(node, t, PROMPT, COMPLETION, None, None, False) is None
    assert gd.a.state[3] == NodeState.DEGRADED
    assert math.isnan(gd.a.release_at[3])


def test_a_probe_asked_as_a_confirmation_never_releases_a_cut():
    fleet, gd, t = held_cut(seed=33)
    node = fleet.nodes[3]
    gd.a.release_at[3] = math.nan  # as probes_due leaves a confirmation probe
    ttft, total = answer(fleet, 3)
    assert gd.record_probe(node, t, PROMPT, COMPLETION, ttft, total, True) is None
    assert gd.a.state[3] == NodeState.DEGRADED


def test_where_the_log_carries_no_tokens_a_probe_is_read_on_decode_and_can_release():
    """No cost model (no token counts): every probe read "unknown" and failed, so in the real drill no
    held cut and no quarantined server was ever given back. Its engine's rows give the peers' time per
    output token, and the probe's answer its own."""
    fleet, gd, t = held_cut(seed=34, rows=True)
    assert gd.signals.fit_norm is None
    node = fleet.nodes[3]
    t, _ = until_release_due(gd, fleet, t, node, rows=True)
    slow_ttft, slow_total = answer(fleet, 3, factor=2.0)
    assert gd.probe_value(PROMPT, COMPLETION, slow_ttft, slow_total) > gd.probe_limit().limit
    assert gd.record_probe(node, t, PROMPT, COMPLETION, slow_ttft, slow_total, True) is False
    t, _ = until_release_due(gd, fleet, t, node, rows=True)
    ttft, total = answer(fleet, 3)
    value = gd.probe_value(PROMPT, COMPLETION, ttft, total)
    assert 0.9 < value <= gd.probe_limit().limit  # its own decode over the peers': about 1x expected
    assert gd.record_probe(node, t, PROMPT, COMPLETION, ttft, total, True) is True
    assert gd.a.state[3] == NodeState.RECOVERING
