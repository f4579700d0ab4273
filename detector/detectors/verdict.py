"""The interface between detectors and the ejection layer (:mod:`detector.ejection`): what a detector
says of every node at one evaluation (:class:`Verdict`), what it is given to say it (:class:`Judging`:
the peers' view of every signal, :class:`PeerView`; the deciding signal, :class:`Decision`; where
each node stands against the lines, :class:`Lines`; all three computed by
:mod:`detector.detectors.zscore`) and what every detector is (:class:`Detector`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar, Protocol

import numpy as np

from detector.states import Reason

if TYPE_CHECKING:
    from detector.nodes import NodeArrays
    from detector.thresholds import Thresholds


@dataclass(frozen=True)
class Verdict:
    """``eject[i]``: the detector wants node ``i`` out of service, for ``reason``. Whether it goes is
    the ejection layer's call (cause priority, persistence, the safeguard cap, the detector's
    ``enforcing`` switch)."""

    reason: Reason
    eject: np.ndarray


@dataclass
class PeerView:
    """Every signal's Z, EMA, baseline, spread and peer count, stacked ``(signal, node)``."""

    z: np.ndarray
    ema: np.ndarray
    baseline: dict[str, float]
    spread: dict[str, float]
    peers: dict[str, int]
    fresh: np.ndarray  # nodes seen within stale_after_s


@dataclass
class Decision:
    """Each node's three Z's (:func:`detector.detectors.zscore.decide`), named for what each feeds:

    - ``weight_z``: the largest Z of any signal — how far a degraded node's weight is cut
      (:mod:`detector.weights`);
    - ``cut_z``: the Z of the node's *deciding* signal (the largest among the judged, queue-free
      signals) — the degrade line (cut or not, and the hysteresis of leaving DEGRADED) and the
      safeguard's ranking of candidates read it; ``cut_excess`` is that signal's EMA over its
      baseline, ``cut_which`` its index in :data:`~detector.signals.SIGNALS` (-1: none yet);
    - ``quarantine_z``: the largest Z among the signals that may take a node out (all but prefill
      time, see :mod:`detector.detectors.zscore`) — the quarantine lines read it, with
      ``quarantine_excess`` and ``quarantine_which`` (a quarantine's record names that signal). A node
      whose prefill time is further out than its decode is cut on the prefill time and quarantined
      on the decode.

    ``t.degrade_z`` and ``t.quarantine_z`` (:class:`~detector.thresholds.Thresholds`) are the lines
    these are held against."""

    weight_z: np.ndarray
    cut_z: np.ndarray
    cut_excess: np.ndarray
    cut_which: np.ndarray
    quarantine_z: np.ndarray
    quarantine_excess: np.ndarray
    quarantine_which: np.ndarray
    queue_free: np.ndarray  # judged on a queue-free signal
    queue_laden: np.ndarray  # judged on a signal that includes the queue
    new: np.ndarray  # this tick's samples that count toward persistence
    drained_over: np.ndarray  # cut queue_drain_s ago and still over the degrade line
    name: str | None  # the group's deciding signal, for the explanation

    def gate(self, v: Verdict, t: Thresholds) -> Verdict:
        """A latency verdict (tail, cross-P50) stands only where the deciding signal agrees: over the
        degrade line (its Z and its materiality) on a signal that may quarantine (decode: prefill time
        grows with load under chunked prefill, so it never takes a node out, alone or through these),
        or, queue-laden, for a node whose queue has drained. Over the materiality alone is not enough:
        a P99 over 100 requests is their top one or two, and in a long-context group one 32k-token
        request put a healthy node's P99/P50 over the line for three windows while its decode Z was
        1.0 (1.15x, within the peers' spread), and the tail quarantined it."""
        keep = ~self.queue_free | ((self.quarantine_excess >= t.degrade_materiality) & (self.quarantine_z >= t.degrade_z))
        keep &= ~self.queue_laden | self.drained_over
        return Verdict(v.reason, v.eject & keep)


@dataclass
class Lines:
    """Where each node's deciding signal stands against the lines, this tick."""

    over_q: np.ndarray  # at quarantine strength (Z and materiality), on a signal that may quarantine
    over_d: np.ndarray  # over the degrade line
    still_d: np.ndarray  # not clearly back under it (hysteresis: leaving DEGRADED needs a margin)


@dataclass(frozen=True)
class Judging:
    """What one evaluation knows when it asks the detectors: every signal's peer view, the deciding
    signal (:func:`~detector.detectors.zscore.decide`), where each node stands against the lines, and
    ``peers``, the nodes that form the baseline (healthy or degraded, fresh)."""

    view: PeerView
    decision: Decision
    lines: Lines
    peers: np.ndarray


class Detector(Protocol):
    """One detector: its verdicts at an evaluation, and the per-node columns that hold its case.

    ``columns``: the :class:`~detector.nodes.NodeArrays` columns holding the detector's case against
    a node, all forgotten together (:func:`detector.ejection.reset_verdicts`) when the node leaves
    service or an operator decides. ``gated``: a latency verdict that stands only where the deciding
    signal agrees (:meth:`~detector.detectors.verdict.Decision.gate`). :meth:`verdicts` gives one
    :class:`Verdict` per reason, in the ejection layer's priority order
    (:data:`~detector.thresholds.DETECTORS`)."""

    columns: ClassVar[tuple[str, ...]]
    gated: ClassVar[bool]

    def verdicts(self, a: NodeArrays, t: Thresholds, now: float, judging: Judging) -> tuple[Verdict, ...]: ...
