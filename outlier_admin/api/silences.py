"""``/api/v1/silences/``: what rejecting a proposal silenced (read role), and ending a silence early.

- ``GET /api/v1/silences/`` : silences, newest first; filters ``active`` (``true``: in force now),
  ``node`` (id), ``group`` (name), ``cause`` (``detector`` | ``gpu_fault``);
- ``GET /api/v1/silences/{id}/`` : one silence;
- ``POST /api/v1/silences/{id}/expire/`` ``{"reason": ...}`` : end it now (role ``operator``, the
  role that rejects proposals; audited as ``silence.expire``). A silence that already ended is a 400.

Silences are created by ``POST /api/v1/proposals/{id}/reject/`` (``silence_s``, default 3600):
:func:`outlier_admin.control.actions.do_reject_proposal`.
"""

from __future__ import annotations

from drf_spectacular.utils import extend_schema
from rest_framework import serializers, viewsets
from rest_framework.decorators import action
from rest_framework.generics import get_object_or_404
from rest_framework.request import Request
from rest_framework.response import Response

from outlier_admin.api.serializers import ReasonSerializer
from outlier_admin.api.views import ApiView, CanDecide, _valid, actor_of
from outlier_admin.control import actions
from outlier_admin.control.models import Silence
from outlier_admin.history.filters import SilenceFilter


class SilenceSerializer(serializers.ModelSerializer):
    node = serializers.IntegerField(source="node_id")
    node_name = serializers.CharField(source="node.name")
    group = serializers.CharField(source="node.group.name")
    active = serializers.SerializerMethodField()

    class Meta:
        model = Silence
        fields = ["id", "node", "node_name", "group", "cause", "created_at", "expires_at", "active", "actor",
                  "reason", "proposal", "expired_by"]

    def get_active(self, obj: Silence) -> bool:
        return obj.is_active()


class SilenceViewSet(ApiView, viewsets.ReadOnlyModelViewSet):
    """Silences: no new quarantine proposal for a node and cause until ``expires_at``."""

    queryset = Silence.objects.select_related("node", "node__group")
    serializer_class = SilenceSerializer
    filterset_class = SilenceFilter
    ordering_fields = ["created_at", "expires_at"]
    ordering = ["-created_at", "-id"]

    @extend_schema(request=ReasonSerializer, responses=SilenceSerializer)
    @action(detail=True, methods=["post"], permission_classes=[CanDecide])
    def expire(self, request: Request, pk: str | None = None) -> Response:
        """End the silence now: the node may be proposed again at once (role ``operator``)."""
        silence = get_object_or_404(Silence, pk=pk)
        data = _valid(ReasonSerializer, request)
        silence = actions.do_expire_silence(silence, actor=actor_of(request), reason=data["reason"])
        return Response(SilenceSerializer(self.get_queryset().get(pk=silence.pk)).data)
