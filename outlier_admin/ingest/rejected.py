"""What was refused, for people: counts by reason and samples with the raw line (the API's
``/api/v1/rejected-input/`` and the dashboard's "Rejected input" page read these, one owner).

A refusal is counted under ``(reason, looks_like, source)``: the reason code, the log format the
input looks like (a key of ``logformats.FORMATS``; "" for pushed records and scrapes), and where it
came from (``log:<source>``, ``http:<token>``, ``dcgm:<node>``...). The window is bounded
(:data:`MAX_WINDOW`) so one request never counts a month of a noisy source's rows.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from django.db.models import Max, QuerySet, Sum
from django.utils import timezone

from contract.logformats import LABELS
from outlier_admin.ingest.models import RejectedInput

DEFAULT_WINDOW = timedelta(hours=24)
MAX_WINDOW = timedelta(days=30)


def window_start(since: datetime | None, *, now: datetime | None = None) -> datetime:
    """``since`` clamped to the last :data:`MAX_WINDOW`; the last :data:`DEFAULT_WINDOW` when None."""
    now = now or timezone.now()
    if since is None:
        return now - DEFAULT_WINDOW
    return max(since, now - MAX_WINDOW)


def refusal_count(qs: QuerySet[RejectedInput] | None = None) -> int:
    """How many refusals the rows stand for (the sum of their counts, never the number of rows)."""
    qs = RejectedInput.objects.all() if qs is None else qs
    return qs.aggregate(n=Sum("count"))["n"] or 0


def counts_by_reason(since: datetime, qs: QuerySet[RejectedInput] | None = None) -> list[dict[str, Any]]:
    """``[{reason, looks_like, format_label, source, count, last_at, sample_id}]`` of the refusals
    received since ``since``, most frequent first; ``sample_id`` is the newest one of each kind.
    ``count`` adds up the rows' counts (a row is a sample standing for that many refusals)."""
    qs = (RejectedInput.objects.all() if qs is None else qs).filter(received_at__gte=since)
    rows = list(
        qs.values("reason", "looks_like", "source")
        .annotate(count=Sum("count"), last_at=Max("received_at"), sample_id=Max("id"))
        .order_by("-count", "reason", "looks_like", "source")[:500]
    )
    for row in rows:
        row["format_label"] = LABELS.get(row["looks_like"], "")
    return rows
