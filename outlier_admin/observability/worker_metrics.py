"""Celery workers serve their own ``/metrics`` (a web process cannot read another container's
multi-process files), on ``WORKER_METRICS_BIND``:``WORKER_METRICS_PORT`` (defaults 127.0.0.1 and
9808; port 0 = off).

Started once in the worker's main process (signal ``worker_ready``); with prefork children and
``PROMETHEUS_MULTIPROC_DIR`` set, the server merges every child's files. Fleet gauges are not
served here (the web ``/metrics`` has them): scrape both, as usual in this ecosystem.

Loopback by default: a worker has no reason to answer the network unless a Prometheus outside the
host scrapes it, and then ``WORKER_METRICS_BIND=0.0.0.0`` (or the pod's address) says so on purpose.
With ``METRICS_TOKEN`` set a scrape needs ``Authorization: Bearer <token>`` here exactly as on the
web ``/metrics`` (the same check: :func:`outlier_admin.observability.metrics.scrape_allowed`).
"""

from __future__ import annotations

import logging
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from threading import Thread

import orjson

log = logging.getLogger(__name__)
_started: list[ThreadingHTTPServer] = []


class _Handler(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        from outlier_admin.observability.metrics import (
            CONTENT_TYPE,
            UNAUTHORIZED_MESSAGE,
            render,
            scrape_allowed,
        )

        if self.path.split("?")[0] not in ("/metrics", "/"):
            self.send_error(404)
            return
        if not scrape_allowed(self.headers.get("Authorization")):
            self._send(401, orjson.dumps({"error": UNAUTHORIZED_MESSAGE}), "application/json",
                       {"WWW-Authenticate": "Bearer"})
            return
        self._send(200, render(fleet=False), CONTENT_TYPE)

    def _send(self, status: int, body: bytes, content_type: str, headers: dict[str, str] | None = None) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        for key, value in (headers or {}).items():
            self.send_header(key, value)
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:  # scrapes every 15 s would flood the log
        return


def start(port: int, host: str = "127.0.0.1") -> ThreadingHTTPServer:
    """Serve the event metrics on ``host:port`` in a daemon thread; returns the server."""
    server = ThreadingHTTPServer((host, port), _Handler)
    server.daemon_threads = True
    Thread(target=server.serve_forever, name="worker-metrics", daemon=True).start()
    _started.append(server)
    return server


def _on_worker_ready(**_: object) -> None:
    from django.conf import settings

    port, host = settings.WORKER_METRICS_PORT, settings.WORKER_METRICS_BIND
    if port and not _started:
        try:
            start(port, host)
            log.info("worker metrics on %s:%s/metrics", host, port)
        except OSError as exc:
            log.error("worker metrics not served on %s:%s: %s", host, port, exc)


def connect() -> None:
    from celery.signals import worker_ready

    worker_ready.connect(_on_worker_ready, weak=False, dispatch_uid="outlier-worker-metrics")
