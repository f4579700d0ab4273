"""The ejection layer (detector.ejection) on its own: the safeguard's cap is never exceeded, only
allowed edges are taken, dry run acts on nothing, errors outrank latency, and one batch equals the
same samples in pieces (hypothesis)."""

from __future__ import annotations

import itertools
import math

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from detector import GroupDetector, NodeState, Thresholds
from detector.detectors.verdict import Verdict
from detector.detectors.zscore import Decision
from detector.ejection import eject
from detector.moves import Moves
from detector.nodes import NodeArrays
from detector.states import ALLOWED_EDGES, OUT_OF_SERVICE, Reason
from detector.thresholds import DETECTORS

from .helpers import Fleet, run

S = NodeState
HELD = [int(s) for s in (*OUT_OF_SERVICE, S.PENDING_APPROVAL)]
REASONS = [Reason(d) for d in DETECTORS]


def _decision(score: np.ndarray) -> Decision:
    n = len(score)
    no = np.zeros(n, dtype=bool)
    return Decision(score=score, excess=np.ones(n), which=np.full(n, 2), weight_score=score, queue_free=~no,
                    queue_laden=no, new=np.ones(n, dtype=np.int64), drained_over=no,
                    name="decode", may_quarantine=~no)


@settings(max_examples=200, deadline=None)
@given(
    states=st.lists(st.sampled_from(list(S)), min_size=1, max_size=40),
    data=st.data(),
    frac=st.floats(0.0, 1.0),
    approval=st.booleans(),
    dry=st.lists(st.sampled_from(DETECTORS), unique=True, max_size=3),
)
def test_eject_respects_the_cap_dry_run_and_the_edges(states, data, frac, approval, dry):
    n = len(states)
    a = NodeArrays([f"n{i}" for i in range(n)])
    a.state[:] = [int(s) for s in states]
    before = a.state.copy()
    masks = [np.array(data.draw(st.lists(st.booleans(), min_size=n, max_size=n))) for _ in REASONS]
    verdicts = [Verdict(r, m) for r, m in zip(REASONS, masks, strict=True)]
    score = np.array(data.draw(st.lists(st.floats(-5, 50), min_size=n, max_size=n)))
    t = Thresholds(max_quarantine_fraction=frac, require_approval=approval, dry_run=dry)
    moves = Moves(a.state)
    ej = eject(a, t, 0.0, verdicts, _decision(score), moves, lambda _r, _i: "")
    cap = math.floor(frac * n + 1e-9)
    held_before = int(np.isin(before, HELD).sum())
    ejected = [m for m in moves.taken if m.dst in (S.QUARANTINED, S.PENDING_APPROVAL)]
    assert len(ejected) <= max(cap - held_before, 0)
    for m in moves.taken:
        assert (m.src, m.dst) in ALLOWED_EDGES
        assert m.src in (S.HEALTHY, S.DEGRADED)  # only nodes in service are taken out or held back
    for m in ejected:
        assert m.reason.value not in dry  # a detector in dry run is recorded, never acted on
        assert m.dst is (S.PENDING_APPROVAL if approval else S.QUARANTINED)
    if ejected and len(ej.blocked.nonzero()[0]):
        # Errors outrank latency: a node held back by the cap never has an error cause while a
        # latency-only node went out.
        errors = {Reason.CONSECUTIVE_ERRORS, Reason.SUCCESS_RATE}
        if any(m.reason not in errors for m in ejected):
            assert not any(ej.cause[i] in (0, 1) for i in ej.blocked.nonzero()[0])


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 1000), cuts=st.lists(st.integers(1, 400), max_size=6), slow=st.floats(1.0, 4.0))
def test_one_batch_equals_the_same_samples_in_pieces(seed, cuts, slow):
    fleet = Fleet(8, seed=seed, rate=400)
    whole = GroupDetector(Thresholds(), fleet.nodes)
    run(whole, fleet, 0.0, 6.0)  # the cost model is fitted, baselines exist
    pieces = GroupDetector.from_bytes(whole.to_bytes())
    fleet.slow[3] = slow
    batch = fleet.batch(6.0, 1.0, status={5: 503} if seed % 2 else None)
    whole.ingest(batch)
    bounds = [0, *sorted({c % len(batch) for c in cuts}), len(batch)]
    for lo, hi in itertools.pairwise(bounds):
        if hi > lo:
            pieces.ingest(batch.take(np.arange(lo, hi)))
    a, b = whole.evaluate(7.0), pieces.evaluate(7.0)
    np.testing.assert_array_equal(a.states, b.states)
    np.testing.assert_allclose(a.weights, b.weights, rtol=1e-9)
    np.testing.assert_allclose(a.z, b.z, rtol=1e-7, equal_nan=True)
    np.testing.assert_allclose(a.evidence, b.evidence, rtol=1e-7)
    assert [(t.node, t.from_state, t.to_state, t.reason) for t in a.transitions] == [
        (t.node, t.from_state, t.to_state, t.reason) for t in b.transitions]


def test_a_pending_node_leaves_only_clearly_under_the_line_as_a_degraded_one_does():
    """Issue 26 item 3: a node pending approval went back to healthy at Z 2.99 (its line 3.0 in that
    group), its proposal superseded, only for a new one to open later. A pending node clears with the
    same margin as a degraded one (``degrade_hysteresis``); in between it keeps its proposal."""
    from detector.detectors.zscore import lines
    from detector.ejection import Ejection, soft_degrade

    t = Thresholds(require_approval=True)  # degrade_z 2.0, hysteresis 0.5, materiality 1.15
    # Z just under the degrade line, half-way down the margin, and clearly back.
    score = np.array([1.99, 1.6, 1.4])
    d = _decision(score)
    d.excess[:] = 1.3
    for start in (S.PENDING_APPROVAL, S.DEGRADED):
        a = NodeArrays([f"n{i}" for i in range(3)])
        a.state[:] = start
        moves = Moves(a.state)
        soft_degrade(a, 100.0, np.zeros(3, dtype=bool), lines(d, t),
                     Ejection(cause=np.full(3, -1, dtype=np.int8), blocked=np.zeros(3, dtype=bool),
                              safeguard_reason=None), moves)
        assert [NodeState(int(s)) for s in a.state] == [start, start, S.HEALTHY], start
