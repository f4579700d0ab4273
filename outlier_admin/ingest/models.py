"""Ingest: where observations come from, what was refused, and GPU health readings."""

from __future__ import annotations

from django.db import models
from django.utils import timezone

from outlier_admin.fleet.models import ModelGroup, Node


class SourceKind(models.TextChoices):
    HTTP = "http", "HTTP push"
    LOG = "log", "gateway access log file"
    DCGM = "dcgm", "dcgm-exporter scrape"


class IngestSource(models.Model):
    """A configured source. For ``log`` sources ``location`` is a file path and ``log_format`` one of
    :data:`contract.logformats.FORMATS`; records without a group go to ``default_group``."""

    name = models.SlugField(max_length=100, unique=True)
    kind = models.CharField(max_length=8, choices=SourceKind.choices)
    location = models.CharField(max_length=500, blank=True, default="")
    log_format = models.CharField(max_length=32, blank=True, default="")
    default_group = models.ForeignKey(ModelGroup, null=True, blank=True, on_delete=models.SET_NULL)
    enabled = models.BooleanField(default=True)
    created_at = models.DateTimeField(default=timezone.now)
    last_ok_at = models.DateTimeField(null=True, blank=True)
    last_error = models.TextField(blank=True, default="")
    accepted_total = models.BigIntegerField(default=0)
    rejected_total = models.BigIntegerField(default=0)
    node_map = models.JSONField(
        default=dict, blank=True,
        help_text="upstream as logged (HAProxy: backend/server) -> node address; '*': the node of lines "
                  "that name no upstream",
    )

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return f"{self.name} ({self.kind})"


class Checkpoint(models.Model):
    """Where a log tailer stopped: the file identity (device, inode) and the byte offset after the
    last complete line. A different inode means rotation; a size below the offset means truncation."""

    source = models.OneToOneField(IngestSource, on_delete=models.CASCADE, related_name="checkpoint")
    path = models.CharField(max_length=500)
    device = models.BigIntegerField(default=0)
    inode = models.BigIntegerField(default=0)
    offset = models.BigIntegerField(default=0)
    updated_at = models.DateTimeField(default=timezone.now)


class RejectedInput(models.Model):
    """Input we refused, kept verbatim with a machine-readable reason (nothing is silently dropped).

    A row is a sample that stands for ``count`` refusals of its reason and source: ingest keeps a few
    samples per reason and batch, and past a source's hourly budget adds to the newest row's count
    (:mod:`outlier_admin.ingest.pipeline`). Counts by reason sum ``count``, never rows."""

    received_at = models.DateTimeField(default=timezone.now, db_index=True)
    source = models.CharField(max_length=100, help_text="http:<token name>, log:<source>, dcgm:<node>")
    source_ref = models.ForeignKey(IngestSource, null=True, blank=True, on_delete=models.SET_NULL)
    line = models.IntegerField(null=True, blank=True)
    reason = models.CharField(max_length=64, db_index=True)
    looks_like = models.CharField(max_length=32, blank=True, default="",
                                  help_text="the log format the input looks like (a key of logformats.FORMATS)")
    detail = models.TextField(blank=True, default="")
    raw = models.TextField()
    count = models.PositiveBigIntegerField(default=1, help_text="refusals this sample stands for")

    class Meta:
        ordering = ["-received_at"]


class GpuReading(models.Model):
    """One scrape of one GPU of a node (dcgm-exporter). Null: the exporter did not report the field
    (or reported the "not supported" sentinel)."""

    node = models.ForeignKey(Node, on_delete=models.CASCADE, related_name="gpu_readings")
    at = models.DateTimeField(default=timezone.now)
    gpu = models.CharField(max_length=16)
    uuid = models.CharField(max_length=80, blank=True, default="")
    model_name = models.CharField(max_length=100, blank=True, default="")
    hostname = models.CharField(max_length=200, blank=True, default="")
    temperature_c = models.FloatField(null=True, blank=True)
    sm_clock_mhz = models.FloatField(null=True, blank=True)
    throttle_reasons = models.BigIntegerField(null=True, blank=True)
    pcie_link_gen = models.SmallIntegerField(null=True, blank=True)
    pcie_link_width = models.SmallIntegerField(null=True, blank=True)
    pcie_replay_count = models.BigIntegerField(null=True, blank=True)
    ecc_sbe = models.BigIntegerField(null=True, blank=True)
    ecc_dbe = models.BigIntegerField(null=True, blank=True)
    xid = models.IntegerField(null=True, blank=True)
    power_w = models.FloatField(null=True, blank=True)
    fb_used_mib = models.FloatField(null=True, blank=True)
    faults = models.JSONField(default=list, blank=True, help_text="hard-fault codes found in this reading")

    class Meta:
        ordering = ["-at"]
        indexes = [models.Index(fields=["node", "-at"])]
