"""The one evaluation sequence (detector.evaluation.evaluate) and the detector interface it runs:
what the live detector and the threshold preview both call."""

from __future__ import annotations

import numpy as np

from detector.detectors.verdict import Judging, PeerView, Verdict
from detector.ejection import enter_quarantine
from detector.evaluation import evaluate
from detector.explain import transitions
from detector.group import GroupDetector
from detector.moves import Moves
from detector.nodes import FIELDS, NodeArrays
from detector.signals import SIGNALS
from detector.states import NodeState, Reason, Safeguard
from detector.thresholds import DETECTORS, Thresholds
from harness.fleet import Fleet, run

S = NodeState


class FailsFast:
    """A detector of this test's own, behind the same interface: node ``bad`` answers errors."""

    columns = ("consec_err",)
    gated = False

    def __init__(self, bad: int) -> None:
        self.bad = bad

    def verdicts(self, a: NodeArrays, t: Thresholds, now: float, judging: Judging) -> tuple[Verdict, ...]:
        eject = np.zeros(len(a), dtype=bool)
        eject[self.bad] = True
        return (Verdict(Reason.CONSECUTIVE_ERRORS, eject),)


def view(n: int, slow: list[int]) -> PeerView:
    """Every node at its peers' baseline on every signal, but the ``slow`` ones 1.5x on decode (Z 3:
    over the degrade line, under quarantine strength)."""
    z, ema = np.zeros((len(SIGNALS), n)), np.ones((len(SIGNALS), n))
    z[SIGNALS.index("decode"), slow], ema[SIGNALS.index("decode"), slow] = 3.0, 1.5
    return PeerView(z=z, ema=ema, baseline=dict.fromkeys(SIGNALS, 1.0), spread=dict.fromkeys(SIGNALS, 0.05),
                    peers=dict.fromkeys(SIGNALS, n), fresh=np.ones(n, dtype=bool))


def group_of_ten() -> NodeArrays:
    """Ten nodes: two pending approval (still slow: their proposals stand) and one quarantined, three
    counted against the cap; the rest healthy."""
    a = NodeArrays([f"n{i}" for i in range(10)])
    a.state[:] = S.HEALTHY
    a.state[[0, 1]] = S.PENDING_APPROVAL
    a.state[2] = S.QUARANTINED
    a.pending_since[[0, 1]] = 0.0
    return a


def test_the_cap_counts_proposals_and_a_held_node_is_flagged_on_its_move():
    a = group_of_ten()
    moves = Moves(a.state)
    out = evaluate(a, Thresholds(), 10.0, view(10, [0, 1]), (FailsFast(5),), moves)
    # 30 % of 10 is 3, and two proposals and a quarantine fill it: node 5 is held at the floor weight.
    assert out.safeguard == Safeguard(limit=3, counted=3, held=1) and out.safeguard.engaged
    assert [(m.i, m.src, m.dst, m.safeguard_hold) for m in moves.taken] == [(5, S.HEALTHY, S.DEGRADED, True)]
    # The record of the move says so too (the dashboard and the API read it there).
    records = transitions(moves.taken, a, Thresholds(), 10.0, view(10, [0, 1]), out.decision,
                          {s: np.zeros(10) for s in SIGNALS}, np.zeros(10))
    assert [(r.node, r.safeguard_hold, r.to_dict()["safeguard_hold"]) for r in records] == [("n5", True, True)]

    a = group_of_ten()
    moves = Moves(a.state)
    out = evaluate(a, Thresholds(max_quarantine_fraction=0.4), 10.0, view(10, [0, 1]), (FailsFast(5),), moves)
    assert out.safeguard == Safeguard(limit=4, counted=4, held=0) and out.safeguard.full
    assert [(m.i, m.dst, m.reason, m.safeguard_hold) for m in moves.taken] == [
        (5, S.QUARANTINED, Reason.CONSECUTIVE_ERRORS, False)]


def test_the_live_detectors_give_their_verdicts_in_priority_order_and_own_disjoint_columns():
    fleet = Fleet(8, seed=3)
    gd = GroupDetector(Thresholds(), fleet.nodes)
    fleet.slow[2] = 3.0
    evs = run(gd, fleet, 0.0, 20.0)
    assert list(evs[-1].verdicts) == list(DETECTORS)
    owned = [c for d in gd.detectors for c in d.columns]
    assert len(owned) == len(set(owned)) and set(owned) <= set(FIELDS)
    # Every detector's case is forgotten when a node leaves service.
    for c in owned:
        gd.a.column(c)[2] = 7
    enter_quarantine(gd.a, gd.thresholds, 2, 20.0)
    assert all(np.array_equal(gd.a.column(c)[2:3], [FIELDS[c][1]], equal_nan=True) for c in owned)


def test_a_tick_reports_the_deciding_signal_of_each_node_and_the_safeguard():
    fleet = Fleet(10, seed=5)
    gd = GroupDetector(Thresholds(), fleet.nodes)
    fleet.slow[4] = 3.0
    evs = run(gd, fleet, 0.0, 30.0)
    for ev in evs:
        for i, w in enumerate(ev.deciding):
            if w >= 0:
                assert ev.z[i] == ev.z_by_signal[ev.deciding_signal(i)][i]
    # The tick that cut node 4 judged it on the signal its transition names, a queue-free one.
    cut = next(ev for ev in evs if ev.transitions)
    i = cut.index(fleet.nodes[4])
    assert [t.node for t in cut.transitions] == [fleet.nodes[4]]
    assert cut.transitions[0].signal == cut.deciding_signal(i) in ("decode", "prefill_time")
    last = evs[-1]
    counted = np.isin(last.states, [int(S.QUARANTINED), int(S.PROBING), int(S.PENDING_APPROVAL)]).sum()
    assert last.states[last.index(fleet.nodes[4])] in (S.QUARANTINED, S.PROBING)
    assert last.cap == Safeguard(limit=3, counted=int(counted), held=0) and counted >= 1
