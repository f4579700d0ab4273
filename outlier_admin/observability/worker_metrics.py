"""Celery workers serve their own ``/metrics`` (a web process cannot read another container's
multi-process files), on ``WORKER_METRICS_PORT`` (default 9808, 0 = off).

Started once in the worker's main process (signal ``worker_ready``); with prefork children and
``PROMETHEUS_MULTIPROC_DIR`` set, the server merges every child's files. Fleet gauges are not
served here (the web ``/metrics`` has them): scrape both, as usual in this ecosystem.
"""

from __future__ import annotations

import logging
import os
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from threading import Thread

log = logging.getLogger(__name__)
_started: list[ThreadingHTTPServer] = []


class _Handler(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        from outlier_admin.observability.metrics import CONTENT_TYPE, render

        if self.path.split("?")[0] not in ("/metrics", "/"):
            self.send_error(404)
            return
        body = render(fleet=False)
        self.send_response(200)
        self.send_header("Content-Type", CONTENT_TYPE)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:  # scrapes every 15 s would flood the log
        return


def start(port: int, host: str = "0.0.0.0") -> ThreadingHTTPServer:
    """Serve the event metrics on ``host:port`` in a daemon thread; returns the server."""
    server = ThreadingHTTPServer((host, port), _Handler)
    server.daemon_threads = True
    Thread(target=server.serve_forever, name="worker-metrics", daemon=True).start()
    _started.append(server)
    return server


def _on_worker_ready(**_: object) -> None:
    port = int(os.environ.get("WORKER_METRICS_PORT", "9808") or 0)
    if port and not _started:
        try:
            start(port)
            log.info("worker metrics on :%s/metrics", port)
        except OSError as exc:
            log.error("worker metrics not served on :%s: %s", port, exc)


def connect() -> None:
    from celery.signals import worker_ready

    worker_ready.connect(_on_worker_ready, weak=False, dispatch_uid="outlier-worker-metrics")
