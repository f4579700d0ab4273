"""From states to the integer-scale weights a gateway applies.

What a state means for traffic is :data:`detector.states.TRAFFIC`; within ``WEIGHTED`` states:

- HEALTHY, FORCED_ACTIVE: ``base``;
- DEGRADED: ``base * 2^-(Z - degrade_z)`` (the seed's soft degrade, halving per
  :data:`~detector.thresholds.WEIGHT_HALVING_Z`), clipped to ``[min_weight_fraction * base,
  base / degrade_materiality]``: strictly under base while the node is held degraded. ``Z`` is
  the largest of any signal, so a node judged slow that also built a queue gets little new work
  until it drains (why, with figures: :mod:`detector.detectors.zscore`);
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


def weights(a: NodeArrays, t: Thresholds, score: np.ndarray) -> np.ndarray:
    base, state = a.base, a.state
    w = base.copy()
    floor = t.min_weight_fraction * base
    deg = state == S.DEGRADED
    factor = np.power(2.0, -(np.nan_to_num(score, nan=t.degrade_z) - t.degrade_z) / WEIGHT_HALVING_Z)
    # At most base / materiality (thresholds.degrade_materiality): a degraded node whose Z dips under
    # the degrade line while it is held is still cut, never back at full weight before it leaves.
    ceiling = base / t.degrade_materiality
    w[deg] = np.clip(base * factor, np.minimum(floor, ceiling), ceiling)[deg]
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
