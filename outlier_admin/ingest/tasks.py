"""Celery tasks of ingest: thin wrappers around plain functions."""

from __future__ import annotations

from celery import shared_task


@shared_task(name="ingest.scrape_all_dcgm", ignore_result=True)
def scrape_all_dcgm() -> int:
    from outlier_admin.ingest.dcgm import scrape_all

    return scrape_all()


@shared_task(name="ingest.scrape_all_metrics", ignore_result=True, expires=5)
def scrape_all_metrics() -> int:
    from outlier_admin.ingest.scraper import scrape_round

    return scrape_round()


@shared_task(name="ingest.tail_all_logs", ignore_result=True)
def tail_all_logs() -> dict[str, int]:
    from outlier_admin.ingest.tailer import tail_all

    return tail_all()


@shared_task(name="ingest.retention", ignore_result=True)
def apply_retention() -> dict[str, int]:
    from outlier_admin.ingest.retention import apply_retention

    return apply_retention()
