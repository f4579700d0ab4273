"""``/api/v1/`` endpoints. Thin: parse input, check the role, call an action or a query, serialize.

Role checks: :mod:`outlier_admin.api.permissions` (reads: any role; thresholds/policy/proposal
decisions: ``operator``; overrides: ``oncall``). Every change goes through
:mod:`outlier_admin.control.actions`, which validates it and writes the audit event.
"""

from __future__ import annotations

from typing import Any

from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse
from django.utils import timezone
from django.views.decorators.csrf import csrf_exempt
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema, inline_serializer
from rest_framework import mixins, serializers, status, viewsets
from rest_framework.decorators import action
from rest_framework.exceptions import APIException, ErrorDetail, NotFound, Throttled, ValidationError
from rest_framework.generics import get_object_or_404  # a malformed id is a 404 too (Django's: a 500)
from rest_framework.renderers import BrowsableAPIRenderer
from rest_framework.request import Request
from rest_framework.response import Response

from contract.names import NODE_ID_MAX, NODE_ID_RE
from detector.signals import SIGNALS
from detector.thresholds import Thresholds
from outlier_admin.api import serializers as s
from outlier_admin.api.errors import PROBLEM_CONTENT_TYPE, problem_response
from outlier_admin.api.inputs import PARSERS, Pagination
from outlier_admin.api.permissions import CanRead, capability_permission
from outlier_admin.api.renderers import FastJSONRenderer
from outlier_admin.control import actions
from outlier_admin.control.models import (
    AuditEvent,
    CanaryProbe,
    Incident,
    Override,
    QuarantineProposal,
    Transition,
)
from outlier_admin.fleet.models import ApiToken, ModelGroup, Node
from outlier_admin.fleet.roles import may_preview, preview_roles
from outlier_admin.history import filters, queries
from outlier_admin.history.preview import PreviewThrottled, preview_thresholds
from outlier_admin.history.timeline import MAX_POINTS, RangeError, group_baseline, node_timeline, parse_range
from outlier_admin.ingest.models import GpuReading

CanTune = capability_permission("tune")
CanDecide = capability_permission("decide")
CanOverride = capability_permission("override")


class PreviewUnavailable(APIException):
    """The preview's rate limiter cannot be reached (503 + Retry-After): it fails closed."""

    status_code = status.HTTP_503_SERVICE_UNAVAILABLE
    default_code = "unavailable"

    def __init__(self, detail: str, wait: int) -> None:
        super().__init__(detail)
        self.wait = wait


class CanPreview(CanRead):
    """The threshold preview: roles of :func:`outlier_admin.history.preview.may_preview` (operator, oncall).
    It reads and replays a whole group's history, so not every reader may start one."""

    def has_permission(self, request: Any, view: Any) -> bool:
        if not super().has_permission(request, view):  # a login, an api-scope token
            return False
        if may_preview(request.user):
            return True
        self.message = (f"Your account may not preview thresholds: it needs the role {' or '.join(preview_roles())}. "
                        "Ask an administrator to add you to that group.")
        return False


def actor_of(request: Request) -> Any:
    """The principal recorded in the audit log: the token when one authenticated the request (as
    ``token:<name>``, linked to its user: see ``actions._actor``), else the logged-in user."""
    return request.auth if isinstance(request.auth, ApiToken) else request.user


def _valid(serializer_class: type[serializers.Serializer], request: Request) -> dict[str, Any]:
    ser = serializer_class(data=request.data)
    ser.is_valid(raise_exception=True)
    return dict(ser.validated_data)


SIGNAL_PARAMETER = OpenApiParameter(
    "signal", OpenApiTypes.STR, enum=list(SIGNALS),
    description="The signal of `z`, `ema` (and of the timeline's baseline). Default: the node's **deciding** "
    "signal, the one the detector weighs, cuts and quarantines it on (`decode` or `prefill_time`, the larger "
    "Z, once the group has a queue-free baseline; else `norm` or `prefill`, the larger Z); the response's "
    "`signal` names the one shown. An unknown value: 400.")
