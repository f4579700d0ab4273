"""The query filters (django-filter filter sets) over the stored history: nodes, transitions, incidents,
proposals, overrides, silences, canary probes, GPU readings, the audit log and the input ingest refused. One
owner, beside the read models: the API's list endpoints, the dashboard's pages and the CSV exports
(:mod:`outlier_admin.history.export`) take the same parameters from here. A node is named by its id
or its name (:class:`NodeRefFilter`); a time is ISO 8601, read in UTC (:class:`UTCIsoDateTimeField`).
The backend that refuses a parameter an endpoint does not have is the API's
(``outlier_admin.api.filters.StrictFilterBackend``)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import django_filters as filters
from django import forms
from django.core.exceptions import ValidationError as FormValidationError
from django.db.models import QuerySet
from django.utils import timezone
from django_filters.fields import IsoDateTimeField

from detector.signals import SIGNALS
from outlier_admin.control.models import (
    AuditEvent,
    CanaryProbe,
    Incident,
    IncidentOutcome,
    Override,
    ProposalSource,
    QuarantineProposal,
    Silence,
    Transition,
)
from outlier_admin.fleet.models import Node
from outlier_admin.ingest.models import GpuReading, RejectedInput


class NodeFilter(filters.FilterSet):
    name = filters.CharFilter(field_name="name", help_text="the node's name (its detector id), exactly")
    group = filters.CharFilter(field_name="group__name", help_text="group name")
    state = filters.CharFilter(field_name="state")
    address = filters.CharFilter(field_name="address", lookup_expr="icontains")
    retired = filters.BooleanFilter(field_name="retired")
    # Not a filter: the signal of each node's `z`/`ema` (read by NodeViewSet.get_queryset, which refuses an
    # unknown one); declared here so that the strict backend knows it and the schema documents it.
    signal = filters.ChoiceFilter(
        choices=[(s, s) for s in SIGNALS], method="keep_all",
        help_text="The signal of `z` and `ema` (default: each node's deciding signal, named in `signal`)")

    class Meta:
        model = Node
        fields = ["name", "group", "state", "address", "retired"]

    def keep_all(self, queryset: QuerySet[Node], name: str, value: str) -> QuerySet[Node]:
        return queryset


def is_node_id(value: str) -> bool:
    """A ``?node=`` of ASCII digits is a node's id; anything else is a name (:data:`NODE_ID_RE
    <contract.names.NODE_ID_RE>` allows a name of digits: address that one within its group)."""
    return value.isascii() and value.isdigit()


class NodeRefFilter(filters.CharFilter):
    """``?node=``: a node's numeric id, or its name, within ``?group=`` when given. Names are unique
    within a group only: a name several groups share without ``?group=`` is refused by
    :class:`NodeRefForm` (a 400 naming the groups), never answered with the rows of whichever node."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("help_text", "the node's id, or its name (within ?group= when names repeat across groups)")
        super().__init__(*args, **kwargs)

    def filter(self, qs: QuerySet, value: Any) -> QuerySet:
        if value in (None, ""):
            return qs
        if is_node_id(value):
            return qs.filter(node_id=int(value))
        nodes = Node.objects.filter(name=value)
        group = self.parent.form.cleaned_data.get("group") if self.parent is not None else None
        if group:
            nodes = nodes.filter(group__name=group)
        return qs.filter(node_id__in=nodes.values("pk"))


class NodeRefForm(forms.Form):
    """The form of a filter set with ``node`` (:class:`NodeRefFilter`) and ``group``: refuses a node
    name that several groups share unless ``group`` says which."""

    def clean(self) -> dict[str, Any]:
        data = super().clean()
        node, group = data.get("node"), data.get("group")
        if node and not group and not is_node_id(node):
            groups = sorted(set(Node.objects.filter(name=node).values_list("group__name", flat=True)))
            if len(groups) > 1:
                self.add_error("node", FormValidationError(
                    "nodes named %(node)s are in groups %(groups)s: add ?group= to say which",
                    code="ambiguous_node", params={"node": repr(node), "groups": ", ".join(groups)}))
        return data


class UTCIsoDateTimeField(IsoDateTimeField):
    """An ISO 8601 date-time, handed to the database in UTC. Python accepts UTC offsets up to 24 h but
    PostgreSQL only up to 15:59 (``?since=2026-01-01T00:00:00+22:00`` was a 500: "time zone
    displacement out of range"), and a date at the edge of Python's range may have no UTC equivalent
    (``0001-01-01T00:00:00+10:00``): both are a 400 naming the value instead."""

    def to_python(self, value: Any) -> datetime | None:
        parsed = super().to_python(value)
        if parsed is None:
            return None
        try:
            return parsed.astimezone(UTC)
        except OverflowError:
            raise FormValidationError(f"{value!r} is out of the supported date range", code="invalid") from None


class UTCIsoDateTimeFilter(filters.IsoDateTimeFilter):
    field_class = UTCIsoDateTimeField


class _TimeFilter(filters.FilterSet):
    since = UTCIsoDateTimeFilter(field_name="at", lookup_expr="gte")
    until = UTCIsoDateTimeFilter(field_name="at", lookup_expr="lt")


class TransitionFilter(_TimeFilter):
    group = filters.CharFilter(field_name="group__name")
    node = NodeRefFilter()
    reason = filters.CharFilter(field_name="reason")
    to_state = filters.CharFilter(field_name="to_state")

    class Meta:
        model = Transition
        form = NodeRefForm
        fields = ["group", "node", "reason", "to_state", "shadow"]


class IncidentFilter(filters.FilterSet):
    """Incidents by group, node, open or ended, outcome, and the time they overlap: ``since`` keeps those
    still open at or after it, ``until`` those started before it."""

    group = filters.CharFilter(field_name="group__name")
    node = NodeRefFilter()
    open = filters.BooleanFilter(field_name="ended_at", lookup_expr="isnull",
                                 help_text="true: open incidents only; false: ended ones only")
    outcome = filters.ChoiceFilter(choices=IncidentOutcome.choices)
    since = UTCIsoDateTimeFilter(method="_since", help_text="incidents not ended before this time")
    until = UTCIsoDateTimeFilter(field_name="started_at", lookup_expr="lt",
                                 help_text="incidents started before this time")

    class Meta:
        model = Incident
        form = NodeRefForm
        fields = ["group", "node", "open", "outcome"]

    def _since(self, qs: QuerySet, name: str, value: datetime) -> QuerySet:
        from django.db.models import Q

        return qs.filter(Q(ended_at__isnull=True) | Q(ended_at__gte=value))


class ProposalFilter(filters.FilterSet):
    group = filters.CharFilter(field_name="group__name")
    node = NodeRefFilter()

    class Meta:
        model = QuarantineProposal
        form = NodeRefForm
        fields = ["group", "node", "status", "source"]


class _NodeRowFilter(filters.FilterSet):
    """Rows that belong to a node (not to a group): the group is the node's."""

    group = filters.CharFilter(field_name="node__group__name")
    node = NodeRefFilter()


class OverrideFilter(_NodeRowFilter):

    class Meta:
        model = Override
        form = NodeRefForm
        fields = ["group", "node", "kind"]


class ProbeFilter(_TimeFilter, _NodeRowFilter):

    class Meta:
        model = CanaryProbe
        form = NodeRefForm
        fields = ["group", "node", "ok", "passed"]


class GpuReadingFilter(_TimeFilter, _NodeRowFilter):

    class Meta:
        model = GpuReading
        form = NodeRefForm
        fields = ["group", "node", "gpu"]


class AuditFilter(_TimeFilter):
    group = filters.CharFilter(field_name="group__name", label="Group")
    node = NodeRefFilter(label="Node (id or name)")
    actor = filters.CharFilter(field_name="actor", label="Actor",
                               help_text="exactly: a username, `token:<name>` or `system:<part>`")
    action = filters.CharFilter(field_name="action", lookup_expr="startswith", label="Action (prefix)")

    class Meta:
        model = AuditEvent
        form = NodeRefForm
        fields = ["group", "node", "actor", "action"]


class RejectedInputFilter(filters.FilterSet):
    since = UTCIsoDateTimeFilter(field_name="received_at", lookup_expr="gte")
    until = UTCIsoDateTimeFilter(field_name="received_at", lookup_expr="lt")
    reason = filters.CharFilter(field_name="reason")
    looks_like = filters.CharFilter(field_name="looks_like")
    source = filters.CharFilter(field_name="source")

    class Meta:
        model = RejectedInput
        fields = ["reason", "looks_like", "source"]


class SilenceFilter(filters.FilterSet):
    active = filters.BooleanFilter(method="filter_active", help_text="true: in force now; false: ended")
    node = filters.NumberFilter(field_name="node_id")
    group = filters.CharFilter(field_name="node__group__name")
    cause = filters.ChoiceFilter(choices=ProposalSource.choices)

    class Meta:
        model = Silence
        fields = ["node", "group", "cause"]

    def filter_active(self, queryset: QuerySet, name: str, value: bool) -> QuerySet:
        now = timezone.now()
        return queryset.filter(expires_at__gt=now) if value else queryset.filter(expires_at__lte=now)
