"""JSON errors a person can act on: ``{"error": "<sentence>", "detail": <DRF detail>, "field": ...}``.

Every error body carries ``error`` (one readable sentence). Validation errors keep DRF's per-field
``detail`` as well; refused actions (:class:`ActionError`) and invalid thresholds
(:class:`ThresholdError`, with ``field``) and previews over a bound (:class:`PreviewTooLarge`, with
``field``) become 400s instead of 500s. A database outage is answered 503 in this same shape by
:mod:`outlier_admin.observability.outage` (for every view, not only DRF's), through :func:`error_body`.
"""

from __future__ import annotations

from typing import Any

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


def exception_handler(exc: Exception, context: dict[str, Any]) -> Response | None:
    """DRF exception handler: see the module docstring for the body shape."""
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
    response = drf_exception_handler(exc, context)
    if response is None:
        return None
    detail = response.data
    response.data = {"error": _sentence(detail), "detail": detail}
    return response
