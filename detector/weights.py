"""From states to the integer-scale weights a gateway applies.

What a state means for traffic is :data:`detector.states.TRAFFIC`; within ``WEIGHTED`` states:

- HEALTHY, FORCED_ACTIVE: ``base``;
- DEGRADED: ``base * 2^-(Z - degrade_z)`` (the seed's soft degrade, halving per
  :data:`~detector.thresholds.WEIGHT_HALVING_Z`), clipped to ``[min_weight_fraction * base,
  base / degrade_materiality]``: strictly under base while the node is held degraded. ``Z`` is
  the largest of any signal, so a node judged slow that also built a queue gets little new work
  until it drains (why, with figures: :mod:`detector.detectors.zscore`). What the **deciding**
  (queue-free) Z allows **falls at once and never rises while the node stays DEGRADED**
  (:func:`hold_cut`, ``cut_weight``): it rises only when the node leaves, after the exit dwell that
  already governs the state. A cut node runs a smaller batch and reads less slow than it is, so a
  weight that followed its Z back up fed it work until it looked slow again: a real llama.cpp server
  at half a core behind nginx, held DEGRADED from +13 s to +67 s, was published at 5, 87, 42, 87, 31,
  87, 22, 77 and 28 % of base in that time (``docs/peers.md``, ``quota:0.5``). A queue still deepens a
  cut only while it lasts: a drained queue gives back what the queue took, never more than the hold;
- WARMING: a linear ramp from ``warmup_min_weight_fraction`` to 1 over ``warmup_samples`` (slow start);
- RECOVERING: ``recovery_steps[step] * base``;

``FLOOR`` states get ``min_weight_fraction * base``, ``DRAIN`` states 0; an operator's pin overrides
all of it, up to ``base`` (the weights document's scale: ``contract.weights_document.pin_range``). When every node would get 0, the least slow node (lowest Z; forced quarantines last) keeps
its base weight: sending traffic nowhere is never better than sending it to the best node left.

What is *published* (:func:`published`) is those weights rounded to integers, except under the
``shadow`` policy: the detector decides and records, and every node it judges is published at its base
weight as HEALTHY (operator-forced states are published as they are: an operator asked for them).
"""

from __future__ import annotations

import numpy as np

from detector.moves import lookup
from detector.nodes import NodeArrays
from detector.states import TRAFFIC, NodeState, Traffic
from detector.thresholds import WEIGHT_HALVING_Z, Thresholds

S = NodeState
_FLOOR = lookup(s for s, rule in TRAFFIC.items() if rule is Traffic.FLOOR)
_DRAIN = lookup(s for s, rule in TRAFFIC.items() if rule is Traffic.DRAIN)
_FORCED = lookup((S.FORCED_QUARANTINE, S.FORCED_ACTIVE))


def degraded_fraction(t: Thresholds, z: np.ndarray) -> np.ndarray:
    """``2^-(Z - degrade_z)`` (halving per ``WEIGHT_HALVING_Z``) as a fraction of base, clipped to
    ``[min_weight_fraction, 1 / degrade_materiality]``; an unknown Z gives the ceiling."""
    factor = np.power(2.0, -(np.nan_to_num(z, nan=t.degrade_z) - t.degrade_z) / WEIGHT_HALVING_Z)
    # At most 1 / materiality (thresholds.degrade_materiality): a degraded node whose Z dips under
    # the degrade line while it is held is still cut, never back at full weight before it leaves.
    ceiling = 1.0 / t.degrade_materiality
    return np.clip(factor, min(t.min_weight_fraction, ceiling), ceiling)


def hold_cut(a: NodeArrays, t: Thresholds, cut_z: np.ndarray) -> None:
    """Lower each DEGRADED node's ``cut_weight`` to what its deciding Z allows now, if that is less
    (the module docstring); every other node forgets its hold. Called once per evaluation, before
    :func:`weights`."""
    deg = a.state == S.DEGRADED
    a.cut_weight = np.where(deg, np.fmin(a.cut_weight, degraded_fraction(t, cut_z)), np.nan)


def weights(a: NodeArrays, t: Thresholds, score: np.ndarray) -> np.ndarray:
    """Every node's weight from its state; ``score``: the largest Z of any signal (module docstring)."""
    base, state = a.base, a.state
    w = base.copy()
    floor = t.min_weight_fraction * base
    deg = state == S.DEGRADED
    w[deg] = (base * np.fmin(degraded_fraction(t, score), a.cut_weight))[deg]
    warming = state == S.WARMING
    ramp = t.warmup_min_weight_fraction + (1 - t.warmup_min_weight_fraction) * np.minimum(
        a.warm_samples / max(t.warmup_samples, 1), 1.0
    )
    w[warming] = (base * ramp)[warming]
    w[_FLOOR[state]] = floor[_FLOOR[state]]
    w[_DRAIN[state]] = 0.0
    rec = state == S.RECOVERING
    steps = np.array(t.recovery_steps)
    w[rec] = (base * steps[np.minimum(a.step, len(steps) - 1)])[rec]
    pinned = np.isfinite(a.pin)
    # A pin is on the document's scale, a share of base: a base weight lowered under an existing pin
    # publishes the pin at base, never a weight the gateways would refuse.
    w[pinned] = np.minimum(a.pin, base)[pinned]
    return w


def with_fallback(a: NodeArrays, t: Thresholds, score: np.ndarray, norm_mean: np.ndarray
                  ) -> tuple[np.ndarray, str | None]:
    """:func:`weights`, and the reason when every node was out and the least slow one was kept."""
    w = weights(a, t, score)
    if not len(w) or (w > 0).any():
        return w, None
    key = np.nan_to_num(score, nan=np.inf).copy()
    key[a.state == S.FORCED_QUARANTINE] = np.inf
    if np.isinf(key).all():
        key = np.nan_to_num(norm_mean, nan=np.inf)
    pick = int(np.argmin(key))
    w[pick] = a.base[pick]
    return w, (f"every node is unavailable; sending traffic to the least slow node {a.ids[pick]!r} "
               "instead of nowhere")


def published(states: np.ndarray, weights: np.ndarray, base: np.ndarray, *, shadow: bool
              ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """What a gateway is told of each node: ``(state codes, weights, base weights)``, the weights and
    base rounded half to even (as ``round``). ``shadow``: every node not forced by an operator is
    published HEALTHY at its base weight (see the module docstring). A ``DRAIN`` state publishes 0."""
    codes = np.asarray(states).astype(np.int64)
    base = np.rint(np.asarray(base, dtype=np.float64))
    weights = np.rint(np.asarray(weights, dtype=np.float64))
    if shadow:
        judged = ~_FORCED[codes]
        codes, weights = np.where(judged, int(S.HEALTHY), codes), np.where(judged, base, weights)
    return codes, np.where(_DRAIN[codes], 0.0, weights), base
