"""Issue 29 finding 5: SSRF through hosts the resolver reads differently from the validator.

- Hex, octal, mixed-radix and short IPv4 forms (``169.0xfea9fe``, ``0x7f000001``) passed as DNS names
  and glibc resolved them to 169.254.169.254 / 127.0.0.1: every host ``inet_aton`` accepts is now
  judged as that address, and refused unless written as the dotted quad.
- A DNS name is judged again when it is resolved (DNS rebinding): a name that resolves to a
  forbidden address is refused by every client that connects to nodes (the DCGM scrape, the
  model-server scraper's connector, the canary), with nothing sent. The names are real: entries this
  module adds to ``/etc/hosts`` for the length of a test (root, as the CI runs) pointing at
  ``0.0.0.0`` (a connect to it reaches this host, so the local server would answer) and at
  ``169.254.169.254``. No resolver is stubbed.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import uuid
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler
from pathlib import Path

import aiohttp
import pytest

from contract.names import NameError_, check_ip, parse_address, validate_scrape_url
from harness.records import http_server
from outlier_admin.fleet.netguard import ForbiddenAddress, forbidden_cause, guarded_connector

HOSTS = Path("/etc/hosts")
#: The security probe's strings (issue 29 finding 5), each with the address glibc made of it.
PROBE = {
    "169.0xfea9fe": "169.254.169.254",
    "0xa9fea9fe": "169.254.169.254",
    "169.254.0xa9fe": "169.254.169.254",
    "0xa9.0xfe.0xa9.0xfe": "169.254.169.254",
    "127.0x1": "127.0.0.1",
    "0x7f000001": "127.0.0.1",
}
OTHER_SPELLINGS = ["0251.0376.0251.0376", "2852039166", "169.16689662", "0xa9fea9fe.", "127.1", "017700000001",
                   "0", "0.0.0.0", "0.1.2.3", "[::ffff:a9fe:a9fe]", "[2002:a9fe:a9fe::1]", "[::a9fe:a9fe]",
                   "[fe80::1]", "[ff02::1]"]


@pytest.mark.parametrize("host", sorted(PROBE))
def test_the_probes_spellings_are_refused_as_the_address_glibc_reads(host):
    assert socket.inet_aton(host) == socket.inet_aton(PROBE[host])  # what the resolver makes of it
    with pytest.raises(NameError_) as err:
        validate_scrape_url(f"http://{host}:9400/metrics")
    assert err.value.reason == "bad_url" and PROBE[host] in err.value.detail
    with pytest.raises(NameError_) as err:
        parse_address(f"{host}:8000")
    # The metadata service is forbidden; loopback is allowed, but only as 127.0.0.1.
    assert err.value.reason == ("forbidden_address" if PROBE[host].startswith("169.") else "bad_address")
    assert PROBE[host] in err.value.detail


@pytest.mark.parametrize("host", OTHER_SPELLINGS)
def test_other_spellings_of_forbidden_or_non_canonical_hosts_are_refused(host):
    with pytest.raises(NameError_):
        validate_scrape_url(f"http://{host}:9400/metrics")


def test_canonical_hosts_still_pass():
    for url in ("http://127.0.0.1:9400/metrics", "http://localhost:9400/metrics", "http://[::1]:9400/metrics",
                "http://dcgm-0.pool-a.svc.cluster.local:9400/metrics", "http://0xcafe.pool-a.test:9400/metrics"):
        assert validate_scrape_url(url) == url
    assert str(check_ip("::ffff:127.0.0.1")) == "127.0.0.1"


@contextlib.contextmanager
def hosts_entry(address: str) -> Iterator[str]:
    """A fresh name that resolves to ``address`` through /etc/hosts for the block, then removed."""
    name = f"oa-ssrf-{uuid.uuid4().hex[:10]}.test"
    line = f"{address} {name}  # tests/security/test_ssrf_resolver.py\n"
    try:
        with HOSTS.open("a") as f:
            f.write(line)
    except OSError as exc:
        pytest.skip(f"/etc/hosts is not writable here ({exc}): the rebinding tests need a real name")
    try:
        assert socket.gethostbyname(name) == address
        yield name
    finally:
        text = HOSTS.read_text()
        HOSTS.write_text("".join(x for x in text.splitlines(keepends=True) if x != line))


class Counting(BaseHTTPRequestHandler):
    hits = 0

    def do_GET(self) -> None:
        type(self).hits += 1
        body = b'DCGM_FI_DEV_GPU_TEMP{gpu="0",UUID="GPU-z"} 40\nvllm:x 1\n'
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_POST = do_GET

    def log_message(self, *args) -> None:
        pass


@pytest.fixture
def server() -> Iterator[tuple[type[Counting], int]]:
    handler = type("Server", (Counting,), {"hits": 0})
    with http_server(handler) as url:
        yield handler, int(url.rsplit(":", 1)[1])


async def _get(connector: aiohttp.BaseConnector, url: str) -> str:
    from outlier_admin.ingest.scraper import fetch

    async with aiohttp.ClientSession(connector=connector) as session:
        return await fetch(session, url, timeout=aiohttp.ClientTimeout(total=5), max_bytes=1 << 20)


def test_a_name_resolving_to_this_host_via_0_0_0_0_reaches_it_without_the_guard(server):
    """The threat is real here: 0.0.0.0 is not an address one can reach, except that Linux connects
    it to this host, so a name pointing at it scrapes whatever listens on loopback."""
    handler, port = server
    with hosts_entry("0.0.0.0") as name:
        assert validate_scrape_url(f"http://{name}:{port}/metrics")  # a DNS name: validation cannot know
        assert asyncio.run(_get_plain(f"http://{name}:{port}/metrics")).startswith("DCGM")
    assert handler.hits == 1


async def _get_plain(url: str) -> str:
    return await _get(aiohttp.TCPConnector(), url)


@pytest.mark.parametrize("address", ["0.0.0.0", "169.254.169.254"])
def test_the_model_server_scrapers_connector_refuses_a_name_that_resolves_to_a_forbidden_address(server, address):
    from outlier_admin.ingest.scraper import ScrapeError

    handler, port = server

    async def go(url: str) -> None:
        await _get(guarded_connector(), url)

    with hosts_entry(address) as name, pytest.raises(ScrapeError) as err:
        asyncio.run(go(f"http://{name}:{port}/metrics"))
    assert err.value.kind == "connect" and "forbidden address" in str(err.value)
    assert isinstance(forbidden_cause(err.value), ForbiddenAddress)
    assert handler.hits == 0


@pytest.mark.parametrize("host", ["0x7f000001", "127.0x1", "0.0.0.0"])
def test_the_connector_refuses_the_spellings_and_literals_itself(server, host):
    """Even a URL that skipped validation (a row written before it) is refused at connect time: the
    resolver judges the spelling, the socket factory the literal address."""
    from outlier_admin.ingest.scraper import ScrapeError

    handler, port = server

    async def go() -> None:
        await _get(guarded_connector(), f"http://{host}:{port}/metrics")

    with pytest.raises(ScrapeError) as err:
        asyncio.run(go())
    assert forbidden_cause(err.value) is not None and handler.hits == 0


@pytest.mark.django_db
@pytest.mark.services
def test_the_dcgm_scrape_refuses_a_name_that_resolves_to_a_forbidden_address(server, redis_client):
    from outlier_admin.control.actions import do_create_group, do_register_node
    from outlier_admin.fleet.models import Node
    from outlier_admin.ingest.dcgm import scrape_all
    from outlier_admin.ingest.models import GpuReading, RejectedInput
    from outlier_admin.observability.metrics import EVENTS

    handler, port = server
    group = do_create_group(f"ssrf-{uuid.uuid4().hex[:8]}", actor="test")
    node = do_register_node(group, "127.0.0.1:8000", actor="test")
    with hosts_entry("0.0.0.0") as name:
        Node.objects.filter(pk=node.pk).update(dcgm_url=f"http://{name}:{port}/metrics")
        assert scrape_all() == 0
    assert handler.hits == 0 and not GpuReading.objects.exists()
    assert EVENTS.get_sample_value("outlier_dcgm_scrape_failures_total",
                                   {"group": group.name, "node": node.name, "kind": "forbidden_address"}) == 1
    kept = RejectedInput.objects.get(source=f"dcgm:{group.name}/{node.name}")
    assert kept.detail.startswith("forbidden_address:") and "0.0.0.0" in kept.detail


@pytest.mark.django_db
@pytest.mark.services
def test_the_canary_refuses_a_node_address_that_resolves_to_a_forbidden_address(server, redis_client):
    from outlier_admin.control.actions import do_create_group, do_register_node
    from outlier_admin.control.canary import ProbeError, probe_node

    handler, port = server
    group = do_create_group(f"ssrf-{uuid.uuid4().hex[:8]}", actor="test")
    with hosts_entry("0.0.0.0") as name:
        node = do_register_node(group, f"{name}:{port}", actor="test")
        probe = probe_node(node)
    assert (probe.ok, probe.error) == (False, ProbeError.CONNECT)
    assert handler.hits == 0
