"""gunicorn settings for the web service: ``gunicorn -c python:outlier_admin.observability.gunicorn_conf
outlier_admin.wsgi``. Every value can be overridden with ``GUNICORN_CMD_ARGS``.

Deployed behind nginx (``deploy/nginx/nginx.conf``: docker-compose.yml's ``proxy`` service, the Helm
chart's web pod), which reads each request whole under deadlines and hands gunicorn only complete ones.
gunicorn's gthread worker cannot do that itself: a connection holds one of its threads from its first
byte until its response, with no deadline on reading the header, so a few dozen clients that drip a
header line every few seconds hold every thread (issue 29, finding 4; measured in
``tests/reliability/test_slow_clients.py``). Hence ``WEB_BIND``: 127.0.0.1 in the Helm pod, where only
the nginx sidecar may reach it.

Run bare (the image's default command), it still keeps what it can: bounded request lines and headers,
a worker timeout, short keep-alive, and no scheme taken from client headers (below).

Ingest runs as a process group of its own (docker-compose.yml's ``ingest`` service, the Helm chart's
``ingest`` container; nginx routes ``/api/v1/ingest/`` to it), from this same file: a flood of records
then queues for ingest's threads, never for the dashboard's and the API's (issue 36, finding 3).
``WEB_NICE`` (0-19) lowers its workers' CPU priority on a shared host, so that the operator surface
keeps its share of the cores while ingest is saturated (containers: the CPU weight, ``cpu_shares`` /
the chart's CPU request, does that between services).

``child_exit`` tells prometheus_client a worker died, so its live gauges are dropped while its
counters stay summed (multi-process mode, ``PROMETHEUS_MULTIPROC_DIR``).
"""

from __future__ import annotations

import os

bind = f"{os.environ.get('WEB_BIND', '0.0.0.0')}:{os.environ.get('PORT', '8000')}"
workers = int(os.environ.get("WEB_CONCURRENCY", "2"))
threads = int(os.environ.get("GUNICORN_THREADS", "4"))
# A request (the view, not the client's upload: nginx buffers that) that runs longer than this kills
# its worker; the slowest legitimate one, a threshold preview at its bounds, stays well under it.
timeout = 30
graceful_timeout = 30
# Idle keep-alive connections wait in the worker's poller, not in a thread: 5 s, then closed.
keepalive = 5
# Request line and headers: what an API client or a browser sends, with room for long cookies. Past a
# bound the request is a 400 before any thread reads further (gunicorn's defaults are 4,094 / 100 / 8,190).
limit_request_line = 4094
limit_request_fields = 50
limit_request_field_size = 8190
# Connections one worker keeps (in service, queued, kept alive); past it, the listen backlog.
worker_connections = 1000
# wsgi.url_scheme never comes from a client's header: gunicorn trusts X-Forwarded-Proto from
# forwarded_allow_ips (127.0.0.1, i.e. the nginx in front), which passes the client's header on. Whether
# the request came over TLS is Django's to decide, with SECURE_PROXY_SSL_HEADER.
secure_scheme_headers: dict[str, str] = {}
accesslog = "-"
# No request bodies in access logs; the ingest endpoint sees tens of thousands of records a second.
access_log_format = '%(h)s "%(r)s" %(s)s %(b)s %(L)ss'


#: Added to each worker's niceness (0: none): ingest's process group gives way to the web's for CPU.
WEB_NICE = min(max(int(os.environ.get("WEB_NICE", "0")), 0), 19)


def post_fork(server, worker) -> None:  # gunicorn hook signature
    if WEB_NICE:
        os.nice(WEB_NICE)


def child_exit(server, worker) -> None:  # gunicorn hook signature
    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        from prometheus_client import multiprocess

        multiprocess.mark_process_dead(worker.pid)
