"""Login throttling on django-axes: failures are counted per **client address** and, separately, per
**username** (``AXES_LOCKOUT_PARAMETERS = ["username", "ip_address"]``), in PostgreSQL (axes' database
handler), over a window of ``LOGIN_LOCKOUT_S`` seconds; the limit is ``LOGIN_MAX_FAILURES``.

Design — who is refused, without the password being checked:

- **An address with ``LOGIN_MAX_FAILURES`` failures** (any usernames): everything from it, the right
  password included. This is what stops a spray of 40 usernames from one address after 5 guesses.
- **A username with ``LOGIN_MAX_FAILURES`` failures** (from any addresses): only attempts from addresses
  that have at least one failure of their own in the window. An address with none still has its
  password checked, so the on-call's right password from a clean address logs in however hard
  someone else hammers their username — nobody can lock the on-call out from another address. The
  cost: while a username is over the limit, each fresh address gets one guess at it (one failure
  makes the address a failing one), so a distributed guesser needs a new address per guess.
- A success clears that address's failures for that username (the owner's own typos), nothing else:
  the on-call logging in must not reset an attacker's count (axes' ``AXES_RESET_ON_SUCCESS`` would).
- Attempts refused while locked out are not counted (``AXES_RESET_COOL_OFF_ON_FAILURE_DURING_LOCKOUT``
  off): a lock ends ``LOGIN_LOCKOUT_S`` after the failures that caused it, and a locked-out flood
  writes nothing to the database.

A failure counts until ``LOGIN_LOCKOUT_S`` passes without another failure of the same username,
address and user agent (axes keeps one row per triple and expires it from its last failure). Locked
out: 429 with ``Retry-After`` (the seconds until enough of the failures behind the lock have expired)
and the login page, on every password login path — the dashboard's and the Django admin's — because
the check sits in the authentication backend and :func:`lockout_response` answers for both.

The client address is ``REMOTE_ADDR``; ``X-Forwarded-For`` is read only when ``REMOTE_ADDR`` is in
``TRUSTED_PROXIES`` (:func:`client_ip`). Without that, every user behind the TLS proxy would share the
proxy's address — settings refuse to start in production with ``SECURE_PROXY_SSL_HEADER`` and no
``TRUSTED_PROXIES``. django-ipware (axes' optional resolver) is not used: it reads the header whoever
the peer is.

PostgreSQL down: a login needs the database anyway (users and sessions live there), so the throttle
adds no dependency: an attempt fails like any page (``outlier_admin.outage``'s 503) before anything is
counted, so retrying through the outage locks nobody out afterwards. Redis plays no part in logging in
(the previous, hand-written throttle counted in Redis and failed open without it).
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
from django.db.models import QuerySet, Sum
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
    """Axes' database handler with the rule of the module docstring: the username key binds only
    addresses that have failures of their own."""

    def _failure_sets(self, request: HttpRequest, credentials: dict[str, Any] | None) -> dict[str, QuerySet]:
        params = get_lockout_parameters(request, credentials)
        if sorted(map(str, params)) != ["ip_address", "username"]:
            raise ValueError(f"AXES_LOCKOUT_PARAMETERS must be ['username', 'ip_address'], got {params!r}")
        return dict(zip(params, self.get_user_attempts(request, credentials), strict=True))

    def _binding(self, request: HttpRequest, credentials: dict[str, Any] | None) -> list[QuerySet]:
        """The failure sets that apply to this request: the address's, plus the username's once the
        address has failed at least once."""
        sets = self._failure_sets(request, credentials)
        by_ip = sets["ip_address"]
        return [by_ip, sets["username"]] if by_ip.exists() else [by_ip]

    def get_failures(self, request: HttpRequest, credentials: dict[str, Any] | None = None) -> int:
        return max(qs.aggregate(n=Sum("failures_since_start"))["n"] or 0 for qs in self._binding(request, credentials))

    def retry_after(self, request: HttpRequest, credentials: dict[str, Any] | None = None) -> int:
        """Seconds until no binding failure set holds ``LOGIN_MAX_FAILURES`` failures. Rows expire one
        by one ``LOGIN_LOCKOUT_S`` after their last failure; a set is locked until its newest rows alone
        fall below the limit, i.e. until the row that brings the newest-first sum to the limit expires."""
        limit = get_failure_limit(request, credentials)
        window = get_cool_off(request) or lockout_window()
        now = timezone.now()
        wait = 0.0
        for qs in self._binding(request, credentials):
            total = 0
            for failures, at in qs.order_by("-attempt_time").values_list("failures_since_start", "attempt_time"):
                total += failures
                if total >= limit:
                    wait = max(wait, (at + window - now).total_seconds())
                    break
        return max(1, round(wait))

    def user_logged_in(self, sender: Any, request: HttpRequest, user: Any, **kwargs: Any) -> None:
        super().user_logged_in(sender, request, user, **kwargs)
        AccessAttempt.objects.filter(username=user.get_username()[:150], ip_address=request.axes_ip_address).delete()


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
