"""Serializers: read shapes of every resource, and the input shapes of actions.

Input serializers only check types and required fields; the rules (ranges, reasons, allowed
states) live in :mod:`outlier_admin.control.actions` and :class:`detector.Thresholds`, whose
errors the exception handler turns into 400s (:mod:`outlier_admin.api.errors`).
"""

from __future__ import annotations

import sys
from typing import Any

from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers
from rest_framework.exceptions import ErrorDetail

from contract.names import ADDRESS_MAX, GROUP_NAME_MAX, NODE_ID_MAX, URL_MAX
from detector.signals import SIGNALS
from outlier_admin.control.actions import DEFAULT_SILENCE_S, MAX_SILENCE_S, REASON_MAX
from outlier_admin.control.models import (
    AuditEvent,
    CanaryProbe,
    Incident,
    Override,
    QuarantineProposal,
    Transition,
)
from outlier_admin.fleet.models import ModelGroup, Node, Policy, ThresholdChange
from outlier_admin.ingest.models import GpuReading


class GroupSerializer(serializers.ModelSerializer):
    """A group; ``decision_signal`` and ``safeguard`` are what its last tick decided (the detector's
    Evaluation, stored by the tick), not figures derived here."""

    node_count = serializers.SerializerMethodField()
    state_counts = serializers.SerializerMethodField()
    decision_signal = serializers.CharField(
        read_only=True, help_text="The signal the detector decided the group on at its last tick (empty before "
        "the first tick and in seed mode); each node's own is its `signal`")
    safeguard = serializers.SerializerMethodField(
        help_text="The safeguard cap at the last tick: `limit` (floor(max_quarantine_fraction x nodes)), "
        "`counted` nodes against it (out of service or pending approval), `held` nodes it kept in service at the "
        "floor weight, `engaged`; null before the first tick")

    class Meta:
        model = ModelGroup
        fields = [
            "id", "name", "slug", "model_name", "hardware_class", "tensor_parallel_size", "policy",
            "thresholds_version", "weights_version", "last_tick_at", "created_at", "retired", "node_count",
            "state_counts", "decision_signal", "safeguard",
        ]

    def _counts(self, obj: ModelGroup) -> dict[str, int]:
        counts = self.context.get("state_counts", {})
        return dict(counts.get(obj.pk, {}))

    def get_node_count(self, obj: ModelGroup) -> int:
        return sum(self._counts(obj).values())

    @extend_schema_field({"type": "object", "additionalProperties": {"type": "integer"}})
    def get_state_counts(self, obj: ModelGroup) -> dict[str, int]:
        return self._counts(obj)

    @extend_schema_field({"type": "object", "nullable": True, "properties": {
        "limit": {"type": "integer"}, "counted": {"type": "integer"}, "held": {"type": "integer"},
        "engaged": {"type": "boolean"}}})
    def get_safeguard(self, obj: ModelGroup) -> dict[str, Any] | None:
        stored = obj.safeguard()
        if stored is None:
            return None
        return {"limit": stored.limit, "counted": stored.counted, "held": stored.held, "engaged": stored.engaged}


