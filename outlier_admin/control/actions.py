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

import re
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
    Silence,
)
from outlier_admin.fleet.models import ApiToken, ModelGroup, Node, Policy, RegisteredVia, ThresholdChange
from outlier_admin.fleet.names import (
    NameError_,
    host_allowed,
    parse_address,
    validate_allow_entry,
    validate_group_name,
    validate_node_id,
    validate_scrape_url,
)
from outlier_admin.weights_document import DEFAULT_BASE_WEIGHT, MAX_BASE_WEIGHT, pin_range

Actor = AbstractBaseUser | str | ApiToken

__all__ = [
    "REASON_MAX",
    "ActionError",
    "ThresholdError",
    "check_override",
    "do_activate",
    "do_approve_proposal",
    "do_create_group",
    "do_create_token",
    "do_create_user",
    "do_expire_silence",
    "do_pin_weight",
    "do_propose_quarantine",
    "do_quarantine",
    "do_register_node",
    "do_register_nodes_from_ingest",
    "do_reject_proposal",
    "do_release",
    "do_retire_node",
    "do_revoke_token",
    "do_save_log_source",
    "do_set_auto_register",
    "do_set_group_policy",
    "do_set_roles",
    "do_unpin_weight",
    "do_unretire_node",
    "do_update_group",
    "do_update_node",
    "do_update_thresholds",
]


class ActionError(ValueError):
    """The action was refused; ``str()`` says why in words an operator understands."""


def _actor(actor: Actor) -> tuple[str, Any]:
    """``(actor name, user or None)``. A token is recorded by its own name (``token:ci-bot``) and
    linked to its user: the audit log says which credential acted, not only on whose behalf."""
    if isinstance(actor, ApiToken):
        return f"token:{actor.name}"[:150], actor.user
    if isinstance(actor, str):
        if not actor.strip():
            raise ActionError("actor must not be empty")
        return actor, None
    return actor.get_username(), actor


#: The longest reason an action takes (the dashboard's forms and the API's serializers say the same):
#: a reason is shown in tables and audit pages; a 100,000-character one made a page 829,209 px wide.
REASON_MAX = 2000


def _reason(reason: str) -> str:
    if not isinstance(reason, str) or not reason.strip():
        raise ActionError("a reason is required (it goes into the audit log)")
    reason = reason.strip()
    if len(reason) > REASON_MAX:
        raise ActionError(f"a reason is at most {REASON_MAX} characters, got {len(reason)}")
    return reason


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


def _signal_tick(group: str) -> None:
    """Tell the group's tick an input waits (it queries inputs only when told): now, for a caller whose
    transaction encloses the tick (a test, a script), and again once the row is committed, for a tick
    that ran in between, found no row yet and consumed the first mark."""
    from outlier_admin.control.redis_conn import mark_inputs_pending

    mark_inputs_pending(group)
    transaction.on_commit(lambda: mark_inputs_pending(group))


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
    """Clear any forced state or detector quarantine of ``node`` and return it to service at full
    weight with fresh statistics (no slow start: the operator vouches for it); the detector judges it
    again from its first samples, so a still-slow node is cut again. A pin is not cleared (unpin)."""
    return _override(node, OverrideKind.RELEASE, actor=actor, reason=reason, expires_in_s=None)


def do_pin_weight(
    node: Node, weight: int, *, actor: Actor, reason: str, expires_in_s: float | None = None
) -> Override:
    """Publish exactly ``weight`` for ``node`` whatever the detector says: on the weights document's
    scale, 0 .. its base weight (:func:`outlier_admin.weights_document.pin_range`; to send a node more
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


# --- quarantine proposals -------------------------------------------------------------------------


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
    _group_fields({"model_name": model_name, "hardware_class": hardware_class,
                   "tensor_parallel_size": tensor_parallel_size})
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
    base_weight: int = DEFAULT_BASE_WEIGHT,
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
    _base_weight(base_weight)
    labels = _labels(labels or {})
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
    registered (or already there) under the address's one spelling
    (:func:`~outlier_admin.fleet.names.address_key`), ``{node_id: reason}`` when refused.

    A node id is registered only when it is an address (``host:port``) whose host lies inside the
    group's ``auto_register_allow`` (or ``AUTO_REGISTER_DEFAULT_ALLOW``): reason ``bad_address`` /
    ``forbidden_address`` / ``node_not_allowed`` otherwise; ``group_full`` past
    ``MAX_NODES_PER_GROUP`` live nodes. One audit event per registered node."""
    allow = group.auto_register_allow or settings.AUTO_REGISTER_DEFAULT_ALLOW
    outcome: dict[str, str | None] = {}
    wanted: dict[str, list[str]] = {}  # the address's one spelling (its node's name) -> the ids given
    for node_id in dict.fromkeys(node_ids):
        try:
            addr = parse_address(node_id)
        except NameError_ as exc:
            outcome[node_id] = exc.reason
            continue
        if not host_allowed(addr, allow):
            outcome[node_id] = "node_not_allowed"
            continue
        # One address, one node: 127.0.0.1:018950 and [::ffff:127.0.0.1]:18950 are 127.0.0.1:18950
        # (fleet.names.address_key), and never take two of the group's MAX_NODES_PER_GROUP slots.
        wanted.setdefault(addr.hostport, []).append(node_id)
    if not wanted:
        return outcome
    with transaction.atomic():
        room = _room_locked(group)
        existing = set(Node.objects.filter(group=group, name__in=list(wanted)).values_list("name", flat=True))
        rows = []
        for name, given in wanted.items():
            if name in existing:
                why = None
            elif room > 0:
                rows.append(Node(group=group, name=name, address=name, registered_via=registered_via))
                why = None
                room -= 1
            else:
                why = "group_full"
            outcome.update(dict.fromkeys(given, why))
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
        if not Node.objects.filter(pk=node.pk, retired=False).update(retired=True):
            raise ActionError(f"node {node.name} is already retired")
        audit("node.retire", actor, node=node, reason=reason,
              detail={"address": node.address, "state": node.state, "weight": node.weight})
    node.refresh_from_db()
    return node


