"""Login throttling on django-axes: failures are counted per **username and client address together**
(``AXES_LOCKOUT_PARAMETERS = [["username", "ip_address"]]``), in PostgreSQL (axes' database handler),
over a window of ``LOGIN_LOCKOUT_S`` seconds; the limit is ``LOGIN_MAX_FAILURES``.

Design — who is refused, without the password being checked: **a username from an address where it
failed ``LOGIN_MAX_FAILURES`` times**, and nothing else.

- Nobody can lock the on-call out from another address, nor from the on-call's own address with
  other usernames: an office NAT, a VPN egress or an ingress that every user shares is one address,
  and four wrong passwords for invented usernames there locked every user of it out for 15 minutes
  (issue 36, finding 2). With the pair as the key, each username has its own budget at each address.
- The price: a spray of many usernames from one address gets ``LOGIN_MAX_FAILURES`` guesses per
  username. Against that: passwords Django's validators accepted, and a name that is not a user
  costs the guesser the same as one that is (so a spray learns nothing about who exists).
- The residual lockout — someone at the on-call's own address failing with the on-call's username —
  is what an admin clears: ``manage.py unlock_login`` or the dashboard's *Login lockouts* page,
  both through :func:`outlier_admin.control.actions.do_unlock_login` (audited).
- A success clears that pair's failures (axes' ``AXES_RESET_ON_SUCCESS``, which with the pair as the
  key resets only the pair: the owner's own typos).
- Attempts refused while locked out are not counted (``AXES_RESET_COOL_OFF_ON_FAILURE_DURING_LOCKOUT``
  off): a lock ends ``LOGIN_LOCKOUT_S`` after the failures that caused it, and a locked-out flood
  writes nothing to the database.

A failure counts until ``LOGIN_LOCKOUT_S`` passes without another failure of the same username,
address and user agent (axes keeps one row per triple and expires it from its last failure). Locked
out: 429 with ``Retry-After`` (the seconds until enough of the failures behind the lock have expired)
and the login page, on every password login path — the dashboard's and the Django admin's — because
the check sits in the authentication backend and :func:`lockout_response` answers for both.

The client address is ``REMOTE_ADDR``; ``X-Forwarded-For`` is read only when ``REMOTE_ADDR`` is in
``TRUSTED_PROXIES`` (:func:`client_ip`): the proxy chain the deployment declares (compose: nginx's
subnet; the Helm chart: the sidecar and the ingress controller's range, value
``web.trustedProxies``). Without that, every user behind the proxy would share the proxy's address:
settings refuse to start in production with ``SECURE_PROXY_SSL_HEADER`` and no ``TRUSTED_PROXIES``,
and the system check :func:`check_client_addresses` warns when the logins recorded come from one
address only. django-ipware (axes' optional resolver) is not used: it reads the header whoever the
peer is.

PostgreSQL down: a login needs the database anyway (users and sessions live there), so the throttle
adds no dependency: an attempt fails like any page (``outlier_admin.outage``'s 503) before anything is
counted, so retrying through the outage locks nobody out afterwards. Redis plays no part in logging in.
"""

from __future__ import annotations

import ipaddress
from datetime import timedelta
from functools import lru_cache
from typing import Any

from axes.backends import AxesStandaloneBackend
from axes.handlers.database import AxesDatabaseHandler
from axes.helpers import get_client_username, get_cool_off, get_failure_limit, get_lockout_parameters
from axes.models import AccessAttempt
from django.conf import settings
from django.contrib.auth.forms import AuthenticationForm
from django.db.models import Max, QuerySet, Sum
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.utils import timezone

IpAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IpNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network


# --- Client address ---------------------------------------------------------------------------------------
@lru_cache(maxsize=8)
def _networks(entries: tuple[str, ...]) -> tuple[IpNetwork, ...]:
    return tuple(ipaddress.ip_network(e, strict=False) for e in entries)


def _parse_hop(text: str) -> IpAddress | None:
    text = text.strip()
    if text.startswith("[") and "]" in text:  # "[2001:db8::1]:443"
        text = text[1:text.index("]")]
    elif text.count(":") == 1:  # "192.0.2.1:5123": some proxies append the client's port
        text = text.split(":", 1)[0]
    try:
        addr = ipaddress.ip_address(text)
    except ValueError:
        return None
    # An IPv4 client seen through a dual-stack socket arrives as ::ffff:a.b.c.d.
    mapped = getattr(addr, "ipv4_mapped", None)
    return mapped or addr


def _trusted(addr: IpAddress) -> bool:
    return any(addr in net for net in _networks(tuple(settings.TRUSTED_PROXIES)) if addr.version == net.version)


