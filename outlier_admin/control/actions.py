"""Every state change an operator can make, as one ``do_*`` function each (Zulip's habit).

Each function validates its input (raising :class:`ActionError` or
:class:`detector.thresholds.ThresholdError`, both ``ValueError``), changes the data and writes
one :class:`AuditEvent` in the same database transaction, so there is never a change without its
audit record or an audit record without its change. The API, the dashboard, management commands
and tests all call these; nothing else writes overrides, decisions, thresholds or policies.

``actor`` is either a Django user (recorded as ``user`` and by username) or a string naming a
non-human principal (``"token:ci-bot"``, ``"system:dcgm"``).

Timing: overrides and proposal decisions are stored with ``applied_at = NULL``; the next detector
tick of the group (at most ``TICK_INTERVAL_MS`` later) applies them to the detector state, records
the resulting transition and publishes the weights. Threshold and policy changes are picked up by
the next tick as well.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.contrib.auth.models import AbstractBaseUser
from django.db import transaction
from django.utils import timezone

from detector.thresholds import ThresholdError, Thresholds
from outlier_admin.control.models import (
    AuditEvent,
    Override,
    OverrideKind,
    ProposalSource,
    ProposalStatus,
    QuarantineProposal,
)
from outlier_admin.fleet.models import ApiToken, ModelGroup, Node, Policy, RegisteredVia, ThresholdChange
from outlier_admin.fleet.names import (
    Address,
    NameError_,
    host_allowed,
    parse_address,
    validate_allow_entry,
    validate_group_name,
    validate_node_id,
    validate_scrape_url,
)

Actor = AbstractBaseUser | str

__all__ = [
    "ActionError",
    "ThresholdError",
    "do_activate",
    "do_approve_proposal",
    "do_create_group",
    "do_create_token",
    "do_pin_weight",
    "do_propose_quarantine",
    "do_quarantine",
    "do_register_node",
    "do_register_nodes_from_ingest",
    "do_reject_proposal",
    "do_release",
    "do_retire_node",
    "do_revoke_token",
    "do_set_auto_register",
    "do_set_group_policy",
    "do_unpin_weight",
    "do_update_thresholds",
]


class ActionError(ValueError):
    """The action was refused; ``str()`` says why in words an operator understands."""


def _actor(actor: Actor) -> tuple[str, Any]:
    if isinstance(actor, str):
        if not actor.strip():
            raise ActionError("actor must not be empty")
        return actor, None
    return actor.get_username(), actor


def _reason(reason: str) -> str:
    if not reason or not reason.strip():
        raise ActionError("a reason is required (it goes into the audit log)")
    return reason.strip()


def _expiry(expires_in_s: float | None) -> Any:
    if expires_in_s is None:
        return None
    if not 0 < expires_in_s <= 30 * 86400:
        raise ActionError(f"expires_in_s must be in (0, 2592000] seconds, got {expires_in_s}")
    return timezone.now() + timedelta(seconds=expires_in_s)


def audit(
    action: str,
    actor: Actor,
    *,
    group: ModelGroup | None = None,
    node: Node | None = None,
    reason: str = "",
    detail: dict[str, Any] | None = None,
) -> AuditEvent:
    """Write one audit event (call inside the transaction of the change it records)."""
    name, user = _actor(actor)
    if group is None and node is not None:
        group = node.group
    return AuditEvent.objects.create(
        actor=name, user=user, action=action, group=group, node=node, reason=reason, detail=detail or {}
    )


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
    return row


# --- node overrides -----------------------------------------------------------------------------


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
    """Clear any forced state or detector quarantine of ``node`` and return it to service; it
    re-enters through warm-up, so a still-slow node is caught again by the detector."""
    return _override(node, OverrideKind.RELEASE, actor=actor, reason=reason, expires_in_s=None)


def do_pin_weight(
    node: Node, weight: int, *, actor: Actor, reason: str, expires_in_s: float | None = None
) -> Override:
    """Publish exactly ``weight`` for ``node`` (0 .. 10 x base weight) whatever the detector says."""
    if isinstance(weight, bool) or not isinstance(weight, int):
        raise ActionError(f"weight must be an integer, got {weight!r}")
    limit = max(10 * node.base_weight, 1)
    if not 0 <= weight <= limit:
        raise ActionError(f"weight must be in [0, {limit}] (10 x base weight), got {weight}")
    return _override(
        node, OverrideKind.PIN, actor=actor, reason=reason, expires_in_s=expires_in_s, weight=weight
    )


def do_unpin_weight(node: Node, *, actor: Actor, reason: str) -> Override:
    """Remove a pinned weight: the detector's weight is published again."""
    return _override(node, OverrideKind.UNPIN, actor=actor, reason=reason, expires_in_s=None)