class NodeSerializer(serializers.ModelSerializer):
    """A node with its latest figures (:func:`outlier_admin.history.queries.with_latest_figures`): ``z`` and
    ``ema`` are on ``signal``, by default the one the detector decides on for this node, so that a
    client alerting on ``z`` sees what the detector acts on."""

    group = serializers.SlugRelatedField(slug_field="name", read_only=True)
    signal = serializers.ChoiceField(
        choices=SIGNALS, source="latest_signal", read_only=True,
        help_text="The signal of `z` and `ema`: the node's deciding signal (the one the detector weighs, cuts and "
        "quarantines it on) unless `?signal=` asked for another")
    ema = serializers.FloatField(source="latest_ema", read_only=True, default=None, allow_null=True,
                                 help_text="The node's EMA of `signal` at the latest history write (the signal's "
                                 "normalised scale)")
    z = serializers.FloatField(source="latest_z", read_only=True, default=None, allow_null=True,
                               help_text="The node's Z on `signal` against its peers' baseline; null without one "
                               "(too few samples or peers, or no traffic: quarantined, probing)")
    p50 = serializers.FloatField(source="latest_p50", read_only=True, default=None, allow_null=True,
                                 help_text="P50 of the tail window (normalised latency, whatever `signal`)")
    p99 = serializers.FloatField(source="latest_p99", read_only=True, default=None, allow_null=True,
                                 help_text="P99 of the tail window (normalised latency, whatever `signal`)")
    samples = serializers.IntegerField(source="latest_samples", read_only=True, default=None, allow_null=True)

    class Meta:
        model = Node
        fields = [
            "id", "name", "address", "group", "state", "weight", "base_weight", "last_seen", "signal", "ema", "z",
            "p50", "p99", "samples", "labels", "gpu_evidence", "dcgm_url", "metrics_url", "retired", "registered_at",
        ]


class ThresholdChangeSerializer(serializers.ModelSerializer):
    class Meta:
        model = ThresholdChange
        fields = ["version", "changed_at", "actor", "reason", "diff", "old", "new"]


class ThresholdChangesField(serializers.DictField):
    """``{threshold: value}``; the values are judged by :class:`detector.Thresholds`. Refused here: an
    integer beyond a double (``1`` followed by 400 zeros), which the range checks convert to float and
    which raised ``OverflowError`` (a 500) in them."""

    def to_internal_value(self, data: Any) -> dict[str, Any]:
        changes = super().to_internal_value(data)
        for name, value in changes.items():
            for item in value if isinstance(value, list) else [value]:
                if isinstance(item, int) and not isinstance(item, bool) and abs(item) > sys.float_info.max:
                    raise serializers.ValidationError({name: ["a number this large is not a threshold"]})
        return changes


class ThresholdUpdateSerializer(serializers.Serializer):
    changes = ThresholdChangesField(help_text='{"quarantine_z": 4.0, ...}; see GET .../thresholds for ranges')
    reason = serializers.CharField(max_length=REASON_MAX, help_text="Why (goes into the audit log)")


class ThresholdPreviewSerializer(serializers.Serializer):
    changes = ThresholdChangesField()
    window_s = serializers.FloatField(default=3600.0, min_value=60.0, max_value=86400.0)


class PolicySerializer(serializers.Serializer):
    policy = serializers.ChoiceField(choices=Policy.choices)
    reason = serializers.CharField(max_length=REASON_MAX)


class ReasonSerializer(serializers.Serializer):
    reason = serializers.CharField(max_length=REASON_MAX, help_text="Why (goes into the audit log)")


class RejectInputSerializer(ReasonSerializer):
    silence_s = serializers.IntegerField(
        required=False, default=DEFAULT_SILENCE_S, min_value=60, max_value=MAX_SILENCE_S,
        help_text="No new proposal of this node and cause for this many seconds (default 3600)")


class OverrideInputSerializer(ReasonSerializer):
    expires_in_s = serializers.FloatField(required=False, allow_null=True, default=None,
                                          help_text="Optional expiry in seconds, (0, 2592000]")


class PinInputSerializer(OverrideInputSerializer):
    weight = serializers.IntegerField(help_text="0 .. the node's base weight (the weights document's scale)")


class StrictInput(serializers.Serializer):
    """Refuses a body naming a field it does not have (``unknown_field``): a PATCH of ``policy`` or
    ``name`` next to an editable field would otherwise apply the one and silently drop the other."""

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        data = self.initial_data if isinstance(self.initial_data, dict) else {}
        unknown = sorted(set(data) - set(self.fields))
        if unknown:
            known = ", ".join(self.fields)
            raise serializers.ValidationError({
                key: [ErrorDetail(f"not a field of this request (it takes {known})", code="unknown_field")]
                for key in unknown})
        return attrs


