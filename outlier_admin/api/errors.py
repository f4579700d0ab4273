"""JSON errors a person can act on: ``{"error": "<sentence>", "detail": <DRF detail>, "field": ...}``.

Every error body carries ``error`` (one readable sentence). Validation errors keep DRF's per-field
``detail`` as well; refused actions (:class:`ActionError`) and invalid thresholds
(:class:`ThresholdError`, with ``field``) and previews over a bound (:class:`PreviewTooLarge`, with
``field``) become 400s instead of 500s; a body over Django's upload limits is a 413 (too large) or a
400 (too many fields or files) in this shape, not Django's bare HTML page. A database outage is
answered 503 in this same shape by :mod:`outlier_admin.observability.outage` (for every view, not only
DRF's), through :func:`error_body`.
"""

from __future__ import annotations

from typing import Any

from django.core.exceptions import RequestDataTooBig, TooManyFieldsSent, TooManyFilesSent
from rest_framework import status
from rest_framework.response import Response
from rest_framework.views import exception_handler as drf_exception_handler

from detector.thresholds import ThresholdError
from outlier_admin.api.preview import PreviewTooLarge
from outlier_admin.control.actions import ActionError


def error_body(sentence: str, detail: Any = None, **extra: Any) -> dict[str, Any]:
    """The API's error body: ``error`` (one readable sentence), ``detail`` (the sentence unless given),
    and any ``extra`` keys (``field``, ``retry_after_s``)."""
    return {"error": sentence, "detail": sentence if detail is None else detail, **extra}


def _sentence(detail: Any) -> str:
    """Flatten DRF's detail (str | list | dict) into one line: ``field: message; field2: message``."""
    if isinstance(detail, dict):
        parts = []
        for key, value in detail.items():
            text = _sentence(value)
            parts.append(text if key in ("detail", "non_field_errors") else f"{key}: {text}")
        return "; ".join(parts)
    if isinstance(detail, list | tuple):
        return "; ".join(_sentence(v) for v in detail)
    return str(detail)


def _encodable(value: Any) -> Any:
    """``value`` with every string made encodable as UTF-8. An error may quote its input, and a JSON body
    can carry a lone surrogate (``"\\ud800"``), which no UTF-8 response can: a threshold named so was
    answered with a 500 (``UnicodeEncodeError`` in the renderer) instead of its 400. Such characters
    are written as ``\\ud800`` in the sentence."""
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            return value.encode("utf-8", "backslashreplace").decode("utf-8")
        return value
    if isinstance(value, dict):
        pairs = [(_encodable(k), _encodable(v)) for k, v in value.items()]
        changed = any(a is not k or b is not v for (a, b), (k, v) in zip(pairs, value.items(), strict=True))
        return dict(pairs) if changed else value  # unchanged: keep DRF's ReturnDict as it is
    if isinstance(value, list | tuple):
        items = [_encodable(v) for v in value]
        return items if any(a is not b for a, b in zip(items, value, strict=True)) else value
    return value


def exception_handler(exc: Exception, context: dict[str, Any]) -> Response | None:
    """DRF exception handler: see the module docstring for the body shape."""
    response = _error_response(exc, context)
    if response is not None:
        response.data = _encodable(response.data)
    return response


def _error_response(exc: Exception, context: dict[str, Any]) -> Response | None:
    if isinstance(exc, ThresholdError):
        return Response(
            {"error": str(exc), "field": exc.field, "detail": {exc.field: [exc.message]}},
            status=status.HTTP_400_BAD_REQUEST,
        )
    if isinstance(exc, PreviewTooLarge):
        return Response(error_body(str(exc), {exc.field: [str(exc)]}, field=exc.field),
                        status=status.HTTP_400_BAD_REQUEST)
    if isinstance(exc, ActionError):
        return Response(error_body(str(exc)), status=status.HTTP_400_BAD_REQUEST)
    # Django's request-size guards (DATA_UPLOAD_MAX_MEMORY_SIZE, DATA_UPLOAD_MAX_NUMBER_FIELDS/FILES)
    # fire when DRF reads the body; left to Django they were a bare HTML "Bad Request (400)".
    if isinstance(exc, RequestDataTooBig):
        return Response(error_body(f"The request body is too large: {exc}"),
                        status=status.HTTP_413_REQUEST_ENTITY_TOO_LARGE)
    if isinstance(exc, TooManyFieldsSent | TooManyFilesSent):
        return Response(error_body(f"The request has too many form fields or files: {exc}"),
                        status=status.HTTP_400_BAD_REQUEST)
    response = drf_exception_handler(exc, context)
    if response is None:
        return None
    detail = response.data
    response.data = {"error": _sentence(detail), "detail": detail}
    return response
