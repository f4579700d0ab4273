"""Error-based ejection with Envoy outlier detection's semantics and defaults.

- **Consecutive errors**: a node whose last ``consecutive_errors`` (5) responses were all errors
  (5xx or timeouts) is ejected. Any non-error response resets the run.
- **Success rate**: at the end of each interval (10 s), among nodes with at least
  ``success_rate_min_requests`` (100) requests — and only if there are at least
  ``success_rate_min_hosts`` (5) of them — a node whose success rate is below
  ``mean - success_rate_stdev * stdev`` (1.9) is an outlier.

These catch the node that fails *fast*: a crashed server answering 503 in 2 ms has excellent latency,
and a latency-only detector would send it more traffic.
"""

from __future__ import annotations

import numpy as np

from detector.samples import node_order


def consecutive_error_runs(consec: np.ndarray, node: np.ndarray, is_error: np.ndarray) -> np.ndarray:
    """New per-node run length of trailing errors after applying a batch (time order within node)."""
    n = len(consec)
    if len(node) == 0:
        return consec.copy()
    order = node_order(node)
    if order is not None:
        node, is_error = node[order], is_error[order]
    per_node = np.bincount(node, minlength=n)
    end = np.cumsum(per_node)  # exclusive end of each node's run in the sorted batch
    position = np.arange(len(node))
    last_ok = np.full(n, -1, dtype=np.int64)
    np.maximum.at(last_ok, node, np.where(is_error, -1, position))
    return np.where(last_ok >= 0, end - 1 - last_ok, consec + per_node)


def success_rate_outliers(
    requests: np.ndarray,
    successes: np.ndarray,
    *,
    min_hosts: int,
    min_requests: int,
    stdev_factor: float,
) -> np.ndarray:
    """Boolean mask of nodes whose success rate is below ``mean - stdev_factor * stdev``."""
    enough = requests >= min_requests
    if enough.sum() < min_hosts:
        return np.zeros(len(requests), dtype=bool)
    rate = np.where(enough, successes / np.maximum(requests, 1), np.nan)
    mean = float(np.nanmean(rate))
    std = float(np.nanstd(rate))
    return enough & (rate < mean - stdev_factor * std)
