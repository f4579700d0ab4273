"""DRF authentication: ``Authorization: Bearer <token>`` against hashed :class:`ApiToken` rows.

``request.auth`` is the :class:`ApiToken`; ``request.user`` is its user or an
``AnonymousUser``-like :class:`TokenUser` for tokens without a user (an ingest token of a gateway).
Scope checks are the caller's job: :func:`require_scope` / :class:`HasTokenScope`.
"""

from __future__ import annotations

from typing import Any

from django.contrib.auth.models import AnonymousUser
from django.utils import timezone
from rest_framework import authentication, exceptions, permissions

from outlier_admin.fleet.models import ApiToken


class TokenUser(AnonymousUser):
    """The principal of a token without a user: authenticated, no Django permissions."""

    def __init__(self, token: ApiToken) -> None:
        super().__init__()
        self.token = token
        self.username = f"token:{token.name}"

    @property
    def is_authenticated(self) -> bool:  # type: ignore[override]
        return True

    def __str__(self) -> str:
        return self.username


def lookup_token(plaintext: str) -> ApiToken | None:
    """The active token with this plaintext, or None (unknown, revoked, or its user deactivated).

    A token dies with its user: deactivating an account (``is_active=False``, what an administrator
    does when someone leaves) refuses its password at login, and must refuse its tokens too, for
    every scope (an ingest token issued to a user as well as an API token). The token is not revoked
    (reactivating the user brings it back); a token without a user is a gateway's and stands alone.
    """
    try:
        token = ApiToken.objects.select_related("user").get(token_hash=ApiToken.hash(plaintext))
    except ApiToken.DoesNotExist:
        return None
    if not token.is_active or (token.user is not None and not token.user.is_active):
        return None
    # Cheap "last used" with a one-minute resolution: avoid a write per request.
    now = timezone.now()
    if token.last_used_at is None or (now - token.last_used_at).total_seconds() > 60:
        ApiToken.objects.filter(pk=token.pk).update(last_used_at=now)
    return token


def token_from_header(header: str | None) -> str | None:
    """The token of an ``Authorization: Bearer <token>`` header, or None if absent / another scheme."""
    if not header:
        return None
    parts = header.split()
    if len(parts) != 2 or parts[0].lower() != "bearer":
        return None
    return parts[1]


class BearerTokenAuthentication(authentication.BaseAuthentication):
    keyword = "Bearer"

    def authenticate(self, request: Any) -> tuple[Any, ApiToken] | None:
        header = request.META.get("HTTP_AUTHORIZATION")
        if not header or not header.lower().startswith("bearer"):
            return None
        plaintext = token_from_header(header)
        if plaintext is None:
            raise exceptions.AuthenticationFailed("Malformed Authorization header: use 'Bearer <token>'.")
        token = lookup_token(plaintext)
        if token is None:
            raise exceptions.AuthenticationFailed("Unknown or revoked token.")
        return (token.user or TokenUser(token)), token

    def authenticate_header(self, request: Any) -> str:
        return self.keyword


class HasTokenScope(permissions.BasePermission):
    """Allow requests authenticated by a token of ``view.required_scope`` (sessions pass through)."""

    def has_permission(self, request: Any, view: Any) -> bool:
        token = request.auth
        if isinstance(token, ApiToken):
            return token.scope == getattr(view, "required_scope", "api")
        return bool(request.user and request.user.is_authenticated)
