"""Per-node sequential evidence of material slowness: Page's CUSUM over each request.

An EMA crossing a line is a poor gate for a weight cut. A node that is steadily 12% slower than its
peers (within the healthy spread of a large fleet) sits one EMA-sd under a 15% line and crosses it
every few seconds, while a node that just became 3x slower crosses it only once its EMA has caught up.
Page's CUSUM asks the question directly, sample by sample: *is this node's mean above the
materiality line?* For each request of node ``i`` with decision signal ``v`` (decode time per token,
or the normalised latency) and the group baseline ``b``:

    x = (log(v / b) - log(m)) / sigma          (sd units above the materiality line m)
    S_i <- max(0, S_i + clip(x, -c, c) - k)

``sigma`` is the group's per-request relative spread, ``k`` the allowance (the statistic drifts down
by ``k`` per sample for a node exactly at the line), ``c`` caps one request's contribution either way, so that no
single request (a preempted one, a prefix-cache hit) moves a node far. A node steadily below the line drifts to
0; one at 1.3x the line climbs by ``c - k`` per request. With ``c = h / p + k`` the fewest requests that
can reach the alarm line ``h`` is ``p`` (``degrade_persistence``).

Batch form (no loop per sample): with increments ``y_j = clip(x_j, -c, c) - k`` of one node and their
running sums ``C_1..C_n``, the recursion from ``S_0`` ends at

    S_n = C_n - min(-S_0, C_1, ..., C_n)

(the statistic restarts after its lowest point), so a tick's samples for every node need one
``cumsum`` and one segmented ``minimum.reduceat``.
"""

from __future__ import annotations

import numpy as np


def excess_over_line(values: np.ndarray, baseline: float, materiality: float, sigma: float) -> np.ndarray:
    """``x = (log(values / baseline) - log(materiality)) / sigma``, per request."""
    return (np.log(values / baseline) - np.log(materiality)) / sigma


def cusum_update(s: np.ndarray, node: np.ndarray, x: np.ndarray, *, allowance: float, cap: float) -> np.ndarray:
    """New per-node statistics after samples ``x`` of nodes ``node``.

    ``node`` must be grouped by node (ascending) with time order inside each group, as
    :meth:`GroupDetector.ingest` arranges them. Equals applying the recursion one sample at a time.
    """
    out = s.copy()
    if len(x) == 0:
        return out
    y = np.clip(x, -cap, cap) - allowance
    starts = np.flatnonzero(np.r_[True, node[1:] != node[:-1]])
    ids = node[starts]
    c = np.cumsum(y)
    before = np.r_[0.0, c][starts]  # running sum up to each node's first sample
    c -= np.repeat(before, np.diff(np.r_[starts, len(y)]))  # per-node running sums C_1..C_n
    ends = np.r_[starts[1:], len(y)] - 1
    lowest = np.minimum.reduceat(c, starts)
    out[ids] = c[ends] - np.minimum(-s[ids], lowest)
    return out