# --- quarantine proposals -------------------------------------------------------------------------


def do_propose_quarantine(
    node: Node, *, actor: Actor, source: str, reason: str, evidence: dict[str, Any] | None = None
) -> QuarantineProposal:
    """Open a proposal to quarantine ``node`` (the detector under policy ``approval``, or a GPU hard
    fault). An existing pending proposal of the same source is returned instead of a duplicate."""
    if source not in ProposalSource.values:
        raise ActionError(f"source must be one of {ProposalSource.values}, got {source!r}")
    reason = _reason(reason)
    with transaction.atomic():
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


def _decide(proposal: QuarantineProposal, status: str, *, actor: Actor, reason: str) -> QuarantineProposal:
    name, user = _actor(actor)
    reason = _reason(reason)
    with transaction.atomic():
        locked = QuarantineProposal.objects.select_for_update().get(pk=proposal.pk)
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
            detail={"proposal": locked.pk, "source": locked.source},
        )
    return locked


def do_approve_proposal(proposal: QuarantineProposal, *, actor: Actor, reason: str) -> QuarantineProposal:
    """Approve: the node is quarantined at the next tick (a detector proposal moves
    ``pending_approval -> quarantined``; a GPU-fault proposal forces a quarantine). Refused if the
    proposal was already decided."""
    return _decide(proposal, ProposalStatus.APPROVED, actor=actor, reason=reason)


def do_reject_proposal(proposal: QuarantineProposal, *, actor: Actor, reason: str) -> QuarantineProposal:
    """Reject: a detector proposal returns the node to service at the next tick; a GPU-fault
    proposal is closed without effect."""
    return _decide(proposal, ProposalStatus.REJECTED, actor=actor, reason=reason)


# --- groups and thresholds ----------------------------------------------------------------------------


def do_create_group(
    name: str,
    *,
    actor: Actor,
    reason: str = "created",
    policy: str = Policy.AUTO,
    model_name: str = "",
    hardware_class: str = "",
    tensor_parallel_size: int = 1,
    created_via: str = "manual",
    auto_register_allow: list[str] | None = None,
) -> ModelGroup:
    """Create a model group with default thresholds (version 1). ``auto_register_allow``: CIDRs and
    DNS suffixes from which nodes that first appear in ingest data may be registered (see
    :mod:`outlier_admin.fleet.names`)."""
    if policy not in Policy.values:
        raise ActionError(f"policy must be one of {Policy.values}, got {policy!r}")
    _checked(validate_group_name, name)
    allow = _allow_list(auto_register_allow or [])
    with transaction.atomic():
        if ModelGroup.objects.filter(name=name).exists():
            raise ActionError(f"group {name!r} already exists")
        group = ModelGroup.objects.create(
            name=name,
            policy=policy,
            model_name=model_name,
            hardware_class=hardware_class,
            tensor_parallel_size=tensor_parallel_size,
            created_via=created_via,
            auto_register_allow=allow,
        )
        audit("group.create", actor, group=group, reason=reason,
              detail={"policy": policy, "auto_register_allow": allow})
    return group


def do_set_auto_register(group: ModelGroup, allow: list[str], *, actor: Actor, reason: str) -> ModelGroup:
    """Set the CIDRs and DNS suffixes from which ingest may register new nodes of ``group``
    (``[]``: the deployment's ``AUTO_REGISTER_DEFAULT_ALLOW``)."""
    reason = _reason(reason)
    normalised = _allow_list(allow)
    with transaction.atomic():
        locked = ModelGroup.objects.select_for_update().get(pk=group.pk)
        old = locked.auto_register_allow
        locked.auto_register_allow = normalised
        locked.save(update_fields=["auto_register_allow"])
        audit("group.auto_register", actor, group=locked, reason=reason, detail={"old": old, "new": normalised})
    group.refresh_from_db()
    return group


def _checked(rule: Callable[[Any], Any], value: Any) -> Any:
    try:
        return rule(value)
    except NameError_ as exc:
        raise ActionError(exc.detail) from None


def _allow_list(allow: list[str]) -> list[str]:
    if not isinstance(allow, list):
        raise ActionError("auto_register_allow must be a list of CIDRs and DNS suffixes")
    return list(dict.fromkeys(_checked(validate_allow_entry, e) for e in allow))