class GroupUpdateSerializer(StrictInput, ReasonSerializer):
    """``PATCH /groups/<slug>/``: the fields to change (any of them) and why. Policy and thresholds have
    their own endpoints; the name stays (records, Redis keys and metrics are keyed by it)."""

    model_name = serializers.CharField(required=False, allow_blank=True, max_length=200)
    hardware_class = serializers.CharField(required=False, allow_blank=True, max_length=100)
    tensor_parallel_size = serializers.IntegerField(required=False, min_value=1, max_value=1024)
    auto_register_allow = serializers.ListField(
        child=serializers.CharField(max_length=300), required=False, max_length=100,
        help_text="CIDRs and DNS suffixes ingest may register new nodes from ([]: the deployment's default)")


class GroupCreateSerializer(GroupUpdateSerializer):
    """``POST /groups/``: a new group of peers (version 1 of the default thresholds)."""

    name = serializers.CharField(max_length=GROUP_NAME_MAX, help_text="The group id used in records and metrics "
                                 "(letters, digits and - _ . @ /: a Hugging Face model id fits)")
    policy = serializers.ChoiceField(choices=Policy.choices, default=Policy.AUTO)


class NodeUpdateSerializer(StrictInput, ReasonSerializer):
    """``PATCH /nodes/<id>/``: the fields to change (any of them) and why. The name (the detector's
    node id) and the group stay: register a new node instead."""

    address = serializers.CharField(required=False, max_length=ADDRESS_MAX,
                                    help_text="host:port, [v6]:port or http(s)://host:port")
    base_weight = serializers.IntegerField(required=False, min_value=1, max_value=1_000_000)
    labels = serializers.DictField(child=serializers.CharField(max_length=200, allow_blank=True), required=False)
    dcgm_url = serializers.CharField(required=False, allow_blank=True, max_length=URL_MAX)
    metrics_url = serializers.CharField(required=False, allow_blank=True, max_length=URL_MAX)


class NodeCreateSerializer(NodeUpdateSerializer):
    """``POST /nodes/``: register a node in a group (it joins the detector in warm-up)."""

    group = serializers.CharField(max_length=GROUP_NAME_MAX, help_text="the group's name")
    address = serializers.CharField(max_length=ADDRESS_MAX, help_text="host:port, [v6]:port or http(s)://host:port")
    name = serializers.CharField(required=False, max_length=NODE_ID_MAX,
                                 help_text="the detector's node id (default: the address)")


class TransitionSerializer(serializers.ModelSerializer):
    node = serializers.IntegerField(source="node_id")
    node_name = serializers.CharField(source="node.name")
    group = serializers.CharField(source="group.name")

    class Meta:
        model = Transition
        fields = [
            "id", "at", "group", "node", "node_name", "from_state", "to_state", "reason", "signal", "z",
            "baseline", "spread", "ema", "p50", "p99", "samples", "shadow", "explanation",
        ]
        extra_kwargs = {"signal": {"help_text": "The signal the detector decided on for this node, of `z`, `baseline`, "
                                   "`spread` and `ema` (empty for an operator's or a canary's transition)"}}


class ProposalSerializer(serializers.ModelSerializer):
    node = serializers.IntegerField(source="node_id")
    node_name = serializers.CharField(source="node.name")
    group = serializers.CharField(source="group.name")

    class Meta:
        model = QuarantineProposal
        fields = [
            "id", "created_at", "group", "node", "node_name", "source", "reason", "evidence", "status",
            "decided_at", "decided_actor", "decision_reason", "applied_at", "outcome", "outcome_reason",
            "transition",
        ]


