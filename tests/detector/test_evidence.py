"""The per-node CUSUM that gates a weight cut (detector.evidence), alone and inside GroupDetector."""

import math

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

import detector.ejection as ejection_module
from detector.evidence import cusum_update, excess_over_line
from detector.group import GroupDetector
from detector.states import NodeState
from detector.thresholds import Thresholds
from harness.fleet import Fleet, run


def one_by_one(s, node, x, k, c):
    s = s.copy()
    for i, v in zip(node, x, strict=True):
        s[i] = max(0.0, s[i] + min(max(v, -c), c) - k)
    return s


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.tuples(st.integers(0, 5), st.floats(-20, 20)), max_size=60),
    st.lists(st.floats(0, 30), min_size=6, max_size=6),
    st.floats(0, 2),
    st.floats(0.5, 10),
)
def test_batch_update_equals_the_recursion_one_sample_at_a_time(samples, start, k, c):
    samples.sort(key=lambda p: p[0])  # grouped by node, arrival order kept within a node (stable)
    node = np.array([p[0] for p in samples], dtype=np.int64)
    x = np.array([p[1] for p in samples], dtype=np.float64)
    s0 = np.array(start)
    got = cusum_update(s0, node, x, allowance=k, cap=c)
    np.testing.assert_allclose(got, one_by_one(s0, node, x, k, c), atol=1e-9)


def test_excess_is_measured_from_the_materiality_line_in_request_sd():
    x = excess_over_line(np.array([14.0 * 1.15, 14.0 * 1.15 * math.e ** 0.1]), 14.0, 1.15, 0.1)
    np.testing.assert_allclose(x, [0.0, 1.0])


def test_below_the_line_drifts_to_zero_and_a_3x_node_needs_degrade_persistence_samples():
    t = Thresholds()
    cap = t.degrade_evidence / t.degrade_persistence + t.evidence_allowance
    # 12% slower than the baseline, 7% per-request noise: under the 15% line, never accumulates.
    rng = np.random.default_rng(3)
    v = 14.0 * 1.12 * rng.lognormal(0, 0.07, 5000)
    s = np.zeros(1)
    peak = 0.0
    for chunk in np.array_split(v, 1000):
        s = cusum_update(s, np.zeros(len(chunk), dtype=np.int64),
                         excess_over_line(chunk, 14.0, 1.15, 0.07), allowance=t.evidence_allowance, cap=cap)
        peak = max(peak, float(s[0]))
    assert peak < t.degrade_evidence / 2
    # 3x slower: each request is capped, so exactly degrade_persistence (3) of them reach the line.
    x = excess_over_line(np.full(3, 42.0), 14.0, 1.15, 0.07)
    s2 = cusum_update(np.zeros(1), np.zeros(2, dtype=np.int64), x[:2], allowance=t.evidence_allowance, cap=cap)
    s3 = cusum_update(np.zeros(1), np.zeros(3, dtype=np.int64), x, allowance=t.evidence_allowance, cap=cap)
    assert s2[0] < t.degrade_evidence <= s3[0] + 1e-9


def test_a_steadily_slightly_slower_node_is_not_cut_but_a_throttled_one_is():
    # Node 4 is 11% slower for good (within a healthy fleet's spread), node 9 is throttled 2.5x.
    fleet = Fleet(24, seed=11, speed_spread=0.0, jitter=0.1)
    fleet.speed[4] = 1.11
    gd = GroupDetector(Thresholds(), fleet.nodes)
    run(gd, fleet, 0, 30)
    fleet.slow[9] = 2.5
    evs = run(gd, fleet, 30, 120)
    cuts_4 = [t for ev in evs for t in ev.transitions if t.node == fleet.nodes[4]]
    assert cuts_4 == []
    assert max(float(ev.z[4]) for ev in evs) >= 2.0  # its EMA did wander over the Z line
    first_9 = next(ev.at for ev in evs if ev.states[9] != NodeState.HEALTHY)
    assert first_9 - 30 <= 1.5


def _cuts_of_a_flapping_node(seconds: float) -> list:
    """Node 3 is 35% slower at full weight and at par once cut (a smaller batch decodes faster)."""
    fleet = Fleet(16, seed=12)
    gd = GroupDetector(Thresholds(degrade_exit_dwell_s=0.0), fleet.nodes)
    run(gd, fleet, 0, 30)
    cuts, t = [], 30.0
    for _ in range(round(seconds / 0.2)):
        fleet.slow[3] = 1.0 if gd.state_of(fleet.nodes[3]) == NodeState.DEGRADED else 1.35
        gd.ingest(fleet.batch(t, 0.2))
        t += 0.2
        ev = gd.evaluate(t)
        cuts += [tr for tr in ev.transitions if tr.node == fleet.nodes[3] and tr.to_state == NodeState.DEGRADED]
    return cuts


def test_flap_damping_doubles_the_evidence_each_new_cut_needs(monkeypatch):
    # Flap damping on its own: without the exit dwell (which alone spaces the cuts 30 s apart). In 150 s
    # the damped line doubles up to its cap (256, 70 s after the first cut) and cuts there three times:
    # 8 cuts damped, 52 undamped (in 300 s: 13 and 102).
    damped = _cuts_of_a_flapping_node(150)
    assert [c.detail.split("cut at ")[1].split(",")[0] for c in damped[:4]] == ["8", "16", "32", "64"]
    monkeypatch.setattr(ejection_module, "MAX_FLAP_DOUBLINGS", 0)  # no damping: the line stays at 8
    undamped = _cuts_of_a_flapping_node(150)
    assert len(undamped) > 4 * len(damped) > 0
