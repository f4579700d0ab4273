"""The nginx agent's upstream directives (``--nginx-directive``, repeatable): rendered by the agent,
accepted by a real nginx, and in force there (``least_conn`` changes where requests go)."""

from __future__ import annotations

import http.client
import json
import shlex
import threading
import time

import pytest

from agent.__main__ import main
from agent.client import effective_weights
from agent.nginx import NginxApplier, check_directive, render_upstream, upstream_name_for
from contract.weights_document import parse_document
from harness.gateways import FakeInferenceServer, NginxProcess, publish, weights_document

pytestmark = pytest.mark.services


@pytest.mark.parametrize(("given", "rendered"), [
    ("least_conn", "least_conn"),
    ("keepalive 32;", "keepalive 32"),
    ("  hash   $request_id consistent ", "hash $request_id consistent"),
    ("zone llm 64k", "zone llm 64k"),
    ("random two least_conn", "random two least_conn"),
])
def test_check_directive_normalises_what_users_write(given, rendered):
    assert check_directive(given) == rendered


@pytest.mark.parametrize("bad", [
    "", ";", "least_conn; server 127.0.0.9:1", "keepalive 32 }", "} upstream x {", "least_conn # c",
    "keepalive\n32", "server 127.0.0.9:1", "Least_Conn", "keepalive '32'", "x" * 201,
])
def test_check_directive_refuses_what_could_change_the_block(bad):
    with pytest.raises(ValueError):
        check_directive(bad)
    with pytest.raises(ValueError):  # the applier refuses it before writing anything
        NginxApplier("/nonexistent/llm.conf", "u", directives=[bad])


def test_directives_come_first_in_the_order_given():
    doc = effective_weights(parse_document(json.dumps(weights_document("g", 1, {"a": "127.0.0.1:8000"}))), 0.0)
    lines = render_upstream(doc, "u", directives=["least_conn", "keepalive 32"]).splitlines()
    assert lines[1:4] == ["upstream u {", "    least_conn;", "    keepalive 32;"]


def _served_by(url: str, n: int, gap_s: float) -> list[str]:
    """``n`` requests, one every ``gap_s`` seconds, each on its own thread and connection, without
    waiting for the earlier ones: a slow server still holds its connection when the next arrives."""
    host, _, port = url.removeprefix("http://").partition(":")
    out: list[str] = []
    lock = threading.Lock()

    def one() -> None:
        conn = http.client.HTTPConnection(host, int(port), timeout=10)
        try:
            conn.request("POST", "/v1/completions", body=b"{}", headers={"Content-Type": "application/json"})
            resp = conn.getresponse()
            resp.read()
            with lock:
                out.append(resp.getheader("X-Served-By") or f"status {resp.status}")
        finally:
            conn.close()

    threads = []
    for _ in range(n):
        t = threading.Thread(target=one)
        t.start()
        threads.append(t)
        time.sleep(gap_s)
    for t in threads:
        t.join(timeout=15)
    return out


@pytest.mark.slow
def test_cli_least_conn_and_keepalive_are_in_force_on_a_real_nginx(tmp_path, redis_client, group, settings,
                                                                   monkeypatch):
    slow = FakeInferenceServer("slow", base_delay_s=2.0)
    fast = FakeInferenceServer("fast", base_delay_s=0.005)
    servers = {"slow": slow.address, "fast": fast.address}
    include = tmp_path / "upstreams" / "llm.conf"
    upstream = upstream_name_for(group)
    NginxApplier(include, upstream, test_cmd=["true"], reload_cmd=["true"]).apply(
        effective_weights(parse_document(json.dumps(weights_document(group, 0, servers))), time.time()))
    nginx = NginxProcess(tmp_path / "nginx", include, upstream)
    try:
        publish(redis_client, weights_document(group, 1, servers))
        args = ["--gateway", "nginx", "--group", group, "--redis-url", settings.REDIS_URL,
                "--nginx-include", str(include), "--nginx-upstream", upstream,
                "--nginx-test-cmd", shlex.join(nginx.test_cmd), "--nginx-reload-cmd", shlex.join(nginx.reload_cmd),
                "--once"]
        # Round robin (no directive): the slow server takes every other request, busy or not.
        rr = _served_by(nginx.url, 10, 0.05)
        assert len(rr) == 10 and rr.count("slow") >= 4, rr

        old = nginx.worker_pids()
        assert main([*args, "--nginx-directive", "least_conn", "--nginx-directive", "keepalive 32"]) == 0
        text = include.read_text()
        assert "    least_conn;\n    keepalive 32;\n" in text
        nginx.wait_reloaded(old)
        # least_conn: while the slow server holds its one connection, every new request goes to the fast one.
        lc = _served_by(nginx.url, 10, 0.05)
        assert len(lc) == 10 and lc.count("slow") <= 1, lc

        # The environment form (one variable, ';'-separated) renders the same; a bad value stops the
        # agent before it writes anything.
        monkeypatch.setenv("OUTLIER_AGENT_NGINX_DIRECTIVES", "least_conn;keepalive 32")
        assert main(args) == 0
        assert include.read_text() == text
        monkeypatch.setenv("OUTLIER_AGENT_NGINX_DIRECTIVES", "least_conn; server 127.0.0.9:1")
        with pytest.raises(SystemExit, match="--nginx-directive"):
            main(args)
        assert include.read_text() == text
    finally:
        nginx.stop()
        slow.stop()
        fast.stop()