NODE_LOOKUP = OpenApiParameter(
    "id", OpenApiTypes.STR, OpenApiParameter.PATH,
    description="The node's numeric id (ASCII digits, no leading zeros: always an id, never a name; a node "
    "name of digits is refused at registration), or its name when no other group has a node of that name (a "
    "name several groups share: 400 `ambiguous_node`; `/api/v1/groups/<group>/nodes/<name>/` is always exact).")


def requested_signal(request: Request | None) -> str | None:
    """The ``?signal=`` asked for (None: each node's deciding signal); any other value than one of
    :data:`~detector.signals.SIGNALS` is a 400 naming them, never a silent default."""
    signal = request.query_params.get("signal") if request is not None else None
    if signal is not None and signal not in SIGNALS:
        raise ValidationError({"signal": [ErrorDetail(
            f"unknown signal {signal[:50]!r}: one of {', '.join(SIGNALS)} (default: the node's deciding signal)",
            code="invalid_choice")]})
    return signal


def node_of(lookup: str, group: ModelGroup | None = None) -> Node:
    """The node a URL names. In ``group``: by name (unique there). Otherwise a number is an id and
    anything else a name: one node of that name in any group, else a 404; a name several groups
    share is a 400 naming them (no node is picked for the caller: an override on the wrong one would
    take a healthy node out)."""
    if not NODE_ID_RE.fullmatch(lookup):  # no node is named so (a NUL, a space...): never a query
        raise NotFound(f"no node {lookup[:200]!r}: a node id is a number, a name 1-{NODE_ID_MAX} of letters, "
                       "digits and . _ : @ - [ ]")
    if group is not None:
        return get_object_or_404(Node, group=group, name=lookup)
    if lookup.isascii() and lookup.isdigit():
        # Digits are an id, and only in their one spelling ("0003" is not node 3): names of digits are
        # refused at registration (fleet.names.validate_new_node_name), so /nodes/3/ has one meaning.
        if lookup != str(int(lookup)) or int(lookup) > 2**63 - 1:
            raise NotFound(f"no node id {lookup[:30]!r}: an id is written without leading zeros")
        return get_object_or_404(Node, pk=int(lookup))
    found = list(Node.objects.filter(name=lookup).select_related("group").order_by("group__name")[:10])
    if not found:
        raise NotFound(f"no node named {lookup[:200]!r} in any group")
    if len(found) > 1:
        paths = ", ".join(f"/api/v1/groups/{n.group.slug}/nodes/{n.name}/" for n in found)
        raise ValidationError({"id": [ErrorDetail(
            f"{len(found)}{'+' if len(found) == 10 else ''} groups have a node named {lookup!r}: "
            f"address it within its group ({paths}) or by id", code="ambiguous_node")]})
    return found[0]


class ApiView:
    """What every endpoint shares: a bounded page and a JSON parser that answers every unreadable body
    with a 400 (:mod:`outlier_admin.api.inputs`)."""

    pagination_class = Pagination
    parser_classes = PARSERS


