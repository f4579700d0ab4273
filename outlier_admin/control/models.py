"""Control: what the detector decided (history, transitions), what humans decided (proposals,
overrides), canary probes, and the audit trail.

Operator decisions (overrides, proposal decisions) and canary results are written here by
:mod:`outlier_admin.control.actions` / the canary task with ``applied_at = NULL``; the next tick of
the group applies them to the detector state (the tick is the only writer of that state) and sets
``applied_at``, the ``outcome`` (applied / failed and why) and the transition the input caused. So an
action takes effect within one tick interval, and its row says whether it did. A rejected proposal
starts a :class:`Silence` of its node and cause.
"""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.db import models
from django.utils import timezone

from outlier_admin.fleet.models import ModelGroup, Node


class NodeHistory(models.Model):
    """Per node and signal: one row per tick at a bounded cadence, and on every transition.

    Bulk-inserted by the tick; ``retention`` downsamples old rows. ``z``/``p50``/``p99``/``ema`` are
    on the normalised scale of the signal (NaN from the detector is stored as NULL). ``evidence`` (the
    node's CUSUM that gates a weight cut, :mod:`detector.evidence`) is on the row of the group's
    deciding signal, NULL on the others. ``deciding``: this row's signal is the one the detector
    judged the node on at that tick (``Evaluation.deciding``: its Z weighs, ranks and ejects the
    node); no row of a write has it when the node had no Z on any signal.
    """

    node = models.ForeignKey(Node, on_delete=models.CASCADE, related_name="history")
    signal = models.CharField(max_length=16)
    at = models.DateTimeField()
    ema = models.FloatField(null=True)
    z = models.FloatField(null=True)
    p50 = models.FloatField(null=True)
    p99 = models.FloatField(null=True)
    samples = models.BigIntegerField(default=0)
    weight = models.FloatField(default=0)
    state = models.CharField(max_length=32)
    evidence = models.FloatField(null=True)
    # A database default too: rows written by SQL that predates the column (benchmarks' COPY) stay valid.
    deciding = models.BooleanField(default=False, db_default=False)
    downsampled = models.BooleanField(default=False)

    class Meta:
        ordering = ["node", "signal", "at"]
        indexes = [
            models.Index(fields=["node", "signal", "at"], name="history_node_signal_at"),
            models.Index(fields=["at"], name="history_at"),
        ]


class GroupBaseline(models.Model):
    """The detector's peer baseline of a group for one signal at one tick: what every node's Z was
    measured against (``Z = (EMA - baseline) / spread``).

    Written by the tick together with the node history (same cadence, same transaction), so charts
    and the threshold preview show the real baseline instead of re-estimating it from peers.
    ``baseline``/``spread`` are NULL when the detector had too few peers to compute them (NaN);
    ``peers`` is the number of nodes the baseline was taken over. ``retention`` thins these rows
    like :class:`NodeHistory`.
    """

    group = models.ForeignKey(ModelGroup, on_delete=models.CASCADE, related_name="baselines")
    signal = models.CharField(max_length=16)
    at = models.DateTimeField()
    baseline = models.FloatField(null=True)
    spread = models.FloatField(null=True)
    peers = models.IntegerField(default=0)
    downsampled = models.BooleanField(default=False)

    class Meta:
        ordering = ["group", "signal", "at"]
        indexes = [
            models.Index(fields=["group", "signal", "at"], name="baseline_group_signal_at"),
            models.Index(fields=["at"], name="baseline_at"),
        ]


