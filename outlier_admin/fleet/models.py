"""Fleet: model groups (peers compared with each other), their thresholds, nodes, and API tokens.

Detector node ids: the detector (``detector.GroupDetector``) knows a node by ``Node.name``, a stable
string that is unique inside its group and never changes after registration (it defaults to the
node's address at registration). The address may change (a node re-IP'd) without losing history.
"""

from __future__ import annotations

import hashlib
import secrets
from typing import Any

from django.conf import settings
from django.db import models
from django.utils import timezone

from contract.weights_document import DEFAULT_BASE_WEIGHT
from detector.states import Safeguard
from detector.thresholds import Thresholds


class Policy(models.TextChoices):
    """What the control plane does with the detector's decisions for a group."""

    SHADOW = "shadow", "shadow (decide, record and show; publish base weights)"
    APPROVAL = "approval", "approval (quarantines wait for a human)"
    AUTO = "auto", "auto (quarantine and restore automatically)"


class ModelGroup(models.Model):
    """Nodes serving the same model on the same hardware class: the peers a node is compared with.

    ``threshold_overrides`` holds only the values that differ from :class:`detector.Thresholds`
    defaults, so improving a default in code reaches every group that never touched it.
    ``require_approval`` is not stored: it follows ``policy == "approval"``.
    """

    name = models.CharField(max_length=200, unique=True,
                            help_text="Group id used in records, Redis keys and metrics (fleet.names)")
    # The URL segment (contract.names.group_slug), set once at creation: pages and API routes name a
    # group by it, since a name may hold "/" (a Hugging Face model id).
    slug = models.SlugField(max_length=220, unique=True, help_text="URL segment of the group")
    model_name = models.CharField(max_length=200, blank=True, default="")
    hardware_class = models.CharField(max_length=100, blank=True, default="")
    tensor_parallel_size = models.PositiveSmallIntegerField(default=1)
    policy = models.CharField(max_length=16, choices=Policy.choices, default=Policy.AUTO)
    threshold_overrides = models.JSONField(default=dict, blank=True)
    thresholds_version = models.PositiveIntegerField(default=1)
    # The PCIe link a healthy node of this group runs at; a node below it is a hard fault.
    # Null: learned as the most common link among the group's GPUs.
    pcie_link_gen_norm = models.PositiveSmallIntegerField(null=True, blank=True)
    pcie_link_width_norm = models.PositiveSmallIntegerField(null=True, blank=True)
    # Monotonic version of the published weights document (bumped by every publish).
    weights_version = models.BigIntegerField(default=0)
    # Where a node that first appears in ingest data may be registered from (CIDRs and DNS suffixes,
    # see contract.names). Empty: settings.AUTO_REGISTER_DEFAULT_ALLOW.
    auto_register_allow = models.JSONField(default=list, blank=True)
    last_tick_at = models.DateTimeField(null=True, blank=True)
    # What the last tick decided for the group as a whole (its Evaluation; control.rows.group_figures):
    # the signal it decided on ("" before the first tick, and in seed mode) and the safeguard's figures
    # (detector.states.Safeguard; limit NULL before the first tick). Read by the API and the dashboard.
    decision_signal = models.CharField(max_length=16, blank=True, default="", db_default="")
    safeguard_limit = models.IntegerField(null=True, blank=True)
    safeguard_counted = models.IntegerField(default=0, db_default=0)
    safeguard_held = models.IntegerField(default=0, db_default=0)
    created_at = models.DateTimeField(default=timezone.now)
    created_via = models.CharField(max_length=32, default="manual")
    # Retired for good (control.actions.do_retire_group): its nodes are retired, ingest refuses its
    # records, ticks and scrapes skip it; its history stays.
    retired = models.BooleanField(default=False)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name

    def save(self, *args: Any, **kwargs: Any) -> None:
        """Give a new group its slug (:func:`~contract.names.unique_group_slug`): a name
        that is a slug keeps it; any other name gets a marked slug (``a.b`` -> ``_a-b``) that no
        group's name can be, numbered (``_a-b-2``) when another group already has it."""
        if self._state.adding and not self.slug:  # set once: a URL must not change under its users
            from contract.names import DERIVED_SLUG_MARK, group_slug, unique_group_slug

            base = group_slug(self.name)
            taken = set(ModelGroup.objects.filter(models.Q(slug__startswith=base)
                                                  | models.Q(slug__startswith=DERIVED_SLUG_MARK + base))
                        .values_list("slug", flat=True))
            self.slug = unique_group_slug(self.name, taken)
        super().save(*args, **kwargs)

    def safeguard(self) -> Safeguard | None:
        """The safeguard as the last tick left it (None before the first tick)."""
        if self.safeguard_limit is None:
            return None
        return Safeguard(limit=self.safeguard_limit, counted=self.safeguard_counted, held=self.safeguard_held)

    def thresholds(self) -> Thresholds:
        """The effective, validated thresholds: defaults + overrides + the policy's approval flag."""
        data = {**Thresholds().to_dict(), **self.threshold_overrides}
        data["require_approval"] = self.policy == Policy.APPROVAL
        return Thresholds.from_dict(data)

    @staticmethod
    def overrides_from(thresholds: Thresholds) -> dict[str, Any]:
        """The values of ``thresholds`` that differ from the defaults (what we store)."""
        defaults = Thresholds().to_dict()
        return {
            k: v
            for k, v in thresholds.to_dict().items()
            if k != "require_approval" and defaults.get(k) != v
        }


