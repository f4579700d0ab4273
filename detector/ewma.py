"""Exponentially weighted mean and variance for every node of a group, updated in one vectorised call.

Per node, for samples ``x_1 .. x_k`` arriving in time order (seed 000's EMA; the first sample ever
initialises the mean, as the seed does):

    m_t = alpha * x_t + (1 - alpha) * m_{t-1}
    q_t = alpha * x_t² + (1 - alpha) * q_{t-1}
    var_t = q_t - m_t²

``var`` equals the incremental (West 1979 / "Welford-style") exponentially weighted variance
``S_t = (1 - alpha) * (S_{t-1} + alpha * (x_t - m_{t-1})²)`` exactly: expand both and they agree term by
term. Keeping ``q`` instead of ``S`` is what makes the batch update closed-form:

    m_k = (1 - alpha)^k * m_0 + sum_j alpha * (1 - alpha)^(k - j) * x_j

so a tick's samples for all nodes are applied with one sort and two ``bincount`` calls, with no Python
loop per sample, and give the same result as one-by-one updates (to float rounding). Signals are
ratios near 1 or per-token times of a few ms, so ``q - m²`` loses no meaningful precision.

**Weighted samples.** A sample may carry a weight ``w_j`` in (0, 1]: it enters with ``alpha_j = alpha *
w_j`` (a noisier kind of sample moves the mean less: inverse-variance weighting, see
:mod:`detector.signals`). The closed form generalises with cumulative log-decays per node run::

    m_k = prod_j (1 - alpha_j) * m_0 + sum_j alpha_j * x_j * prod_{i > j} (1 - alpha_i)

Unweighted batches keep the power form above (and its exact rounding).

Ingest data is untrusted, so each sample may be clipped to ``[lo, hi]`` before it enters (winsorised:
``x_j -> min(max(x_j, lo), hi)``). The bounds are fixed for the whole batch (the caller derives them
from the group's last peer baseline), so the update above stays closed-form and one batch still equals
the same samples one by one under the same bounds. One sample then moves the mean by at most
``alpha * (hi - m)``, however large it was (``1e308`` made ``q`` overflow and the variance NaN).
"""

from __future__ import annotations

import numpy as np

from detector.samples import node_order


class EwmaArrays:
    """EW mean/variance and sample counts over ``n`` nodes (one signal)."""

    def __init__(self, n: int, alpha: float) -> None:
        self.alpha = float(alpha)
        self.mean = np.zeros(n)
        self.sq = np.zeros(n)
        self.count = np.zeros(n, dtype=np.int64)

    def __len__(self) -> int:
        return len(self.mean)

    def variance(self) -> np.ndarray:
        return np.maximum(self.sq - self.mean**2, 0.0)

    def update(self, node: np.ndarray, x: np.ndarray, clip: tuple[float, float] | None = None,
               weight: np.ndarray | None = None) -> None:
        """Apply samples ``x`` of nodes ``node`` (indices). Within a node, array order is time order.
        ``clip``: ``(lo, hi)`` every sample is clipped to first; ``weight``: per-sample weights in
        (0, 1] (see the module docstring)."""
        if len(x) == 0:
            return
        if clip is not None:
            x = np.clip(x, clip[0], clip[1])
        n = len(self.mean)
        order = node_order(node)
        if order is not None:
            node, x = node[order], x[order]
            weight = None if weight is None else weight[order]
        per_node = np.bincount(node, minlength=n)
        starts = np.cumsum(per_node) - per_node
        if weight is None:
            rank = np.arange(len(x)) - starts[node]  # 0-based position within the node's run
            a = self.alpha
            decay_each = (1.0 - a) ** (per_node[node] - 1 - rank)
            decay_all = (1.0 - a) ** per_node
        else:
            a = self.alpha * np.clip(weight, 0.0, 1.0)
            log_keep = np.cumsum(np.log1p(-np.minimum(a, 1.0 - 1e-12)))
            run_end = log_keep[np.maximum(starts + per_node - 1, 0)]
            run_start = np.where(starts > 0, log_keep[np.maximum(starts - 1, 0)], 0.0)
            decay_each = np.exp(run_end[node] - log_keep)  # prod over the node's later samples
            decay_all = np.where(per_node > 0, np.exp(run_end - run_start), 1.0)
        # Nodes with no history start from their first sample (seed semantics).
        fresh = self.count == 0
        first_idx = starts[fresh & (per_node > 0)]
        self.mean[fresh & (per_node > 0)] = x[first_idx]
        self.sq[fresh & (per_node > 0)] = x[first_idx] ** 2
        self.mean = decay_all * self.mean + np.bincount(node, weights=a * decay_each * x, minlength=n)
        self.sq = decay_all * self.sq + np.bincount(node, weights=a * decay_each * x * x, minlength=n)
        self.count += per_node

    def reset(self, mask: np.ndarray) -> None:
        """Forget the history of the nodes in ``mask`` (the next sample re-initialises them)."""
        self.mean[mask] = 0.0
        self.sq[mask] = 0.0
        self.count[mask] = 0

    def append(self, k: int) -> None:
        self.mean = np.concatenate([self.mean, np.zeros(k)])
        self.sq = np.concatenate([self.sq, np.zeros(k)])
        self.count = np.concatenate([self.count, np.zeros(k, dtype=np.int64)])

    def delete(self, index: int) -> None:
        self.mean = np.delete(self.mean, index)
        self.sq = np.delete(self.sq, index)
        self.count = np.delete(self.count, index)