class OverrideSerializer(serializers.ModelSerializer):
    node = serializers.IntegerField(source="node_id")
    node_name = serializers.CharField(source="node.name")

    class Meta:
        model = Override
        fields = ["id", "node", "node_name", "kind", "weight", "reason", "actor", "created_at", "expires_at",
                  "applied_at", "outcome", "outcome_reason", "transition"]


class ProbeSerializer(serializers.ModelSerializer):
    node = serializers.IntegerField(source="node_id")
    node_name = serializers.CharField(source="node.name")

    class Meta:
        model = CanaryProbe
        fields = ["id", "node", "node_name", "at", "ok", "status", "total_ms", "ttft_ms", "prompt_tokens",
                  "completion_tokens", "normalised_latency", "limit", "error", "passed", "applied_at"]


class IncidentSerializer(serializers.ModelSerializer):
    node = serializers.IntegerField(source="node_id")
    node_name = serializers.CharField(source="node.name")
    group = serializers.CharField(source="group.name")
    open = serializers.BooleanField(source="is_open", help_text="not ended yet")
    cause = serializers.SerializerMethodField(help_text="the deciding cause in words, with its signal and units")

    class Meta:
        model = Incident
        fields = ["id", "group", "node", "node_name", "started_at", "ended_at", "open", "first_state", "worst_state",
                  "reason", "signal", "unit", "z", "ema", "baseline", "cause", "detail", "quarantined_at",
                  "probes_failed", "restore_steps_failed", "outcome", "opened_by", "closed_by"]
        extra_kwargs = {
            "unit": {"help_text": "the unit of `ema` and `baseline` (`ms/token`, `x expected`)"},
            "outcome": {"help_text": "empty while open; fault_confirmed, no_fault_found (cut and restored: no fault "
                                     "found), operator or retired once ended"},
            "opened_by": {"help_text": "the transition that opened it (its deciding cause)"},
        }

    def get_cause(self, obj: Incident) -> str:
        from outlier_admin.control.incidents import cause_text

        return cause_text(obj)


class GpuReadingSerializer(serializers.ModelSerializer):
    node = serializers.IntegerField(source="node_id")

    class Meta:
        model = GpuReading
        fields = [
            "id", "node", "at", "gpu", "uuid", "model_name", "hostname", "temperature_c", "sm_clock_mhz",
            "throttle_reasons", "pcie_link_gen", "pcie_link_width", "pcie_replay_count", "ecc_sbe", "ecc_dbe",
            "xid", "power_w", "fb_used_mib", "faults",
        ]


class AuditEventSerializer(serializers.ModelSerializer):
    group = serializers.SerializerMethodField()
    node = serializers.SerializerMethodField()

    class Meta:
        model = AuditEvent
        fields = ["id", "at", "actor", "action", "group", "node", "reason", "detail"]

    def get_group(self, obj: AuditEvent) -> str | None:
        return obj.group.name if obj.group_id else None

    def get_node(self, obj: AuditEvent) -> dict[str, Any] | None:
        return {"id": obj.node_id, "name": obj.node.name} if obj.node_id else None


class TimelinePointSerializer(serializers.Serializer):
    at = serializers.DateTimeField()
    ema = serializers.FloatField(allow_null=True)
    z = serializers.FloatField(allow_null=True)
    p50 = serializers.FloatField(allow_null=True)
    p99 = serializers.FloatField(allow_null=True)
    weight = serializers.FloatField()
    samples = serializers.IntegerField()
    state = serializers.CharField()
    evidence = serializers.FloatField(
        allow_null=True, help_text="The node's CUSUM of per-request excess over degrade_materiality (sd), "
        "which gates a weight cut; recorded on the signal the detector decides on, null on the others.")


class BaselinePointSerializer(serializers.Serializer):
    """The detector's peer baseline of the node's group (``Z = (EMA - baseline) / spread``)."""

    at = serializers.DateTimeField()
    baseline = serializers.FloatField(allow_null=True)
    spread = serializers.FloatField(allow_null=True)
    peers = serializers.IntegerField()
