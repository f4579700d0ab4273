"""Celery app: ``celery -A outlier_admin worker --beat`` runs every periodic task.

Broker: ``CELERY_BROKER_URL`` or ``REDIS_URL``. Periodic tasks (see README "Entry points"):
ticks of every group (``TICK_INTERVAL_MS``), canary probes (1 s), DCGM scrapes
(``DCGM_SCRAPE_INTERVAL_S``), log tailing (``LOG_TAIL_INTERVAL_S``), retention (hourly). The beat's
tick task enqueues nothing while event-driven tickers (``manage.py run_ticker``) are alive.
"""

from __future__ import annotations

import os

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "outlier_admin.settings")

app = Celery("outlier_admin")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks(["outlier_admin.control", "outlier_admin.ingest", "outlier_admin.observability"])

