"""Roles -> capabilities: who may do what, the one table the API and the dashboard enforce.

Roles are the Django groups created by ``fleet/migrations/0002_roles.py``. What each may do follows
issue 5 (the capability map below is the single place that says so)::

    read            viewer, operator, oncall
    tune            operator            thresholds of a group, group policy; creating and editing
                                        groups and nodes
    decide          operator            approve / reject quarantine proposals
    override        oncall              manual quarantine / release / pin / unpin

Roles add up: a user in ``operator`` and ``oncall`` has both sets. Superusers may do everything.
The API's permission classes are :mod:`outlier_admin.api.permissions`.
"""

from __future__ import annotations

from typing import Any

ROLES = ("viewer", "operator", "oncall")

CAPABILITIES: dict[str, frozenset[str]] = {
    "read": frozenset({"viewer", "operator", "oncall"}),
    "tune": frozenset({"operator"}),
    "decide": frozenset({"operator"}),
    "override": frozenset({"oncall"}),
}
#: Capabilities that allow a threshold preview (any one): ``tune`` (operator) and ``override``
#: (oncall); the preview itself is :mod:`outlier_admin.history.preview`.
PREVIEW_CAPABILITIES = ("tune", "override")


def roles_of(user: Any) -> frozenset[str]:
    """The role names of ``user`` (cached on the user object for the request)."""
    if user is None or not getattr(user, "is_authenticated", False) or not getattr(user, "pk", None):
        return frozenset()
    cached = getattr(user, "_oa_roles", None)
    if cached is None:
        cached = frozenset(user.groups.filter(name__in=ROLES).values_list("name", flat=True))
        user._oa_roles = cached
    return cached


def user_can(user: Any, capability: str) -> bool:
    """True if ``user`` holds a role that grants ``capability`` (see the module table)."""
    if capability not in CAPABILITIES:
        raise KeyError(f"unknown capability {capability!r}")
    if user is None or not getattr(user, "is_authenticated", False):
        return False
    if getattr(user, "pk", None) and not getattr(user, "is_active", False):
        return False  # a deactivated account holds no role, however it got here (session, token)
    if getattr(user, "is_superuser", False) and getattr(user, "is_active", False):
        return True
    return bool(roles_of(user) & CAPABILITIES[capability])


def capabilities_of(user: Any) -> dict[str, bool]:
    """``{capability: allowed}`` for templates (buttons are hidden when not allowed)."""
    return {cap: user_can(user, cap) for cap in CAPABILITIES}


def may_preview(user: Any) -> bool:
    """True if ``user`` may run a threshold preview (see :data:`PREVIEW_CAPABILITIES`)."""
    return any(user_can(user, cap) for cap in PREVIEW_CAPABILITIES)


def preview_roles() -> list[str]:
    """The role names that may preview, sorted (for the 403 messages)."""
    return sorted(set().union(*(CAPABILITIES[cap] for cap in PREVIEW_CAPABILITIES)))
