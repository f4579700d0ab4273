"""The API's permission classes over the roles' capabilities (:mod:`outlier_admin.fleet.roles`).

A bearer token of scope ``api`` acts as its user with that user's roles; a token without a user
or of scope ``ingest`` may do nothing here (ingest tokens only push samples, elsewhere).
"""

from __future__ import annotations

from typing import Any

from rest_framework import permissions

from outlier_admin.fleet.models import ApiToken, TokenScope
from outlier_admin.fleet.roles import CAPABILITIES, ROLES, capabilities_of, roles_of, user_can  # noqa: F401


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

