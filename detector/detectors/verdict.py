"""The interface between detectors and the ejection layer (:mod:`detector.ejection`): what a detector
says of every node at one evaluation (:class:`Verdict`), what it is given to say it (:class:`Judging`)
and what every detector is (:class:`Detector`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar, Protocol

import numpy as np

from detector.states import Reason

if TYPE_CHECKING:
    from detector.detectors.zscore import Decision, Lines, PeerView
    from detector.nodes import NodeArrays
    from detector.thresholds import Thresholds


@dataclass(frozen=True)
class Verdict:
    """``eject[i]``: the detector wants node ``i`` out of service, for ``reason``. Whether it goes is
    the ejection layer's call (cause priority, persistence, the safeguard cap, the detector's
    ``enforcing`` switch)."""

    reason: Reason
    eject: np.ndarray


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
    signal agrees (:meth:`~detector.detectors.zscore.Decision.gate`). :meth:`verdicts` gives one
    :class:`Verdict` per reason, in the ejection layer's priority order
    (:data:`~detector.thresholds.DETECTORS`)."""

    columns: ClassVar[tuple[str, ...]]
    gated: ClassVar[bool]

    def verdicts(self, a: NodeArrays, t: Thresholds, now: float, judging: Judging) -> tuple[Verdict, ...]: ...
