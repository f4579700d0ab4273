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

from outlier_admin.control.models import AuditEvent, CanaryProbe, Override, QuarantineProposal, Transition
from outlier_admin.fleet.models import ModelGroup, Node, Policy, ThresholdChange
from outlier_admin.ingest.models import GpuReading


class GroupSerializer(serializers.ModelSerializer):
    node_count = serializers.SerializerMethodField()
    state_counts = serializers.SerializerMethodField()

    class Meta:
        model = ModelGroup
        fields = [
            "id", "name", "model_name", "hardware_class", "tensor_parallel_size", "policy",
            "thresholds_version", "weights_version", "last_tick_at", "created_at", "node_count", "state_counts",
        ]

    def _counts(self, obj: ModelGroup) -> dict[str, int]:
        counts = self.context.get("state_counts", {})
        return dict(counts.get(obj.pk, {}))

    def get_node_count(self, obj: ModelGroup) -> int:
        return sum(self._counts(obj).values())

    @extend_schema_field({"type": "object", "additionalProperties": {"type": "integer"}})
    def get_state_counts(self, obj: ModelGroup) -> dict[str, int]:
        return self._counts(obj)


class NodeSerializer(serializers.ModelSerializer):
    group = serializers.SlugRelatedField(slug_field="name", read_only=True)
    ema = serializers.FloatField(source="latest_ema", read_only=True, default=None, allow_null=True)
    z = serializers.FloatField(source="latest_z", read_only=True, default=None, allow_null=True)
    p50 = serializers.FloatField(source="latest_p50", read_only=True, default=None, allow_null=True)
    p99 = serializers.FloatField(source="latest_p99", read_only=True, default=None, allow_null=True)
    samples = serializers.IntegerField(source="latest_samples", read_only=True, default=None, allow_null=True)

    class Meta:
        model = Node
        fields = [
            "id", "name", "address", "group", "state", "weight", "base_weight", "last_seen", "ema", "z",
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
    reason = serializers.CharField(help_text="Why (goes into the audit log)")


class ThresholdPreviewSerializer(serializers.Serializer):
    changes = ThresholdChangesField()
    window_s = serializers.FloatField(default=3600.0, min_value=60.0, max_value=86400.0)


class PolicySerializer(serializers.Serializer):
    policy = serializers.ChoiceField(choices=Policy.choices)
    reason = serializers.CharField()


class ReasonSerializer(serializers.Serializer):
    reason = serializers.CharField(help_text="Why (goes into the audit log)")


class OverrideInputSerializer(ReasonSerializer):
    expires_in_s = serializers.FloatField(required=False, allow_null=True, default=None,
                                          help_text="Optional expiry in seconds, (0, 2592000]")


class PinInputSerializer(OverrideInputSerializer):
    weight = serializers.IntegerField(help_text="0 .. 10 x the node's base weight")


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


class ProposalSerializer(serializers.ModelSerializer):
    node = serializers.IntegerField(source="node_id")
    node_name = serializers.CharField(source="node.name")
    group = serializers.CharField(source="group.name")

    class Meta:
        model = QuarantineProposal
        fields = [
            "id", "created_at", "group", "node", "node_name", "source", "reason", "evidence", "status",
            "decided_at", "decided_actor", "decision_reason", "applied_at",
        ]


class OverrideSerializer(serializers.ModelSerializer):
    node = serializers.IntegerField(source="node_id")
    node_name = serializers.CharField(source="node.name")

    class Meta:
        model = Override
        fields = ["id", "node", "node_name", "kind", "weight", "reason", "actor", "created_at", "expires_at",
                  "applied_at"]


class ProbeSerializer(serializers.ModelSerializer):
    node = serializers.IntegerField(source="node_id")
    node_name = serializers.CharField(source="node.name")

    class Meta:
        model = CanaryProbe
        fields = ["id", "node", "node_name", "at", "ok", "status", "total_ms", "ttft_ms", "prompt_tokens",
                  "completion_tokens", "normalised_latency", "error", "passed", "applied_at"]


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