class GroupViewSet(ApiView, viewsets.ReadOnlyModelViewSet):
    """Model groups: the peers each node is compared with, their thresholds and policy."""

    queryset = ModelGroup.objects.all()
    serializer_class = s.GroupSerializer
    # By slug (contract.names.group_slug): a name may hold "/" (a model id); an old name is its own slug.
    lookup_field = "slug"
    lookup_value_regex = "[-a-zA-Z0-9_]+"
    filterset_fields = ["name", "policy", "retired"]
    ordering_fields = ["name", "created_at"]

    def get_serializer_context(self) -> dict[str, Any]:
        ctx = super().get_serializer_context()
        ctx["state_counts"] = queries.state_counts()
        return ctx

    @extend_schema(responses=inline_serializer("Thresholds", {
        "version": serializers.IntegerField(), "policy": serializers.CharField(),
        "values": serializers.DictField(), "overrides": serializers.DictField(), "ranges": serializers.DictField(),
    }))
    @action(detail=True, methods=["get"])
    def thresholds(self, request: Request, slug: str | None = None) -> Response:
        """Effective thresholds, the stored overrides of the defaults, and every field's allowed range."""
        group = self.get_object()
        return Response({
            "version": group.thresholds_version, "policy": group.policy,
            "values": group.thresholds().to_dict(), "overrides": group.threshold_overrides,
            "ranges": Thresholds.field_ranges(),
        })

    @extend_schema(parameters=[SIGNAL_PARAMETER, OpenApiParameter(
        "node_name", OpenApiTypes.STR, OpenApiParameter.PATH, description="The node's name in the group "
        "(its detector id), exactly")], responses=s.NodeSerializer)
    @action(detail=True, methods=["get"], url_path=r"nodes/(?P<node_name>[^/]+)", url_name="node")
    def node(self, request: Request, slug: str | None = None, node_name: str = "") -> Response:
        """One node of the group by its name (as ``GET /nodes/<id>/``): names are unique within a group,
        not across groups. No node of that name here: 404."""
        node = node_of(node_name, self.get_object())
        figures = queries.with_latest_figures(Node.objects.select_related("group"), requested_signal(request))
        return Response(s.NodeSerializer(figures.get(pk=node.pk)).data)

    @extend_schema(request=s.ThresholdUpdateSerializer, responses=s.ThresholdChangeSerializer)
    @thresholds.mapping.patch
    def update_thresholds(self, request: Request, slug: str | None = None) -> Response:
        """Change some thresholds (role ``operator``): a new version, audited. A value out of range is
        a 400 naming the field and its range; nothing is stored then."""
        group = self.get_object()
        data = _valid(s.ThresholdUpdateSerializer, request)
        change = actions.do_update_thresholds(group, data["changes"], actor=actor_of(request), reason=data["reason"])
        return Response(s.ThresholdChangeSerializer(change).data)

    @extend_schema(responses=s.ThresholdChangeSerializer(many=True))
    @action(detail=True, methods=["get"], url_path="thresholds/history")
    def threshold_history(self, request: Request, slug: str | None = None) -> Response:
        """Every thresholds/policy version with who, when, why and the diff ``{field: [old, new]}``."""
        group = self.get_object()
        page = self.paginate_queryset(group.threshold_changes.all())
        return self.get_paginated_response(s.ThresholdChangeSerializer(page, many=True).data)

    @extend_schema(request=s.ThresholdPreviewSerializer, responses={
        200: OpenApiTypes.OBJECT,
        (429, PROBLEM_CONTENT_TYPE): OpenApiResponse(response={"$ref": "#/components/schemas/Problem"},
                                                     description="Too many previews: the user's (`PREVIEW_BURST`, `PREVIEW_REFILL_S`) "
                                                     "or this server's (`PREVIEW_MAX_CONCURRENT`): code "
                                                     "`throttled`; retry after `Retry-After` seconds")})
    @action(detail=True, methods=["post"], url_path="thresholds/preview", permission_classes=[CanPreview])
    def threshold_preview(self, request: Request, slug: str | None = None) -> Response:
        """Replay recorded history under the proposed values (changes nothing; role ``operator`` or
        ``oncall``). Bounded: over ``PREVIEW_MAX_WINDOW_S``, ``PREVIEW_MAX_NODES`` or ``PREVIEW_MAX_ROWS``
        it is a 400 naming the bound (see :mod:`outlier_admin.history.preview`). Rate-limited per user
        (``PREVIEW_BURST``, ``PREVIEW_REFILL_S``) and per process (``PREVIEW_MAX_CONCURRENT``): a 429
        ``throttled`` with ``Retry-After``; the input is checked first, so a bad one spends no token.

        ``fidelity`` says whether the replay of the **current** thresholds reproduces the cuts and
        quarantines the detector recorded in the window (``faithful``, ``recorded``, ``reproduced``,
        ``missed``, ``extra``, ``nodes_without_rows``): when it does not, ``added``/``removed`` describe
        the replay, not what the change would do."""
        group = self.get_object()
        data = _valid(s.ThresholdPreviewSerializer, request)
        if not data["changes"]:
            raise ValidationError({"changes": ["give at least one threshold to preview"]})
        try:
            preview = preview_thresholds(group, data["changes"], window_s=data["window_s"], user=request.user)
        except PreviewThrottled as exc:
            if exc.status == 429:
                raise Throttled(wait=exc.retry_after_s, detail=str(exc)) from exc
            # Not chained: a refused connection in the cause would read as PostgreSQL's outage.
            raise PreviewUnavailable(str(exc), wait=exc.retry_after_s) from None
        return Response(preview.to_dict())

    @extend_schema(request=s.PolicySerializer, responses=s.GroupSerializer)
    @action(detail=True, methods=["post"], permission_classes=[CanTune])
    def policy(self, request: Request, slug: str | None = None) -> Response:
        """Set the group's policy (``shadow``/``approval``/``auto``; role ``operator``)."""
        group = self.get_object()
        data = _valid(s.PolicySerializer, request)
        group = actions.do_set_group_policy(group, data["policy"], actor=actor_of(request), reason=data["reason"])
        return Response(self.get_serializer(group).data)

    @extend_schema(request=s.GroupCreateSerializer, responses={201: s.GroupSerializer})
    def create(self, request: Request) -> Response:
        """Create a group (role ``operator``, audited), with the default thresholds as version 1. A
        name already taken or not a valid group id: 400."""
        data = _valid(s.GroupCreateSerializer, request)
        group = actions.do_create_group(data.pop("name"), actor=actor_of(request), reason=data.pop("reason"), **data)
        return Response(self.get_serializer(group).data, status=status.HTTP_201_CREATED)

    @extend_schema(request=s.GroupUpdateSerializer, responses=s.GroupSerializer)
    def partial_update(self, request: Request, slug: str | None = None) -> Response:
        """Change the group's model name, hardware class, tensor-parallel size or auto-register list
        (role ``operator``, audited with the diff)."""
        group = self.get_object()
        data = _valid(s.GroupUpdateSerializer, request)
        reason = data.pop("reason")
        group = actions.do_update_group(group, data, actor=actor_of(request), reason=reason)
        return Response(self.get_serializer(group).data)

    @extend_schema(request=s.ReasonSerializer, responses=s.GroupSerializer)
    @action(detail=True, methods=["post"], permission_classes=[CanTune])
    def retire(self, request: Request, slug: str | None = None) -> Response:
        """Retire the group and all its nodes for good (role ``operator``, audited): ingest refuses its
        records, ticks and scrapes skip it; its history stays. A retired group: 400."""
        group = self.get_object()
        data = _valid(s.ReasonSerializer, request)
        group = actions.do_retire_group(group, actor=actor_of(request), reason=data["reason"])
        return Response(self.get_serializer(group).data)

    def get_permissions(self) -> list[Any]:
        if self.request is not None and (self.request.method == "PATCH" or self.action == "create"):
            return [CanTune()]
        return super().get_permissions()


