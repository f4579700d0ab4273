"""Issue 29 finding 6: a DCGM scrape is bounded (size and total time) and one exporter's bad page is
that node's failure, never the round's. Real exporters on 127.0.0.1 (tiny HTTP servers), the real
PostgreSQL and Redis."""

from __future__ import annotations

import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler

import pytest

from harness.records import http_server
from outlier_admin.control.actions import do_create_group, do_register_node
from outlier_admin.fleet.models import Node
from outlier_admin.ingest.dcgm import KINDS, scrape_all
from outlier_admin.ingest.models import GpuReading, RejectedInput
from outlier_admin.observability.metrics import EVENTS
from tests.outlier_admin.api.conftest import _fast_password_hasher, users  # noqa: F401

pytestmark = [pytest.mark.django_db, pytest.mark.services, pytest.mark.timeout(60)]

GOOD_PAGE = (
    '# TYPE DCGM_FI_DEV_GPU_TEMP gauge\n'
    'DCGM_FI_DEV_GPU_TEMP{gpu="0",UUID="GPU-good",Hostname="h1",modelName="H100"} 41\n'
    '# TYPE DCGM_FI_DEV_XID_ERRORS gauge\n'
    'DCGM_FI_DEV_XID_ERRORS{gpu="0",UUID="GPU-good",Hostname="h1",modelName="H100"} 0\n'
)
LONG_HOSTNAME_PAGE = GOOD_PAGE.replace('Hostname="h1"', 'Hostname="' + "h" * 300 + '"')
HUGE_XID_PAGE = GOOD_PAGE.replace("} 0\n", "} 99999999999\n")


def page_handler(body: bytes) -> type[BaseHTTPRequestHandler]:
    class Page(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.send_header("Content-Type", "text/plain")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args) -> None:
            pass

    return Page


