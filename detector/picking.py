"""Weighted picking of a node for the next request, given the detector's weights.

- :class:`SmoothWeightedRoundRobin` — nginx's smooth weighted round-robin (``ngx_http_upstream_
  get_peer``): every pick adds each node's weight to its ``current``, picks the largest ``current``, and
  subtracts the total from the winner. Over any ``sum(weights)`` picks, node *i* is chosen exactly
  ``weights[i]`` times, interleaved (5,1,1 -> a a b a c a a), never in bursts.
- :class:`PowerOfTwoChoices` — pick two distinct nodes at random in proportion to weight and keep the
  one with the lower load (Mitzenmacher 2001; Finagle/Linkerd's P2C).

Seed 000's ``Route()`` returned the maximum-weight node every time: that is not WRR, and it sends all
traffic to one node. Do not copy it.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


class SmoothWeightedRoundRobin:
    """Deterministic smooth WRR over integer-or-float weights (weight 0 = never picked), vectorised:
    ``current += weights; i = argmax(current); current[i] -= total`` (the simulator picks ~10^6 times
    a run through this one implementation).

    A node of weight 0 is parked at a very negative ``current`` so it is never picked, and starts
    again from 0 when it gets a weight back (a node returning to service does not inherit credit from
    before). With equal weights this is plain round robin.
    """

    PARK = -1e18

    def __init__(self, weights: Sequence[float] | np.ndarray) -> None:
        self.weights = np.zeros(len(weights))
        self.current = np.full(len(weights), self.PARK)
        self.total = 0.0
        self.set_weights(weights)

    def set_weights(self, weights: Sequence[float] | np.ndarray) -> None:
        w = np.asarray(weights, dtype=np.float64)
        if (w < 0).any() or not np.isfinite(w).all():
            raise ValueError("weights must be finite and >= 0")
        if len(w) != len(self.current):
            self.weights, self.current = np.zeros(len(w)), np.full(len(w), self.PARK)
        was_parked = self.weights <= 0
        self.weights = np.where(w > 0, w, 0.0)
        self.current = np.where(self.weights > 0, np.where(was_parked, 0.0, self.current), self.PARK)
        self.total = float(self.weights.sum())

    def pick(self) -> int:
        if self.total <= 0:
            raise LookupError("no node has a positive weight")
        current = self.current
        current += self.weights
        i = int(current.argmax())
        current[i] -= self.total
        return i


class PowerOfTwoChoices:
    """Two weighted random candidates, the less loaded one wins (ties: the first)."""

    def __init__(self, rng: np.random.Generator | None = None) -> None:
        self.rng = rng or np.random.default_rng()

    def pick(self, weights: Sequence[float] | np.ndarray, load: Sequence[float] | np.ndarray) -> int:
        w = np.asarray(weights, dtype=np.float64)
        positive = np.flatnonzero(w > 0)
        if len(positive) == 0:
            raise LookupError("no node has a positive weight")
        if len(positive) == 1:
            return int(positive[0])
        p = w[positive] / w[positive].sum()
        a, b = self.rng.choice(positive, size=2, replace=False, p=p)
        load = np.asarray(load)
        return int(a if load[a] <= load[b] else b)
