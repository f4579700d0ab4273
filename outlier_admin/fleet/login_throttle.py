"""Login throttling: after ``LOGIN_MAX_FAILURES`` failed logins for one username from one client IP
within ``LOGIN_LOCKOUT_S`` seconds, further attempts for that pair are refused with 429 (and
``Retry-After``) until the window expires — without even checking the password, so guessing stops.

The counter lives in Redis (``outlier:login-fail:<sha256(username|ip)>``, ``INCR`` + ``EXPIRE`` on the
first failure: a fixed window that starts at the first failure), shared by every web worker. A
successful login clears it. Keying on username *and* IP keeps an attacker from locking a real
operator out from another address. If Redis is unreachable the check fails open (logged): during an
incident the on-call engineer must still be able to log in, and the password check still applies.

Two pieces: :class:`ThrottledModelBackend` (``AUTHENTICATION_BACKENDS``) counts and blocks on every
password login path — the dashboard's and the Django admin's — and :class:`ThrottledLoginView` answers
a locked-out pair with 429 + ``Retry-After`` on the dashboard login page.
"""

from __future__ import annotations

import hashlib
import logging
from typing import Any

import redis
from django.conf import settings
from django.contrib.auth import views as auth_views
from django.contrib.auth.backends import ModelBackend
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse

from outlier_admin.control.redis_conn import get_redis

log = logging.getLogger(__name__)


def failure_key(username: str, ip: str) -> str:
    digest = hashlib.sha256(f"{username.strip().lower()}|{ip}".encode()).hexdigest()[:32]
    return f"outlier:login-fail:{digest}"


def locked_for(username: str, ip: str) -> int:
    """Seconds until ``username`` may try again from ``ip`` (0: not locked)."""
    try:
        r = get_redis()
        key = failure_key(username, ip)
        count = r.get(key)
        if count is None or int(count) < settings.LOGIN_MAX_FAILURES:
            return 0
        ttl = r.ttl(key)
        return max(int(ttl), 1)
    except redis.RedisError as exc:
        log.warning("login throttle unavailable (failing open): %s", exc)
        return 0


def record_failure(username: str, ip: str) -> int:
    """Count one failed login; returns the failures in the current window (0 if Redis is down)."""
    try:
        pipe = get_redis().pipeline(transaction=True)
        key = failure_key(username, ip)
        pipe.incr(key)
        pipe.expire(key, settings.LOGIN_LOCKOUT_S, nx=True)
        count, _ = pipe.execute()
        return int(count)
    except redis.RedisError as exc:
        log.warning("login throttle unavailable (failure not counted): %s", exc)
        return 0


def clear_failures(username: str, ip: str) -> None:
    try:
        get_redis().delete(failure_key(username, ip))
    except redis.RedisError as exc:
        log.warning("login throttle unavailable (counter not cleared): %s", exc)


def client_ip(request: HttpRequest) -> str:
    """``REMOTE_ADDR`` only: ``X-Forwarded-For`` is client-controlled unless a trusted proxy
    rewrites it, and trusting it would let an attacker pick a fresh "IP" per attempt."""
    return request.META.get("REMOTE_ADDR") or "unknown"


class ThrottledModelBackend(ModelBackend):
    """``ModelBackend`` that refuses a locked-out username+IP before checking the password
    (``PermissionDenied`` stops Django's backend chain) and counts failed checks."""

    def authenticate(self, request: HttpRequest | None, username: str | None = None, password: str | None = None,
                     **kwargs: Any) -> Any:
        if request is None or username is None:
            return super().authenticate(request, username=username, password=password, **kwargs)
        name, ip = str(username)[:150], client_ip(request)
        if locked_for(name, ip):
            raise PermissionDenied("too many failed logins")
        user = super().authenticate(request, username=username, password=password, **kwargs)
        if user is None:
            record_failure(name, ip)
        else:
            clear_failures(name, ip)
        return user


class ThrottledLoginView(auth_views.LoginView):
    """Django's login view answering 429 + ``Retry-After`` (with the page) while the username+IP is
    locked out; counting happens in :class:`ThrottledModelBackend`."""

    def post(self, request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        username = str(request.POST.get("username", ""))[:150]
        wait = locked_for(username, client_ip(request))
        if wait:
            form = self.get_form()
            context = self.get_context_data(form=form, throttled_s=wait)
            response = self.render_to_response(context, status=429)
            response["Retry-After"] = str(wait)
            return response
        return super().post(request, *args, **kwargs)
