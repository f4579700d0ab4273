"""deploy/nginx/nginx.conf, the web tier's front (docker-compose.yml's proxy, the Helm chart's web pod
sidecar): parsed and checked by the real nginx, its bounds against the application's own, its answers
served by a real nginx in front of a real gunicorn. The slow-client behaviour itself:
tests/reliability/test_slow_clients.py."""

from __future__ import annotations

import json
import re
import socket
from pathlib import Path

import pytest
from django.conf import settings

from tests.reliability import stack

pytestmark = pytest.mark.skipif(not Path(stack.NGINX).exists(), reason="no nginx binary (apt-get install nginx-light)")
TEXT = stack.NGINX_CONF.read_text()


def directive(name: str) -> str:
    values = re.findall(rf"^\s*{name}\s+([^;]+);", TEXT, re.M)
    assert len(values) == 1, (name, values)
    return values[0]


def test_the_real_nginx_accepts_the_shipped_config(tmp_path: Path) -> None:
    out = stack.nginx_check(stack.local_config(18080, 18000), tmp_path)
    assert out.returncode == 0, out.stderr
    # The check can fail: a directive nginx does not know is refused.
    out = stack.nginx_check(stack.local_config(18080, 18000).replace("send_timeout", "sned_timeout"), tmp_path)
    assert out.returncode != 0 and "sned_timeout" in out.stderr


def test_every_client_read_and_write_has_a_deadline() -> None:
    for name in ("client_header_timeout", "client_body_timeout", "send_timeout"):
        values = re.findall(rf"^\s*{name}\s+([^;]+);", TEXT, re.M)
        assert values[0] == "10s" and all(int(v.removesuffix("s")) <= 10 for v in values), (name, values)
    assert directive("reset_timedout_connection") == "on"
    assert directive("proxy_request_buffering") == "on" and directive("proxy_buffering") == "on"
    # gunicorn answers (or its worker is killed) before nginx gives up on it.
    from outlier_admin.observability import gunicorn_conf

    assert int(directive("proxy_read_timeout").removesuffix("s")) > gunicorn_conf.timeout


def test_the_body_limit_lets_the_largest_ingest_batch_through() -> None:
    """Django refuses a batch over INGEST_MAX_BODY_BYTES with its own 413 in the API's format; nginx
    must not cut it first."""
    ingest = TEXT[TEXT.index("location /api/v1/ingest/ {"):]
    limit = re.search(r"client_max_body_size\s+([^;]+);", ingest[:ingest.index("proxy_pass")]).group(1)
    assert limit.endswith("m") and int(limit[:-1]) * 1024 * 1024 > settings.INGEST_MAX_BODY_BYTES


@pytest.mark.slow
def test_served_through_nginx_the_app_sees_the_client_and_refusals_are_problems(django_db_setup: None,
                                                                                 tmp_path: Path) -> None:
    with stack.gunicorn(tmp_path / "gunicorn.log") as web:
        (tmp_path / "nginx").mkdir()
        with stack.nginx(web, tmp_path / "nginx") as proxy:
            assert stack.get(proxy, "/nginx-healthz", 3)[0] == 200
            assert stack.get(proxy, "/healthz", 3)[0] == 200
            # A body over the proxy's limit: refused by nginx, in the API's error format.
            with socket.create_connection(("127.0.0.1", proxy), timeout=5) as s:
                s.sendall(b"POST /api/v1/ingest/requests HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 20000000\r\n"
                          b"Content-Type: application/json\r\nConnection: close\r\n\r\n")
                answer = b""
                while not answer.endswith(b"}\n") and (chunk := s.recv(65536)):  # nginx lingers for the body
                    answer += chunk
            head, _, body = answer.partition(b"\r\n\r\n")
            assert head.startswith(b"HTTP/1.1 413") and b"application/problem+json" in head
            problem = json.loads(body)
            assert problem["status"] == 413 and problem["errors"][0]["code"] == "too_large"
        # gunicorn gone behind nginx: a 503 problem with Retry-After, not nginx's HTML 502.
    (tmp_path / "nginx2").mkdir()
    with stack.gunicorn(tmp_path / "gunicorn2.log") as web:
        pass
    with stack.nginx(web, tmp_path / "nginx2", wait_path="/nginx-healthz") as proxy:
        import http.client

        conn = http.client.HTTPConnection("127.0.0.1", proxy, timeout=5)
        conn.request("GET", "/api/v1/groups/", headers={"Host": "127.0.0.1"})
        resp = conn.getresponse()
        assert resp.status == 503 and resp.getheader("Retry-After") == "5"
        assert json.loads(resp.read())["errors"][0]["code"] == "unavailable"
    # The access log names the client (not gunicorn's view, which is nginx's address).
    assert "127.0.0.1 \"GET /api/v1/groups/ HTTP/1.1\" 503" in (tmp_path / "nginx2" / "out.log").read_text()
