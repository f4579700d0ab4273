"""The agent driving a real Envoy, Traefik and Caddy (harness/routers.py), configured as
docs/gateways.md tells a user to, in front of the four fake inference servers (s3 3x slower).

Each router goes through what a gray failure asks of it, with the agent running on the real Redis
and the documents published the way the control plane publishes them: a quarantined node gets no
new request, a degraded node its weight's share, a restored one its share back, a stale document
fails open (every node back at its base weight). The routers use their weighted round robin, whose
shares are exact over a few cycles: ``policy`` of each harness class says which.

Then what goes wrong: a router that is down or refuses (the apply fails, is counted and retried, and
the router keeps its last good set), a document naming a node the router does not know (skipped and
reported), and a document that would leave the router nothing to route to (refused).
"""

from __future__ import annotations

import json
import threading
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import pytest

from agent.__main__ import main
from agent.base import ApplyError
from agent.caddy import CaddyApplier
from agent.client import GatewayClient, effective_weights
from agent.core import Agent
from agent.envoy import EnvoyApplier
from agent.metrics import make_registry
from agent.traefik import TraefikApplier, parked_service
from contract.weights_document import parse_document
from harness.gateways import publish, run_agent, send_traffic, wait_version, weights_document
from harness.routers import CaddyRouter, EnvoyRouter, TraefikRouter, router_unavailable, start_router

pytestmark = [pytest.mark.services, pytest.mark.timeout(90)]
N = 80  # requests per phase: 20 per server under round robin; the weighted cycles repeat within it
DEGRADED = 35  # s3's weight when soft-degraded: 35 / (300 + 35) = 10.4 % of the requests


def _skip_without(kind: str) -> None:
    reason = router_unavailable(kind)
    if reason:
        pytest.skip(reason)


def make_envoy(tmp_path: Path, addresses: dict[str, str], **_: object):
    router = EnvoyRouter(tmp_path / "envoy", addresses, policy="ROUND_ROBIN")
    return router, EnvoyApplier(router.eds_path, "llm", admin_url=router.admin_url)


def make_traefik(tmp_path: Path, addresses: dict[str, str], throttle: str | None = None):
    router = TraefikRouter(tmp_path / "traefik", addresses, policy="wrr", throttle=throttle)
    return router, TraefikApplier(router.service_path, "llm", api_url=router.admin_url)


def make_caddy(tmp_path: Path, addresses: dict[str, str], **_: object):
    router = CaddyRouter(tmp_path / "caddy", addresses, policy="weighted_round_robin")
    return router, CaddyApplier(router.admin_url, "outlier-llm")


ROUTERS: dict[str, Callable] = {"envoy": make_envoy, "traefik": make_traefik, "caddy": make_caddy}


