"""An operator's overrides of one node: quarantine, activate, release, pin and unpin its weight.

Part of :mod:`outlier_admin.control.actions` (its docstring states the rules every action keeps)."""

from __future__ import annotations

from typing import Any

from django.db import transaction

from contract.weights_document import pin_range
from outlier_admin.control.actions.core import (
    ActionError,
    Actor,
    _actor,
    _expiry,
    _reason,
    _signal_tick,
    audit,
)
from outlier_admin.control.models import Override, OverrideKind
from outlier_admin.fleet.models import Node


def _override(
    node: Node, kind: str, *, actor: Actor, reason: str, expires_in_s: float | None, weight: int | None = None
) -> Override:
    name, user = _actor(actor)
    reason = _reason(reason)
    expires_at = _expiry(expires_in_s)
    with transaction.atomic():
        row = Override.objects.create(
            node=node, kind=kind, weight=weight, reason=reason, actor=name, user=user, expires_at=expires_at
        )
        detail: dict[str, Any] = {"override": row.pk, "expires_at": expires_at.isoformat() if expires_at else None}
        if weight is not None:
            detail["weight"] = weight
        audit(f"node.{kind}", actor, node=node, reason=reason, detail=detail)
        _signal_tick(node.group.name)
    return row


def do_quarantine(node: Node, *, actor: Actor, reason: str, expires_in_s: float | None = None) -> Override:
    """Force ``node`` out of service (weight 0, state ``forced_quarantine``) until released or, with
    ``expires_in_s``, until that many seconds from now. The safeguard does not limit manual
    quarantines (the operator decides)."""
    return _override(node, OverrideKind.QUARANTINE, actor=actor, reason=reason, expires_in_s=expires_in_s)


def do_activate(node: Node, *, actor: Actor, reason: str, expires_in_s: float | None = None) -> Override:
    """Force ``node`` into service at its base weight (state ``forced_active``): the detector keeps
    scoring it but does not act on it, until released or expired."""
    return _override(node, OverrideKind.ACTIVATE, actor=actor, reason=reason, expires_in_s=expires_in_s)


def do_release(node: Node, *, actor: Actor, reason: str) -> Override:
    """Clear any forced state or detector quarantine of ``node`` and return it to service at full
    weight with fresh statistics (no slow start: the operator vouches for it); the detector judges it
    again from its first samples, so a still-slow node is cut again. A pin is not cleared (unpin)."""
    return _override(node, OverrideKind.RELEASE, actor=actor, reason=reason, expires_in_s=None)


def do_pin_weight(
    node: Node, weight: int, *, actor: Actor, reason: str, expires_in_s: float | None = None
) -> Override:
    """Publish exactly ``weight`` for ``node`` whatever the detector says: on the weights document's
    scale, 0 .. its base weight (:func:`contract.weights_document.pin_range`; to send a node more
    traffic than its peers, raise its base weight)."""
    _pin_weight(node, weight)
    return _override(
        node, OverrideKind.PIN, actor=actor, reason=reason, expires_in_s=expires_in_s, weight=weight
    )


def _pin_weight(node: Node, weight: Any) -> int:
    if isinstance(weight, bool) or not isinstance(weight, int):
        raise ActionError(f"weight must be an integer, got {weight!r}")
    low, high = pin_range(node.base_weight)
    if not low <= weight <= high:
        raise ActionError(f"weight must be in [{low}, {high}] (at most the base weight), got {weight}")
    return weight


def check_override(node: Node, kind: str, *, reason: str, expires_in_s: float | None = None,
                   weight: int | None = None) -> None:
    """Raise :class:`ActionError` if the override would be refused, without writing anything: the
    dashboard asks this before its confirmation step, so "Yes" is never followed by a refusal."""
    _reason(reason)
    if kind not in (OverrideKind.RELEASE, OverrideKind.UNPIN):  # those take no expiry
        _expiry(expires_in_s)
    if kind == OverrideKind.PIN:
        _pin_weight(node, weight)


def do_unpin_weight(node: Node, *, actor: Actor, reason: str) -> Override:
    """Remove a pinned weight: the detector's weight is published again."""
    return _override(node, OverrideKind.UNPIN, actor=actor, reason=reason, expires_in_s=None)
