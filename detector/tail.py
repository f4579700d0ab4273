"""Seed 001's tail detector (P99/P50 ratio over windows) and the cross-node P50 check.

Per node, once per window (default 30 s), over its last ``window_size`` samples:

- fewer than ``tail_min_samples`` (100) samples -> ``INSUFFICIENT`` (seed 001: the P99 estimate's
  95% CI is about ±30% below that);
- ``P99 / P50 > tail_ratio`` (3.0) -> ``SUSPECT``; still so for ``tail_windows`` (3) consecutive
  windows -> ``UNHEALTHY``;
- ratio back at or below the threshold -> ``HEALTHY`` (seed 001's *Recovered*).

Cross-node check: a node whose P50 exceeds ``cross_p50_ratio`` (2x) times the median P50 of its peers
is *relatively slow*. It catches a node that is uniformly slow — its own P99/P50 looks normal.

One guard the seed lacks: a ratio only counts when it also stands out from the peers' ratios
(``> peer_factor * median ratio``, default 1.5). Under a surge every node queues and every node's tail
widens; that is a group condition for admission control, not a node fault.

We run both on the *normalised* signal (latency / cost model), not on raw latency as the seed does:
raw LLM latencies span three orders of magnitude with prompt length, so a perfectly healthy node's raw
P99/P50 is ~8 and the seed's ratio test would flag every node.
"""

from __future__ import annotations

import enum

import numpy as np


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
    peer_factor: float = 1.5,
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


def cross_p50_slow(p50: np.ndarray, peers: np.ndarray, enough: np.ndarray, *, factor: float) -> np.ndarray:
    """Nodes with ``P50 > factor * median(P50 of peers)`` (needs at least 3 peers with data)."""
    ref = peers & enough & np.isfinite(p50)
    if ref.sum() < 3:
        return np.zeros(len(p50), dtype=bool)
    median = float(np.median(p50[ref]))
    return enough & (p50 > factor * median)
