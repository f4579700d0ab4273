"""Start-up checks of the client address the login throttle keys on (``fleet.W001``, ``fleet.W002``).

The throttle (:mod:`outlier_admin.fleet.login_throttle`) counts failures per username *and* client
address; the address is only the client's when ``TRUSTED_PROXIES`` names every proxy in front of the
app. When it does not, every user appears as one proxy: a lockout then applies to everyone with that
username, and the logs and audit show one address for the whole company. Two symptoms are visible
without a request:

- ``fleet.W001`` (database): the logins axes recorded over the last :data:`LOOKBACK` (successes and
  failures) come from **one** address although at least :data:`MIN_USERS` usernames logged in: the app
  only ever sees one address. Run by ``manage.py migrate`` (the compose web's start, the Helm chart's
  migrate job) and ``manage.py check --database default``.
- ``fleet.W002``: running in Kubernetes (``KUBERNETES_SERVICE_HOST``) with ``TRUSTED_PROXIES`` holding
  loopback only: the pod's nginx is trusted, the ingress controller in front of it is not, so each
  request's address is the ingress pod's (the chart's ``web.trustedProxies`` names its range).

Warnings, not errors: a one-user installation, or a first week with one admin, is legitimate.
"""

from __future__ import annotations

import ipaddress
import os
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.core import checks

LOOKBACK = timedelta(days=7)
MIN_USERS = 2


def _recent_logins() -> tuple[set[str], set[str]]:
    """(usernames, addresses) of the logins and failed logins axes recorded within :data:`LOOKBACK`."""
    from axes.models import AccessAttempt, AccessLog
    from django.utils import timezone

    since = timezone.now() - LOOKBACK
    users: set[str] = set()
    addresses: set[str] = set()
    for model in (AccessLog, AccessAttempt):
        for username, ip in model.objects.filter(attempt_time__gte=since).values_list("username", "ip_address") \
                .distinct()[:10_000]:
            if username:
                users.add(username)
            if ip:
                addresses.add(ip)
    return users, addresses


def check_client_addresses(app_configs: Any = None, databases: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """``fleet.W001`` (see the module docstring); needs the database, skipped before migrations."""
    if not databases:
        return []
    from django.db import DatabaseError

    try:
        users, addresses = _recent_logins()
    except DatabaseError:  # no axes tables yet (before the first migrate)
        return []
    if len(addresses) == 1 and len(users) >= MIN_USERS:
        (only,) = addresses
        return [checks.Warning(
            f"the {len(users)} users who logged in over the last {LOOKBACK.days} days all came from one address, "
            f"{only}: the app sees its proxy's address, not the clients'",
            hint="set TRUSTED_PROXIES to the proxies in front of the app (compose: WEB_EDGE_SUBNET plus your TLS "
                 "proxy; Helm: web.trustedProxies = the ingress controller's pod range), so that login lockouts, "
                 "logs and the audit see each client",
            id="fleet.W001")]
    return []


def check_trusted_proxies_in_kubernetes(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """``fleet.W002`` (see the module docstring)."""
    if not os.environ.get("KUBERNETES_SERVICE_HOST"):
        return []
    nets = [ipaddress.ip_network(e, strict=False) for e in settings.TRUSTED_PROXIES]
    if all(net.is_loopback for net in nets):
        return [checks.Warning(
            "running in Kubernetes with TRUSTED_PROXIES = loopback only: every request through an ingress has "
            "the ingress controller's address",
            hint="set the chart's web.trustedProxies to the ingress controller's pod range (e.g. 10.42.0.0/16)",
            id="fleet.W002")]
    return []
