"""``/api/v1/rejected-input/``: input ingest refused, with its reason and raw text (read role).

- ``GET /api/v1/rejected-input/`` : samples, newest first, each with its raw line; filters
  ``reason``, ``looks_like`` (the log format it looks like), ``source``, ``since``, ``until``;
- ``GET /api/v1/rejected-input/{id}/`` : one sample;
- ``GET /api/v1/rejected-input/summary/?since=`` : counts by reason, format and source since
  ``since`` (default: the last 24 h; at most 30 days back), with the newest sample's id of each.

The counting is :mod:`outlier_admin.ingest.rejected`'s (the dashboard page reads the same).
"""

from __future__ import annotations

from typing import Any

from django.core.exceptions import ValidationError as FormValidationError
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, extend_schema, inline_serializer
from rest_framework import serializers, viewsets
from rest_framework.decorators import action
from rest_framework.exceptions import ValidationError
from rest_framework.request import Request
from rest_framework.response import Response

from outlier_admin.api.views import ApiView
from outlier_admin.history.filters import RejectedInputFilter, UTCIsoDateTimeField
from outlier_admin.ingest.models import RejectedInput
from outlier_admin.ingest.rejected import counts_by_reason, window_start


class RejectedInputSerializer(serializers.ModelSerializer):
    class Meta:
        model = RejectedInput
        fields = ["id", "received_at", "source", "line", "reason", "looks_like", "detail", "raw", "count"]


class RejectedInputViewSet(ApiView, viewsets.ReadOnlyModelViewSet):
    """Input refused by ingest (records, log lines, scrapes), each with its reason and raw text."""

    queryset = RejectedInput.objects.all()
    serializer_class = RejectedInputSerializer
    filterset_class = RejectedInputFilter
    ordering_fields = ["received_at"]
    ordering = ["-received_at", "-id"]

    @extend_schema(
        parameters=[OpenApiParameter("since", OpenApiTypes.DATETIME, description="default: 24 h ago; at most 30 days")],
        responses=inline_serializer("RejectedInputSummary", {
            "since": serializers.DateTimeField(),
            "total": serializers.IntegerField(),
            "by_reason": inline_serializer("RejectedInputCount", {
                "reason": serializers.CharField(), "looks_like": serializers.CharField(),
                "format_label": serializers.CharField(), "source": serializers.CharField(),
                "count": serializers.IntegerField(), "last_at": serializers.DateTimeField(),
                "sample_id": serializers.IntegerField(),
            }, many=True),
        }),
    )
    @action(detail=False, methods=["get"], filter_backends=[])
    def summary(self, request: Request) -> Response:
        """Counts of refused input by reason, format it looks like and source."""
        unknown = sorted(set(request.query_params) - {"since", "format"})
        if unknown:
            raise ValidationError({name: ["unknown query parameter; this endpoint takes: since"] for name in unknown})
        since = None
        if "since" in request.query_params:
            try:
                since = UTCIsoDateTimeField().clean(request.query_params["since"])
            except FormValidationError as exc:
                raise ValidationError({"since": exc.messages}) from None
        start = window_start(since)
        rows: list[dict[str, Any]] = counts_by_reason(start)
        return Response({"since": start, "total": sum(r["count"] for r in rows), "by_reason": rows})