def do_update_thresholds(
    group: ModelGroup, changes: dict[str, Any], *, actor: Actor, reason: str
) -> ThresholdChange:
    """Apply ``changes`` (field -> new value) to the group's thresholds as a new version.

    The full result is validated by :class:`detector.thresholds.Thresholds`; an unknown field or a
    value out of range raises ``ThresholdError`` naming the field and its allowed range, and nothing
    is stored. ``require_approval`` cannot be set here: it follows the policy
    (:func:`do_set_group_policy`). Returns the version record (``old``/``new`` are full dicts,
    ``diff`` is ``{field: [old, new]}``).
    """
    name, user = _actor(actor)
    reason = _reason(reason)
    if not changes:
        raise ActionError("no threshold changes given")
    if "require_approval" in changes:
        raise ActionError("require_approval follows the group policy; set the policy to 'approval' instead")
    with transaction.atomic():
        locked = ModelGroup.objects.select_for_update().get(pk=group.pk)
        old = locked.thresholds()
        new = old.replace(**changes)  # raises ThresholdError
        old_d, new_d = old.to_dict(), new.to_dict()
        diff = {k: [old_d[k], new_d[k]] for k in new_d if old_d[k] != new_d[k]}
        if not diff:
            raise ActionError("the given values equal the current thresholds")
        locked.threshold_overrides = ModelGroup.overrides_from(new)
        locked.thresholds_version += 1
        locked.save(update_fields=["threshold_overrides", "thresholds_version"])
        change = ThresholdChange.objects.create(
            group=locked, version=locked.thresholds_version, actor=name, user=user,
            old=old_d, new=new_d, diff=diff, reason=reason,
        )
        audit("group.thresholds", actor, group=locked, reason=reason,
              detail={"version": locked.thresholds_version, "diff": diff})
    group.refresh_from_db()
    return change


def do_set_group_policy(group: ModelGroup, policy: str, *, actor: Actor, reason: str) -> ModelGroup:
    """Switch the group between ``shadow`` / ``approval`` / ``auto``. Counts as a thresholds
    version too (``require_approval`` changes with it), so the history shows it."""
    name, user = _actor(actor)
    reason = _reason(reason)
    if policy not in Policy.values:
        raise ActionError(f"policy must be one of {Policy.values}, got {policy!r}")
    with transaction.atomic():
        locked = ModelGroup.objects.select_for_update().get(pk=group.pk)
        if locked.policy == policy:
            raise ActionError(f"group {locked.name} already has policy {policy}")
        old_policy = locked.policy
        old_t = locked.thresholds().to_dict()
        locked.policy = policy
        locked.thresholds_version += 1
        locked.save(update_fields=["policy", "thresholds_version"])
        new_t = locked.thresholds().to_dict()
        diff: dict[str, Any] = {"policy": [old_policy, policy]}
        if old_t["require_approval"] != new_t["require_approval"]:
            diff["require_approval"] = [old_t["require_approval"], new_t["require_approval"]]
        ThresholdChange.objects.create(
            group=locked, version=locked.thresholds_version, actor=name, user=user,
            old={**old_t, "policy": old_policy}, new={**new_t, "policy": policy}, diff=diff, reason=reason,
        )
        audit("group.policy", actor, group=locked, reason=reason, detail={"old": old_policy, "new": policy})
    group.refresh_from_db()
    return group


# --- nodes ----------------------------------------------------------------------------------------------


def do_register_node(
    group: ModelGroup,
    address: str,
    *,
    actor: Actor,
    name: str | None = None,
    base_weight: int = 100,
    labels: dict[str, Any] | None = None,
    dcgm_url: str = "",
    metrics_url: str = "",
    registered_via: str = RegisteredVia.MANUAL,
    reason: str = "registered",
) -> Node:
    """Add a node to ``group``. ``address`` is ``host:port`` or ``http(s)://host:port`` (validated:
    the canary builds its URL from it); ``name`` (the detector's node id) defaults to ``address``.
    Refused when the group already has ``MAX_NODES_PER_GROUP`` live nodes. The node joins the
    detector at the next tick, in warm-up (slow start)."""
    if not isinstance(address, str) or not address.strip():
        raise ActionError("address is required")
    address = address.strip()
    _checked(parse_address, address)
    node_id = _checked(validate_node_id, name or address)
    _checked(validate_scrape_url, dcgm_url)
    _checked(validate_scrape_url, metrics_url)
    if not 1 <= base_weight <= 1_000_000:
        raise ActionError(f"base_weight must be in [1, 1000000], got {base_weight}")
    with transaction.atomic():
        if _room_locked(group) <= 0:
            raise ActionError(f"group {group.name} already has {settings.MAX_NODES_PER_GROUP} live nodes "
                              "(MAX_NODES_PER_GROUP)")
        if Node.objects.filter(group=group, name=node_id).exists():
            raise ActionError(f"group {group.name} already has a node {node_id!r}")
        node = Node.objects.create(
            group=group, name=node_id, address=address, base_weight=base_weight,
            labels=labels or {}, dcgm_url=dcgm_url, metrics_url=metrics_url,
            registered_via=registered_via,
        )
        audit("node.register", actor, node=node, reason=reason,
              detail={"address": address, "base_weight": base_weight, "via": registered_via})
    return node


