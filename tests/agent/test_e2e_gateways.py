"""End to end with real software: 4 fake inference servers (s3 3x slower), a real HAProxy / nginx,
the agent (pub/sub + polling on the real Redis), bounded loopback traffic. Weights documents are
written to Redis the way the control plane writes them.
"""

from __future__ import annotations

import json
import time

import pytest

from agent.client import GatewayClient, effective_weights
from agent.core import Agent
from agent.haproxy import HAProxyApplier, RuntimeAPI
from agent.nginx import NginxApplier, upstream_name_for
from agent.shipper import LogShipper, node_map_from_haproxy
from contract.weights_document import parse_document
from harness.gateways import (
    HAProxyProcess,
    NginxProcess,
    SyslogCollector,
    publish,
    run_agent,
    send_traffic,
    wait_version,
    weights_document,
)

pytestmark = [pytest.mark.services, pytest.mark.slow, pytest.mark.timeout(60)]
N = 200  # requests per phase: 50 per server under round-robin


def assert_even(result, servers, tolerance=0.05):
    for name in servers:
        assert abs(result.share(name) - 1 / len(servers)) <= tolerance, (name, dict(result.counts))


def test_haproxy_quarantine_and_restore(tmp_path, redis_client, group, addresses):
    logs = SyslogCollector()
    haproxy = HAProxyProcess(tmp_path, addresses, backend="llm", log_port=logs.port)
    agent = Agent(GatewayClient(redis_client, group, poll_interval_s=2.0), HAProxyApplier(haproxy.socket_path, "llm"),
                  status_file=str(tmp_path / "status.json"))
    publish(redis_client, weights_document(group, 1, addresses))
    stop, thread = run_agent(agent)
    api = RuntimeAPI(haproxy.socket_path)
    try:
        wait_version(agent, 1)
        before = send_traffic(haproxy.url, N)
        assert before.errors == 0 and before.total == N
        assert_even(before, addresses)  # ~25% each, the slow one included
        median = {k: sorted(v)[len(v) // 2] for k, v in before.latencies_ms.items()}
        # It is the slow one (3x by design; a busy machine adds the same scheduling delay to all four,
        # which shrinks the ratio, hence the margin).
        assert median["s3"] > 1.5 * sorted([median["s0"], median["s1"], median["s2"]])[1]

        publish(redis_client, weights_document(group, 2, addresses, quarantined=("s3",)))
        wait_version(agent, 2)
        during = send_traffic(haproxy.url, N)
        assert during.errors == 0 and during.share("s3") <= 0.01
        assert_even(during, ["s0", "s1", "s2"])
        state = {s.name: s for s in api.show_servers_state("llm")}
        assert state["s3"].drained and state["s3"].uweight == 0
        assert all(state[n].uweight == 256 and not state[n].drained for n in ("s0", "s1", "s2"))

        publish(redis_client, weights_document(group, 3, addresses))  # canary passed: restored
        wait_version(agent, 3)
        after = send_traffic(haproxy.url, N)
        assert after.errors == 0
        assert_even(after, addresses)
        state = {s.name: s for s in api.show_servers_state("llm")}
        assert not state["s3"].drained and state["s3"].uweight == 256
        assert agent.state.apply_errors == 0 and agent.state.applies == 2
        assert len(agent.apply_latencies) == 3 and max(lat for _, lat in agent.apply_latencies) < 1.0
    finally:
        stop.set()
        thread.join(timeout=5)
        haproxy.stop()
        logs.stop()

    # The real HAProxy log lines parse into ingest records, as the log shipper would send them.
    shipper = LogShipper("http://127.0.0.1:1/unused", "token",
                         node_map={f"llm/{k}": v for k, v in addresses.items()})
    for line in logs.lines:
        shipper.feed(line)
    records = list(shipper.buffer)
    assert len(records) == 3 * N
    by_node = {}
    for rec in records:
        by_node.setdefault(rec["node"], []).append(rec)
    assert len(by_node[addresses["s3"]]) == 2 * N // 4  # none while quarantined
    assert all(r["prompt_tokens"] == 4 and r["completion_tokens"] == 16 and r["status"] == 200 for r in records)
    slow = sorted(r["total_ms"] for r in by_node[addresses["s3"]])
    fast = sorted(r["total_ms"] for r in by_node[addresses["s0"]])
    assert slow[len(slow) // 2] >= 2 * max(fast[len(fast) // 2], 1.0)


def test_haproxy_shipper_node_map_from_runtime_api(tmp_path, addresses):
    with HAProxyProcess(tmp_path, addresses, backend="llm") as haproxy:
        assert node_map_from_haproxy(RuntimeAPI(haproxy.socket_path), "llm") == {
            f"llm/{k}": v for k, v in addresses.items()}


def test_nginx_quarantine_and_restore(tmp_path, redis_client, group, addresses):
    include = tmp_path / "upstreams" / "llm.conf"
    upstream = upstream_name_for(group)
    # Bootstrap: the include must exist before nginx starts; the agent's first apply writes it.
    bootstrap = NginxApplier(include, upstream, test_cmd=["true"], reload_cmd=["true"])
    bootstrap.apply(effective_weights(parse_document(json.dumps(weights_document(group, 0, addresses))),
                                      time.time()))
    nginx = NginxProcess(tmp_path / "nginx", include, upstream)
    applier = NginxApplier(include, upstream, test_cmd=nginx.test_cmd, reload_cmd=nginx.reload_cmd)
    agent = Agent(GatewayClient(redis_client, group, poll_interval_s=2.0), applier)
    publish(redis_client, weights_document(group, 1, addresses))
    stop, thread = run_agent(agent)
    try:
        wait_version(agent, 1)
        assert agent.state.applies == 0  # same weights as the bootstrap file: nothing written
        before = send_traffic(nginx.url, N)
        assert before.errors == 0
        assert_even(before, addresses)

        old_workers = nginx.worker_pids()
        publish(redis_client, weights_document(group, 2, addresses, quarantined=("s3",)))
        wait_version(agent, 2)
        assert f"server {addresses['s3']} down;" in include.read_text()
        nginx.wait_reloaded(old_workers)
        during = send_traffic(nginx.url, N)
        assert during.errors == 0 and during.share("s3") == 0
        assert_even(during, ["s0", "s1", "s2"])

        old_workers = nginx.worker_pids()
        publish(redis_client, weights_document(group, 3, addresses))
        wait_version(agent, 3)
        nginx.wait_reloaded(old_workers)
        after = send_traffic(nginx.url, N)
        assert after.errors == 0
        assert_even(after, addresses)
    finally:
        stop.set()
        thread.join(timeout=5)
        nginx.stop()
