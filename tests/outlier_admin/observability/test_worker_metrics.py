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


# --- the default multi-process directory (issue 17: 0 samples under the plain README command) ----------


def test_ensure_multiprocess_dir_creates_a_private_directory_and_respects_a_set_one(monkeypatch, tmp_path):
    import os
    import stat

    from prometheus_client import values

    monkeypatch.setattr(values, "ValueClass", values.ValueClass)  # restored after the test
    monkeypatch.delenv(worker_metrics.ENV, raising=False)
    created = worker_metrics.ensure_multiprocess_dir()
    try:
        assert os.environ[worker_metrics.ENV] == created and os.path.isdir(created)
        st = os.stat(created)
        assert stat.S_IMODE(st.st_mode) == 0o700 and st.st_uid == os.getuid()
        assert values.ValueClass is not values.MutexValue  # what the forked children will record with
        assert worker_metrics.ensure_multiprocess_dir() == created  # idempotent: one directory
    finally:
        worker_metrics._on_worker_shutdown()
        monkeypatch.delenv(worker_metrics.ENV, raising=False)
    assert not os.path.exists(created)

    chosen = tmp_path / "operator-chose-this"
    monkeypatch.setenv(worker_metrics.ENV, str(chosen))
    assert worker_metrics.ensure_multiprocess_dir() == str(chosen) and chosen.is_dir()
    worker_metrics._on_worker_shutdown()
    assert chosen.is_dir()  # never removed: not ours


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_plain_worker_command_serves_the_childrens_tick_metrics(settings, tmp_path):
    """``celery -A outlier_admin worker`` exactly as the README runs it (prefork pool, 2 children, no
    ``PROMETHEUS_MULTIPROC_DIR``) plus its beat: the ticks run in the children, and the worker's
    ``/metrics`` must count them (before: 0 samples)."""
    import os
    import re
    import subprocess
    import sys
    import time
    from pathlib import Path

    from django.db import connection

    from outlier_admin.control.actions import do_create_group, do_register_node

    group = do_create_group("wm-default-dir", actor="test")
    do_register_node(group, "127.0.0.1:9", actor="test")
    db = connection.settings_dict
    port = _free_port()
    env = {k: v for k, v in os.environ.items() if k != worker_metrics.ENV}
    env.update({
        "DATABASE_URL": f"postgres://{db['USER']}@{db['HOST']}:{db['PORT']}/{db['NAME']}",
        "REDIS_URL": settings.REDIS_URL, "TICK_INTERVAL_MS": "300", "WORKER_METRICS_PORT": str(port),
        "LOG_TAIL_INTERVAL_S": "3600", "DCGM_SCRAPE_INTERVAL_S": "3600", "METRICS_TOKEN": "",
    })
    log = (tmp_path / "celery.log").open("wb")
    proc = subprocess.Popen(
        [sys.executable, "-m", "celery", "-A", "outlier_admin", "worker", "--beat", "--concurrency", "2",
         "--loglevel", "INFO", "-s", str(tmp_path / "beat-schedule")],
        cwd=Path(__file__).resolve().parents[3], env=env, stdout=log, stderr=subprocess.STDOUT,
    )
    count, deadline = 0.0, time.monotonic() + 90
    try:
        while time.monotonic() < deadline and count < 3:
            time.sleep(0.5)
            try:
                status, _, body = _get(port)
            except OSError:
                continue
            assert status == 200
            count = sum(s.value for fam in text_string_to_metric_families(body.decode()) for s in fam.samples
                        if s.name == "outlier_tick_duration_seconds_count" and s.labels.get("group") == group.name)
    finally:
        proc.terminate()
        proc.wait(timeout=60)
        log.close()
    text = (tmp_path / "celery.log").read_text(errors="replace")
    assert count >= 3, f"worker /metrics counted {count} ticks of {group.name}; log tail:\n{text[-3000:]}"
    made = re.search(r"multi-process directory (\S*outlier-worker-metrics-[\w]+)", text)
    assert made, "the worker logged no default multi-process directory"
    assert not Path(made.group(1)).exists()  # removed at shutdown