def do_retire_group(group: ModelGroup, *, actor: Actor, reason: str) -> ModelGroup:
    """Retire ``group`` for good with all its nodes (one audited change): ingest refuses its records
    from then on, ticks and scrapes skip it, its nodes leave the weights document; its history stays.
    A retired group: :class:`ActionError`."""
    reason = _reason(reason)
    with transaction.atomic():
        if not ModelGroup.objects.filter(pk=group.pk, retired=False).update(retired=True):
            raise ActionError(f"group {group.name} is already retired")
        nodes = list(Node.objects.filter(group=group, retired=False).values_list("name", flat=True))
        Node.objects.filter(group=group, retired=False).update(retired=True)
        audit("group.retire", actor, group=group, reason=reason, detail={"nodes_retired": sorted(nodes)})
    group.refresh_from_db()
    return group


#: What ``do_update_node`` may change (the name is the detector's node id and the group its peers: both
#: stay; register a new node instead).
NODE_EDITABLE = ("address", "base_weight", "labels", "dcgm_url", "metrics_url")
#: What ``do_update_group`` may change (policy and thresholds have their own audited actions).
GROUP_EDITABLE = ("model_name", "hardware_class", "tensor_parallel_size", "auto_register_allow")
LABELS_MAX = 50  # keys per node; each key and value at most 200 characters


def _base_weight(base_weight: Any) -> int:
    if isinstance(base_weight, bool) or not isinstance(base_weight, int) or not 1 <= base_weight <= MAX_BASE_WEIGHT:
        raise ActionError(f"base_weight must be an integer in [1, {MAX_BASE_WEIGHT}], got {base_weight!r}")
    return base_weight


def _labels(labels: Any) -> dict[str, str]:
    """Operator labels of a node: at most :data:`LABELS_MAX` string pairs of up to 200 characters
    (shown on pages and in the API; never interpreted)."""
    if not isinstance(labels, dict) or len(labels) > LABELS_MAX:
        raise ActionError(f"labels must be an object of at most {LABELS_MAX} string pairs")
    for key, value in labels.items():
        if not (isinstance(key, str) and isinstance(value, str) and 0 < len(key) <= 200 and len(value) <= 200
                and key.isprintable() and value.isprintable()):
            raise ActionError("each label is a printable key of 1-200 characters and a value of at most 200")
    return labels


def _group_fields(fields: dict[str, Any]) -> None:
    """The descriptive fields of a group, bounded by their columns."""
    for key, limit in (("model_name", 200), ("hardware_class", 100)):
        if key in fields:
            value = fields[key]
            if not isinstance(value, str) or len(value) > limit or not value.isprintable():
                raise ActionError(f"{key} must be printable text of at most {limit} characters")
    if "tensor_parallel_size" in fields:
        tp = fields["tensor_parallel_size"]
        if isinstance(tp, bool) or not isinstance(tp, int) or not 1 <= tp <= 1024:
            raise ActionError(f"tensor_parallel_size must be an integer in [1, 1024], got {tp!r}")