class Transition(models.Model):
    """A state change of a node with its explanation (the detector's evidence at that moment)."""

    group = models.ForeignKey(ModelGroup, on_delete=models.CASCADE, related_name="transitions")
    node = models.ForeignKey(Node, on_delete=models.CASCADE, related_name="transitions")
    at = models.DateTimeField(db_index=True)
    from_state = models.CharField(max_length=32)
    to_state = models.CharField(max_length=32)
    reason = models.CharField(max_length=64)
    signal = models.CharField(max_length=16, blank=True, default="")
    z = models.FloatField(null=True)
    baseline = models.FloatField(null=True)
    spread = models.FloatField(null=True)
    ema = models.FloatField(null=True)
    p50 = models.FloatField(null=True)
    p99 = models.FloatField(null=True)
    samples = models.BigIntegerField(default=0)
    # Full explanation: the detector's Transition.to_dict(), the thresholds in force, the group
    # policy, whether it was published (shadow: recorded, not published), GPU evidence if any.
    explanation = models.JSONField(default=dict)
    shadow = models.BooleanField(default=False)

    class Meta:
        ordering = ["-at"]
        indexes = [models.Index(fields=["node", "-at"], name="transition_node_at")]


class ProposalStatus(models.TextChoices):
    PENDING = "pending"
    APPROVED = "approved"
    REJECTED = "rejected"
    SUPERSEDED = "superseded"


class ProposalSource(models.TextChoices):
    DETECTOR = "detector", "latency outlier (policy approval)"
    GPU_FAULT = "gpu_fault", "GPU hard fault (DCGM)"


class Outcome(models.TextChoices):
    """What the tick did with an operator input (an override, a decided proposal): ``applied`` when
    the detector took it (``transition`` links the state change it caused, NULL when it moved no
    state, e.g. a pin), ``failed`` with ``outcome_reason`` when it could not (an illegal edge, a node
    no longer in the detector). NULL until a tick applied the row."""

    APPLIED = "applied"
    FAILED = "failed"


class QuarantineProposal(models.Model):
    """A quarantine waiting for a human decision.

    ``superseded``: a detector proposal whose condition cleared (or whose node left
    ``pending_approval`` by another way) before anyone decided; it cannot be approved any more.
    """

    group = models.ForeignKey(ModelGroup, on_delete=models.CASCADE, related_name="proposals")
    node = models.ForeignKey(Node, on_delete=models.CASCADE, related_name="proposals")
    created_at = models.DateTimeField(default=timezone.now, db_index=True)
    source = models.CharField(max_length=16, choices=ProposalSource.choices)
    reason = models.CharField(max_length=200)
    evidence = models.JSONField(default=dict)
    status = models.CharField(max_length=16, choices=ProposalStatus.choices, default=ProposalStatus.PENDING)
    decided_at = models.DateTimeField(null=True, blank=True)
    decided_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL)
    decided_actor = models.CharField(max_length=150, blank=True, default="")
    decision_reason = models.TextField(blank=True, default="")
    applied_at = models.DateTimeField(null=True, blank=True)
    outcome = models.CharField(max_length=16, choices=Outcome.choices, null=True, blank=True)
    outcome_reason = models.CharField(max_length=300, blank=True, default="")
    transition = models.ForeignKey("Transition", null=True, blank=True, on_delete=models.SET_NULL,
                                   related_name="+")

    class Meta:
        ordering = ["-created_at"]
        indexes = [models.Index(fields=["status", "applied_at"], name="proposal_status_applied")]


class OverrideKind(models.TextChoices):
    QUARANTINE = "quarantine", "force quarantine"
    ACTIVATE = "activate", "force active (never quarantine)"
    RELEASE = "release", "release (clear forced state, back to service)"
    PIN = "pin", "pin weight"
    UNPIN = "unpin", "unpin weight"


class Override(models.Model):
    """A manual decision about one node. ``expires_at``: the detector drops it at that time."""

    node = models.ForeignKey(Node, on_delete=models.CASCADE, related_name="overrides")
    kind = models.CharField(max_length=16, choices=OverrideKind.choices)
    weight = models.PositiveIntegerField(null=True, blank=True)
    reason = models.TextField()
    actor = models.CharField(max_length=150)
    user = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL)
    created_at = models.DateTimeField(default=timezone.now, db_index=True)
    expires_at = models.DateTimeField(null=True, blank=True)
    applied_at = models.DateTimeField(null=True, blank=True)
    outcome = models.CharField(max_length=16, choices=Outcome.choices, null=True, blank=True)
    outcome_reason = models.CharField(max_length=300, blank=True, default="")
    transition = models.ForeignKey("Transition", null=True, blank=True, on_delete=models.SET_NULL,
                                   related_name="+")

    class Meta:
        ordering = ["-created_at"]
        indexes = [models.Index(fields=["applied_at"], name="override_applied")]


