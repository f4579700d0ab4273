"""What every gateway applier returns, and the interface the agent loop calls."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

from agent.client import EffectiveWeights


class ApplyError(RuntimeError):
    """The gateway refused or failed the change; the previous configuration is still in force."""


@dataclass
class ApplyResult:
    """Outcome of one apply.

    ``changes``: human-readable changes actually sent/written (empty = nothing to do).
    ``unknown``: gateway servers matching no node of the document (left alone, reported).
    ``missing``: document nodes with no server in the gateway (nothing to apply them to).
    ``note``: what the operator should know about an apply that succeeded (nginx not running: the
    include was written and validated but there was nothing to reload), logged by the agent.
    """

    changes: list[str] = field(default_factory=list)
    unknown: list[str] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)
    note: str = ""


class Applier(Protocol):
    """One gateway integration. ``apply`` must be idempotent: calling it twice with the same weights
    sends/writes nothing the second time."""

    name: str

    def apply(self, weights: EffectiveWeights) -> ApplyResult: ...

    def set_safeguard(self, active: bool) -> None:
        """Pass the group's safeguard flag to the gateway where it has a place for it."""
        ...


def refuse_no_backend(routable: int, gateway: str, detail: str = "") -> None:
    """Never leave a router with nothing to route to: a change after which no backend would take new
    requests (every known one quarantined, or the document names none it knows and the rest are out)
    is refused, and the router keeps its last good set. One rule for every applier that owns the
    whole set of a router's backends' states (Envoy, Traefik, Caddy)."""
    if routable <= 0:
        raise ApplyError(f"refused: {gateway} would have no backend left to route to{detail}; "
                         "the last good set stays in force")


class NoteOnce:
    """Passes an apply's ``note`` on once per change of it, not at every resync (the agent logs each
    note it gets as a warning)."""

    def __init__(self) -> None:
        self.last = ""

    def __call__(self, result: ApplyResult) -> ApplyResult:
        previous, self.last = self.last, result.note
        if result.note == previous:
            result.note = ""
        return result
