"""Seed 001's tail detector: the P99/P50 ratio of each node's recent requests, over windows.

Per node, once per window (default 30 s), over its last ``window_size`` samples:

- fewer than ``tail_min_samples`` (100) samples -> ``INSUFFICIENT`` (seed 001: the P99 estimate's
  95% CI is about ±30% below that);
- ``P99 / P50 > tail_ratio`` (3.0) -> ``SUSPECT``; still so for ``tail_windows`` (3) consecutive
  windows -> ``UNHEALTHY``;
- ratio back at or below the threshold -> ``HEALTHY`` (seed 001's *Recovered*).

One guard the seed lacks: a ratio only counts when it also stands out from the peers' ratios
(``> peer_factor * median ratio``, :data:`~detector.thresholds.TAIL_PEER_FACTOR`). Under a surge every node queues and every node's tail
widens; that is a group condition for admission control, not a node fault.

We run it on the *normalised* signal (latency / cost model), not on raw latency as the seed does:
raw LLM latencies span three orders of magnitude with prompt length, so a perfectly healthy node's raw
P99/P50 is ~8 and the seed's ratio test would flag every node. When the decode signal has a baseline,
a request's window value is its queue-free decode time over that baseline instead: near saturation
the total's P99/P50 widens on any node by queueing alone.

:class:`TailDetector` owns the per-node sliding windows (:mod:`detector.window`) and, once per
``tail_window_s``, the percentiles that both this detector and the cross-node P50
(:mod:`detector.detectors.cross_p50`) judge.
"""

from __future__ import annotations

import enum
import math

import numpy as np

from detector.detectors.cross_p50 import cross_p50_slow
from detector.detectors.verdict import Judging, Verdict
from detector.nodes import NodeArrays
from detector.states import Reason
from detector.thresholds import TAIL_PEER_FACTOR, Thresholds
from detector.window import SlidingWindows


class TailStatus(enum.IntEnum):
    INSUFFICIENT = 0
    HEALTHY = 1
    SUSPECT = 2
    UNHEALTHY = 3


def tail_step(
    status: np.ndarray,
    suspect_windows: np.ndarray,
    p50: np.ndarray,
    p99: np.ndarray,
    filled: np.ndarray,
    *,
    min_samples: int,
    ratio: float,
    windows: int,
    peer_factor: float = TAIL_PEER_FACTOR,
) -> tuple[np.ndarray, np.ndarray]:
    """One window's evaluation for every node; returns the new ``(status, suspect_windows)``."""
    with np.errstate(divide="ignore", invalid="ignore"):
        r = p99 / p50
    enough = (filled >= min_samples) & (p50 > 0) & np.isfinite(r)
    limit = ratio
    if enough.sum() >= 3:
        limit = max(ratio, peer_factor * float(np.median(r[enough])))
    over = enough & (r > limit)
    new_windows = np.where(over, suspect_windows + 1, 0)
    new_status = np.full_like(status, TailStatus.INSUFFICIENT)
    new_status[enough & ~over] = TailStatus.HEALTHY
    new_status[over] = TailStatus.SUSPECT
    new_status[over & (new_windows >= windows)] = TailStatus.UNHEALTHY
    return new_status, new_windows


def judge_percentiles(a: NodeArrays, t: Thresholds, p50: np.ndarray, p99: np.ndarray, filled: np.ndarray,
                      peers: np.ndarray) -> None:
    """One window's judgement of every node from its P50/P99 over ``filled`` samples: the tail status
    (:func:`tail_step`) and the cross-P50 check against ``peers``, kept in ``a``."""
    a.p50, a.p99 = p50, p99
    a.tail, a.tail_windows = tail_step(
        a.tail, a.tail_windows, p50, p99, filled,
        min_samples=t.tail_min_samples, ratio=t.tail_ratio, windows=t.tail_windows,
    )
    enough = filled >= t.tail_min_samples
    a.cross_slow = cross_p50_slow(p50, peers, enough, factor=t.cross_p50_ratio).astype(np.int8)


def _verdict(a: NodeArrays) -> tuple[Verdict, ...]:
    return (Verdict(Reason.TAIL_RATIO, a.tail == TailStatus.UNHEALTHY),)


class TailDetector:
    """Per-node windows of recent requests and seed 001's ratio test over them (a
    :class:`~detector.detectors.verdict.Detector`)."""

    columns = ("tail", "tail_windows")
    gated = True

    def __init__(self, n: int, window_size: int, now: float) -> None:
        self.window = SlidingWindows(n, window_size)
        self.last_window_at = now

    def ingest(self, node: np.ndarray, signals: dict[str, np.ndarray], decode_baseline: float) -> None:
        """One value per request: decode / its baseline when known, else the normalised latency."""
        x = signals["norm"]
        if math.isfinite(decode_baseline) and decode_baseline > 0:
            x = np.where(np.isfinite(signals["decode"]), signals["decode"] / decode_baseline, x)
        ok = np.isfinite(x)
        self.window.add(node[ok], x[ok].astype(np.float32))

    def step(self, a: NodeArrays, t: Thresholds, now: float, peers: np.ndarray) -> None:
        """Once per ``tail_window_s``: each node's P50/P99, its tail status and the cross-P50 check
        against ``peers`` (the nodes that form the baseline)."""
        if now - self.last_window_at < t.tail_window_s:
            return
        self.last_window_at = now
        q = self.window.percentiles((50.0, 99.0))
        judge_percentiles(a, t, q[0], q[1], self.window.filled, peers)

    def verdicts(self, a: NodeArrays, t: Thresholds, now: float, judging: Judging) -> tuple[Verdict, ...]:
        """The window's step (once per ``tail_window_s``) over the baseline's peers, then the verdict."""
        self.step(a, t, now, judging.peers)
        return _verdict(a)

    def resize(self, window_size: int) -> None:
        """A new ``window_size`` keeps each node's newest samples that fit."""
        w = self.window
        resized = SlidingWindows(len(w.filled), window_size)
        for i in range(len(w.filled)):  # once per change, not on the hot path
            k = int(w.filled[i])
            if k:
                newest = np.roll(w.values[i], -int(w.pos[i]))[w.size - k :] if k == w.size else w.values[i, :k]
                resized.add(np.full(k, i), newest)
        self.window = resized


class RecordedTail:
    """The tail and cross-P50 detectors over percentiles recorded elsewhere (the threshold preview's
    history rows), judged at every evaluation: ``p50``/``p99`` per node, ``has`` where they count as a
    full window."""

    columns = TailDetector.columns
    gated = True

    def __init__(self, p50: np.ndarray, p99: np.ndarray, has: np.ndarray) -> None:
        self.p50, self.p99, self.has = p50, p99, has

    def verdicts(self, a: NodeArrays, t: Thresholds, now: float, judging: Judging) -> tuple[Verdict, ...]:
        filled = np.where(self.has, t.tail_min_samples, 0)
        judge_percentiles(a, t, self.p50, self.p99, filled, judging.peers)
        return _verdict(a)
