"""Observability: ``/metrics`` (Prometheus), ``/healthz``, ``/readyz``, alert webhooks and JSON logs.

- :mod:`.metrics` — every series is named ``outlier_*``; fleet gauges are read from the database and
  Redis at scrape time, event counters/histograms are recorded by :mod:`.hooks` (multi-process safe).
- :mod:`.hooks` — the functions the pipeline calls after a tick / an ingest batch.
- :mod:`.events` — the event scan: new transitions and audit events as structured log lines (an
  outbox read with cursors, so nothing is logged twice), then the alerts brought up to date.
- :mod:`.alerts` — the alerts that hold now (level-triggered: re-sent to Alertmanager every
  ``ALERT_RESEND_S``, resolved with the labels they fired with) and their delivery to Alertmanager
  and JSON webhooks.
- :mod:`.health` — database and Redis checks; :mod:`.logconfig` — the JSON log formatter.
"""
