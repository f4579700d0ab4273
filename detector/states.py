"""Node states, the allowed edges between them, and the explanation record of every transition.

::

    WARMING ──► HEALTHY ◄──► DEGRADED
                  │  ▲          │
                  │  └──────┐   │  Z >= quarantine_z for N samples (policy auto)
                  ▼         │   ▼
          PENDING_APPROVAL ─┼─► QUARANTINED ──► PROBING ──► RECOVERING ──► HEALTHY
          (policy approval) │       ▲  ▲          │  failed probe │ bad step
                            │       │  └──────────┘               │
                            │       └─────────────────────────────┘ (probe interval doubles)
    operators: FORCED_QUARANTINE, FORCED_ACTIVE (optional expiry), release -> HEALTHY
    DEGRADED ──► RECOVERING: a held cut whose release probe, at its peers' load, passed

What a state means for traffic is one table, :data:`contract.traffic.TRAFFIC` (with the states
themselves, :class:`~contract.traffic.NodeState`: the gateway side reads them without the detector),
re-exported here as the detector's vocabulary.

The safeguard cap counts :data:`SAFEGUARD_COUNTED`: the ``DRAIN`` states **and** PENDING_APPROVAL. A
proposal is a quarantine the detector has decided on and a person may approve at any moment; if it did
not count, a group could hold more proposals than the cap allows out, and approving them would take
more nodes out than a group-wide slowdown may cost. At most :func:`safeguard_cap` nodes are counted at
once; :class:`Safeguard` is what a tick reports of it.
"""

from __future__ import annotations

import enum
import math
from dataclasses import asdict, dataclass, field
from typing import Any

# The states and the traffic table, re-exported as the detector's vocabulary (their owner is contract.traffic).
from contract.traffic import DEFAULT_BASE_WEIGHT as DEFAULT_BASE_WEIGHT
from contract.traffic import OUT_OF_SERVICE as OUT_OF_SERVICE
from contract.traffic import OUT_OF_SERVICE_LABELS as OUT_OF_SERVICE_LABELS
from contract.traffic import TRAFFIC as TRAFFIC
from contract.traffic import NodeState as NodeState
from contract.traffic import Traffic as Traffic
from contract.traffic import traffic_of as traffic_of

S = NodeState


#: States counted against the safeguard cap: out of service, or proposed for quarantine (see the
#: module docstring).
SAFEGUARD_COUNTED = OUT_OF_SERVICE | {S.PENDING_APPROVAL}


def safeguard_cap(fraction: float, nodes: int) -> int:
    """How many of ``nodes`` may be in :data:`SAFEGUARD_COUNTED` states at once:
    ``floor(fraction * nodes)`` (``max_quarantine_fraction``; the epsilon keeps 0.3 * 10 at 3)."""
    return math.floor(fraction * nodes + 1e-9)


@dataclass(frozen=True)
class Safeguard:
    """The safeguard as one evaluation left it: ``limit`` (:func:`safeguard_cap` of the group's nodes),
    ``counted`` nodes in :data:`SAFEGUARD_COUNTED` states after the evaluation, ``held`` nodes the
    detector wanted out this evaluation but kept in service at the floor weight because the cap was
    full (a group-wide slowdown is not a node fault)."""

    limit: int
    counted: int
    held: int = 0

    @property
    def full(self) -> bool:
        """No room for another quarantine or proposal."""
        return self.counted >= self.limit

    @property
    def engaged(self) -> bool:
        """The cap is acting: it held a node back, or it is full with nodes counted against it."""
        return self.held > 0 or (self.counted > 0 and self.full)
#: States whose nodes form the peer baseline (when warmed up and fresh).
BASELINE_STATES = frozenset({S.HEALTHY, S.DEGRADED})
#: States whose latency the detector judges toward a cut or a quarantine: the baseline's, and a node
#: proposed for quarantine (kept at the floor so its evidence stays current until a person decides).
JUDGED_STATES = BASELINE_STATES | {S.PENDING_APPROVAL}
#: States an operator set (a manual quarantine, a node forced active): the detector does not move them.
OPERATOR_STATES = frozenset({S.FORCED_QUARANTINE, S.FORCED_ACTIVE})
#: The canary's cycle: a quarantined node waits for its probes, is probed, and ramps back up.
CANARY_STATES = (S.QUARANTINED, S.PROBING, S.RECOVERING)