class Stream:
    """An exporter that answers 200 and streams forever: a fast stream (the size cap cuts it) or a
    drip of one sample line every ``drip_s`` (only the total timeout cuts it). Counts what it sent."""

    def __init__(self, *, drip_s: float = 0.0, chunk: int = 64 * 1024) -> None:
        self.drip_s, self.chunk, self.sent, self.stop = drip_s, chunk, 0, threading.Event()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                self.send_response(200)
                self.send_header("Content-Type", "text/plain")
                self.end_headers()  # no Content-Length: the body ends when the connection does
                line = b'DCGM_FI_DEV_GPU_TEMP{gpu="0",UUID="GPU-s"} 40\n'
                data = line * max(1, outer.chunk // len(line))
                deadline = time.monotonic() + 30
                try:
                    while not outer.stop.is_set() and time.monotonic() < deadline:
                        self.wfile.write(line if outer.drip_s else data)
                        self.wfile.flush()
                        outer.sent += len(line) if outer.drip_s else len(data)
                        if outer.drip_s:
                            time.sleep(outer.drip_s)
                except OSError:  # the scraper hung up: what this test wants
                    pass

            def log_message(self, *args) -> None:
                pass

        self.handler = Handler


def failures(node: Node, kind: str) -> float:
    return EVENTS.get_sample_value("outlier_dcgm_scrape_failures_total",
                                   {"group": node.group.name, "node": node.name, "kind": kind}) or 0.0


def _node(group: str, port: int, url: str) -> Node:
    """A node of a new group (a fresh name each time: the failure counters live as long as the process)."""
    g = do_create_group(f"{group}-{uuid.uuid4().hex[:8]}", actor="test")
    node = do_register_node(g, f"127.0.0.1:{port}", actor="test")
    Node.objects.filter(pk=node.pk).update(dcgm_url=url + "/metrics")
    return Node.objects.select_related("group").get(pk=node.pk)


def _rejected(node: Node) -> RejectedInput:
    return RejectedInput.objects.get(source=f"dcgm:{node.group.name}/{node.name}")


def test_streaming_exporters_are_cut_at_the_cap_and_the_timeout_while_another_group_is_scraped(
        redis_client, settings):
    """The probe's exporter streamed 20 MB/s and the worker grew by 1 GB in 70 s (httpx's timeout is
    per read, so a stream that keeps sending never times out). Now the fast stream is cut at
    DCGM_MAX_BYTES and the drip at DCGM_TIMEOUT_S, in the same round that records another group's
    node."""
    settings.DCGM_TIMEOUT_S = 2
    settings.DCGM_MAX_BYTES = 256 * 1024
    fast, drip = Stream(), Stream(drip_s=0.05)
    with (http_server(page_handler(GOOD_PAGE.encode())) as good_url, http_server(fast.handler) as fast_url,
          http_server(drip.handler) as drip_url):
        good = _node("healthy-group", 9001, good_url)
        flood = _node("flood-group", 9002, fast_url)
        slow = _node("drip-group", 9003, drip_url)
        started = time.monotonic()
        try:
            stored = scrape_all()
        finally:
            fast.stop.set()
            drip.stop.set()
        took = time.monotonic() - started
    assert stored == 1 and GpuReading.objects.get().node_id == good.pk
    assert GpuReading.objects.get().temperature_c == 41.0
    assert failures(flood, "too_large") == 1 and _rejected(flood).detail.startswith("too_large:")
    assert failures(slow, "timeout") == 1 and _rejected(slow).detail.startswith("timeout:")
    # Cut: the fast stream sent at most the cap plus what the sockets buffer, not seconds of a
    # loopback flood (GBs); the drip was cut by the timeout (its reason above). The round's time is
    # only a hang guard, under the 30 s the streams would run uncut.
    assert fast.sent < 64 * 1024 * 1024
    assert took < 10 * settings.DCGM_TIMEOUT_S, took


@pytest.mark.parametrize(("page", "what"), [
    (LONG_HOSTNAME_PAGE, "label Hostname (300 characters)"),
    (HUGE_XID_PAGE, "DCGM_FI_DEV_XID_ERRORS = 1e+11 is outside 0..65535"),
    (b"\xff\xfeDCGM_FI_DEV_GPU_TEMP 1\n", "not UTF-8"),
    (GOOD_PAGE.replace('Hostname="h1"', 'Hostname="a\\u0000b"').replace("\\u0000", "\x00"), "control character"),
    (GOOD_PAGE.replace("} 41\n", "} -Inf\n"), "DCGM_FI_DEV_GPU_TEMP = -inf is outside"),
])
def test_a_bad_page_is_that_nodes_failure_only(page, what, redis_client):
    """A 300-character Hostname (VARCHAR(200)) and XID_ERRORS 99999999999 (INTEGER) raised an
    uncaught DataError that aborted the round: GPU-fault detection off fleet-wide. Now the page is
    refused before the database, as that node's ``parse`` failure (counted, kept as rejected input),
    and the other node of the round, whose XID 79 is a hard fault, still opens its proposal."""
    from outlier_admin.control.models import QuarantineProposal

    body = page if isinstance(page, bytes) else page.encode()
    faulty = GOOD_PAGE.replace("} 0\n", "} 79\n").encode()
    with http_server(page_handler(body)) as bad_url, http_server(page_handler(faulty)) as fault_url:
        bad = _node("bad-group", 9001, bad_url)
        other = _node("other-group", 9002, fault_url)
        assert scrape_all() == 1
    assert failures(bad, "parse") == 1
    assert what in _rejected(bad).detail and _rejected(bad).reason == "scrape_failed"
    assert not GpuReading.objects.filter(node=bad).exists()
    assert GpuReading.objects.get(node=other).xid == 79
    assert QuarantineProposal.objects.get(node=other).source == "gpu_fault"


def test_a_dead_exporter_is_kept_once_per_interval_and_every_kind_is_known(redis_client):
    with http_server(page_handler(GOOD_PAGE.encode())) as url:
        _node("live", 9001, url)
        dead = _node("dead", 9002, "http://127.0.0.1:9")  # discard port: connection refused
        assert scrape_all() == 1
        assert scrape_all() == 1
    assert failures(dead, "connect") == 2
    assert RejectedInput.objects.filter(source=f"dcgm:{dead.group.name}/{dead.name}").count() == 1  # REJECT_EVERY_S
    assert {"too_large", "timeout", "parse", "forbidden_address", "database"} <= set(KINDS)


def test_the_failure_is_shown_on_the_nodes_page_with_the_other_scrape_failures(redis_client, users):  # noqa: F811
    from django.test import Client

    with http_server(page_handler(HUGE_XID_PAGE.encode())) as url:
        bad = _node("page-group", 9001, url)
        scrape_all()
    viewer = Client()
    viewer.force_login(users["viewer"])
    html = viewer.get(f"/nodes/{bad.pk}/").content.decode()
    assert 'id="scrape-failures"' in html
    assert "DCGM exporter · parse: ValueError: DCGM_FI_DEV_XID_ERRORS = 1e+11 is outside 0..65535" in html