class ThresholdChange(models.Model):
    """One version of a group's thresholds: who changed what, when, old -> new."""

    group = models.ForeignKey(ModelGroup, on_delete=models.CASCADE, related_name="threshold_changes")
    version = models.PositiveIntegerField()
    changed_at = models.DateTimeField(default=timezone.now)
    actor = models.CharField(max_length=150)
    user = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL)
    old = models.JSONField(default=dict)
    new = models.JSONField(default=dict)
    diff = models.JSONField(default=dict, help_text='{"field": [old, new], ...}')
    reason = models.TextField(blank=True, default="")

    class Meta:
        ordering = ["group", "-version"]
        constraints = [models.UniqueConstraint(fields=["group", "version"], name="uniq_threshold_version")]


class RegisteredVia(models.TextChoices):
    MANUAL = "manual"
    INGEST = "ingest"
    LOGS = "logs"
    API = "api"


class Node(models.Model):
    """One inference server (one replica of the model; a TP group of GPUs counts as one node).

    ``state`` and ``weight`` mirror the last published decision (labels of
    :class:`detector.NodeState`); the source of truth while running is the detector state in Redis.
    """

    group = models.ForeignKey(ModelGroup, on_delete=models.CASCADE, related_name="nodes")
    name = models.CharField(max_length=200, help_text="Stable id inside the group; the detector's node id")
    address = models.CharField(
        max_length=300, help_text="host:port or http(s)://host:port of the OpenAI-compatible server"
    )
    base_weight = models.PositiveIntegerField(default=DEFAULT_BASE_WEIGHT)
    labels = models.JSONField(default=dict, blank=True)
    state = models.CharField(max_length=32, default="warming")
    weight = models.PositiveIntegerField(default=0)
    last_seen = models.DateTimeField(null=True, blank=True)
    registered_via = models.CharField(max_length=16, choices=RegisteredVia.choices, default=RegisteredVia.MANUAL)
    registered_at = models.DateTimeField(default=timezone.now)
    # dcgm-exporter endpoint (http://host:9400/metrics); empty: not scraped.
    dcgm_url = models.CharField(max_length=300, blank=True, default="")
    # Model server metrics endpoint (vLLM / SGLang, http://host:8000/metrics); empty: not scraped.
    # Its inter-token-latency histogram streams the node's decode time between completions.
    metrics_url = models.CharField(max_length=300, blank=True, default="")
    # Latest GPU evidence summary (per GPU), written by the DCGM scrape; see ingest.GpuReading.
    gpu_evidence = models.JSONField(default=dict, blank=True)
    retired = models.BooleanField(default=False)

    class Meta:
        ordering = ["group", "name"]
        constraints = [
            models.UniqueConstraint(fields=["group", "name"], name="uniq_node_name_in_group"),
        ]
        indexes = [models.Index(fields=["address"])]

    def __str__(self) -> str:
        return f"{self.group.name}/{self.name}"

    @property
    def base_url(self) -> str:
        """``scheme://host:port`` of the node's OpenAI-compatible API, rebuilt from the validated
        address (never the stored text as is); raises ``NameError_`` for an invalid address."""
        from contract.names import parse_address

        return parse_address(self.address).base_url


class TokenScope(models.TextChoices):
    INGEST = "ingest"
    API = "api"


class ApiToken(models.Model):
    """A bearer token. Only its SHA-256 is stored; the plaintext is shown once at creation.

    Tokens are random (256 bits), so a fast hash is enough (no password stretching needed).
    """

    name = models.CharField(max_length=100)
    scope = models.CharField(max_length=16, choices=TokenScope.choices)
    token_hash = models.CharField(max_length=64, unique=True)
    prefix = models.CharField(max_length=12, help_text="First characters, to recognise a token in lists")
    user = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.CASCADE)
    created_at = models.DateTimeField(default=timezone.now)
    last_used_at = models.DateTimeField(null=True, blank=True)
    revoked_at = models.DateTimeField(null=True, blank=True)
    # The groups an ingest token may push records for (group names, fleet.names); empty: every group.
    # Names, not foreign keys: deleting a group must never widen a token to every group.
    ingest_groups = models.JSONField(
        default=list, blank=True,
        help_text="ingest tokens: the group names it may push records for; empty = any group",
    )

    PREFIX = "oa_"

    class Meta:
        ordering = ["-created_at"]

    def __str__(self) -> str:
        return f"{self.name} ({self.scope}, {self.prefix}...)"

    @staticmethod
    def hash(plaintext: str) -> str:
        return hashlib.sha256(plaintext.encode("utf-8")).hexdigest()

    @classmethod
    def issue(cls, *, name: str, scope: str, user: Any = None,
              ingest_groups: list[str] | None = None) -> tuple[ApiToken, str]:
        """Create a token; returns ``(row, plaintext)``. The plaintext is not recoverable later.
        ``ingest_groups``: the groups an ingest token may push for (validated by the caller,
        :func:`~outlier_admin.control.actions.do_create_token`)."""
        if scope not in TokenScope.values:
            raise ValueError(f"scope must be one of {TokenScope.values}, got {scope!r}")
        if ingest_groups and scope != TokenScope.INGEST:
            raise ValueError("only an ingest token is scoped to groups (an API token acts as its user)")
        plaintext = cls.PREFIX + secrets.token_urlsafe(32)
        row = cls.objects.create(
            name=name, scope=scope, token_hash=cls.hash(plaintext), prefix=plaintext[:10], user=user,
            ingest_groups=sorted(set(ingest_groups or ())),
        )
        return row, plaintext

    def group_scope(self) -> frozenset[str] | None:
        """The groups this token may push records for; None: any group (an unscoped token)."""
        return frozenset(self.ingest_groups) if self.ingest_groups else None

    @property
    def is_active(self) -> bool:
        return self.revoked_at is None
