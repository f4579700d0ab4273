"""Operator inputs a tick applies to the detector: overrides, decided proposals, canary probe results.

The actions (:mod:`outlier_admin.control.actions`) only write rows; the group's tick applies them under
the group's lock, so the detector state has one writer. The tick stamps the rows applied in its SQL
transaction (:func:`record_applied`), with their outcome: ``applied`` and the :class:`Transition` the
input caused (matched by node and the state edge the detector took while applying it; none for a pin,
or a quarantine that only moved an expiry), or ``failed`` with the reason (an illegal edge, a node not
in the detector, an approval that came after the node left ``pending_approval``).

Silences (:class:`~outlier_admin.control.models.Silence`, started by rejecting a proposal): no
proposal is opened for a silenced node and cause (:func:`~outlier_admin.control.actions.
do_propose_quarantine` checks), and the detector is handed the active latency silences
(``GroupDetector.silence_latency``): latency causes do not take a silenced node out of service, so it
stays degraded at its computed weight instead of cycling through ``pending_approval`` and the floor.
A node found waiting in ``pending_approval`` under a silence is returned to service.
"""

from __future__ import annotations

import logging
import math
from typing import Any

from detector.group import GroupDetector
from detector.states import IllegalTransition, NodeState, Transition
from outlier_admin.control.actions import do_propose_quarantine, do_supersede_proposals
from outlier_admin.control.models import (
    CanaryProbe,
    Outcome,
    Override,
    OverrideKind,
    ProposalSource,
    ProposalStatus,
    QuarantineProposal,
    Silence,
)
from outlier_admin.control.models import Transition as TransitionRow
from outlier_admin.fleet.models import ModelGroup, Node

log = logging.getLogger(__name__)

#: Longest outcome reason stored (``Override.outcome_reason``).
REASON_MAX = 300


def _outcome(row: Override | QuarantineProposal, outcome: str, reason: str = "",
             moved: tuple[str, NodeState, NodeState] | None = None) -> None:
    """Note on the (unsaved) row what applying it did; :func:`record_applied` writes it."""
    row.outcome = outcome
    row.outcome_reason = reason[:REASON_MAX]
    row._moved = moved  # (node, from, to) when the detector changed the node's state


def _run(gd: GroupDetector, row: Override | QuarantineProposal, name: str, step: Any) -> None:
    """Apply one input with ``step()``; its outcome goes on ``row``."""
    before = gd.state_of(name)
    # A refused input is recorded on its row, never fatal to the tick: it would be retried, and fail,
    # at every later tick of the group.
    try:
        step()
    except (ValueError, IllegalTransition) as exc:
        log.warning("%s %s on %s not applicable: %s", type(row).__name__, row.pk, name, exc)
        _outcome(row, Outcome.FAILED, str(exc))
        return
    after = gd.state_of(name)
    _outcome(row, Outcome.APPLIED, "", (name, before, after) if after != before else None)


