"""Roles -> capabilities, enforced on every API endpoint and dashboard view.

Roles are the Django groups created by ``fleet/migrations/0002_roles.py``. What each may do follows
issue 5 (the capability map below is the single place that says so)::

    read            viewer, operator, oncall
    tune            operator            thresholds of a group, group policy; creating and editing
                                        groups and nodes
    decide          operator            approve / reject quarantine proposals
    override        oncall              manual quarantine / release / pin / unpin

Roles add up: a user in ``operator`` and ``oncall`` has both sets. Superusers may do everything.
A bearer token of scope ``api`` acts as its user with that user's roles; a token without a user
or of scope ``ingest`` may do nothing here (ingest tokens only push samples, elsewhere).
"""

from __future__ import annotations

from typing import Any

from rest_framework import permissions

from outlier_admin.fleet.models import ApiToken, TokenScope

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


class _Capability(permissions.BasePermission):
    capability = "read"

    def has_permission(self, request: Any, view: Any) -> bool:
        token = request.auth
        if isinstance(token, ApiToken) and token.scope != TokenScope.API:
            self.message = "This token has scope 'ingest': it can only push samples to /api/v1/ingest/requests."
            return False
        if not (request.user and request.user.is_authenticated):
            return False
        if user_can(request.user, self.capability):
            return True
        roles = sorted(CAPABILITIES[self.capability])
        self.message = (
            f"Your account may not {self.capability!s} here: it needs the role {' or '.join(roles)}. "
            "Ask an administrator to add you to that group."
        )
        return False


class CanRead(_Capability):
    """Any role (viewer, operator, oncall) may read."""

    capability = "read"


class MutatingCapability(_Capability):
    """Reads need ``read``; unsafe methods need ``view.write_capability``."""

    def has_permission(self, request: Any, view: Any) -> bool:
        self.capability = "read" if request.method in permissions.SAFE_METHODS else view.write_capability
        return super().has_permission(request, view)


def capability_permission(capability: str) -> type[_Capability]:
    """A DRF permission class requiring ``capability`` for every method (used on POST actions)."""
    if capability not in CAPABILITIES:
        raise KeyError(f"unknown capability {capability!r}")
    return type(f"Can{capability.title()}", (_Capability,), {"capability": capability})


def may_preview(user: Any) -> bool:
    """True if ``user`` may run a threshold preview (see :data:`PREVIEW_CAPABILITIES`)."""
    return any(user_can(user, cap) for cap in PREVIEW_CAPABILITIES)


def preview_roles() -> list[str]:
    """The role names that may preview, sorted (for the 403 messages)."""
    return sorted(set().union(*(CAPABILITIES[cap] for cap in PREVIEW_CAPABILITIES)))
