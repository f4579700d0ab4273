"""Keep node history bounded: raw rows for ``HISTORY_RAW_DAYS``, then one row per node, signal and
hour (the hour's last row, marked ``downsampled``) until ``HISTORY_KEEP_DAYS``, then nothing.
Rejected input and GPU readings are kept ``HISTORY_KEEP_DAYS``.

Portable ORM only (runs on SQLite for the demo).
"""

from __future__ import annotations

from datetime import timedelta

from django.conf import settings
from django.db.models import Max
from django.db.models.functions import TruncHour
from django.utils import timezone

from outlier_admin.control.models import NodeHistory
from outlier_admin.ingest.models import GpuReading, RejectedInput


def apply_retention(now=None) -> dict[str, int]:
    now = now or timezone.now()
    raw_cut = now - timedelta(days=settings.HISTORY_RAW_DAYS)
    keep_cut = now - timedelta(days=settings.HISTORY_KEEP_DAYS)
    dropped = NodeHistory.objects.filter(at__lt=keep_cut).delete()[0]
    old = NodeHistory.objects.filter(at__lt=raw_cut, downsampled=False)
    keep_ids = list(
        old.annotate(hour=TruncHour("at"))
        .values("node_id", "signal", "hour")
        .annotate(last=Max("id"))
        .values_list("last", flat=True)
    )
    thinned = old.exclude(id__in=keep_ids).delete()[0]
    NodeHistory.objects.filter(id__in=keep_ids).update(downsampled=True)
    rejected = RejectedInput.objects.filter(received_at__lt=keep_cut).delete()[0]
    gpu = GpuReading.objects.filter(at__lt=keep_cut).delete()[0]
    return {"history_dropped": dropped, "history_thinned": thinned, "rejected_dropped": rejected,
            "gpu_dropped": gpu}