def do_update_node(node: Node, changes: dict[str, Any], *, actor: Actor, reason: str) -> Node:
    """Change some of :data:`NODE_EDITABLE` on ``node``, validated as at registration; one audit
    event ``node.update`` with the diff ``{field: [old, new]}``. A new address reaches the weights
    document and the canary at the next tick."""
    reason = _reason(reason)
    unknown = sorted(set(changes) - set(NODE_EDITABLE))
    if unknown:
        raise ActionError(f"cannot change {', '.join(unknown)}; a node's editable fields: {', '.join(NODE_EDITABLE)}")
    if not changes:
        raise ActionError("nothing to change")
    clean: dict[str, Any] = {}
    for key, value in changes.items():
        if key == "address":
            if not isinstance(value, str) or not value.strip():
                raise ActionError("address is required")
            _checked(parse_address, value.strip())
            clean[key] = value.strip()
        elif key == "base_weight":
            clean[key] = _base_weight(value)
        elif key == "labels":
            clean[key] = _labels(value)
        else:
            clean[key] = _checked(validate_scrape_url, value)
    with transaction.atomic():
        locked = Node.objects.select_for_update().get(pk=node.pk)
        if locked.retired:
            raise ActionError(f"node {locked.name} is retired")
        audit("node.update", actor, node=locked, reason=reason, detail={"diff": _save_changes(locked, clean)})
    node.refresh_from_db()
    return node


def _save_changes(locked: Any, clean: dict[str, Any]) -> dict[str, list[Any]]:
    """Set ``clean`` on the locked row and save those fields; the diff ``{field: [old, new]}``."""
    diff = {k: [getattr(locked, k), v] for k, v in clean.items() if getattr(locked, k) != v}
    for key, value in clean.items():
        setattr(locked, key, value)
    locked.save(update_fields=list(clean))
    return diff


def do_update_group(group: ModelGroup, changes: dict[str, Any], *, actor: Actor, reason: str) -> ModelGroup:
    """Change some of :data:`GROUP_EDITABLE` on ``group``; one audit event ``group.update`` with the
    diff ``{field: [old, new]}``. ``auto_register_allow`` is checked as in :func:`do_set_auto_register`."""
    reason = _reason(reason)
    unknown = sorted(set(changes) - set(GROUP_EDITABLE))
    if unknown:
        raise ActionError(f"cannot change {', '.join(unknown)}; a group's editable fields: {', '.join(GROUP_EDITABLE)} "
                          "(policy and thresholds have their own endpoints)")
    if not changes:
        raise ActionError("nothing to change")
    _group_fields(changes)
    clean = dict(changes)
    if "auto_register_allow" in clean:
        clean["auto_register_allow"] = _allow_list(clean["auto_register_allow"])
    with transaction.atomic():
        locked = ModelGroup.objects.select_for_update().get(pk=group.pk)
        audit("group.update", actor, group=locked, reason=reason, detail={"diff": _save_changes(locked, clean)})
    group.refresh_from_db()
    return group


# --- tokens ----------------------------------------------------------------------------------------------


def do_create_token(*, name: str, scope: str, actor: Actor, user: Any = None,
                    groups: list[str] | None = None) -> tuple[ApiToken, str]:
    """Issue a bearer token; returns ``(row, plaintext)`` (the plaintext is shown once).

    ``groups`` (ingest tokens only): the groups the token may push records for; ingest refuses its
    records for any other group (reason ``group_out_of_scope``). None or empty: every group, as
    before scopes existed. Each name must be a group that exists or one that ingest may create
    (``AUTO_CREATE_GROUPS``): a typo would otherwise scope a gateway's token to nothing."""
    if not name or not name.strip():
        raise ActionError("a token needs a name")
    from outlier_admin.ingest.pipeline import auto_create_pattern

    scoped: list[str] = []
    for group in groups or ():
        group = _checked(validate_group_name, group.strip() if isinstance(group, str) else group)
        if not ModelGroup.objects.filter(name=group).exists() and auto_create_pattern(group) is None:
            raise ActionError(f"no group {group!r} (and it matches no AUTO_CREATE_GROUPS pattern)")
        scoped.append(group)
    try:
        with transaction.atomic():
            row, plaintext = ApiToken.issue(name=name.strip(), scope=scope, user=user, ingest_groups=scoped)
            detail: dict[str, Any] = {"token": row.pk, "scope": scope}
            if row.ingest_groups:
                detail["groups"] = row.ingest_groups
            audit("token.create", actor, reason=f"token {row.name}", detail=detail)
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


# --- users -----------------------------------------------------------------------------------------------


