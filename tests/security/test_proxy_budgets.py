"""Issue 36, finding 1, through the real nginx running the shipped ``deploy/nginx/nginx.conf``: a flood of
slow bodies from one address exhausts only its own budget. 140 connections with a bogus bearer token and
140 without credentials each drip a body; meanwhile, from the same address, the on-call's session
reaches the dashboard and the API, ``/healthz`` answers, and a gateway's valid token pushes to ingest.
Before: one ``limit_conn per_client 128`` per address, and every one of them got 429 for as long as the
flood lasted.

The behaviour is nginx's, so its upstreams here are two stub servers (the web, and ingest's own
process group) that answer at once and name themselves: which one answered shows the proxy's routing.
Every address is on 127.0.0.0/8.
"""

from __future__ import annotations

import http.client
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from tests.reliability import stack

pytestmark = pytest.mark.skipif(not Path(stack.NGINX).exists(), reason="no nginx binary (apt-get install nginx-light)")

FLOOD = 140
SESSION = {"Cookie": "sessionid=oncall-session-1"}
GATEWAY = {"Authorization": "Bearer oa_valid-gateway-token"}


@contextmanager
def stub(name: str) -> Iterator[int]:
    """An upstream that reads any request's body and answers 200 ``<name> <method> <path>``."""

    class Handler(BaseHTTPRequestHandler):
        def _answer(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            if length:
                self.rfile.read(length)
            body = f"{name} {self.command} {self.path}".encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        do_GET = do_POST = _answer

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server.server_address[1]
    finally:
        server.shutdown()
        server.server_close()


@contextmanager
def proxy(tmp_path: Path, edit=None) -> Iterator[int]:
    with stub("web") as web, stub("ingest") as ingest, \
            stack.nginx(web, tmp_path, wait_path="/nginx-healthz", ingest_port=ingest, edit=edit) as port:
        yield port


def request(port: int, method: str, path: str, headers: dict[str, str] | None = None,
            body: bytes | None = None) -> tuple[int, str]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    try:
        conn.request(method, path, body=body, headers={"Host": "127.0.0.1", **(headers or {})})
        resp = conn.getresponse()
        return resp.status, resp.read().decode(errors="replace")
    finally:
        conn.close()


class SlowBodies:
    """``count`` connections that each send a request head announcing a 100-byte body, then one byte of
    it every 2 s (inside nginx's deadline between two reads), until closed."""

    def __init__(self, port: int, path: str, headers: dict[str, str], count: int = FLOOD) -> None:
        head = "".join(f"{k}: {v}\r\n" for k, v in headers.items())
        self.socks = []
        for _ in range(count):
            s = socket.create_connection(("127.0.0.1", port), timeout=5)
            s.sendall(f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n{head}Content-Type: application/x-ndjson\r\n"
                      "Content-Length: 100\r\n\r\nx".encode())
            self.socks.append(s)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._drip, daemon=True)
        self._thread.start()

    def _drip(self) -> None:
        while not self._stop.wait(2.0):
            for s in self.socks:
                with suppress(OSError):
                    s.send(b"x")

    def answered(self) -> list[bytes]:
        """The first bytes of what nginx sent on each socket so far (b"" where nothing yet)."""
        out = []
        for s in self.socks:
            s.setblocking(False)
            try:
                out.append(s.recv(64))
            except (BlockingIOError, OSError):
                out.append(b"")
        return out

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)
        for s in self.socks:
            s.close()


def test_a_flood_of_slow_bodies_from_one_address_exhausts_only_its_own_budget(tmp_path: Path) -> None:
    with proxy(tmp_path) as port:
        bogus = SlowBodies(port, "/api/v1/ingest/requests", {"Authorization": "Bearer oa_bogus"})
        anonymous = SlowBodies(port, "/accounts/login/", {})
        try:
            time.sleep(1.0)  # every head is in: the budgets are as full as the flood makes them
            refused = [a for a in bogus.answered() + anonymous.answered() if a.startswith(b"HTTP/1.1 429")]
            assert refused, "the flood stays within no budget at all: the test would prove nothing"
            # Same address, other budgets: all answered by their upstream.
            assert request(port, "GET", "/", SESSION) == (200, "web GET /")
            assert request(port, "GET", "/api/v1/groups/", SESSION) == (200, "web GET /api/v1/groups/")
            assert request(port, "GET", "/healthz") == (200, "web GET /healthz")
            assert request(port, "POST", "/api/v1/ingest/requests", GATEWAY, b'{"x": 1}\n') == \
                (200, "ingest POST /api/v1/ingest/requests")
            # An anonymous request from the address waits behind its own flood only.
            assert request(port, "GET", "/accounts/login/")[0] == 429
        finally:
            bogus.close()
            anonymous.close()


