"""Invariants of the detector under random fleets, faults and operator actions (hypothesis)."""

import contextlib
import math

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from detector.group import GroupDetector
from detector.states import ALLOWED_EDGES, OUT_OF_SERVICE, NodeState
from detector.thresholds import Thresholds
from harness.fleet import Fleet

OUT = [int(s) for s in OUT_OF_SERVICE]


def _act(gd: GroupDetector, what: str, node: str, now: float) -> None:
    if what == "approve":
        gd.approve(node, now)
    elif what == "reject":
        gd.reject(node, now)
    elif what == "release":
        gd.release(node, now)
    elif what == "force_q":
        gd.force_quarantine(node, now, until=now + 3)
    elif what == "force_a":
        gd.force_active(node, now, until=now + 3)
    else:
        gd.pin_weight(node, 3, now, until=now + 3)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    n=st.integers(3, 14),
    seed=st.integers(0, 10_000),
    slow=st.dictionaries(st.integers(0, 13), st.floats(0.5, 12.0), max_size=8),
    frac=st.floats(0.0, 0.6),
    approval=st.booleans(),
    actions=st.lists(st.tuples(st.integers(0, 60), st.integers(0, 13), st.sampled_from(["approve", "reject", "release", "force_q", "force_a", "pin"])), max_size=6),
)
def test_invariants(n, seed, slow, frac, approval, actions):
    fleet = Fleet(n, seed=seed, rate=20 * n)
    t = Thresholds(max_quarantine_fraction=frac, require_approval=approval, canary_interval_s=2, recovery_step_s=2)
    gd = GroupDetector(t, fleet.nodes)
    cap = math.floor(frac * n + 1e-9)
    now = 0.0
    for step in range(75):
        if step == 20:
            fleet.slow = {k % n: v for k, v in slow.items()}
        gd.ingest(fleet.batch(now, 0.2))
        now += 0.2
        for when, who, what in actions:
            if when == step:
                node = fleet.nodes[who % n]
                # e.g. approving a node that is not pending is refused and changes nothing
                with contextlib.suppress(ValueError):
                    _act(gd, what, node, now)
        ev = gd.evaluate(now)
        for node in ev.probes_due:
            i = fleet.nodes.index(node)
            f = fleet.slow.get(i, 1.0)
            gd.record_probe(node, now, 1000, 100, 140 * f, 1540 * f, True)
        assert (ev.weights >= 0).all() and np.isfinite(ev.weights).all()
        assert ev.weights.sum() > 0  # never route to nowhere
        forced = int((ev.states == NodeState.FORCED_QUARANTINE).sum())
        detector_out = int(np.isin(ev.states, OUT).sum()) - forced
        assert detector_out + int((ev.states == NodeState.PENDING_APPROVAL).sum()) <= max(cap, 0) + forced
        for tr in ev.transitions:
            assert (tr.from_state, tr.to_state) in ALLOWED_EDGES