def client_ip(request: HttpRequest) -> str | None:
    """The client's address: ``REMOTE_ADDR``, unless it is a trusted proxy; then ``X-Forwarded-For`` is
    walked from the right (the entry our proxy appended) past further trusted proxies, and the first
    untrusted address is the client. Entries left of it were written by the client and are ignored;
    an unparsable entry stops the walk at the last address a trusted proxy vouched for."""
    addr = _parse_hop(request.META.get("REMOTE_ADDR") or "")
    if addr is None:
        return None
    if _trusted(addr):
        hops = [h for h in request.META.get("HTTP_X_FORWARDED_FOR", "").split(",") if h.strip()]
        for hop in reversed(hops):
            parsed = _parse_hop(hop)
            if parsed is None:
                break
            addr = parsed
            if not _trusted(addr):
                break
    return str(addr)


# --- Axes hooks (named in settings) -----------------------------------------------------------------------
def failure_limit(request: HttpRequest | None, credentials: dict[str, Any] | None) -> int:
    """``AXES_FAILURE_LIMIT``: read at each request, so ``LOGIN_MAX_FAILURES`` stays the knob."""
    return settings.LOGIN_MAX_FAILURES


def lockout_window(request: HttpRequest | None = None) -> timedelta:
    """``AXES_COOLOFF_TIME``: ``LOGIN_LOCKOUT_S``."""
    return timedelta(seconds=settings.LOGIN_LOCKOUT_S)


def username_of(request: HttpRequest, credentials: dict[str, Any] | None) -> str | None:
    """``AXES_USERNAME_CALLABLE``: the posted username cut to Django's 150 characters (axes' column holds
    255; a longer one would be a database error, i.e. a 500, instead of a counted failure)."""
    if credentials:
        name = credentials.get(settings.AXES_USERNAME_FORM_FIELD)
    else:
        name = getattr(request, "data", request.POST).get(settings.AXES_USERNAME_FORM_FIELD)
    return None if name is None else str(name)[:150]


class LoginThrottleBackend(AxesStandaloneBackend):
    """Axes' check (first in ``AUTHENTICATION_BACKENDS``; ``ModelBackend`` follows and checks the
    password). A call without a request is not a web login (``Client.login`` in tests, scripts): it is
    neither throttled nor counted, as axes would refuse it outright."""

    def authenticate(self, request: HttpRequest | None, username: str | None = None, password: str | None = None,
                     **kwargs: Any) -> None:
        if request is None:
            return None
        return super().authenticate(request, username=username, password=password, **kwargs)


class LoginThrottleHandler(AxesDatabaseHandler):
    """Axes' database handler, checked to count per (username, address) pair, with the wait until a
    pair's lock ends."""

    def _pair_attempts(self, request: HttpRequest, credentials: dict[str, Any] | None) -> QuerySet:
        params = get_lockout_parameters(request, credentials)
        if len(params) != 1 or sorted(map(str, params[0])) != ["ip_address", "username"] or isinstance(params[0], str):
            raise ValueError(f"AXES_LOCKOUT_PARAMETERS must be [['username', 'ip_address']], got {params!r}")
        return self.get_user_attempts(request, credentials)[0]

    def retry_after(self, request: HttpRequest, credentials: dict[str, Any] | None = None) -> int:
        """Seconds until the pair holds fewer than ``LOGIN_MAX_FAILURES`` failures. Rows expire one by
        one ``LOGIN_LOCKOUT_S`` after their last failure; the pair is locked until its newest rows alone
        fall below the limit, i.e. until the row that brings the newest-first sum to the limit expires."""
        limit = get_failure_limit(request, credentials)
        window = get_cool_off(request) or lockout_window()
        total = 0
        rows = self._pair_attempts(request, credentials).order_by("-attempt_time")
        for failures, at in rows.values_list("failures_since_start", "attempt_time"):
            total += failures
            if total >= limit:
                return max(1, round((at + window - timezone.now()).total_seconds()))
        return 1


def locked_out(now: Any = None) -> list[dict[str, Any]]:
    """The (username, address) pairs locked out now: ``{"username", "ip_address", "failures",
    "last_at", "until"}``, newest first (the dashboard's *Login lockouts* page, ``unlock_login
    --list``)."""
    now = now or timezone.now()
    window = lockout_window()
    pairs = (AccessAttempt.objects.filter(attempt_time__gte=now - window)
             .values("username", "ip_address")
             .annotate(failures=Sum("failures_since_start"), last_at=Max("attempt_time"))
             .filter(failures__gte=settings.LOGIN_MAX_FAILURES).order_by("-last_at"))
    return [{**p, "until": p["last_at"] + window} for p in pairs]


def lockout_response(request: HttpRequest, original_response: HttpResponse | None = None,
                     credentials: dict[str, Any] | None = None) -> HttpResponse:
    """``AXES_LOCKOUT_CALLABLE``: 429, ``Retry-After`` and the dashboard's login page with the wait, for
    every login path (the admin's included; its user can log in there once the wait is over)."""
    from axes.handlers.proxy import AxesProxyHandler

    wait = AxesProxyHandler.get_implementation().retry_after(request, credentials)
    context = {
        "form": AuthenticationForm(request, initial={"username": get_client_username(request, credentials) or ""}),
        "next": request.POST.get("next") or request.GET.get("next", ""),
        "throttled_s": wait,
    }
    response = render(request, "registration/login.html", context, status=429)
    response["Retry-After"] = str(wait)
    return response
