"""The API's filter backend: django-filter's, refusing a query parameter an endpoint does not have
(:class:`StrictFilterBackend`, the ``DEFAULT_FILTER_BACKENDS`` of ``settings.REST_FRAMEWORK``). The
filter sets themselves are the read model's (:mod:`outlier_admin.history.filters`), shared with the
dashboard."""

from __future__ import annotations

from typing import Any

from django.db.models import QuerySet
from django_filters.rest_framework import DjangoFilterBackend
from rest_framework.exceptions import ErrorDetail, ValidationError
from rest_framework.settings import api_settings


class StrictFilterBackend(DjangoFilterBackend):
    """django-filter's backend that refuses a list request naming a query parameter the endpoint does
    not know: ``?nmae=x`` (or a filter of another endpoint) was silently ignored and answered with the
    whole table, which a client cannot tell from a match. Known: the endpoint's filters, the ordering
    parameter, the page's ``limit``/``offset`` and DRF's ``format``. Only lists: a detail action's own
    parameters (the timeline's ``start``, ``signal``...) are its own business."""

    def filter_queryset(self, request: Any, queryset: QuerySet, view: Any) -> QuerySet:
        if getattr(view, "action", None) == "list":
            known = {api_settings.ORDERING_PARAM, api_settings.URL_FORMAT_OVERRIDE}
            paginator = getattr(view, "paginator", None)
            known |= {getattr(paginator, "limit_query_param", None), getattr(paginator, "offset_query_param", None)}
            filterset_class = self.get_filterset_class(view, queryset)
            if filterset_class is not None:
                known |= set(filterset_class.base_filters)
            unknown = sorted(set(request.query_params) - known)
            if unknown:
                allowed = ", ".join(sorted(k for k in known if k))
                raise ValidationError({name: [ErrorDetail(f"unknown query parameter; this endpoint takes: {allowed}",
                                                          code="unknown_filter")] for name in unknown})
        return super().filter_queryset(request, queryset, view)