ALLOWED_EDGES: frozenset[tuple[NodeState, NodeState]] = frozenset(
    {
        (S.WARMING, S.HEALTHY),
        (S.HEALTHY, S.DEGRADED),
        (S.HEALTHY, S.QUARANTINED),
        (S.HEALTHY, S.PENDING_APPROVAL),
        (S.DEGRADED, S.HEALTHY),
        (S.DEGRADED, S.QUARANTINED),
        (S.DEGRADED, S.PENDING_APPROVAL),
        (S.DEGRADED, S.RECOVERING),  # a held cut that passed a release probe (ejection.probes_due)
        (S.PENDING_APPROVAL, S.QUARANTINED),
        (S.PENDING_APPROVAL, S.HEALTHY),
        (S.PENDING_APPROVAL, S.DEGRADED),
        (S.QUARANTINED, S.PROBING),
        (S.PROBING, S.QUARANTINED),
        (S.PROBING, S.RECOVERING),
        (S.RECOVERING, S.HEALTHY),
        (S.RECOVERING, S.QUARANTINED),
        (S.FORCED_QUARANTINE, S.QUARANTINED),  # expiry: back under the detector's control
        (S.FORCED_ACTIVE, S.HEALTHY),  # expiry or release
    }
    # Operators may force any node, and release any held node back to service.
    | {(s, f) for s in S for f in OPERATOR_STATES if s != f}
    | {(s, S.HEALTHY) for s in (S.QUARANTINED, S.PROBING, S.RECOVERING, S.FORCED_QUARANTINE, S.WARMING)}
)


class Reason(enum.StrEnum):
    """Why a transition happened (the dashboard and alerts key on these codes)."""

    WARMED_UP = "warmed_up"
    Z_DEGRADE = "z_degrade"
    Z_RECOVERED = "z_recovered"
    Z_QUARANTINE = "z_quarantine"
    TAIL_RATIO = "tail_ratio"
    CROSS_P50 = "cross_p50"
    CONSECUTIVE_ERRORS = "consecutive_errors"
    SUCCESS_RATE = "success_rate"
    PROBE_DUE = "probe_due"
    PROBE_FAILED = "probe_failed"
    PROBES_PASSED = "probes_passed"
    RECOVERY_STEP_FAILED = "recovery_step_failed"
    RECOVERED = "recovered"
    APPROVED = "approved"
    REJECTED = "rejected"
    CONDITION_CLEARED = "condition_cleared"
    OPERATOR_QUARANTINE = "operator_quarantine"
    OPERATOR_ACTIVE = "operator_active"
    OPERATOR_RELEASE = "operator_release"
    OVERRIDE_EXPIRED = "override_expired"


class IllegalTransition(RuntimeError):
    """A state change outside :data:`ALLOWED_EDGES` was attempted (a bug, never silently done)."""


def check_edge(src: NodeState, dst: NodeState) -> None:
    if (src, dst) not in ALLOWED_EDGES:
        raise IllegalTransition(f"{src.label} -> {dst.label} is not an allowed transition")


@dataclass(frozen=True)
class Transition:
    """One state change and the evidence for it: enough for an operator to see *why*.
    ``safeguard_hold``: the detector wanted the node out and the safeguard cap kept it in service at
    the floor weight instead."""

    node: str
    at: float
    from_state: NodeState
    to_state: NodeState
    reason: str
    signal: str | None = None
    z: float | None = None
    baseline: float | None = None
    spread: float | None = None
    ema: float | None = None
    p50: float | None = None
    p99: float | None = None
    samples: int = 0
    weight: float | None = None
    detail: str = ""
    thresholds: dict[str, Any] = field(default_factory=dict)
    safeguard_hold: bool = False

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["from_state"] = self.from_state.label
        d["to_state"] = self.to_state.label
        for key in ("z", "baseline", "spread", "ema", "p50", "p99", "weight"):
            v = d[key]
            if v is not None and v != v:  # NaN is not JSON
                d[key] = None
        return d