class SilenceQuerySet(models.QuerySet):
    def active(self, now: Any = None) -> SilenceQuerySet:
        """Silences in force at ``now`` (default: the database's now)."""
        return self.filter(expires_at__gt=now or timezone.now())


class Silence(models.Model):
    """No new quarantine proposal for ``node`` and ``cause`` (a :class:`ProposalSource`) until
    ``expires_at``: created by rejecting a proposal (the operator said "not this, not now"), so the
    same counters or the same slow node do not propose it again every few seconds. Expiring it early
    moves ``expires_at`` to that moment (``expired_by`` says who)."""

    objects = SilenceQuerySet.as_manager()

    node = models.ForeignKey(Node, on_delete=models.CASCADE, related_name="silences")
    cause = models.CharField(max_length=16, choices=ProposalSource.choices)
    created_at = models.DateTimeField(default=timezone.now)
    expires_at = models.DateTimeField(db_index=True)
    actor = models.CharField(max_length=150)
    user = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL)
    reason = models.TextField()
    proposal = models.ForeignKey(QuarantineProposal, null=True, blank=True, on_delete=models.SET_NULL,
                                 related_name="silences")
    expired_by = models.CharField(max_length=150, blank=True, default="")

    class Meta:
        ordering = ["-created_at"]
        indexes = [models.Index(fields=["node", "cause", "expires_at"], name="silence_node_cause_expiry")]

    def is_active(self, now: Any = None) -> bool:
        return self.expires_at > (now or timezone.now())


class CanaryProbe(models.Model):
    """One synthetic request to a quarantined/probing node. ``passed`` is the detector's verdict
    (NULL until the next tick fed it to the state machine)."""

    node = models.ForeignKey(Node, on_delete=models.CASCADE, related_name="probes")
    at = models.DateTimeField(default=timezone.now, db_index=True)
    ok = models.BooleanField(help_text="HTTP 2xx with a completion")
    status = models.IntegerField(default=0, help_text="HTTP status; 0 = connection error / timeout")
    total_ms = models.FloatField(null=True)
    ttft_ms = models.FloatField(null=True)
    prompt_tokens = models.IntegerField(default=0)
    completion_tokens = models.IntegerField(default=0)
    normalised_latency = models.FloatField(null=True, help_text="latency on the scale the detector judged it (norm signal); set by the judging tick")
    limit = models.FloatField(null=True, help_text="the pass limit it was judged against, on the same scale "
                              "(detector.canary.probe_limit); set by the judging tick")
    error = models.TextField(blank=True, default="")
    passed = models.BooleanField(null=True)
    applied_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-at"]


class IncidentOutcome(models.TextChoices):
    """How an incident ended (:mod:`outlier_admin.control.incidents` defines each)."""

    FAULT_CONFIRMED = "fault_confirmed", "fault confirmed"
    NO_FAULT_FOUND = "no_fault_found", "cut and restored: no fault found"
    OPERATOR = "operator", "returned to service by an operator"
    RETIRED = "retired", "node retired"


