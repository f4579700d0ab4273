"""Keep node history bounded: raw rows for ``HISTORY_RAW_DAYS``, then one row per node, signal and
hour (the hour's last row, marked ``downsampled``) until ``HISTORY_KEEP_DAYS``, then nothing. Group
baselines (one row per group and signal) are thinned the same way, per group, signal and hour.
Ingest's own rows (GPU readings, rejected input) are kept by :mod:`outlier_admin.ingest.retention`.

Portable ORM only (runs on SQLite for the demo).
"""

from __future__ import annotations

from datetime import timedelta

from django.conf import settings
from django.db.models import Max
from django.db.models.functions import TruncHour
from django.utils import timezone

from outlier_admin.control.models import GroupBaseline, NodeHistory


def _thin(model: type[NodeHistory] | type[GroupBaseline], owner: str, raw_cut, keep_cut) -> tuple[int, int]:
    """Drop ``model`` rows older than ``keep_cut``; older than ``raw_cut``, keep the last row per
    ``owner`` (node or group), signal and hour. Returns ``(dropped, thinned)``."""
    dropped = model.objects.filter(at__lt=keep_cut).delete()[0]
    old = model.objects.filter(at__lt=raw_cut, downsampled=False)
    keep_ids = list(
        old.annotate(hour=TruncHour("at"))
        .values(owner, "signal", "hour")
        .annotate(last=Max("id"))
        .values_list("last", flat=True)
    )
    thinned = old.exclude(id__in=keep_ids).delete()[0]
    model.objects.filter(id__in=keep_ids).update(downsampled=True)
    return dropped, thinned


def apply_retention(now=None) -> dict[str, int]:
    now = now or timezone.now()
    raw_cut = now - timedelta(days=settings.HISTORY_RAW_DAYS)
    keep_cut = now - timedelta(days=settings.HISTORY_KEEP_DAYS)
    dropped, thinned = _thin(NodeHistory, "node_id", raw_cut, keep_cut)
    baseline_dropped, baseline_thinned = _thin(GroupBaseline, "group_id", raw_cut, keep_cut)
    return {"history_dropped": dropped, "history_thinned": thinned, "baseline_dropped": baseline_dropped,
            "baseline_thinned": baseline_thinned}
