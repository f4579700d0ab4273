"""The cross-node P50 check: a node whose P50 exceeds ``cross_p50_ratio`` (2x) times the median P50
of its peers is *relatively slow*. It catches a node that is uniformly slow, whose own P99/P50 looks
normal. The percentiles are the tail detector's (:mod:`detector.detectors.tail`), on the same
normalised per-request values, refreshed once per ``tail_window_s``.
"""

from __future__ import annotations

import numpy as np

from detector.detectors.verdict import Judging, Verdict
from detector.nodes import NodeArrays
from detector.states import Reason
from detector.thresholds import Thresholds


def cross_p50_slow(p50: np.ndarray, peers: np.ndarray, enough: np.ndarray, *, factor: float) -> np.ndarray:
    """Nodes with ``P50 > factor * median(P50 of peers)`` (needs at least 3 peers with data)."""
    ref = peers & enough & np.isfinite(p50)
    if ref.sum() < 3:
        return np.zeros(len(p50), dtype=bool)
    median = float(np.median(p50[ref]))
    return enough & (p50 > factor * median)


class CrossP50Detector:
    """The cross-node P50 verdict (a :class:`~detector.detectors.verdict.Detector`). ``cross_slow`` is
    set with the tail detector's percentiles (:func:`detector.detectors.tail.judge_percentiles`), which
    comes before it in every evaluation."""

    columns = ("cross_slow",)
    gated = True

    def verdicts(self, a: NodeArrays, t: Thresholds, now: float, judging: Judging) -> tuple[Verdict, ...]:
        return (Verdict(Reason.CROSS_P50, a.cross_slow.astype(bool)),)
