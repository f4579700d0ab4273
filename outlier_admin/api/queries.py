"""Read queries shared by the API and the dashboard (kept out of views so both stay thin)."""

from __future__ import annotations

from collections import Counter
from typing import Any

from django.db.models import OuterRef, QuerySet, Subquery

from outlier_admin.control.models import NodeHistory, QuarantineProposal
from outlier_admin.fleet.models import ModelGroup, Node

LATEST_FIELDS = ("ema", "z", "p50", "p99", "samples")
#: Display order of states (also the order of the count columns on the overview).
STATE_ORDER = (
    "healthy", "degraded", "pending_approval", "quarantined", "probing", "recovering", "warming",
    "forced_quarantine", "forced_active",
)
OUT_OF_SERVICE = frozenset({"quarantined", "probing", "forced_quarantine"})


def with_latest_figures(nodes: QuerySet[Node], signal: str = "norm") -> QuerySet[Node]:
    """Annotate each node with its latest ``ema``/``z``/``p50``/``p99``/``samples`` of ``signal``.

    One correlated subquery per figure, each an index probe on ``(node, signal, at)``: cost grows
    with the number of nodes, not with the length of their history."""
    latest = NodeHistory.objects.filter(node=OuterRef("pk"), signal=signal).order_by("-at")
    return nodes.annotate(**{f"latest_{f}": Subquery(latest.values(f)[:1]) for f in LATEST_FIELDS})


def state_counts(group_ids: list[int] | None = None) -> dict[int, Counter[str]]:
    """``{group_id: Counter(state -> live nodes)}`` (retired nodes excluded)."""
    qs = Node.objects.filter(retired=False)
    if group_ids is not None:
        qs = qs.filter(group_id__in=group_ids)
    out: dict[int, Counter[str]] = {}
    for gid, state in qs.values_list("group_id", "state"):
        out.setdefault(gid, Counter())[state] += 1
    return out


def safeguard_status(group: ModelGroup, counts: Counter[str]) -> dict[str, Any]:
    """How close the group is to its safeguard: ``out`` of ``total`` nodes out of service, the
    limit ``floor(max_quarantine_fraction * total)``, and ``engaged`` when nodes are out and the
    limit is reached (the detector will refuse the next quarantine)."""
    total = sum(counts.values())
    out = sum(v for k, v in counts.items() if k in OUT_OF_SERVICE)
    fraction = group.thresholds().max_quarantine_fraction
    limit = int(fraction * total + 1e-9)
    return {"out": out, "total": total, "limit": limit, "fraction": fraction,
            "engaged": out > 0 and out >= limit}


def pending_proposals() -> QuerySet[QuarantineProposal]:
    return QuarantineProposal.objects.filter(status="pending").select_related("node", "group")
