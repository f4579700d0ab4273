"""Model groups: creation, thresholds, policy, auto-registration, editable fields, retirement.

Part of :mod:`outlier_admin.control.actions` (its docstring states the rules every action keeps)."""

from __future__ import annotations

import fnmatch
from typing import Any

from django.conf import settings
from django.db import transaction

from contract.names import validate_allow_entry, validate_group_name
from outlier_admin.control.actions.core import (
    ActionError,
    Actor,
    _actor,
    _checked,
    _reason,
    _save_changes,
    audit,
)
from outlier_admin.fleet.models import ModelGroup, Node, Policy, ThresholdChange


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
    :mod:`contract.names`)."""
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


#: What ``do_update_group`` may change (policy and thresholds have their own audited actions).
GROUP_EDITABLE = ("model_name", "hardware_class", "tensor_parallel_size", "auto_register_allow")


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


def auto_create_pattern(name: str) -> str | None:
    """The operator's ``AUTO_CREATE_GROUPS`` pattern that lets ingest create group ``name``, or None."""
    return next((p for p in settings.AUTO_CREATE_GROUPS if fnmatch.fnmatchcase(name, p)), None)
