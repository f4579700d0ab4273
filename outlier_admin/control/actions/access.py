"""API tokens and users (roles).

Part of :mod:`outlier_admin.control.actions` (its docstring states the rules every action keeps)."""

from __future__ import annotations

from typing import Any

from django.db import transaction
from django.utils import timezone

from contract.names import validate_group_name
from outlier_admin.control.actions.core import ActionError, Actor, _checked, _reason, audit
from outlier_admin.control.actions.groups import auto_create_pattern
from outlier_admin.fleet.models import ApiToken, ModelGroup


def do_create_token(*, name: str, scope: str, actor: Actor, user: Any = None,
                    groups: list[str] | None = None) -> tuple[ApiToken, str]:
    """Issue a bearer token; returns ``(row, plaintext)`` (the plaintext is shown once).

    ``groups`` (ingest tokens only): the groups the token may push records for; ingest refuses its
    records for any other group (reason ``group_out_of_scope``). None or empty: every group, as
    before scopes existed. Each name must be a group that exists or one that ingest may create
    (``AUTO_CREATE_GROUPS``): a typo would otherwise scope a gateway's token to nothing."""
    if not name or not name.strip():
        raise ActionError("a token needs a name")
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


def do_create_user(username: str, *, roles: list[str], actor: Actor, password: str | None = None,
                   reason: str = "created") -> Any:
    """Create a dashboard/API user holding ``roles`` (of :data:`outlier_admin.fleet.roles.ROLES`);
    ``password`` None: the user cannot log in with a password (an API token's user)."""
    from django.contrib.auth import get_user_model
    from django.contrib.auth.models import Group

    from outlier_admin.fleet.roles import ROLES

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
    """Make ``user``'s roles exactly ``roles`` (of :data:`outlier_admin.fleet.roles.ROLES`; other
    Django groups it belongs to stay). One audit event ``user.roles`` with the old and new roles when
    they change; nothing is written when they do not. The Django admin's user form comes here too
    (:mod:`outlier_admin.control.admin`)."""
    from django.contrib.auth.models import Group

    from outlier_admin.fleet.roles import ROLES

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


def do_unlock_login(username: str, *, actor: Actor, reason: str, ip_address: str | None = None) -> int:
    """Clear the login failures of ``username`` (at ``ip_address`` only, when given): a lockout
    (:mod:`outlier_admin.fleet.login_throttle`) ends now. Returns how many failures were cleared; 0 is
    not an error (the lock may have expired meanwhile), and is audited all the same."""
    from axes.models import AccessAttempt
    from django.db.models import Sum

    reason = _reason(reason)
    username = (username or "").strip()
    if not username or len(username) > 150:
        raise ActionError("a username is 1-150 characters")
    if ip_address:
        import ipaddress

        try:
            ip_address = str(ipaddress.ip_address(ip_address.strip()))
        except ValueError:
            raise ActionError(f"{ip_address[:60]!r} is not an IP address") from None
    with transaction.atomic():
        rows = AccessAttempt.objects.select_for_update().filter(username=username)
        if ip_address:
            rows = rows.filter(ip_address=ip_address)
        cleared = rows.aggregate(n=Sum("failures_since_start"))["n"] or 0
        addresses = sorted(set(rows.values_list("ip_address", flat=True)))
        rows.delete()
        audit("login.unlock", actor, reason=reason,
              detail={"username": username, "ip_address": ip_address, "addresses": addresses, "failures": cleared})
    return cleared
