"""One evaluation of a group's nodes: the sequence the live detector and the threshold preview share.

:func:`evaluate` is called by :meth:`detector.group.GroupDetector.evaluate` (every tick, over the
nodes' EW statistics) and by the threshold preview's replay
(:func:`outlier_admin.history.preview.replay`, over the figures its history rows recorded). Given every
signal's peer view and the group's detectors (:class:`~detector.detectors.verdict.Detector`, in the
ejection layer's priority order), it decides in this order:

1. the deciding signal and where each node stands against the lines
   (:func:`~detector.detectors.zscore.decide`, :func:`~detector.detectors.zscore.lines`);
2. each detector's verdicts: the Z verdict through persistence (:func:`detector.ejection.persistent_z`),
   a ``gated`` detector's (tail, cross-P50) through the deciding signal's gate
   (:meth:`~detector.detectors.verdict.Decision.gate`);
3. which nodes a weight cut is due for (:func:`detector.ejection.degrade_wanted`);
4. ejection: cause priority, dry run, the safeguard cap (:func:`detector.ejection.eject`);
5. soft degrade and hysteresis (:func:`detector.ejection.soft_degrade`);
6. restore steps and probes due (:func:`detector.ejection.restore`, :func:`detector.ejection.probes_due`),
   when the caller has canary probes (``judged`` given; the preview has none to replay);
7. the end of the tick (:func:`detector.ejection.end_of_tick`).

What happens before it (operator expiries, the end of warm-up, the peer view) and after it (weights,
explanations) is the caller's: the preview follows the recorded states for those.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from detector import ejection
from detector.detectors import zscore
from detector.detectors.verdict import Decision, Detector, Judging, Lines, PeerView, Verdict
from detector.moves import Moves, lookup
from detector.nodes import NodeArrays
from detector.states import BASELINE_STATES, SAFEGUARD_COUNTED, Reason, Safeguard
from detector.thresholds import Thresholds

_BASELINE = lookup(BASELINE_STATES)
_COUNTED = lookup(SAFEGUARD_COUNTED)


def _no_detail(reason: Reason, i: int) -> str:
    return ""


@dataclass
class Outcome:
    """What :func:`evaluate` decided: the deciding signal per node, the lines, every verdict (before
    dry run and the cap), what the cap let through, the probes due, the safeguard's figures, and each
    node's ``evidence`` toward a weight cut as the verdicts saw it, before the end of the tick resets
    it for a node that left service: the history records this value, so a replay of the tick (the
    threshold preview) sees the evidence a quarantine was decided on."""

    decision: Decision
    lines: Lines
    verdicts: list[Verdict]
    ejection: ejection.Ejection
    probes_due: np.ndarray
    safeguard: Safeguard
    evidence: np.ndarray


def evaluate(a: NodeArrays, t: Thresholds, now: float, view: PeerView, detectors: Sequence[Detector],
             moves: Moves, *, judged: np.ndarray | None = None,
             explain: Callable[[Reason, int], str] = _no_detail) -> Outcome:
    """Steps 1-7 of the module docstring over the nodes ``a`` at time ``now``; every state edge goes
    through ``moves``. ``judged``: the nodes with enough samples since their restore began (a live
    tick); None: no restore steps or probes in this evaluation. ``explain(reason, i)`` words a cause
    for the record."""
    d = zscore.decide(view, a, t, now)
    lines = zscore.lines(d, t)
    judging = Judging(view=view, decision=d, lines=lines, peers=_BASELINE[a.state] & view.fresh)
    verdicts: list[Verdict] = []
    ungated = np.zeros(len(a), dtype=bool)  # an enforced errors or Z verdict: a restore step fails on it
    for detector in detectors:
        for v in detector.verdicts(a, t, now, judging):
            if v.reason is Reason.Z_QUARANTINE:
                v = ejection.persistent_z(a, t, d, v.eject, now)
            elif detector.gated:
                v = d.gate(v, t)
            if not detector.gated:
                ungated |= ejection.enforced(v, t)
            verdicts.append(v)
    degrade_now = ejection.degrade_wanted(a, t, lines)
    evidence = zscore.evidence(a)
    ej = ejection.eject(a, t, now, verdicts, d, moves, explain)
    ejection.soft_degrade(a, t, now, degrade_now, lines, ej, moves)
    due = np.zeros(len(a), dtype=bool)
    if judged is not None:
        ejection.restore(a, t, now, judged=judged, failing=ungated, over_d=lines.over_d, moves=moves)
        due = ejection.probes_due(a, t, now, moves, strong=lines.over_q, accused=ej.cause >= 0)
    ejection.end_of_tick(a, now)
    safeguard = Safeguard(limit=ejection.cap(t, len(a)), counted=int(_COUNTED[a.state].sum()),
                          held=int(ej.blocked.sum()))
    return Outcome(decision=d, lines=lines, verdicts=verdicts, ejection=ej, probes_due=due, safeguard=safeguard,
                   evidence=evidence)
