"""Keep ingest's rows bounded: GPU readings for ``HISTORY_KEEP_DAYS`` (as long as the node history
they explain, :mod:`outlier_admin.control.retention`), rejected input for ``INGEST_REJECTED_KEEP_DAYS``
(30 by default, like the history: a month to find when a gateway started sending what).

Portable ORM only (runs on SQLite for the demo).
"""

from __future__ import annotations

from datetime import timedelta

from django.conf import settings
from django.utils import timezone

from outlier_admin.ingest.models import GpuReading, RejectedInput


def apply_retention(now=None) -> dict[str, int]:
    now = now or timezone.now()
    rejected_cut = now - timedelta(days=settings.INGEST_REJECTED_KEEP_DAYS)
    rejected = RejectedInput.objects.filter(received_at__lt=rejected_cut).delete()[0]
    gpu = GpuReading.objects.filter(at__lt=now - timedelta(days=settings.HISTORY_KEEP_DAYS)).delete()[0]
    return {"rejected_dropped": rejected, "gpu_dropped": gpu}
