"""Issue 8 end to end with the control plane deciding: nothing in the loop is scripted.

Four fake OpenAI-compatible servers (s3 turns three times slower per output token after a healthy phase), a real HAProxy (or
nginx) in front of them, bounded concurrent traffic through the gateway on loopback, the gateway's
access log shipped to ``POST /api/v1/ingest/requests`` with a bearer token (the HAProxy syslog
shipper / an nginx file tail, against the real ingest API served by ``live_server``), a real
``celery -A outlier_admin worker --beat`` ticking the group on the real PostgreSQL and Redis, canary
probes from that worker to the servers' ``/v1/completions``, and the agent applying the published
weights to the gateway.

Asserted: s3's share through the gateway is ~25% before the control plane acts, 0 once it is
quarantined (HAProxy's ``show servers state`` / nginx's rendered include agree), and ~25% again
after s3 heals and its canary probes restore it; the healthy servers are never touched. The
decision-to-applied latency (the tick's ``generated_at`` -> the agent finished applying, so the tick
itself is included) is printed, and written as JSON when ``OUTLIER_E2E_FIGURES`` names a file.

Thresholds are lowered with ``do_update_thresholds`` (the operator path) so one run takes ~30 s:
canary every 1 s, 2 passes, recovery steps 0.5 -> 1.0 of 1 s each, no slow start, and a canary
tolerance of 3 spreads because the probe is timed by the worker's HTTP client while traffic is
timed by the gateway (a few ms of client overhead on a shared 2-core machine), and a degrade
materiality of 1.5 (see ``bench.agent_e2e.FAST_LOOP``) because the healthy servers
must stay untouched on that host.
"""

from __future__ import annotations

import json
import os
import socket
import threading
import time
from collections import Counter
from pathlib import Path

import pytest
from django.db import connection

from agent.client import GatewayClient, effective_weights
from agent.core import Agent
from agent.haproxy import HAProxyApplier, RuntimeAPI
from agent.nginx import NginxApplier, upstream_name_for
from agent.shipper import LogShipper, node_map_from_haproxy, serve_udp, tail_file
from bench.agent import summarise
from bench.agent_e2e import FAST_LOOP  # the thresholds of the quick loop, one copy
from contract.logformats import nginx as nginx_format
from contract.weights_document import parse_document
from harness.gateways import (
    CeleryWorker,
    FakeServerFleet,
    HAProxyProcess,
    NginxProcess,
    TrafficLoop,
    run_agent,
    weights_document,
)
from outlier_admin.control.actions import do_create_group, do_register_node, do_update_thresholds

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.services, pytest.mark.slow,
              pytest.mark.timeout(90)]
ROOT = Path(__file__).resolve().parents[2]
HEALTHY = ("s0", "s1", "s2")


@pytest.fixture
def token_servers():
    """s0..s3: 5 ms TTFT + 5 ms per output token; the test makes s3 3x slower per token (its gray
    failure) after a healthy phase. In their own process (see ``FakeServerFleet``), controlled through
    their admin endpoints."""
    fleet = FakeServerFleet({f"s{i}": {"per_token_ms": 5.0, "slowdown": 1.0} for i in range(4)})
    yield fleet.servers
    fleet.stop()


@pytest.fixture
def control_plane(redis_client, settings, tmp_path, group, token_servers):
    """The group with its four nodes and fast canary thresholds, and a Celery worker with beat."""
    g = do_create_group(group, actor="e2e", reason="gateway e2e")
    do_update_thresholds(g, dict(FAST_LOOP), actor="e2e", reason="e2e: one run must fit in a minute")
    for srv in token_servers.values():
        do_register_node(g, srv.address, actor="e2e", reason="fake inference server")
    db = connection.settings_dict
    worker = CeleryWorker(tmp_path / "celery", {
        "DATABASE_URL": f"postgres://{db['USER']}@{db['HOST']}:{db['PORT']}/{db['NAME']}",
        "REDIS_URL": settings.REDIS_URL,
        "TICK_INTERVAL_MS": "500",
        "CANARY_TIMEOUT_S": "5",
        "LOG_TAIL_INTERVAL_S": "3600",
        "DCGM_SCRAPE_INTERVAL_S": "3600",
    }, cwd=ROOT)
    yield g
    worker.stop()


def start_agent(redis_client, group, applier) -> tuple[Agent, threading.Event, threading.Thread]:
    agent = Agent(GatewayClient(redis_client, group, poll_interval_s=1.0), applier)
    stop, thread = run_agent(agent, resync_interval_s=60)
    return agent, stop, thread