class NodeViewSet(ApiView, viewsets.ReadOnlyModelViewSet):
    """Nodes with their state, weight and latest figures; registered and edited by operators, overridden
    by on-call engineers."""

    serializer_class = s.NodeSerializer
    filterset_class = filters.NodeFilter
    ordering_fields = ["name", "state", "weight", "last_seen", "latest_z", "latest_ema"]
    lookup_value_regex = "[^/]+"  # an id, or a name (contract.names.NODE_ID_RE: no "/"): see node_of

    def get_queryset(self) -> QuerySet[Node]:
        if getattr(self, "swagger_fake_view", False):  # schema generation: no request, maybe no database
            return Node.objects.none()
        return queries.with_latest_figures(Node.objects.select_related("group"), requested_signal(self.request))

    def get_object(self) -> Node:
        node = node_of(self.kwargs["pk"])
        self.check_object_permissions(self.request, node)
        return self.get_queryset().get(pk=node.pk)

    @extend_schema(parameters=[NODE_LOOKUP, SIGNAL_PARAMETER])
    def retrieve(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        """One node with its state, weight and latest figures (``z``/``ema`` on ``signal``)."""
        return super().retrieve(request, *args, **kwargs)

    def get_permissions(self) -> list[Any]:
        if self.action in ("create", "partial_update"):
            return [CanTune()]
        return super().get_permissions()

    @extend_schema(request=s.NodeCreateSerializer, responses={201: s.NodeSerializer})
    def create(self, request: Request) -> Response:
        """Register a node in a group (role ``operator``, audited); it joins the detector in warm-up at
        the next tick. An unknown group, a bad address or URL, a name taken or a full group: 400."""
        data = _valid(s.NodeCreateSerializer, request)
        group = ModelGroup.objects.filter(name=data.pop("group")).first()
        if group is None:
            raise ValidationError({"group": [ErrorDetail("no group of this name", code="unknown_group")]})
        node = actions.do_register_node(group, data.pop("address"), actor=actor_of(request),
                                        reason=data.pop("reason"), **data)
        return Response(self.get_serializer(self.get_queryset().get(pk=node.pk)).data, status=status.HTTP_201_CREATED)

    @extend_schema(parameters=[NODE_LOOKUP], request=s.NodeUpdateSerializer, responses=s.NodeSerializer)
    def partial_update(self, request: Request, pk: str | None = None) -> Response:
        """Change the node's address, base weight, labels or scrape URLs (role ``operator``, audited
        with the diff). Its name and group stay; a retired node: 400."""
        node = node_of(str(pk))
        data = _valid(s.NodeUpdateSerializer, request)
        reason = data.pop("reason")
        actions.do_update_node(node, data, actor=actor_of(request), reason=reason)
        return Response(self.get_serializer(self.get_queryset().get(pk=node.pk)).data)

    @extend_schema(
        parameters=[
            NODE_LOOKUP,
            OpenApiParameter("start", OpenApiTypes.DATETIME, description="ISO 8601; default end - hours"),
            OpenApiParameter("end", OpenApiTypes.DATETIME, description="ISO 8601; default now"),
            OpenApiParameter("hours", OpenApiTypes.FLOAT, description="length of the range (default 1)"),
            SIGNAL_PARAMETER,
            OpenApiParameter("max_points", OpenApiTypes.INT, description=f"at most {MAX_POINTS}"),
        ],
        responses=inline_serializer("Timeline", {
            "node": serializers.IntegerField(), "signal": serializers.CharField(),
            "start": serializers.DateTimeField(), "end": serializers.DateTimeField(),
            "points": s.TimelinePointSerializer(many=True), "transitions": s.TransitionSerializer(many=True),
            "baseline": s.BaselinePointSerializer(many=True),
        }),
    )
    @action(detail=True, methods=["get"], renderer_classes=[FastJSONRenderer, BrowsableAPIRenderer])
    def timeline(self, request: Request, pk: str | None = None) -> Response:
        """EMA/Z/P50/P99/weight/state/evidence over a range, downsampled to at most 2,000 points (Z, P99
        and evidence keep each bucket's maximum, weight its minimum), with the transitions in the range and the
        detector's peer baseline of the node's group on the same signal (at most 300 points)."""
        node = node_of(str(pk))
        try:
            start, end = parse_range(request.query_params, now=timezone.now())
        except RangeError as exc:
            raise ValidationError({"range": [str(exc)]}) from None
        signal = requested_signal(request) or queries.node_signal(node)
        try:
            max_points = int(request.query_params.get("max_points", MAX_POINTS))
        except ValueError:
            raise ValidationError({"max_points": ["must be an integer"]}) from None
        if not 1 <= max_points <= MAX_POINTS:
            raise ValidationError({"max_points": [f"must be in [1, {MAX_POINTS}]"]})
        points = node_timeline(node, start, end, signal=signal, max_points=max_points)
        transitions = Transition.objects.filter(node=node, at__gte=start, at__lt=end).select_related("node", "group")
        return Response({
            "node": node.pk, "signal": signal, "start": start, "end": end,
            "points": [p.to_dict() for p in points],
            "transitions": s.TransitionSerializer(transitions.order_by("at"), many=True).data,
            "baseline": [b.to_dict() for b in group_baseline(node.group_id, start, end, signal=signal)],
        })

    def _override(self, request: Request, pk: str | None, kind: str) -> Response:
        node = node_of(str(pk))
        serializer_class = s.PinInputSerializer if kind == "pin" else (
            s.ReasonSerializer if kind in ("release", "unpin") else s.OverrideInputSerializer)
        data = _valid(serializer_class, request)
        actor = actor_of(request)
        if kind == "quarantine":
            row = actions.do_quarantine(node, actor=actor, reason=data["reason"], expires_in_s=data["expires_in_s"])
        elif kind == "activate":
            row = actions.do_activate(node, actor=actor, reason=data["reason"], expires_in_s=data["expires_in_s"])
        elif kind == "pin":
            row = actions.do_pin_weight(node, data["weight"], actor=actor, reason=data["reason"],
                                        expires_in_s=data["expires_in_s"])
        elif kind == "unpin":
            row = actions.do_unpin_weight(node, actor=actor, reason=data["reason"])
        else:
            row = actions.do_release(node, actor=actor, reason=data["reason"])
        row = Override.objects.select_related("node").get(pk=row.pk)
        return Response(s.OverrideSerializer(row).data, status=status.HTTP_201_CREATED)

    @extend_schema(parameters=[NODE_LOOKUP], request=s.OverrideInputSerializer, responses={201: s.OverrideSerializer})
    @action(detail=True, methods=["post"], permission_classes=[CanOverride])
    def quarantine(self, request: Request, pk: str | None = None) -> Response:
        """Force the node out of service (role ``oncall``); applied by the group's next tick."""
        return self._override(request, pk, "quarantine")

    @extend_schema(parameters=[NODE_LOOKUP], request=s.ReasonSerializer, responses={201: s.OverrideSerializer})
    @action(detail=True, methods=["post"], permission_classes=[CanOverride])
    def release(self, request: Request, pk: str | None = None) -> Response:
        """Clear a forced state or quarantine; back to service at full weight, judged afresh (role ``oncall``)."""
        return self._override(request, pk, "release")

    @extend_schema(parameters=[NODE_LOOKUP], request=s.OverrideInputSerializer, responses={201: s.OverrideSerializer})
    @action(detail=True, methods=["post"], permission_classes=[CanOverride])
    def activate(self, request: Request, pk: str | None = None) -> Response:
        """Force the node into service at base weight; the detector keeps scoring it (role ``oncall``)."""
        return self._override(request, pk, "activate")

    @extend_schema(parameters=[NODE_LOOKUP], request=s.PinInputSerializer, responses={201: s.OverrideSerializer})
    @action(detail=True, methods=["post"], permission_classes=[CanOverride])
    def pin(self, request: Request, pk: str | None = None) -> Response:
        """Publish exactly ``weight`` for the node (role ``oncall``)."""
        return self._override(request, pk, "pin")

    @extend_schema(parameters=[NODE_LOOKUP], request=s.ReasonSerializer, responses={201: s.OverrideSerializer})
    @action(detail=True, methods=["post"], permission_classes=[CanOverride])
    def unpin(self, request: Request, pk: str | None = None) -> Response:
        """Remove a pinned weight (role ``oncall``)."""
        return self._override(request, pk, "unpin")

    @extend_schema(parameters=[NODE_LOOKUP], request=s.ReasonSerializer, responses=s.NodeSerializer)
    @action(detail=True, methods=["post"], permission_classes=[CanOverride])
    def retire(self, request: Request, pk: str | None = None) -> Response:
        """Take the node out of its group for good (role ``oncall``, audited): it leaves the detector
        and the weights document at the next tick; its history stays. A retired node: 400."""
        node = node_of(str(pk))
        data = _valid(s.ReasonSerializer, request)
        actions.do_retire_node(node, actor=actor_of(request), reason=data["reason"])
        return Response(self.get_serializer(self.get_queryset().get(pk=node.pk)).data)


class TransitionViewSet(ApiView, viewsets.ReadOnlyModelViewSet):
    """State changes with their explanation (evidence, thresholds in force, policy, safeguard)."""

    queryset = Transition.objects.select_related("node", "group")
    serializer_class = s.TransitionSerializer
    filterset_class = filters.TransitionFilter
    ordering_fields = ["at"]


class IncidentViewSet(ApiView, viewsets.ReadOnlyModelViewSet):
    """A node's episodes out of full service, newest first: one start, one deciding cause (signal, Z,
    EMA vs peer baseline with units), the canary's probes counted beneath it, and how it ended
    (:mod:`outlier_admin.control.incidents`)."""

    queryset = Incident.objects.select_related("node", "group")
    serializer_class = s.IncidentSerializer
    filterset_class = filters.IncidentFilter
    ordering_fields = ["started_at", "ended_at"]

    @extend_schema(responses={(200, "text/csv"): OpenApiTypes.STR})
    @action(detail=False, methods=["get"])
    def export(self, request: Request) -> HttpResponse:
        """The incidents under the same filters as CSV, newest first (the audit log's CSV writer:
        :func:`outlier_admin.history.export.csv_response`)."""
        from outlier_admin.history.export import INCIDENT_COLUMNS, csv_response, incident_rows

        stamp = timezone.now().strftime("%Y%m%dT%H%M%SZ")
        return csv_response(f"outlier-admin-incidents-{stamp}.csv", INCIDENT_COLUMNS,
                            incident_rows(self.filter_queryset(self.get_queryset())))


class ProposalViewSet(ApiView, viewsets.ReadOnlyModelViewSet):
    """Quarantines waiting for a human (policy ``approval``, GPU hard faults)."""

    queryset = QuarantineProposal.objects.select_related("node", "group")
    serializer_class = s.ProposalSerializer
    filterset_class = filters.ProposalFilter
    ordering_fields = ["created_at"]

    def _decide(self, request: Request, pk: str | None, approve: bool) -> Response:
        proposal = get_object_or_404(QuarantineProposal, pk=pk)
        if approve:
            data = _valid(s.ReasonSerializer, request)
            proposal = actions.do_approve_proposal(proposal, actor=actor_of(request), reason=data["reason"])
        else:
            data = _valid(s.RejectInputSerializer, request)
            proposal = actions.do_reject_proposal(proposal, actor=actor_of(request), reason=data["reason"],
                                                  silence_s=data["silence_s"])
        return Response(s.ProposalSerializer(self.get_queryset().get(pk=proposal.pk)).data)

    @extend_schema(request=s.ReasonSerializer, responses=s.ProposalSerializer)
    @action(detail=True, methods=["post"], permission_classes=[CanDecide])
    def approve(self, request: Request, pk: str | None = None) -> Response:
        """Approve: the node is quarantined at the next tick (role ``operator``)."""
        return self._decide(request, pk, approve=True)

    @extend_schema(request=s.RejectInputSerializer, responses=s.ProposalSerializer)
    @action(detail=True, methods=["post"], permission_classes=[CanDecide])
    def reject(self, request: Request, pk: str | None = None) -> Response:
        """Reject: a detector proposal returns the node to service, and no new proposal of this node
        and cause opens for ``silence_s`` seconds (default 1 h; role ``operator``)."""
        return self._decide(request, pk, approve=False)


class OverrideViewSet(ApiView, viewsets.ReadOnlyModelViewSet):
    """Manual decisions about nodes (create them with ``POST /api/v1/nodes/<id>/<kind>``)."""

    queryset = Override.objects.select_related("node")
    serializer_class = s.OverrideSerializer
    filterset_class = filters.OverrideFilter
    ordering_fields = ["created_at"]


class ProbeViewSet(ApiView, viewsets.ReadOnlyModelViewSet):
    """Canary probes of quarantined / probing nodes and their verdicts."""

    queryset = CanaryProbe.objects.select_related("node")
    serializer_class = s.ProbeSerializer
    filterset_class = filters.ProbeFilter
    ordering_fields = ["at"]


class GpuReadingViewSet(ApiView, viewsets.ReadOnlyModelViewSet):
    """DCGM readings per GPU of a node."""

    queryset = GpuReading.objects.all()
    serializer_class = s.GpuReadingSerializer
    filterset_class = filters.GpuReadingFilter
    ordering_fields = ["at"]


class AuditViewSet(ApiView, mixins.ListModelMixin, mixins.RetrieveModelMixin, viewsets.GenericViewSet):
    """Every change by a person or token: who, when, what, why, and before -> after in ``detail``."""

    queryset = AuditEvent.objects.select_related("group", "node")
    serializer_class = s.AuditEventSerializer
    filterset_class = filters.AuditFilter
    ordering_fields = ["at"]


@csrf_exempt  # it changes nothing; without this a POST would get the CSRF failure page instead
def api_not_found(request: HttpRequest, unmatched: str = "") -> HttpResponse:
    """A URL under ``/api/`` that no endpoint matches (an id or group name of the wrong shape,
    ``/api/v1/groups/a%2Fb/``): the API's 404 problem, not Django's HTML page, so a client can read the
    problem like any other (see :mod:`outlier_admin.api.urls`)."""
    return problem_response(404, f"No API endpoint at {request.path!r}: check the path, the id and the group name.",
                            instance=request.path)
