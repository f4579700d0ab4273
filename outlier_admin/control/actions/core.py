"""What every action shares: the refusal, the actor, the reason, the expiry and the audit event.

Part of :mod:`outlier_admin.control.actions` (its docstring states the rules every action keeps)."""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from typing import Any

from django.contrib.auth.models import AbstractBaseUser
from django.db import transaction
from django.utils import timezone

from contract.names import NameError_
from outlier_admin.control.models import AuditEvent
from outlier_admin.fleet.models import ApiToken, ModelGroup, Node


class ActionError(ValueError):
    """The action was refused; ``str()`` says why in words an operator understands."""


Actor = AbstractBaseUser | str | ApiToken


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


def _checked(rule: Callable[[Any], Any], value: Any) -> Any:
    try:
        return rule(value)
    except NameError_ as exc:
        raise ActionError(exc.detail) from None


def _save_changes(locked: Any, clean: dict[str, Any]) -> dict[str, list[Any]]:
    """Set ``clean`` on the locked row and save those fields; the diff ``{field: [old, new]}``."""
    diff = {k: [getattr(locked, k), v] for k, v in clean.items() if getattr(locked, k) != v}
    for key, value in clean.items():
        setattr(locked, key, value)
    locked.save(update_fields=list(clean))
    return diff