def wait_until(predicate, timeout_s: float, what: str, every_s: float = 0.05) -> float:
    """Poll ``predicate`` until true; returns the wall-clock time it first held."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return time.time()
        time.sleep(every_s)
    raise AssertionError(f"timed out after {timeout_s}s waiting for {what}")


def shares(counts: Counter[str], names) -> dict[str, float]:
    total = sum(counts[n] for n in names)
    return {n: counts[n] / total for n in names}


def assert_share(counts: Counter[str], names, expected: float, tolerance: float) -> None:
    for name, share in shares(counts, names).items():
        assert abs(share - expected) <= tolerance, (name, dict(counts))


def report_latency(agent: Agent, gateway: str) -> dict:
    """Print decision-to-applied figures: every published version (heartbeats included) and the
    versions that changed the gateway (the decisions)."""
    figures = {
        "gateway": gateway,
        "all_versions": summarise([v for _, v in agent.apply_latencies]),
        "changes": summarise([v for _, v in agent.change_latencies]),
    }
    print(f"\n{gateway}: tick generated_at -> applied, all versions {figures['all_versions']}, "
          f"changes {figures['changes']}")
    out = os.environ.get("OUTLIER_E2E_FIGURES")
    if out:
        path = Path(f"{out}.{gateway}.json")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(figures, indent=2) + "\n")
    return figures


def test_haproxy_control_plane_quarantines_and_canary_restores(
        tmp_path, live_server, ingest_token, redis_client, group, token_servers, control_plane):
    addresses = {name: srv.address for name, srv in token_servers.items()}
    syslog = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    syslog.bind(("127.0.0.1", 0))
    haproxy = HAProxyProcess(tmp_path / "haproxy", addresses, backend="llm", log_port=syslog.getsockname()[1])
    api = RuntimeAPI(haproxy.socket_path)
    shipper = LogShipper(f"{live_server.url}/api/v1/ingest/requests", ingest_token, group=group,
                         node_map=node_map_from_haproxy(api, "llm"))
    stop_shipper = threading.Event()
    shipper_thread = threading.Thread(target=serve_udp, args=(shipper, syslog, stop_shipper),
                                      kwargs={"flush_interval_s": 0.5}, daemon=True)
    shipper_thread.start()
    agent, stop_agent, agent_thread = start_agent(redis_client, group, HAProxyApplier(haproxy.socket_path, "llm"))

    def servers():
        return {s.name: s for s in api.show_servers_state("llm")}

    def healthy_untouched():
        state = servers()
        assert all(state[n].uweight == 256 and not state[n].drained for n in HEALTHY), state

    started = time.time()
    traffic = TrafficLoop(haproxy.url, clients=4, deadline_s=75)
    try:
        # Healthy phase: round robin, every server has its quarter, nothing is touched.
        before = traffic.wait_requests(started, 200)
        assert_share(before, addresses, 0.25, 0.07)
        assert not servers()["s3"].drained and not agent.change_log
        # The gray failure; the quarantine is decided by the worker's ticks from the shipped logs.
        token_servers["s3"].set_slowdown(3.0)
        # One apply sends the drain and the weight as two runtime-API commands: wait for both.
        t_out = wait_until(lambda: (lambda s: s.drained and s.uweight == 0)(servers()["s3"]), 30,
                           "s3 drained at weight 0 by the control plane")
        healthy_untouched()

        during = traffic.wait_requests(t_out + 0.3, 200)
        assert during["s3"] / sum(during.values()) <= 0.01, during
        assert_share(during, HEALTHY, 1 / 3, 0.06)
        # Still slow: its canary probes fail and it stays out.
        wait_until(lambda: token_servers["s3"].user_agents["python-httpx"] >= 1, 10, "a canary probe of s3")
        assert servers()["s3"].drained
        healthy_untouched()

        token_servers["s3"].heal()
        t_back = wait_until(lambda: (lambda s: not s.drained and s.uweight == 256)(servers()["s3"]), 30,
                            "s3 restored to full weight after canary passes and recovery steps")
        assert token_servers["s3"].user_agents["python-httpx"] >= FAST_LOOP["canary_passes"] + 1
        after = traffic.wait_requests(t_back + 0.3, 200)
        assert_share(after, addresses, 0.25, 0.06)
        healthy_untouched()
    finally:
        traffic.stop()
        stop_agent.set()
        agent_thread.join(timeout=5)
        stop_shipper.set()
        shipper_thread.join(timeout=5)
        syslog.close()
        haproxy.stop()

    assert traffic.errors == 0
    assert not [c for _, _, c in agent.change_log if "llm/s3 " not in c], list(agent.change_log)
    assert agent.state.apply_errors == 0
    # Shipped through the real ingest API: every request line accepted, none lost.
    # The only lines that are not request logs are HAProxy's own notices about s3 ("Server llm/s3
    # enters drain state ..."), kept with their reason: HAProxy agrees on what happened.
    assert shipper.post_errors == 0 and shipper.shipped > 200
    assert all(reason == "not_a_request" and "Server llm/s3 " in line for reason, line in shipper.rejected)
    assert any("enters drain state" in line for _, line in shipper.rejected)
    figures = report_latency(agent, "haproxy")
    assert figures["changes"]["n"] >= 2  # its latencies are figures: bench.agent_e2e


def test_nginx_control_plane_quarantines_and_canary_restores(
        tmp_path, live_server, ingest_token, redis_client, group, token_servers, control_plane):
    addresses = {name: srv.address for name, srv in token_servers.items()}
    include = tmp_path / "upstreams" / "llm.conf"
    access_log = tmp_path / "nginx" / "access.log"
    upstream = upstream_name_for(group)
    # Bootstrap the include at base weights before nginx starts (what `--once` does on a new host).
    NginxApplier(include, upstream, test_cmd=["true"], reload_cmd=["true"]).apply(effective_weights(parse_document(
        json.dumps(weights_document(group, 0, {a: a for a in addresses.values()}))), time.time()))
    base_lines = {n: f"server {addresses[n]} weight=100;" for n in addresses}
    nginx = NginxProcess(tmp_path / "nginx", include, upstream, access_log=access_log)
    shipper = LogShipper(f"{live_server.url}/api/v1/ingest/requests", ingest_token, group=group,
                         parser=nginx_format.parse_line)
    stop_shipper = threading.Event()
    shipper_thread = threading.Thread(target=tail_file, args=(shipper, access_log, stop_shipper),
                                      kwargs={"flush_interval_s": 0.5, "start_offset": 0}, daemon=True)
    shipper_thread.start()
    applier = NginxApplier(include, upstream, test_cmd=nginx.test_cmd, reload_cmd=nginx.reload_cmd)
    agent, stop_agent, agent_thread = start_agent(redis_client, group, applier)

    def healthy_untouched():
        text = include.read_text()
        assert all(base_lines[n] in text for n in HEALTHY), text

    workers: list[set[int]] = [nginx.worker_pids()]

    def include_says(line: str) -> bool:
        # Remember the workers that ran before the agent's reload: the new upstream is live for all
        # traffic only once they have exited (nginx reloads gracefully).
        if line in include.read_text():
            return True
        workers.append(nginx.worker_pids())
        return False

    started = time.time()
    traffic = TrafficLoop(nginx.url, clients=4, deadline_s=75)
    try:
        before = traffic.wait_requests(started, 200)
        assert_share(before, addresses, 0.25, 0.07)
        assert not agent.change_log and all(base_lines[n] in include.read_text() for n in addresses)
        token_servers["s3"].set_slowdown(3.0)
        wait_until(lambda: include_says(f"server {addresses['s3']} down;"), 30, "s3 down in the include")
        nginx.wait_reloaded(workers[-1])
        t_out = time.time()
        healthy_untouched()

        during = traffic.wait_requests(t_out + 0.3, 200)
        assert during["s3"] / sum(during.values()) <= 0.01, during
        assert_share(during, HEALTHY, 1 / 3, 0.06)
        wait_until(lambda: token_servers["s3"].user_agents["python-httpx"] >= 1, 10, "a canary probe of s3")
        assert f"server {addresses['s3']} down;" in include.read_text()

        token_servers["s3"].heal()
        workers.append(nginx.worker_pids())
        wait_until(lambda: include_says(base_lines["s3"]), 30, "s3 back at full weight in the include")
        nginx.wait_reloaded(workers[-1])
        t_back = time.time()
        after = traffic.wait_requests(t_back + 0.3, 200)
        assert_share(after, addresses, 0.25, 0.06)
        healthy_untouched()
    finally:
        traffic.stop()
        stop_agent.set()
        agent_thread.join(timeout=5)
        stop_shipper.set()
        shipper_thread.join(timeout=5)
        nginx.stop()

    assert traffic.errors == 0
    server_changes = [c for _, _, c in agent.change_log if c.startswith(("- server", "+ server"))]
    assert server_changes and all(addresses["s3"] in c for c in server_changes), server_changes
    # nginx is reloaded only when routing changes (not when s3 flips between quarantined and probing).
    # (The applier reports "rewrote <file>" for a rewrite that changed no server line.)
    assert not [c for _, _, c in agent.change_log if c.startswith("rewrote")], list(agent.change_log)
    assert agent.state.apply_errors == 0
    assert shipper.post_errors == 0 and not shipper.rejected_by_reason and shipper.shipped > 200
    figures = report_latency(agent, "nginx")
    assert figures["changes"]["n"] >= 2  # its latencies are figures: bench.agent_e2e
