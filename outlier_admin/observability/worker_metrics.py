"""Celery workers serve their own ``/metrics`` (a web process cannot read another container's
multi-process files), on ``WORKER_METRICS_BIND``:``WORKER_METRICS_PORT`` (defaults 127.0.0.1 and
9808; port 0 = off).

Started once in the worker's main process (signal ``worker_ready``); the server merges the files
every prefork child writes to ``PROMETHEUS_MULTIPROC_DIR``. Fleet gauges are not served here (the web
``/metrics`` has them): scrape both, as usual in this ecosystem.

**A multi-process directory by default.** Tasks run in the pool's children, so their counters live in
the children's memory, which the main process's server cannot read: under the README's plain
``celery -A outlier_admin worker`` (no ``PROMETHEUS_MULTIPROC_DIR``) every event series had 0 samples.
So when the variable is unset, :func:`ensure_multiprocess_dir` (signal ``worker_init``: in the main
process, after Django's set-up and before the pool forks) creates a private directory
(``tempfile.mkdtemp``: a fresh name no other user can predict or pre-create, mode 0700), sets the
variable for the children to inherit and switches ``prometheus_client`` to its multi-process values;
it is removed at ``worker_shutdown``. A directory the operator set (the image's ``/run/prometheus``)
is used as it is, created if missing, and never removed.

Loopback by default: a worker has no reason to answer the network unless a Prometheus outside the
host scrapes it, and then ``WORKER_METRICS_BIND=0.0.0.0`` (or the pod's address) says so on purpose.
With ``METRICS_TOKEN`` set a scrape needs ``Authorization: Bearer <token>`` here exactly as on the
web ``/metrics`` (the same check: :func:`outlier_admin.observability.metrics.scrape_allowed`).
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from threading import Thread

import orjson

log = logging.getLogger(__name__)
_started: list[ThreadingHTTPServer] = []
#: The directory :func:`ensure_multiprocess_dir` created itself (removed at shutdown), if any.
_created_dir: list[str] = []
ENV = "PROMETHEUS_MULTIPROC_DIR"


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


def ensure_multiprocess_dir() -> str:
    """Make sure ``PROMETHEUS_MULTIPROC_DIR`` names an existing directory and ``prometheus_client``
    records into it; returns the directory. Unset: a new private one (see the module docstring).

    Must run before the pool forks: a child inherits the environment and the value class. Series
    already created in this process keep their in-memory values (the main process records none:
    tasks run in the children, and every event metric is labelled, so its values are created on
    first use)."""
    from prometheus_client import values

    path = os.environ.get(ENV)
    if path:
        os.makedirs(path, mode=0o700, exist_ok=True)
    else:
        path = tempfile.mkdtemp(prefix="outlier-worker-metrics-")
        _created_dir.append(path)
        os.environ[ENV] = path
    if values.ValueClass is values.MutexValue:  # imported before the variable was set
        values.ValueClass = values.get_value_class()
    return path


def _on_worker_init(**_: object) -> None:
    from django.conf import settings

    if settings.WORKER_METRICS_PORT:
        log.info("worker metrics: multi-process directory %s", ensure_multiprocess_dir())


def _on_worker_shutdown(**_: object) -> None:
    while _created_dir:
        shutil.rmtree(_created_dir.pop(), ignore_errors=True)


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
    from celery.signals import worker_init, worker_ready, worker_shutdown

    worker_init.connect(_on_worker_init, weak=False, dispatch_uid="outlier-worker-metrics-dir")
    worker_ready.connect(_on_worker_ready, weak=False, dispatch_uid="outlier-worker-metrics")
    worker_shutdown.connect(_on_worker_shutdown, weak=False, dispatch_uid="outlier-worker-metrics-cleanup")