def do_create_user(username: str, *, roles: list[str], actor: Actor, password: str | None = None,
                   reason: str = "created") -> Any:
    """Create a dashboard/API user holding ``roles`` (of :data:`outlier_admin.api.permissions.ROLES`);
    ``password`` None: the user cannot log in with a password (an API token's user)."""
    from django.contrib.auth import get_user_model
    from django.contrib.auth.models import Group

    from outlier_admin.api.permissions import ROLES

    username = (username or "").strip()
    if not username or len(username) > 150:
        raise ActionError("a username is 1-150 characters")
    unknown = sorted(set(roles) - set(ROLES))
    if unknown or not roles:
        raise ActionError(f"roles must be some of {', '.join(ROLES)}, got {', '.join(unknown) or 'none'}")
    model = get_user_model()
    with transaction.atomic():
        if model.objects.filter(username=username).exists():
            raise ActionError(f"user {username!r} already exists")
        user = model.objects.create_user(username=username, password=password)
        user.groups.set(Group.objects.filter(name__in=roles))
        audit("user.create", actor, reason=reason, detail={"username": username, "roles": sorted(set(roles))})
    return user


def do_set_roles(user: Any, roles: list[str], *, actor: Actor, reason: str) -> Any:
    """Make ``user``'s roles exactly ``roles`` (of :data:`outlier_admin.api.permissions.ROLES`; other
    Django groups it belongs to stay). One audit event ``user.roles`` with the old and new roles when
    they change; nothing is written when they do not. The Django admin's user form comes here too
    (:mod:`outlier_admin.control.admin`)."""
    from django.contrib.auth.models import Group

    from outlier_admin.api.permissions import ROLES

    reason = _reason(reason)
    unknown = sorted(set(roles) - set(ROLES))
    if unknown:
        raise ActionError(f"roles must be some of {', '.join(ROLES)}, got {', '.join(unknown)}")
    wanted = sorted(set(roles))
    with transaction.atomic():
        old = sorted(user.groups.filter(name__in=ROLES).values_list("name", flat=True))
        if old == wanted:
            return user
        user.groups.remove(*Group.objects.filter(name__in=set(old) - set(wanted)))
        user.groups.add(*Group.objects.filter(name__in=wanted))
        audit("user.roles", actor, reason=reason, detail={"username": user.get_username(), "old": old, "new": wanted})
    user._oa_roles = None  # permissions.roles_of caches on the instance
    return user


def do_unretire_node(node: Node, *, actor: Actor, reason: str) -> Node:
    """Bring a retired ``node`` back into its group (it re-joins the detector in warm-up at the next
    tick). Refused when it is not retired, or when the group is full (``MAX_NODES_PER_GROUP``)."""
    reason = _reason(reason)
    with transaction.atomic():
        if _room_locked(node.group) <= 0:
            raise ActionError(f"group {node.group.name} already has {settings.MAX_NODES_PER_GROUP} live nodes "
                              "(MAX_NODES_PER_GROUP)")
        if not Node.objects.filter(pk=node.pk, retired=True).update(retired=False):
            raise ActionError(f"node {node.name} is not retired")
        audit("node.unretire", actor, node=node, reason=reason, detail={"address": node.address})
    node.refresh_from_db()
    return node


def do_save_log_source(name: str, *, path: str, log_format: str, group: ModelGroup | None,
                       node_map: dict[str, str], actor: Actor, reason: str) -> Any:
    """Create or update the log source ``name`` (``manage.py tail_logs --add``) and enable it; one audit
    event ``ingest_source.create`` or ``ingest_source.update`` (with the diff) in the same transaction."""
    from outlier_admin.ingest.models import IngestSource

    reason = _reason(reason)
    name = (name or "").strip()
    if not re.fullmatch(r"[-a-zA-Z0-9_]{1,100}", name):
        raise ActionError(f"a log source name is 1-100 letters, digits, '-' or '_', got {name[:100]!r}")
    if not isinstance(path, str) or not path.strip():
        raise ActionError("a log source needs a path")
    fields = {"kind": "log", "location": path.strip(), "log_format": log_format, "default_group": group,
              "enabled": True, "node_map": node_map}
    with transaction.atomic():
        row = IngestSource.objects.select_for_update().filter(name=name).first()
        if row is None:
            row = IngestSource.objects.create(name=name, **fields)
            audit("ingest_source.create", actor, group=group, reason=reason,
                  detail={"source": name, "path": row.location, "format": log_format, "node_map": node_map})
            return row
        def shown(obj: Any) -> dict[str, Any]:  # comparable, JSON-able values of the fields
            return {k: (v.name if isinstance(v, ModelGroup) else v) for k, v in obj.items()}

        old = shown({k: getattr(row, k) for k in fields})
        new = shown(fields)
        diff = {k: [old[k], new[k]] for k in fields if old[k] != new[k]}
        for key, value in fields.items():
            setattr(row, key, value)
        row.save(update_fields=list(fields))
        audit("ingest_source.update", actor, group=group, reason=reason, detail={"source": name, "diff": diff})
    return row


def effective_thresholds(group: ModelGroup) -> Thresholds:
    """Shorthand used by views: the group's validated thresholds."""
    return group.thresholds()
