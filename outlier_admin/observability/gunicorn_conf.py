"""gunicorn settings for the web service: ``gunicorn -c python:outlier_admin.observability.gunicorn_conf
outlier_admin.wsgi``. Every value can be overridden with ``GUNICORN_CMD_ARGS``.

``child_exit`` tells prometheus_client a worker died, so its live gauges are dropped while its
counters stay summed (multi-process mode, ``PROMETHEUS_MULTIPROC_DIR``).
"""

from __future__ import annotations

import os

bind = f"0.0.0.0:{os.environ.get('PORT', '8000')}"
workers = int(os.environ.get("WEB_CONCURRENCY", "2"))
threads = int(os.environ.get("GUNICORN_THREADS", "4"))
timeout = 30
accesslog = "-"
# No request bodies in access logs; the ingest endpoint sees tens of thousands of records a second.
access_log_format = '%(h)s "%(r)s" %(s)s %(b)s %(L)ss'


def child_exit(server, worker) -> None:  # gunicorn hook signature
    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        from prometheus_client import multiprocess

        multiprocess.mark_process_dead(worker.pid)
