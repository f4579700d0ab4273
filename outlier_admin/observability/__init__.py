"""Observability: ``/metrics`` (Prometheus), ``/healthz``, ``/readyz``, alert webhooks and JSON logs.

- :mod:`.metrics` — every series is named ``outlier_*``; fleet gauges are read from the database and
  Redis at scrape time, event counters/histograms are recorded by :mod:`.hooks` (multi-process safe).
- :mod:`.hooks` — the functions the pipeline calls after a tick / an ingest batch.
- :mod:`.events` — turns new transitions, audit events, proposals and safeguard edges into
  structured log lines and alerts (an outbox scan with a cursor, so nothing is sent twice).
- :mod:`.alerts` — Alertmanager and generic JSON webhook delivery.
- :mod:`.health` — database and Redis checks; :mod:`.logconfig` — the JSON log formatter.
"""
