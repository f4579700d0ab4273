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

Weights per state: HEALTHY base; DEGRADED ``base * 2^-(Z - degrade_z)`` floored at
``min_weight_fraction * base``; WARMING a linear ramp (slow start); PENDING_APPROVAL the floor;
QUARANTINED / PROBING / FORCED_QUARANTINE 0; RECOVERING ``step * base``; FORCED_ACTIVE base.
"""

from __future__ import annotations

import enum
from dataclasses import asdict, dataclass, field
from typing import Any


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

#: States in which a node receives no traffic (counted against the safeguard).
OUT_OF_SERVICE = frozenset({S.QUARANTINED, S.PROBING, S.FORCED_QUARANTINE})
#: States whose nodes form the peer baseline (when warmed up and fresh).
BASELINE_STATES = frozenset({S.HEALTHY, S.DEGRADED})

_OPERATOR = {S.FORCED_QUARANTINE, S.FORCED_ACTIVE}

ALLOWED_EDGES: frozenset[tuple[NodeState, NodeState]] = frozenset(
    {
        (S.WARMING, S.HEALTHY),
        (S.HEALTHY, S.DEGRADED),
        (S.HEALTHY, S.QUARANTINED),
        (S.HEALTHY, S.PENDING_APPROVAL),
        (S.DEGRADED, S.HEALTHY),
        (S.DEGRADED, S.QUARANTINED),
        (S.DEGRADED, S.PENDING_APPROVAL),
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
    | {(s, f) for s in S for f in _OPERATOR if s != f}
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
    """One state change and the evidence for it: enough for an operator to see *why*."""

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

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["from_state"] = self.from_state.label
        d["to_state"] = self.to_state.label
        for key in ("z", "baseline", "spread", "ema", "p50", "p99", "weight"):
            v = d[key]
            if v is not None and v != v:  # NaN is not JSON
                d[key] = None
        return d
