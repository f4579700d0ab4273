"""The problem document (RFC 9457, ``application/problem+json``) every error of the API answers with;
its shape is described in :mod:`outlier_admin.api.errors`, which maps exceptions to it.

Apart from ``errors`` because it needs nothing but Django's response: the views outside DRF (ingest,
the database outage's 503) build their bodies here without importing the API's exception handling
(and through it the actions and the preview).
"""

from __future__ import annotations

from http import HTTPStatus
from typing import Any

import orjson
from django.http import HttpResponse

#: The media type of every error body (RFC 9457 section 3).
PROBLEM_CONTENT_TYPE = "application/problem+json"

#: The ``code`` of a problem that has no more specific one (DRF's own default codes where it has one).
DEFAULT_CODES = {
    400: "invalid", 401: "not_authenticated", 403: "permission_denied", 404: "not_found",
    405: "method_not_allowed", 406: "not_acceptable", 413: "too_large", 415: "unsupported_media_type",
    429: "throttled", 500: "error", 503: "unavailable",
}


def problem(status_code: int, detail: str, *, code: str | None = None, attr: str | None = None,
            errors: list[dict[str, Any]] | None = None, instance: str | None = None,
            **extensions: Any) -> dict[str, Any]:
    """The problem document of an error: see the module docstring. ``errors`` defaults to the one
    error ``{code, detail, attr}`` (``code`` defaults by status, :data:`DEFAULT_CODES`);
    ``extensions`` are extra members (``retry_after_s``)."""
    body: dict[str, Any] = {
        "type": "about:blank",
        "title": HTTPStatus(status_code).phrase,
        "status": status_code,
        "detail": detail,
    }
    if instance:
        body["instance"] = instance
    body["errors"] = errors if errors is not None else [
        {"code": code or DEFAULT_CODES.get(status_code, "error"), "detail": detail, "attr": attr}]
    body.update(extensions)
    return _encodable(body)


def problem_response(status_code: int, detail: str, **kwargs: Any) -> HttpResponse:
    """A plain Django response carrying :func:`problem` (for views outside DRF)."""
    return HttpResponse(orjson.dumps(problem(status_code, detail, **kwargs)), status=status_code,
                        content_type=PROBLEM_CONTENT_TYPE)


def _encodable(value: Any) -> Any:
    """``value`` with every string made encodable as UTF-8. An error may quote its input, and a JSON body
    can carry a lone surrogate (``"\\ud800"``), which no UTF-8 response can: a threshold named so was
    answered with a 500 (``UnicodeEncodeError`` in the renderer) instead of its 400. Such characters
    are written as ``\\ud800``."""
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            return value.encode("utf-8", "backslashreplace").decode("utf-8")
        return value
    if isinstance(value, dict):
        return {_encodable(k): _encodable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_encodable(v) for v in value]
    return value
