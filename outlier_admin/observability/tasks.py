"""Celery task of the observability app (thin: the logic is in :mod:`.events`)."""

from __future__ import annotations

from celery import shared_task


@shared_task(name="observability.scan_events", ignore_result=True)
def scan_events_task() -> dict:
    from outlier_admin.observability.events import scan_events

    res = scan_events()
    return {"transitions": res.transitions, "audits": res.audits, "alerts": len(res.alerts), "skipped": res.skipped}