def do_register_nodes_from_ingest(
    group: ModelGroup, node_ids: list[str], *, actor: Actor, registered_via: str = RegisteredVia.INGEST
) -> dict[str, str | None]:
    """Register nodes that first appeared in ingest data, in one transaction: ``{node_id: None}`` when
    registered (or already there), ``{node_id: reason}`` when refused.

    A node id is registered only when it is an address (``host:port``) whose host lies inside the
    group's ``auto_register_allow`` (or ``AUTO_REGISTER_DEFAULT_ALLOW``): reason ``bad_address`` /
    ``forbidden_address`` / ``node_not_allowed`` otherwise; ``group_full`` past
    ``MAX_NODES_PER_GROUP`` live nodes. One audit event per registered node."""
    allow = group.auto_register_allow or settings.AUTO_REGISTER_DEFAULT_ALLOW
    outcome: dict[str, str | None] = {}
    wanted: list[tuple[str, Address]] = []
    for node_id in dict.fromkeys(node_ids):
        try:
            addr = parse_address(node_id)
        except NameError_ as exc:
            outcome[node_id] = exc.reason
            continue
        if not host_allowed(addr, allow):
            outcome[node_id] = "node_not_allowed"
            continue
        wanted.append((node_id, addr))
    if not wanted:
        return outcome
    with transaction.atomic():
        room = _room_locked(group)
        existing = set(Node.objects.filter(group=group, name__in=[n for n, _ in wanted]).values_list("name", flat=True))
        rows = []
        for node_id, addr in wanted:
            if node_id in existing:
                outcome[node_id] = None
            elif room > 0:
                rows.append(Node(group=group, name=node_id, address=addr.hostport, registered_via=registered_via))
                outcome[node_id] = None
                room -= 1
            else:
                outcome[node_id] = "group_full"
        created = Node.objects.bulk_create(rows)
        actor_name, user = _actor(actor)
        AuditEvent.objects.bulk_create([
            AuditEvent(actor=actor_name, user=user, action="node.register", group=group, node=node,
                       reason="first record from this node",
                       detail={"address": node.address, "base_weight": node.base_weight, "via": registered_via})
            for node in created
        ])
    return outcome


def _room_locked(group: ModelGroup) -> int:
    """How many more live nodes ``group`` may take (``MAX_NODES_PER_GROUP``), with its row locked
    until the transaction ends: registrations of one group are ordered, so the cap holds under
    concurrent requests."""
    ModelGroup.objects.select_for_update().get(pk=group.pk)
    return settings.MAX_NODES_PER_GROUP - Node.objects.filter(group=group, retired=False).count()


def do_retire_node(node: Node, *, actor: Actor, reason: str) -> Node:
    """Take ``node`` out of the group for good (removed from the detector and the weights document
    at the next tick; its history stays)."""
    reason = _reason(reason)
    with transaction.atomic():
        Node.objects.filter(pk=node.pk).update(retired=True)
        audit("node.retire", actor, node=node, reason=reason)
    node.refresh_from_db()
    return node


# --- tokens ----------------------------------------------------------------------------------------------


def do_create_token(*, name: str, scope: str, actor: Actor, user: Any = None) -> tuple[ApiToken, str]:
    """Issue a bearer token; returns ``(row, plaintext)`` (the plaintext is shown once)."""
    if not name or not name.strip():
        raise ActionError("a token needs a name")
    try:
        with transaction.atomic():
            row, plaintext = ApiToken.issue(name=name.strip(), scope=scope, user=user)
            audit("token.create", actor, reason=f"token {row.name}", detail={"token": row.pk, "scope": scope})
    except ValueError as exc:
        raise ActionError(str(exc)) from exc
    return row, plaintext


def do_revoke_token(token: ApiToken, *, actor: Actor, reason: str) -> ApiToken:
    """Revoke a token (it stops authenticating immediately)."""
    reason = _reason(reason)
    with transaction.atomic():
        ApiToken.objects.filter(pk=token.pk, revoked_at__isnull=True).update(revoked_at=timezone.now())
        audit("token.revoke", actor, reason=reason, detail={"token": token.pk, "name": token.name})
    token.refresh_from_db()
    return token


def effective_thresholds(group: ModelGroup) -> Thresholds:
    """Shorthand used by views: the group's validated thresholds."""
    return group.thresholds()
