"""Query filters of the list endpoints (django-filter), shared with the dashboard's audit page."""

from __future__ import annotations

import django_filters as filters

from outlier_admin.control.models import AuditEvent, CanaryProbe, Override, QuarantineProposal, Transition
from outlier_admin.fleet.models import Node
from outlier_admin.ingest.models import GpuReading


class NodeFilter(filters.FilterSet):
    group = filters.CharFilter(field_name="group__name", help_text="group name")
    state = filters.CharFilter(field_name="state")
    address = filters.CharFilter(field_name="address", lookup_expr="icontains")
    retired = filters.BooleanFilter(field_name="retired")

    class Meta:
        model = Node
        fields = ["group", "state", "address", "retired"]


class _TimeFilter(filters.FilterSet):
    since = filters.IsoDateTimeFilter(field_name="at", lookup_expr="gte")
    until = filters.IsoDateTimeFilter(field_name="at", lookup_expr="lt")


class TransitionFilter(_TimeFilter):
    group = filters.CharFilter(field_name="group__name")
    node = filters.NumberFilter(field_name="node_id")
    reason = filters.CharFilter(field_name="reason")
    to_state = filters.CharFilter(field_name="to_state")

    class Meta:
        model = Transition
        fields = ["group", "node", "reason", "to_state", "shadow"]


class ProposalFilter(filters.FilterSet):
    group = filters.CharFilter(field_name="group__name")
    node = filters.NumberFilter(field_name="node_id")

    class Meta:
        model = QuarantineProposal
        fields = ["group", "node", "status", "source"]


class OverrideFilter(filters.FilterSet):
    group = filters.CharFilter(field_name="node__group__name")
    node = filters.NumberFilter(field_name="node_id")

    class Meta:
        model = Override
        fields = ["group", "node", "kind"]


class ProbeFilter(_TimeFilter):
    group = filters.CharFilter(field_name="node__group__name")
    node = filters.NumberFilter(field_name="node_id")

    class Meta:
        model = CanaryProbe
        fields = ["group", "node", "ok", "passed"]


class GpuReadingFilter(_TimeFilter):
    group = filters.CharFilter(field_name="node__group__name")
    node = filters.NumberFilter(field_name="node_id")

    class Meta:
        model = GpuReading
        fields = ["group", "node", "gpu"]


class AuditFilter(_TimeFilter):
    group = filters.CharFilter(field_name="group__name", label="Group")
    node = filters.NumberFilter(field_name="node_id", label="Node id")
    actor = filters.CharFilter(field_name="actor", lookup_expr="icontains", label="Actor")
    action = filters.CharFilter(field_name="action", lookup_expr="startswith", label="Action (prefix)")

    class Meta:
        model = AuditEvent
        fields = ["group", "node", "actor", "action"]
