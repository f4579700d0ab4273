"""Operator inputs a tick applies to the detector: overrides, decided proposals, canary probe results.

The actions (:mod:`outlier_admin.control.actions`) only write rows; the group's tick applies them under
the group's lock, so the detector state has one writer. The tick stamps the rows applied in its SQL
transaction.
"""

from __future__ import annotations

import logging
import math

from detector import GroupDetector, NodeState, Transition
from outlier_admin.control.actions import do_propose_quarantine
from outlier_admin.control.models import (
    CanaryProbe,
    Override,
    OverrideKind,
    ProposalSource,
    ProposalStatus,
    QuarantineProposal,
)
from outlier_admin.fleet.models import ModelGroup, Node

log = logging.getLogger(__name__)


def apply(gd: GroupDetector, group: ModelGroup, now: float) -> tuple[list, list, list]:
    """Apply unapplied overrides, decided proposals and probe results; return the rows applied."""
    known = set(gd.nodes)
    overrides = list(
        Override.objects.filter(node__group=group, applied_at__isnull=True).select_related("node").order_by("created_at")
    )
    for o in overrides:
        name = o.node.name
        if name not in known:
            continue
        until = o.expires_at.timestamp() if o.expires_at else None
        try:
            if o.kind == OverrideKind.QUARANTINE:
                gd.force_quarantine(name, now, until=until)
            elif o.kind == OverrideKind.ACTIVATE:
                gd.force_active(name, now, until=until)
            elif o.kind == OverrideKind.RELEASE:
                gd.release(name, now)
            elif o.kind == OverrideKind.PIN:
                gd.pin_weight(name, float(o.weight or 0), now, until=until)
            elif o.kind == OverrideKind.UNPIN:
                gd.unpin(name)
        except ValueError as exc:  # e.g. an illegal edge: recorded on the row, not fatal to the tick
            log.warning("override %s on %s not applicable: %s", o.kind, name, exc)
    decided = list(
        QuarantineProposal.objects.filter(
            group=group, applied_at__isnull=True, status__in=[ProposalStatus.APPROVED, ProposalStatus.REJECTED]
        ).select_related("node")
    )
    for p in decided:
        name = p.node.name
        if name not in known:
            continue
        try:
            state = gd.state_of(name)
            if p.source == ProposalSource.DETECTOR and state == NodeState.PENDING_APPROVAL:
                (gd.approve if p.status == ProposalStatus.APPROVED else gd.reject)(name, now)
            elif p.source == ProposalSource.GPU_FAULT and p.status == ProposalStatus.APPROVED:
                gd.force_quarantine(name, now)
        except ValueError as exc:
            log.warning("proposal %s on %s not applicable: %s", p.pk, name, exc)
    probes = list(
        CanaryProbe.objects.filter(node__group=group, applied_at__isnull=True).select_related("node").order_by("at")
    )
    for pr in probes:
        if pr.node.name not in known:
            continue
        pr.passed = gd.record_probe(
            pr.node.name, pr.at.timestamp(), pr.prompt_tokens, pr.completion_tokens,
            pr.ttft_ms, pr.total_ms, pr.ok,
        )
        # Stored on the scale the detector judged it on, beside the verdict (NULL if not computable).
        value = gd.probe_value(pr.prompt_tokens, pr.completion_tokens, pr.ttft_ms, pr.total_ms) if pr.ok else None
        pr.normalised_latency = value if value is not None and math.isfinite(value) else None
    return overrides, decided, probes


def open_detector_proposal(node: Node, t: Transition) -> None:
    do_propose_quarantine(
        node, actor="system:detector", source=ProposalSource.DETECTOR,
        reason=f"{t.reason}: {t.detail}" if t.detail else t.reason, evidence=t.to_dict(),
    )