class Incident(models.Model):
    """A node's episode out of full service: from its first cut or quarantine to the end of its
    restore (:mod:`outlier_admin.control.incidents`: when one opens and closes, its cause, its
    outcome). Opened and closed by the writer of the transitions, in the same statement's
    transaction; everything that happened to the node in ``[started_at, ended_at]`` (transitions,
    probes, overrides, proposals) is the incident's.

    The deciding cause is copied from the transition that opened it: ``reason``, ``signal``, ``z``,
    the node's ``ema`` against the peers' ``baseline`` (both in ``unit``)."""

    group = models.ForeignKey(ModelGroup, on_delete=models.CASCADE, related_name="incidents")
    node = models.ForeignKey(Node, on_delete=models.CASCADE, related_name="incidents")
    started_at = models.DateTimeField(db_index=True)
    ended_at = models.DateTimeField(null=True, blank=True, db_index=True)
    opened_by = models.ForeignKey(Transition, null=True, on_delete=models.SET_NULL, related_name="+")
    closed_by = models.ForeignKey(Transition, null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    first_state = models.CharField(max_length=32)
    worst_state = models.CharField(max_length=32)
    reason = models.CharField(max_length=64)
    signal = models.CharField(max_length=16, blank=True, default="")
    unit = models.CharField(max_length=16, blank=True, default="")
    z = models.FloatField(null=True)
    ema = models.FloatField(null=True)
    baseline = models.FloatField(null=True)
    detail = models.TextField(blank=True, default="")
    quarantined_at = models.DateTimeField(null=True, blank=True)
    probes_failed = models.IntegerField(default=0)
    restore_steps_failed = models.IntegerField(default=0)
    outcome = models.CharField(max_length=16, choices=IncidentOutcome.choices, blank=True, default="")

    class Meta:
        ordering = ["-started_at", "-pk"]
        indexes = [models.Index(fields=["node", "-started_at"], name="incident_node_started")]
        constraints = [models.UniqueConstraint(fields=["node"], condition=models.Q(ended_at__isnull=True),
                                               name="one_open_incident_per_node")]

    @property
    def is_open(self) -> bool:
        return self.ended_at is None


class AuditLogIsAppendOnly(PermissionError):
    """Raised on any attempt to change or remove an audit event from the application."""


class AuditEventQuerySet(models.QuerySet):
    """Reads and inserts only: bulk ``update()`` / ``delete()`` raise :class:`AuditLogIsAppendOnly`.

    (Django's deletion collector uses the plain base manager, so deleting a user, group or node still
    sets the audit rows' foreign key to NULL as declared: the event text stays.)
    """

    def update(self, **kwargs: Any) -> int:
        raise AuditLogIsAppendOnly("the audit log is append-only: audit events cannot be updated")

    def delete(self) -> tuple[int, dict[str, int]]:
        raise AuditLogIsAppendOnly("the audit log is append-only: audit events cannot be deleted")


class AuditEvent(models.Model):
    """Every state change made by a person or a token, written in the same transaction as the change.

    Append-only from the application's point of view: ``save()`` of an existing row, ``delete()``
    and the queryset's ``update()`` / ``delete()`` raise :class:`AuditLogIsAppendOnly`.
    """

    objects = AuditEventQuerySet.as_manager()

    at = models.DateTimeField(default=timezone.now, db_index=True)
    actor = models.CharField(max_length=150)
    user = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL)
    action = models.CharField(max_length=64, db_index=True)
    group = models.ForeignKey(ModelGroup, null=True, blank=True, on_delete=models.SET_NULL)
    node = models.ForeignKey(Node, null=True, blank=True, on_delete=models.SET_NULL)
    reason = models.TextField(blank=True, default="")
    detail = models.JSONField(default=dict)

    class Meta:
        ordering = ["-at"]

    def save(self, *args: Any, **kwargs: Any) -> None:
        # A row that exists is never written again (a pk alone is not enough: tests and fixtures may
        # insert with an explicit pk, so ask the ORM whether this instance was loaded).
        if not self._state.adding:
            raise AuditLogIsAppendOnly("the audit log is append-only: audit events cannot be updated")
        kwargs["force_insert"] = True
        super().save(*args, **kwargs)

    def delete(self, *args: Any, **kwargs: Any) -> tuple[int, dict[str, int]]:
        raise AuditLogIsAppendOnly("the audit log is append-only: audit events cannot be deleted")
