"""Nodes: registration (by an operator or from ingest), editable fields, retirement and return.

Part of :mod:`outlier_admin.control.actions` (its docstring states the rules every action keeps)."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.db import transaction

from contract.names import (
    NameError_,
    host_allowed,
    parse_address,
    validate_new_node_name,
    validate_scrape_url,
)
from contract.weights_document import DEFAULT_BASE_WEIGHT, MAX_BASE_WEIGHT
from outlier_admin.control.actions.core import (
    ActionError,
    Actor,
    _actor,
    _checked,
    _reason,
    _save_changes,
    audit,
)
from outlier_admin.control.incidents import close_retired
from outlier_admin.control.models import AuditEvent
from outlier_admin.fleet.models import ModelGroup, Node, RegisteredVia


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
    node_id = _checked(validate_new_node_name, name or address)
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
    (:func:`~contract.names.address_key`), ``{node_id: reason}`` when refused.

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
        # (contract.names.address_key), and never take two of the group's MAX_NODES_PER_GROUP slots.
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
    at the next tick; its history stays; its open incident ends as ``retired``)."""
    reason = _reason(reason)
    with transaction.atomic():
        if not Node.objects.filter(pk=node.pk, retired=False).update(retired=True):
            raise ActionError(f"node {node.name} is already retired")
        ended = close_retired(node)  # its open incident ends with it, with this audit event
        audit("node.retire", actor, node=node, reason=reason,
              detail={"address": node.address, "state": node.state, "weight": node.weight,
                      **({"incident": ended.pk} if ended else {})})
    node.refresh_from_db()
    return node


#: What ``do_update_node`` may change (the name is the detector's node id and the group its peers: both
#: stay; register a new node instead).
NODE_EDITABLE = ("address", "base_weight", "labels", "dcgm_url", "metrics_url")


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
