"""The Celery worker's own /metrics server: loopback by default, and ``METRICS_TOKEN`` enforced exactly
as on the web ``/metrics`` (one check, :func:`outlier_admin.observability.metrics.scrape_allowed`)."""

from __future__ import annotations

import socket
import urllib.error
import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

from outlier_admin.observability import metrics, worker_metrics

TOKEN = "w0rker-scrape-token"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def stop_servers():
    """Shut down every server a test started and forget it (``_started`` makes start-up idempotent)."""
    yield
    while worker_metrics._started:
        server = worker_metrics._started.pop()
        server.shutdown()
        server.server_close()


def _get(port: int, token: str | None = None) -> tuple[int, dict[str, str], bytes]:
    req = urllib.request.Request(f"http://127.0.0.1:{port}/metrics")
    if token is not None:
        req.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(req, timeout=5) as resp:
            return resp.status, dict(resp.headers), resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, dict(exc.headers), exc.read()


def test_worker_ready_binds_loopback_by_default(settings, monkeypatch, stop_servers):
    port = _free_port()
    settings.WORKER_METRICS_PORT = port
    monkeypatch.setenv("WORKER_METRICS_PORT", str(port))  # where the old code read it
    monkeypatch.delenv("WORKER_METRICS_BIND", raising=False)
    worker_metrics._on_worker_ready()
    assert len(worker_metrics._started) == 1
    assert worker_metrics._started[0].server_address == ("127.0.0.1", port)


def test_worker_ready_binds_the_configured_address(settings, stop_servers):
    port = _free_port()
    settings.WORKER_METRICS_PORT, settings.WORKER_METRICS_BIND = port, "127.0.0.2"
    worker_metrics._on_worker_ready()
    assert worker_metrics._started[0].server_address == ("127.0.0.2", port)


def test_worker_ready_with_port_0_serves_nothing(settings, stop_servers):
    settings.WORKER_METRICS_PORT = 0
    worker_metrics._on_worker_ready()
    assert worker_metrics._started == []


def test_worker_metrics_need_the_token_when_configured(settings, stop_servers):
    settings.METRICS_TOKEN = TOKEN
    metrics.INGEST_RECORDS.labels("http", "accepted").inc(3)  # something to serve
    port = worker_metrics.start(0).server_address[1]

    status, headers, body = _get(port)
    assert status == 401 and headers["WWW-Authenticate"] == "Bearer"
    assert b"METRICS_TOKEN" in body and b"outlier_" not in body
    assert _get(port, "wrong-token")[0] == 401
    assert _get(port, TOKEN[:-1])[0] == 401  # a prefix of the token is not the token

    status, headers, body = _get(port, TOKEN)
    assert status == 200 and headers["Content-Type"].startswith("text/plain")
    samples = {(s.name, tuple(sorted(s.labels.items()))) for fam in text_string_to_metric_families(body.decode())
               for s in fam.samples}
    assert ("outlier_ingest_records_total", (("result", "accepted"), ("source", "http"))) in samples


def test_worker_metrics_stay_open_without_a_token(settings, stop_servers):
    settings.METRICS_TOKEN = ""
    port = worker_metrics.start(0).server_address[1]
    status, _, body = _get(port)
    assert status == 200 and b"outlier_" in body


@pytest.mark.parametrize(("header", "allowed"), [
    (None, False), ("", False), (f"Bearer {TOKEN}", True), (f"bearer   {TOKEN} ", True),
    (f"Basic {TOKEN}", False), (f"Bearer {TOKEN}x", False), ("Bearer", False), (TOKEN, False),
])
def test_scrape_allowed_is_one_bearer_check(header, allowed):
    assert metrics.scrape_allowed(header, TOKEN) is allowed
    assert metrics.scrape_allowed(header, "") is True  # no token configured: open (as documented)
