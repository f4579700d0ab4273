"""The node states and what each means for the traffic a gateway sends the node: one table,
:data:`TRAFFIC`, which every consumer imports (the detector's weights and :mod:`detector.states`, the
publisher, the weights document, the gateway client and agents, the threshold preview, the API).
Plain Python: the gateway side imports it without the detector or numpy.

- ``WEIGHTED``: the node serves at its computed weight — HEALTHY and FORCED_ACTIVE base; DEGRADED
  ``base * 2^-(Z - degrade_z)`` floored at ``min_weight_fraction * base``; WARMING a linear ramp
  (slow start); RECOVERING ``step * base``;
- ``FLOOR``: kept sampled at ``min_weight_fraction * base`` — PENDING_APPROVAL (the detector wants it
  out, a human has not decided: it keeps a trickle so the evidence stays current, and gateways must
  not take it out before anyone approved);
- ``DRAIN``: no new traffic, weight 0 — QUARANTINED, PROBING (the canary, not the gateway, sends its
  requests), FORCED_QUARANTINE.

"""

from __future__ import annotations

import enum


class NodeState(enum.IntEnum):
    WARMING = 0
    HEALTHY = 1
    DEGRADED = 2
    QUARANTINED = 3
    PROBING = 4
    RECOVERING = 5
    PENDING_APPROVAL = 6
    FORCED_QUARANTINE = 7
    FORCED_ACTIVE = 8

    @property
    def label(self) -> str:
        return self.name.lower()

    @classmethod
    def from_label(cls, label: str) -> NodeState:
        return cls[label.upper()]


S = NodeState


#: A node's base weight unless registered with another: the scale every weight is on (the detector's,
#: the weights document's, the gateways'); the plain-Python owner, so the gateway side can import it.
DEFAULT_BASE_WEIGHT = 100


class Traffic(enum.StrEnum):
    """What a state means for the traffic a gateway sends the node (see the module docstring)."""

    WEIGHTED = "weighted"
    FLOOR = "floor"
    DRAIN = "drain"


#: The one traffic table: every state, what a gateway does with a node in it.
TRAFFIC: dict[NodeState, Traffic] = {
    S.WARMING: Traffic.WEIGHTED,
    S.HEALTHY: Traffic.WEIGHTED,
    S.DEGRADED: Traffic.WEIGHTED,
    S.RECOVERING: Traffic.WEIGHTED,
    S.FORCED_ACTIVE: Traffic.WEIGHTED,
    S.PENDING_APPROVAL: Traffic.FLOOR,
    S.QUARANTINED: Traffic.DRAIN,
    S.PROBING: Traffic.DRAIN,
    S.FORCED_QUARANTINE: Traffic.DRAIN,
}
assert set(TRAFFIC) == set(NodeState), "every state has a traffic rule"


def traffic_of(state: NodeState | str) -> Traffic | None:
    """The traffic rule of a state or a state label (``"pending_approval"``); ``None`` for a label
    this version does not know (a gateway then follows the published weight alone: draining on an
    unknown label would let a newer control plane's new state empty an older gateway's pool)."""
    if isinstance(state, NodeState):
        return TRAFFIC[state]
    try:
        return TRAFFIC[NodeState.from_label(state)]
    except (KeyError, AttributeError):
        return None


#: States in which a node receives no traffic.
OUT_OF_SERVICE = frozenset(s for s, rule in TRAFFIC.items() if rule is Traffic.DRAIN)
#: Their labels, for consumers of the weights document and the API.
OUT_OF_SERVICE_LABELS = frozenset(s.label for s in OUT_OF_SERVICE)
