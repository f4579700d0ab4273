"""A request whose path, query or form carries a character PostgreSQL cannot store is a 400, before any
view reads it.

PostgreSQL's ``text`` holds no NUL (``\\x00``): psycopg refuses such a value when it is sent, so a
lookup of ``/api/v1/nodes/1%00/`` or ``?node=a%00`` (or a login form's username, which axes writes
down) was a 500 with a driver traceback. No name, id, filter or form field of ours may hold a NUL, so
the answer does not depend on the view: 400, in the API's problem format under ``/api/`` and for JSON
clients, plain text elsewhere. JSON bodies are the parsers' business (a ``"\\u0000"`` in a record is
refused by its validator; a rejected record's copy is escaped: ``ingest.pipeline._pg_text``).
"""

from __future__ import annotations

from collections.abc import Callable

from django.http import HttpRequest, HttpResponse, HttpResponseBadRequest

from outlier_admin.problem import problem_response

NUL = "\x00"
FORM_TYPES = ("application/x-www-form-urlencoded", "multipart/form-data")
DETAIL = "the request holds a NUL character (in its path, query or form), which no name, id or field may hold"


def has_unstorable(request: HttpRequest) -> bool:
    """True when the path, a query parameter (name or value) or a form field (outside ``/api/``) holds
    a NUL."""
    if NUL in request.path_info:
        return True
    if any(NUL in k or any(NUL in v for v in vs) for k, vs in request.GET.lists()):
        return True
    # Forms are the dashboard's and the admin's; the API reads JSON only (a form there is its 415, which
    # reading request.POST here would pre-empt: DRF would take the parsed form).
    if request.method == "POST" and request.content_type in FORM_TYPES and not request.path_info.startswith("/api/"):
        return any(NUL in k or any(NUL in v for v in vs) for k, vs in request.POST.lists())
    return False


class UnstorableInputMiddleware:
    """400 for :func:`has_unstorable` requests; first in the chain, so no view, session or throttle
    reads (or writes) the value."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        if has_unstorable(request):
            accept = request.headers.get("Accept", "")
            if request.path.startswith("/api/") or ("application/json" in accept and "text/html" not in accept):
                return problem_response(400, DETAIL, code="nul_character", instance=request.path.replace(NUL, ""))
            return HttpResponseBadRequest(DETAIL + "\n", content_type="text/plain; charset=utf-8")
        return self.get_response(request)
