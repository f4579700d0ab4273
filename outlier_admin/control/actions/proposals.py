"""Quarantine proposals (the detector's under policy ``approval``, a GPU hard fault's), their
decisions, the silences a rejection starts, and their supersession when the cause clears.

Part of :mod:`outlier_admin.control.actions` (its docstring states the rules every action keeps)."""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from typing import Any

from django.db import transaction
from django.utils import timezone

from outlier_admin.control.actions.core import (
    ActionError,
    Actor,
    _actor,
    _reason,
    _signal_tick,
    audit,
)
from outlier_admin.control.models import (
    AuditEvent,
    ProposalSource,
    ProposalStatus,
    QuarantineProposal,
    Silence,
)
from outlier_admin.control.models import Transition as TransitionRow
from outlier_admin.fleet.models import Node


def do_propose_quarantine(
    node: Node, *, actor: Actor, source: str, reason: str, evidence: dict[str, Any] | None = None
) -> QuarantineProposal | None:
    """Open a proposal to quarantine ``node`` (the detector under policy ``approval``, or a GPU hard
    fault). An existing pending proposal of the same source is returned instead of a duplicate;
    ``None`` (nothing opened) while a :class:`Silence` of this node and cause is in force — an
    operator rejected the last one, and the detector and the DCGM scrape both come here, so neither
    can ask again before the silence ends."""
    if source not in ProposalSource.values:
        raise ActionError(f"source must be one of {ProposalSource.values}, got {source!r}")
    reason = _reason(reason)
    with transaction.atomic():
        if Silence.objects.active().filter(node=node, cause=source).exists():
            return None
        existing = (
            QuarantineProposal.objects.select_for_update()
            .filter(node=node, source=source, status=ProposalStatus.PENDING)
            .first()
        )
        if existing is not None:
            return existing
        row = QuarantineProposal.objects.create(
            group=node.group, node=node, source=source, reason=reason, evidence=evidence or {}
        )
        audit("proposal.open", actor, node=node, reason=reason, detail={"proposal": row.pk, "source": source})
    return row


def _decide(proposal: QuarantineProposal, status: str, *, actor: Actor, reason: str,
            also: Callable[[QuarantineProposal], dict[str, Any]] | None = None) -> QuarantineProposal:
    """Decide a pending proposal; ``also(row)`` runs in the same transaction after the decision and
    returns what to add to the audit event's detail (a rejection's silence)."""
    name, user = _actor(actor)
    reason = _reason(reason)
    with transaction.atomic():
        locked = QuarantineProposal.objects.select_for_update().get(pk=proposal.pk)
        if locked.status == ProposalStatus.SUPERSEDED:
            raise ActionError(
                f"proposal {locked.pk} is superseded: {locked.decision_reason or 'its condition cleared'}; "
                "there is nothing to approve or reject (the detector opens a new proposal, with fresh "
                "evidence, if the node is slow again)")
        if locked.status != ProposalStatus.PENDING:
            raise ActionError(f"proposal {locked.pk} is already {locked.status}")
        locked.status = status
        locked.decided_at = timezone.now()
        locked.decided_by = user
        locked.decided_actor = name
        locked.decision_reason = reason
        locked.save(update_fields=["status", "decided_at", "decided_by", "decided_actor", "decision_reason"])
        audit(
            f"proposal.{status}",
            actor,
            node=locked.node,
            reason=reason,
            detail={"proposal": locked.pk, "source": locked.source, **(also(locked) if also else {})},
        )
        _signal_tick(locked.node.group.name)
    return locked


def do_approve_proposal(proposal: QuarantineProposal, *, actor: Actor, reason: str) -> QuarantineProposal:
    """Approve: the node is quarantined at the next tick (a detector proposal moves
    ``pending_approval -> quarantined``; a GPU-fault proposal forces a quarantine). Refused if the
    proposal was already decided."""
    return _decide(proposal, ProposalStatus.APPROVED, actor=actor, reason=reason)


#: How long a rejection silences new proposals of the same node and cause unless the operator says.
DEFAULT_SILENCE_S = 3600


MAX_SILENCE_S = 30 * 86400