def shares(url: str, n: int = N, clients: int = 4) -> dict[str, float]:
    """Each server's share of ``n`` requests sent by ``clients`` sequential clients at once."""
    results = []
    threads = [threading.Thread(target=lambda: results.append(send_traffic(url, n // clients)))
               for _ in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    counts = Counter()
    for r in results:
        assert r.errors == 0, (r.errors, dict(r.counts))
        counts.update(r.counts)
    assert sum(counts.values()) == n, dict(counts)
    return {name: counts[name] / n for name in ("s0", "s1", "s2", "s3")}


def assert_shares(got: dict[str, float], want: dict[str, float], tolerance: float = 0.05) -> None:
    assert all(abs(got[k] - want[k]) <= tolerance for k in want), (got, want)


EVEN = {f"s{i}": 0.25 for i in range(4)}


@pytest.mark.slow
@pytest.mark.parametrize("kind", list(ROUTERS))
def test_router_follows_quarantine_degrade_restore_and_fails_open(kind, tmp_path, redis_client, group, addresses):
    _skip_without(kind)
    router, applier = ROUTERS[kind](tmp_path, addresses)
    agent = Agent(GatewayClient(redis_client, group, poll_interval_s=2.0), applier)
    stop, thread = run_agent(agent)
    try:
        publish(redis_client, weights_document(group, 1, addresses))
        wait_version(agent, 1, 15.0)
        assert agent.state.applies == 0  # the operator's seed already has every node at base weight
        assert_shares(shares(router.url), EVEN)

        publish(redis_client, weights_document(group, 2, addresses, quarantined=("s3",)))
        wait_version(agent, 2, 15.0)
        during = shares(router.url)
        assert during["s3"] == 0.0  # not one new request
        assert_shares(during, {"s0": 1 / 3, "s1": 1 / 3, "s2": 1 / 3})

        publish(redis_client, weights_document(group, 3, addresses, weights={"s3": DEGRADED}))
        wait_version(agent, 3, 15.0)
        degraded = shares(router.url)
        assert_shares(degraded, {"s3": DEGRADED / (300 + DEGRADED)}, tolerance=0.04)
        assert degraded["s3"] > 0  # a degraded node keeps its trickle

        publish(redis_client, weights_document(group, 4, addresses))  # canary passed: restored
        wait_version(agent, 4, 15.0)
        assert_shares(shares(router.url), EVEN)

        # s3 quarantined again, then the control plane dies: its last document goes stale and the
        # agent fails open on the clock (no new message), every node back at its base weight.
        publish(redis_client, weights_document(group, 5, addresses, quarantined=("s3",), stale_after_s=4.0))
        wait_version(agent, 5, 15.0)
        deadline = time.time() + 15
        while agent.state.mode != "fail_open" and time.time() < deadline:
            time.sleep(0.05)
        assert agent.state.mode == "fail_open" and agent.state.last_error == ""
        assert_shares(shares(router.url), EVEN)
        assert agent.state.apply_errors == 0 and agent.state.applies == 5  # v2..v5 and the fail-open
        assert agent.state.missing == [] and agent.state.unknown == []
        latencies = [lat for _, lat in agent.change_latencies]
        assert len(latencies) == 4 and max(latencies) < 20.0  # Traefik: its 2 s throttle, on a loaded host
    finally:
        stop.set()
        thread.join(timeout=10)
        router.stop()


def eff(group: str, addresses: dict[str, str], version: int = 1, **kw):
    return effective_weights(parse_document(json.dumps(weights_document(group, version, addresses, **kw))),
                             time.time())


def metrics_text(agent: Agent) -> str:
    from prometheus_client import generate_latest

    return generate_latest(make_registry(agent)).decode()


def running(kind: str, router) -> dict[str, object]:
    """What the router runs for each backend, from its own admin interface."""
    if kind == "envoy":
        return {addr: (h["health_flags"], h["weight"]) for addr, h in router.hosts().items()}
    if kind == "traefik":
        return dict(router.weights())
    handler = router.handler()
    return dict(zip([u["dial"] for u in handler["upstreams"]],
                    handler["load_balancing"]["selection_policy"]["weights"], strict=True))


def out_of_service(kind: str, router, address: str) -> bool:
    """Whether the router sends ``address`` no new request, the way the agent takes a node out there."""
    now = running(kind, router)
    if kind == "envoy":
        return now[address] == ("/eds_status_draining", 1)
    if kind == "caddy":
        return now[address] == 0
    parked = json.loads(router.service_path.read_text())["http"]["services"].get(parked_service("llm"), {})
    return address not in now and f"http://{address}" in [s["url"] for s in parked["loadBalancer"]["servers"]]


@pytest.mark.parametrize("kind", [pytest.param(k, marks=pytest.mark.slow) if k == "traefik" else k for k in ROUTERS])
def test_unknown_node_skipped_no_backend_left_refused_router_down_counted(kind, tmp_path, redis_client, group,
                                                                          addresses):
    _skip_without(kind)
    # Traefik's documented 200 ms provider throttle (docs/gateways.md); the lifecycle test keeps 2 s.
    router, applier = ROUTERS[kind](tmp_path, addresses, throttle="200ms")
    agent = Agent(GatewayClient(redis_client, group), applier)
    try:
        # A node the router does not know: skipped and reported; the others applied.
        stranger = {**addresses, "s9": "127.0.0.1:9"}
        publish(redis_client, weights_document(group, 1, stranger, quarantined=("s3", "s9")))
        assert agent.run_once()
        assert agent.state.missing == ["s9 (127.0.0.1:9)"] and agent.state.unknown == []
        labels = f'gateway="{kind}",group="{group}"'
        assert f"outlier_agent_missing_nodes{{{labels}}} 1.0" in metrics_text(agent)
        good = running(kind, router)
        assert "127.0.0.1:9" not in good and out_of_service(kind, router, addresses["s3"])

        # Every node out (a bad document; the control plane caps it at 30 %): refused, counted, the
        # last good set stays in force and still serves.
        publish(redis_client, weights_document(group, 2, addresses, quarantined=("s0", "s1", "s2", "s3")))
        with pytest.raises(ApplyError, match="no backend left"):
            agent.run_once()
        assert agent.state.apply_errors == 1 and agent.state.version == 1
        assert running(kind, router) == good
        assert_shares(shares(router.url, 24), {"s0": 1 / 3, "s1": 1 / 3, "s2": 1 / 3, "s3": 0.0}, tolerance=0.1)

        # The router goes down: retried with backoff, then counted; the router keeps nothing new.
        router.stop()
        if kind != "caddy":
            applier.confirm_timeout_s = 0.5
        publish(redis_client, weights_document(group, 3, addresses))
        t0 = time.monotonic()
        with pytest.raises(ApplyError):
            agent.run_once()
        assert time.monotonic() - t0 >= 0.5  # 0.2 s + 0.4 s backoff (Caddy) or the confirmation wait
        assert agent.state.apply_errors == 2 and agent.state.version == 1
        assert f"outlier_agent_apply_errors_total{{{labels}}} 2.0" in metrics_text(agent)

        # It comes back (from the operator's configuration): the agent's next turn applies.
        router, agent.applier = ROUTERS[kind](tmp_path / "again", addresses, throttle="200ms")
        publish(redis_client, weights_document(group, 4, addresses, quarantined=("s2",)))
        assert agent.run_once() and agent.state.version == 4 and agent.state.last_error == ""
        assert out_of_service(kind, router, addresses["s2"])
        assert not out_of_service(kind, router, addresses["s3"])
    finally:
        router.stop()


def test_caddy_least_conn_takes_quarantined_upstreams_out_and_back(tmp_path, group, addresses):
    """A Caddy policy without weights: quarantine removes the upstream, restore puts it back; a
    degraded node keeps its full share and the apply says so once."""
    _skip_without("caddy")
    router = CaddyRouter(tmp_path / "caddy", addresses, policy="round_robin")
    applier = CaddyApplier(router.admin_url, "outlier-llm")
    try:
        applier.apply(eff(group, addresses, quarantined=("s1",)))
        assert [u["dial"] for u in router.handler()["upstreams"]] == [addresses[n] for n in ("s0", "s2", "s3")]
        assert shares(router.url, 40)["s1"] == 0.0
        result = applier.apply(eff(group, addresses, 2, weights={"s3": DEGRADED}))
        assert "has no weights" in result.note and "s3" in result.note
        assert sorted(u["dial"] for u in router.handler()["upstreams"]) == sorted(addresses.values())
        assert_shares(shares(router.url, 40), EVEN)
        assert applier.apply(eff(group, addresses, 3, weights={"s3": DEGRADED})).note == ""  # said once
    finally:
        router.stop()


@pytest.mark.parametrize("kind", [pytest.param(k, marks=pytest.mark.slow) if k == "traefik" else k for k in ROUTERS])
def test_the_command_line_the_harness_gives_drives_the_router(kind, tmp_path, redis_client, group, addresses, settings):
    """``python -m agent`` with the router's ``agent_args`` (what the drill runs, and what
    docs/gateways.md shows): one ``--once`` apply reaches the router, confirmed where it can be."""
    _skip_without(kind)
    router = (TraefikRouter(tmp_path / kind, addresses, throttle="200ms") if kind == "traefik"
              else start_router(kind, tmp_path / kind, addresses))
    try:
        publish(redis_client, weights_document(group, 1, addresses, quarantined=("s1",)))
        assert main([*router.agent_args(group), "--redis-url", settings.REDIS_URL, "--once"]) == 0
        assert out_of_service(kind, router, addresses["s1"])
        assert not out_of_service(kind, router, addresses["s0"])
    finally:
        router.stop()