def test_ingest_has_its_own_upstream_and_anonymous_bodies_are_capped_before_they_are_read(tmp_path: Path) -> None:
    with proxy(tmp_path) as port:
        assert request(port, "POST", "/api/v1/ingest/requests", GATEWAY, b"{}") == \
            (200, "ingest POST /api/v1/ingest/requests")
        assert request(port, "GET", "/api/v1/nodes/", SESSION) == (200, "web GET /api/v1/nodes/")
        # No token on ingest: the app's 401, from nginx, with the body never read.
        with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
            s.sendall(b"POST /api/v1/ingest/requests HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 5000000\r\n\r\n")
            head = s.recv(4096)
        assert head.startswith(b"HTTP/1.1 401") and b"application/problem+json" in head
        # An anonymous body: 100 kB at most, announced by its length; a login form goes through.
        status, body = request(port, "POST", "/accounts/login/", {"Content-Type": "application/x-www-form-urlencoded"},
                               b"u=" + b"x" * 200_000)
        assert status == 413 and '"too_large"' in body
        assert request(port, "POST", "/accounts/login/", {"Content-Type": "application/x-www-form-urlencoded"},
                       b"username=oncall&password=x") == (200, "web POST /accounts/login/")
        with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
            s.sendall(b"POST /accounts/login/ HTTP/1.1\r\nHost: 127.0.0.1\r\nTransfer-Encoding: chunked\r\n\r\n")
            assert s.recv(4096).startswith(b"HTTP/1.1 411")
        # With a session, an API body up to 1 MiB goes through, not more; ingest's limit is 12 MiB.
        # (Bodies under 1 MiB: nginx keeps them in memory, and its worker here may not write to tmp_path.)
        assert request(port, "POST", "/api/v1/nodes/", SESSION, b"x" * 900_000)[0] == 200
        assert request(port, "POST", "/api/v1/nodes/", SESSION, b"x" * 1_500_000)[0] == 413
        assert request(port, "POST", "/api/v1/ingest/requests", GATEWAY, b"x" * 900_000)[0] == 200
        with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
            s.sendall(b"POST /api/v1/ingest/requests HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer oa_x\r\n"
                      b"Content-Length: 13000000\r\n\r\n")
            assert s.recv(4096).startswith(b"HTTP/1.1 413")


def test_behind_a_declared_proxy_the_budgets_count_the_clients_it_names(tmp_path: Path) -> None:
    """The Helm chart writes ``set_real_ip_from`` for web.trustedProxies: behind the ingress, the
    anonymous budget is the client's, not the ingress pod's. Here 127.0.0.1 plays the ingress."""
    def trust_loopback(conf: str) -> str:
        marker = "    # set_real_ip_from: trusted proxies in front of nginx"
        assert conf.count(marker) == 1
        return conf.replace(marker, "    set_real_ip_from 127.0.0.1;")

    with proxy(tmp_path, edit=trust_loopback) as port:
        flood = SlowBodies(port, "/accounts/login/", {"X-Forwarded-For": "127.0.0.66"}, count=40)
        try:
            time.sleep(1.0)
            assert any(a.startswith(b"HTTP/1.1 429") for a in flood.answered())
            assert request(port, "GET", "/accounts/login/", {"X-Forwarded-For": "127.0.0.67"}) == \
                (200, "web GET /accounts/login/")
            assert request(port, "GET", "/accounts/login/", {"X-Forwarded-For": "127.0.0.66"})[0] == 429
        finally:
            flood.close()
