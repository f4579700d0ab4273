"""The agent driving a real Envoy, Traefik and Caddy (tests/harness/routers.py), configured as
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

from outlier_admin.agent.base import ApplyError
from outlier_admin.agent.caddy import CaddyApplier
from outlier_admin.agent.core import Agent
from outlier_admin.agent.envoy import EnvoyApplier
from outlier_admin.agent.metrics import make_registry
from outlier_admin.agent.traefik import TraefikApplier, parked_service
from outlier_admin.gateway_client import GatewayClient, effective_weights, parse_document
from tests.harness.gateways import publish, send_traffic, weights_document
from tests.harness.routers import CaddyRouter, EnvoyRouter, TraefikRouter, router_unavailable

pytestmark = [pytest.mark.services, pytest.mark.timeout(90)]
N = 80  # requests per phase: 20 per server under round robin; the weighted cycles repeat within it
DEGRADED = 35  # s3's weight when soft-degraded: 35 / (300 + 35) = 10.4 % of the requests


def _skip_without(kind: str) -> None:
    reason = router_unavailable(kind)
    if reason:
        pytest.skip(reason)


def make_envoy(tmp_path: Path, addresses: dict[str, str]):
    router = EnvoyRouter(tmp_path / "envoy", addresses, policy="ROUND_ROBIN")
    return router, EnvoyApplier(router.eds_path, "llm", admin_url=router.admin_url)


def make_traefik(tmp_path: Path, addresses: dict[str, str]):
    router = TraefikRouter(tmp_path / "traefik", addresses, policy="wrr")
    return router, TraefikApplier(router.service_path, "llm", api_url=router.admin_url)


def make_caddy(tmp_path: Path, addresses: dict[str, str]):
    router = CaddyRouter(tmp_path / "caddy", addresses, policy="weighted_round_robin")
    return router, CaddyApplier(router.admin_url, "outlier-llm")


ROUTERS: dict[str, Callable] = {"envoy": make_envoy, "traefik": make_traefik, "caddy": make_caddy}


def run_agent(agent: Agent):
    stop = threading.Event()
    thread = threading.Thread(target=agent.run, args=(stop,), kwargs={"resync_interval_s": 60}, daemon=True)
    thread.start()
    return stop, thread


def wait_version(agent: Agent, version: int, timeout: float = 15.0) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        if agent.state.version == version and agent.state.last_error == "":
            return
        time.sleep(0.01)
    raise AssertionError(f"agent did not apply version {version}: {agent.state}")


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
        wait_version(agent, 1)
        assert agent.state.applies == 0  # the operator's seed already has every node at base weight
        assert_shares(shares(router.url), EVEN)

        publish(redis_client, weights_document(group, 2, addresses, quarantined=("s3",)))
        wait_version(agent, 2)
        during = shares(router.url)
        assert during["s3"] == 0.0  # not one new request
        assert_shares(during, {"s0": 1 / 3, "s1": 1 / 3, "s2": 1 / 3})

        publish(redis_client, weights_document(group, 3, addresses, weights={"s3": DEGRADED}))
        wait_version(agent, 3)
        degraded = shares(router.url)
        assert_shares(degraded, {"s3": DEGRADED / (300 + DEGRADED)}, tolerance=0.04)
        assert degraded["s3"] > 0  # a degraded node keeps its trickle

        publish(redis_client, weights_document(group, 4, addresses))  # canary passed: restored
        wait_version(agent, 4)
        assert_shares(shares(router.url), EVEN)

        # The control plane died with s3 quarantined: the document goes stale and the agent fails open.
        publish(redis_client, weights_document(group, 5, addresses, quarantined=("s3",),
                                               generated_at=time.time() - 120, stale_after_s=60))
        wait_version(agent, 5)
        assert agent.state.mode == "fail_open"
        assert_shares(shares(router.url), EVEN)
        assert agent.state.apply_errors == 0 and agent.state.applies == 3
        assert agent.state.missing == [] and agent.state.unknown == []
        latencies = [lat for _, lat in agent.change_latencies]
        assert len(latencies) == 3 and max(latencies) < 10.0  # Traefik's 2 s provider throttle included
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


@pytest.mark.parametrize("kind", list(ROUTERS))
def test_unknown_node_is_skipped_and_no_backend_left_is_refused(kind, tmp_path, group, addresses):
    _skip_without(kind)
    router, applier = ROUTERS[kind](tmp_path, addresses)
    try:
        # A node the router does not know: skipped and reported; the others applied.
        stranger = {**addresses, "s9": "127.0.0.1:9"}
        result = applier.apply(eff(group, stranger, quarantined=("s3", "s9")))
        assert result.missing == ["s9 (127.0.0.1:9)"] and result.unknown == []
        assert shares(router.url)["s3"] == 0.0
        # Every node out (the control plane's 30 % cap broken, or a bad document): refused, the last
        # good set stays, and nothing of the stranger was added.
        with pytest.raises(ApplyError, match="no backend left"):
            applier.apply(eff(group, addresses, 2, quarantined=("s0", "s1", "s2", "s3")))
        assert_shares(shares(router.url), {"s0": 1 / 3, "s1": 1 / 3, "s2": 1 / 3})
        if kind == "envoy":
            assert set(router.hosts()) == set(addresses.values())
        elif kind == "traefik":
            assert set(router.weights()) == {addresses[n] for n in ("s0", "s1", "s2")}
            doc = json.loads(router.service_path.read_text())["http"]["services"]
            assert [s["url"] for s in doc[parked_service("llm")]["loadBalancer"]["servers"]] == [
                f"http://{addresses['s3']}"]
        else:
            assert [u["dial"] for u in router.handler()["upstreams"]] == list(addresses.values())
    finally:
        router.stop()


@pytest.mark.parametrize("kind", list(ROUTERS))
def test_router_down_counts_a_failure_and_the_agent_retries(kind, tmp_path, redis_client, group, addresses):
    _skip_without(kind)
    router, applier = ROUTERS[kind](tmp_path, addresses)
    router.stop()  # down: Envoy and Traefik cannot confirm, Caddy cannot be reached
    if kind != "caddy":
        applier.confirm_timeout_s = 0.5
    agent = Agent(GatewayClient(redis_client, group), applier)
    publish(redis_client, weights_document(group, 1, addresses, quarantined=("s3",)))
    t0 = time.monotonic()
    with pytest.raises(ApplyError):
        agent.run_once()
    assert time.monotonic() - t0 >= 0.5  # retried with backoff before giving up (0.2 s + 0.4 s or the confirm wait)
    assert agent.state.apply_errors == 1 and agent.state.version is None
    labels = f'gateway="{kind}",group="{group}"'
    assert f"outlier_agent_apply_errors_total{{{labels}}} 1.0" in metrics_text(agent)
    # The router comes back (same configuration): the next turn applies.
    router, applier2 = ROUTERS[kind](tmp_path / "again", addresses)
    try:
        agent.applier = applier2
        assert agent.run_once()
        assert agent.state.version == 1 and agent.state.last_error == ""
        assert shares(router.url)["s3"] == 0.0
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
        assert shares(router.url)["s1"] == 0.0
        result = applier.apply(eff(group, addresses, 2, weights={"s3": DEGRADED}))
        assert "has no weights" in result.note and "s3" in result.note
        assert sorted(u["dial"] for u in router.handler()["upstreams"]) == sorted(addresses.values())
        assert_shares(shares(router.url), EVEN)
        assert applier.apply(eff(group, addresses, 3, weights={"s3": DEGRADED})).note == ""  # said once
    finally:
        router.stop()