def apply(gd: GroupDetector, group: ModelGroup, now: float) -> tuple[list, list, list]:
    """Apply unapplied overrides, decided proposals and probe results; return the rows applied."""
    known = set(gd.nodes)
    overrides = list(
        Override.objects.filter(node__group=group, applied_at__isnull=True).select_related("node").order_by("created_at")
    )
    for o in overrides:
        name = o.node.name
        if name not in known:
            _outcome(o, Outcome.FAILED, f"node {name} is not in the detector (retired?)")
            continue
        until = o.expires_at.timestamp() if o.expires_at else None
        steps = {
            OverrideKind.QUARANTINE: lambda n=name, u=until: gd.force_quarantine(n, now, until=u),
            OverrideKind.ACTIVATE: lambda n=name, u=until: gd.force_active(n, now, until=u),
            OverrideKind.RELEASE: lambda n=name: gd.release(n, now),
            OverrideKind.PIN: lambda n=name, w=float(o.weight or 0), u=until: gd.pin_weight(n, w, now, until=u),
            OverrideKind.UNPIN: lambda n=name: gd.unpin(n),
        }
        if o.kind not in steps:
            _outcome(o, Outcome.FAILED, f"unknown override kind {o.kind!r}")
            continue
        _run(gd, o, name, steps[o.kind])
    decided = list(
        QuarantineProposal.objects.filter(
            group=group, applied_at__isnull=True, status__in=[ProposalStatus.APPROVED, ProposalStatus.REJECTED]
        ).select_related("node")
    )
    for p in decided:
        name = p.node.name
        if name not in known:
            _outcome(p, Outcome.FAILED, f"node {name} is not in the detector (retired?)")
            continue
        state = gd.state_of(name)
        approved = p.status == ProposalStatus.APPROVED
        if p.source == ProposalSource.DETECTOR and state == NodeState.PENDING_APPROVAL:
            _run(gd, p, name, lambda n=name, a=approved: (gd.approve if a else gd.reject)(n, now))
        elif p.source == ProposalSource.DETECTOR and approved:
            _outcome(p, Outcome.FAILED, f"node is {state.label}, no longer pending_approval: nothing to quarantine")
        elif p.source == ProposalSource.DETECTOR:
            _outcome(p, Outcome.APPLIED, f"node already {state.label}: nothing to return to service")
        elif approved:
            _run(gd, p, name, lambda n=name: gd.force_quarantine(n, now))
        else:
            _outcome(p, Outcome.APPLIED, "GPU-fault proposal closed")
    _sync_silences(gd, group, now)
    probes = list(
        CanaryProbe.objects.filter(node__group=group, applied_at__isnull=True).select_related("node").order_by("at")
    )
    for pr in probes:
        if pr.node.name not in known:
            continue
        # The limit before the verdict: what this probe was judged against (record_probe reads the same).
        limit = gd.probe_limit().limit
        pr.passed = gd.record_probe(
            pr.node.name, pr.at.timestamp(), pr.prompt_tokens, pr.completion_tokens,
            pr.ttft_ms, pr.total_ms, pr.ok,
        )
        # A confirmation probe of a degraded node is a sample, not a verdict: it has no limit (a
        # release probe of a held cut is a verdict, and has one).
        pr.limit = limit if pr.passed is not None and math.isfinite(limit) else None
        # Stored on the scale the detector judged it on, beside the verdict (NULL if not computable).
        value = gd.probe_value(pr.prompt_tokens, pr.completion_tokens, pr.ttft_ms, pr.total_ms) if pr.ok else None
        pr.normalised_latency = value if value is not None and math.isfinite(value) else None
    return overrides, decided, probes


def _sync_silences(gd: GroupDetector, group: ModelGroup, now: float) -> list[str]:
    """Hand the detector the group's active latency silences (see module docstring) and return to
    service a node still waiting in ``pending_approval`` under one; returns those nodes' names."""
    active = dict(
        Silence.objects.active().filter(node__group=group, cause=ProposalSource.DETECTOR)
        .values_list("node__name", "expires_at")
    )
    gd.silence_latency({name: until.timestamp() for name, until in active.items()})
    released = sorted(n for n in active if n in gd and gd.state_of(n) == NodeState.PENDING_APPROVAL)
    for name in released:
        gd.reject(name, now)
        log.info("node %s/%s back in service: its latency proposals are silenced", group.name, name)
    return released


def record_applied(overrides: list[Override], decided: list[QuarantineProposal],
                   transitions: list[TransitionRow], stamp: Any) -> None:
    """In the tick's SQL transaction: stamp the applied inputs with ``stamp``, their outcome and the
    transition row each caused; supersede the pending detector proposals of nodes that left
    ``pending_approval`` in this tick (their condition cleared, or an operator forced or released
    the node) — a decided proposal is no longer pending, so only undecided ones are touched."""
    used: set[int] = set()
    for row in [*overrides, *decided]:
        row.applied_at = stamp
        row.transition = None
        moved = getattr(row, "_moved", None)
        if moved is None:
            continue
        name, src, dst = moved
        for t in transitions:
            if (t.pk not in used and t.node.name == name and t.from_state == src.label and t.to_state == dst.label):
                used.add(t.pk)
                row.transition = t
                break
    fields = ["applied_at", "outcome", "outcome_reason", "transition"]
    if overrides:
        Override.objects.bulk_update(overrides, fields)
    if decided:
        QuarantineProposal.objects.bulk_update(decided, fields)
    left = {t.node_id: t for t in transitions if t.from_state == NodeState.PENDING_APPROVAL.label}
    if not left:
        return
    do_supersede_proposals(left)  # an action: its audit events in this transaction


def open_detector_proposal(node: Node, t: Transition) -> None:
    do_propose_quarantine(
        node, actor="system:detector", source=ProposalSource.DETECTOR,
        reason=f"{t.reason}: {t.detail}" if t.detail else t.reason, evidence=t.to_dict(),
    )
