"""Error-based ejection with Envoy outlier detection's semantics and defaults.

- **Consecutive errors**: a node whose last ``consecutive_errors`` (5) responses were all errors
  (5xx, and the 408/504 timeouts a server or gateway produced) is ejected. Any non-error response
  resets the run.
- **Success rate**: at the end of each interval (10 s), among nodes with at least
  ``success_rate_min_requests`` (100) requests — and only if there are at least
  ``success_rate_min_hosts`` (5) of them — a node whose success rate is below
  ``mean - success_rate_stdev * stdev`` (1.9) is an outlier.

A client's cancellation (status 0: its deadline passed, or it went away) is neither an error nor a
response here (:mod:`detector.samples`): near saturation a healthy node's queue reaches the client's
deadline by chance, and as errors they ejected healthy nodes, whose load then pushed their peers past
the deadline too (a cascade; Envoy's outlier detection never hears of a downstream disconnect either).
A group with too little capacity is a condition for admission control, not an outlier.

These catch the node that fails *fast*: a crashed server answering 503 in 2 ms has excellent latency,
and a latency-only detector would send it more traffic.

:class:`ErrorDetector` keeps the counts per node (``consec_err``, ``int_requests``, ``int_success`` of
:class:`~detector.nodes.NodeArrays`) and gives two verdicts, ``consecutive_errors`` and
``success_rate``; the ejection layer ranks them first (an error is unambiguous).
"""

from __future__ import annotations

import numpy as np

from detector.detectors.verdict import Judging, Verdict
from detector.nodes import NodeArrays
from detector.samples import node_order
from detector.states import Reason
from detector.thresholds import Thresholds


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


class ErrorDetector:
    """Consecutive errors (per response) and the success rate (per ``error_interval_s``)."""

    columns = ("consec_err",)
    gated = False

    def __init__(self, now: float) -> None:
        self.interval_started = now

    @staticmethod
    def ingest(a: NodeArrays, node: np.ndarray, is_error: np.ndarray) -> None:
        """Count responses that carry an outcome (latency or error), grouped by node in time order."""
        n = len(a)
        a.consec_err = consecutive_error_runs(a.consec_err, node, is_error)
        a.int_requests += np.bincount(node, minlength=n)
        a.int_success += np.bincount(node[~is_error], minlength=n)

    def verdicts(self, a: NodeArrays, t: Thresholds, now: float, judging: Judging | None = None
                 ) -> tuple[Verdict, Verdict]:
        consecutive = Verdict(Reason.CONSECUTIVE_ERRORS, a.consec_err >= t.consecutive_errors)
        sr_bad = np.zeros(len(a), dtype=bool)
        if now - self.interval_started >= t.error_interval_s:
            sr_bad = success_rate_outliers(
                a.int_requests, a.int_success, min_hosts=t.success_rate_min_hosts,
                min_requests=t.success_rate_min_requests, stdev_factor=t.success_rate_stdev,
            )
            a.int_requests[:] = 0
            a.int_success[:] = 0
            self.interval_started = now
        return consecutive, Verdict(Reason.SUCCESS_RATE, sr_bad)