def do_reject_proposal(
    proposal: QuarantineProposal, *, actor: Actor, reason: str, silence_s: float = DEFAULT_SILENCE_S
) -> QuarantineProposal:
    """Reject: a detector proposal returns the node to service at the next tick; a GPU-fault
    proposal is closed without effect. Either way a :class:`Silence` of the node and the proposal's
    cause starts, for ``silence_s`` seconds (60 .. 30 days, default 1 h), in the same transaction:
    no new proposal of that cause for the node until it ends or is expired
    (:func:`do_expire_silence`). One audit event, ``proposal.rejected``, names the silence."""
    silence_s = _silence_seconds(silence_s)

    def silence(decided: QuarantineProposal) -> dict[str, Any]:
        name, user = _actor(actor)
        row = Silence.objects.create(
            node=decided.node, cause=decided.source, created_at=decided.decided_at,
            expires_at=decided.decided_at + timedelta(seconds=silence_s),
            actor=name, user=user, reason=decided.decision_reason, proposal=decided,
        )
        return {"silence": row.pk, "silence_s": silence_s, "silenced_until": row.expires_at.isoformat()}

    return _decide(proposal, ProposalStatus.REJECTED, actor=actor, reason=reason, also=silence)


def _silence_seconds(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ActionError(f"silence_s must be a number of seconds, got {value!r}")
    if not 60 <= value <= MAX_SILENCE_S:
        raise ActionError(f"silence_s must be in [60, {MAX_SILENCE_S}] seconds (1 min .. 30 days), got {value}")
    return float(value)


def do_expire_silence(silence: Silence, *, actor: Actor, reason: str) -> Silence:
    """End ``silence`` now: the detector or the DCGM scrape may propose the node again at once.
    Refused for a silence that already ended."""
    name, _user = _actor(actor)
    reason = _reason(reason)
    with transaction.atomic():
        locked = Silence.objects.select_for_update().get(pk=silence.pk)
        now = timezone.now()
        if not locked.is_active(now):
            raise ActionError(f"silence {locked.pk} already ended at {locked.expires_at.isoformat()}")
        old = locked.expires_at
        locked.expires_at = now
        locked.expired_by = name
        locked.save(update_fields=["expires_at", "expired_by"])
        audit("silence.expire", actor, node=locked.node, reason=reason,
              detail={"silence": locked.pk, "cause": locked.cause, "was_until": old.isoformat()})
        # The detector holds the silence (silenced_until): its tick must read the inputs again.
        _signal_tick(locked.node.group.name)
    return locked


def do_supersede_proposals(left: dict[int, TransitionRow], *, actor: Actor = "system:detector"
                           ) -> list[QuarantineProposal]:
    """Close the pending detector proposals of the nodes that left ``pending_approval`` (``left``: a
    node's id -> the transition row that took it out): their condition cleared, or an operator forced
    or released the node, so there is nothing left to approve or reject (:func:`_decide` refuses a
    superseded proposal with this reason). One audit event ``proposal.superseded`` per proposal, in
    the caller's transaction (the tick's SQL write). A decided proposal is no longer pending: only
    undecided ones are touched."""
    name, user = _actor(actor)
    with transaction.atomic():
        stale = list(QuarantineProposal.objects.select_for_update().filter(
            node_id__in=list(left), source=ProposalSource.DETECTOR, status=ProposalStatus.PENDING))
        for p in stale:
            t = left[p.node_id]
            p.status = ProposalStatus.SUPERSEDED
            p.decided_at = t.at
            p.decided_actor = name
            p.decision_reason = f"the node left pending_approval ({t.from_state} -> {t.to_state}, {t.reason})"
            p.transition = t
        if stale:
            QuarantineProposal.objects.bulk_update(stale, ["status", "decided_at", "decided_actor",
                                                           "decision_reason", "transition"])
            AuditEvent.objects.bulk_create([
                AuditEvent(actor=name, user=user, action="proposal.superseded", group_id=p.group_id,
                           node_id=p.node_id, reason=p.decision_reason,
                           detail={"proposal": p.pk, "source": p.source, "transition": p.transition.pk})
                for p in stale])
    return stale
