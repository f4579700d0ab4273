"""Every error of the API as an RFC 9457 problem (``application/problem+json``), one shape everywhere:

.. code-block:: json

    {"type": "about:blank", "title": "Bad Request", "status": 400,
     "detail": "reason: This field is required.", "instance": "/api/v1/nodes/7/quarantine/",
     "errors": [{"code": "required", "detail": "This field is required.", "attr": "reason"}]}

``type`` is ``about:blank`` (RFC 9457 section 4.2.1: the problem is what the HTTP status says, and
``title`` is that status's phrase); ``detail`` is one readable sentence; ``errors`` lists each fault
with a stable ``code`` a client can branch on and the input at fault in ``attr`` (``null`` when it is
the request as a whole; nested fields are dotted, ``changes.quarantine_z``). A 503 adds
``retry_after_s`` (and sends ``Retry-After``).

drf-standardized-errors does the work for DRF views (it turns every exception into one flat list of
errors, rolls the transaction back, answers an unexpected exception with a 500 in the same shape and
still reports it to Django's ``got_request_exception`` and log); this module only names our own
exceptions for it (:class:`ProblemHandler`) and writes its list as a problem (:class:`ProblemFormatter`).
The views outside DRF build the same body with :func:`~outlier_admin.problem.problem`
(:mod:`outlier_admin.problem`, which needs neither DRF nor anything of ours): the ingest endpoint
(:mod:`outlier_admin.ingest.views`), the database outage's 503 (:mod:`outlier_admin.outage`)
and the API's 404 for unknown paths (:func:`outlier_admin.api.views.api_not_found`).

What becomes what: a refused action (:class:`~outlier_admin.control.actions.ActionError`) is a 400
``refused``; an invalid threshold (:class:`~detector.thresholds.ThresholdError`) a 400 ``invalid``
on its field; a preview over a bound (:class:`~outlier_admin.history.preview.PreviewTooLarge`) a 400
``too_large`` on the input at fault; a body over Django's upload limits a 413 ``too_large``. A
database outage is left to :class:`~outlier_admin.outage.DatabaseOutageMiddleware`
(503, this shape), not made a 500 here.
"""

from __future__ import annotations

from dataclasses import asdict
from http import HTTPStatus
from typing import Any

from django.core.exceptions import RequestDataTooBig, TooManyFieldsSent, TooManyFilesSent
from drf_standardized_errors.formatter import ExceptionFormatter
from drf_standardized_errors.handler import ExceptionHandler
from drf_standardized_errors.types import ErrorResponse
from rest_framework import exceptions, status
from rest_framework.exceptions import ErrorDetail
from rest_framework.renderers import JSONRenderer
from rest_framework.response import Response

from outlier_admin.problem import (  # noqa: F401  (re-exported: the views name them here)
    DEFAULT_CODES,
    PROBLEM_CONTENT_TYPE,
    problem,
    problem_response,
)


def _sentence(errors: list[dict[str, Any]]) -> str:
    """One line out of the list: ``attr: detail; attr2: detail`` (errors of the whole request bare)."""
    parts = []
    for e in errors:
        attr = e.get("attr")
        parts.append(f"{attr}: {e['detail']}" if attr and attr not in ("non_field_errors", "detail") else e["detail"])
    return "; ".join(dict.fromkeys(parts))


class RequestTooLarge(exceptions.APIException):
    """Django's ``RequestDataTooBig`` as an API error (413)."""

    status_code = status.HTTP_413_REQUEST_ENTITY_TOO_LARGE
    default_code = "too_large"


class ProblemHandler(ExceptionHandler):
    """drf-standardized-errors' handler (``DRF_STANDARDIZED_ERRORS["EXCEPTION_HANDLER_CLASS"]``) that
    knows our exceptions and leaves a database outage to the outage middleware."""

    def convert_known_exceptions(self, exc: Exception) -> Exception:
        from detector.thresholds import ThresholdError
        from outlier_admin.control.actions import ActionError
        from outlier_admin.history.preview import PreviewTooLarge

        if isinstance(exc, ThresholdError):
            return exceptions.ValidationError({exc.field: [ErrorDetail(exc.message, code="invalid")]})
        if isinstance(exc, PreviewTooLarge):
            return exceptions.ValidationError({exc.field: [ErrorDetail(str(exc), code="too_large")]})
        if isinstance(exc, ActionError):
            return exceptions.ValidationError([ErrorDetail(str(exc), code="refused")])
        # Django's request-size guards (DATA_UPLOAD_MAX_MEMORY_SIZE, DATA_UPLOAD_MAX_NUMBER_FIELDS/FILES)
        # fire when DRF reads the body; left to Django they were a bare HTML "Bad Request (400)".
        if isinstance(exc, RequestDataTooBig):
            return RequestTooLarge(f"The request body is too large: {exc}")
        if isinstance(exc, TooManyFieldsSent | TooManyFilesSent):
            return exceptions.ParseError(f"The request has too many fields or files: {exc}")
        return super().convert_known_exceptions(exc)

    def should_not_handle(self, exc: Exception) -> bool:
        from outlier_admin.outage import is_database_outage

        # Re-raised: DatabaseOutageMiddleware answers it 503 + Retry-After (a 500 would say "our bug").
        return is_database_outage(exc) or super().should_not_handle(exc)

    def get_response(self, exc: exceptions.APIException, data: dict) -> Response:
        response = super().get_response(exc, data)
        request = self.context.get("request")
        renderer = getattr(request, "accepted_renderer", None)
        # JSON clients get the problem's own media type; the browsable API keeps its HTML page.
        if renderer is None or isinstance(renderer, JSONRenderer):
            response.content_type = PROBLEM_CONTENT_TYPE
        return response


class ProblemFormatter(ExceptionFormatter):
    """drf-standardized-errors' flat error list written as an RFC 9457 problem
    (``DRF_STANDARDIZED_ERRORS["EXCEPTION_FORMATTER_CLASS"]``)."""

    def format_error_response(self, error_response: ErrorResponse) -> Any:
        errors = [asdict(e) for e in error_response.errors]
        status_code = self.exc.status_code
        request = self.context.get("request")
        extensions: dict[str, Any] = {}
        if getattr(self.exc, "wait", None):
            extensions["retry_after_s"] = int(self.exc.wait)
        return problem(status_code, _sentence(errors) or HTTPStatus(status_code).phrase, errors=errors,
                       instance=getattr(request, "path", None), **extensions)
