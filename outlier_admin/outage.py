"""PostgreSQL unreachable: the REST API and the dashboard answer 503 with ``Retry-After``, not 500.

The one owner of the rule "a database outage is a 503, retry later": :func:`is_database_outage`
says which exceptions are an outage, :class:`DatabaseOutageMiddleware` turns them into the answer
(the API's problem body, or a small HTML page for the dashboard and the admin), and ``/metrics``
(:class:`outlier_admin.observability.metrics.FleetCollector`) asks the same function to decide which
failures only cost it its SQL-backed series.

A 500 tells a client, a load balancer and the on-call engineer that the code is broken; during an
outage it is not, and the request can be sent again unchanged once PostgreSQL is back. Signing in
needs SQL as well (sessions, API tokens), so an unauthenticated request gets the same 503: nothing
is revealed by it, and a 401/403 would wrongly tell a scripted client that its credentials are bad.
The ingest endpoint keeps its own 503 (it must not accept records it cannot store; see its view).
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from django.http import HttpRequest, HttpResponse
from django.template.loader import render_to_string

from outlier_admin.problem import problem_response

log = logging.getLogger(__name__)

#: Seconds a client should wait before sending the request again (a PostgreSQL restart or failover
#: takes seconds; asking sooner only adds load to a server that is coming back).
RETRY_AFTER_S = 5
MESSAGE = "The database is unavailable: nothing was read or changed. Retry in a few seconds."


def _outage_errors() -> tuple[type[BaseException], ...]:
    # Django wraps driver errors in its own classes; psycopg's own are listed too for the few paths
    # that raise them unwrapped. The tick's fallback (control.outage_store) and ingest use this tuple too.
    from django.db import InterfaceError, OperationalError

    errors: list[type[BaseException]] = [OperationalError, InterfaceError]
    try:
        import psycopg
    except ImportError:  # another driver (the demo's SQLite): Django's classes are enough
        pass
    else:
        errors += [psycopg.OperationalError, psycopg.InterfaceError]
    return tuple(errors)


DB_OUTAGE_ERRORS: tuple[type[BaseException], ...] = _outage_errors()


def is_database_outage(exc: BaseException) -> bool:
    """True when ``exc`` (or what it was raised from) says PostgreSQL cannot be reached or used now:
    connection refused/reset/closed, server shutting down, a statement cancelled. Not integrity or
    programming errors: those are bugs or bad input and stay 4xx/500."""
    seen: set[int] = set()
    cur: BaseException | None = exc
    while cur is not None and id(cur) not in seen:
        if isinstance(cur, DB_OUTAGE_ERRORS):
            return True
        seen.add(id(cur))
        cur = cur.__cause__
    return False


def _wants_json(request: HttpRequest) -> bool:
    if request.path.startswith("/api/"):
        return True
    accept = request.headers.get("Accept", "")
    return "application/json" in accept and "text/html" not in accept


def unavailable_response(request: HttpRequest) -> HttpResponse:
    """The 503 answer: the API's problem (:mod:`outlier_admin.problem`) under ``/api/`` (or for
    JSON clients), else the standalone HTML page. Neither touches the database (the page is rendered without the request:
    context processors would read the session and the user from SQL)."""
    if _wants_json(request):
        resp = problem_response(503, MESSAGE, code="database_unavailable", instance=request.path,
                                retry_after_s=RETRY_AFTER_S)
    else:
        html = render_to_string("dashboard/unavailable.html", {"retry_after_s": RETRY_AFTER_S})
        resp = HttpResponse(html, status=503, content_type="text/html; charset=utf-8")
    resp["Retry-After"] = str(RETRY_AFTER_S)
    resp["Cache-Control"] = "no-store"
    return resp


class DatabaseOutageMiddleware:
    """Answers 503 + ``Retry-After`` for a view (or a response rendered after it) that raised a
    database outage error; other exceptions go on to Django's handling."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        return self.get_response(request)

    def process_exception(self, request: HttpRequest, exception: Exception) -> HttpResponse | None:
        if not is_database_outage(exception):
            return None
        # A warning, not an error with a traceback: the cause is outside the code, and during an
        # outage every request would log one.
        log.warning("503 for %s %s: database unavailable: %s: %s", request.method, request.path,
                    type(exception).__name__, str(exception).strip()[:300])
        return unavailable_response(request)
