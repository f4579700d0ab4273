"""End to end on the real routers: SGLang Model Gateway (``smg``) and vLLM router driven by the agent
through their worker API, in front of three fake inference servers; weights documents written to the
real Redis as the control plane writes them, the agent's own loop (pub/sub + polling) applying them.
Each server's share is counted by the server itself (every completion it answered).

What these routers can express (agent/worker_set.py): a quarantined node is removed
(no new request), a restored node registered again (its share back), a stale document fails open
(every node back); a soft-degraded node stays (no weights), unless ``remove_below`` is set.
"""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Callable, Iterator

import pytest

from agent.base import ApplyError
from agent.client import GatewayClient
from agent.core import Agent
from agent.metrics import APPLY_FAILURES
from agent.smg import SmgApplier
from agent.vllm_router import VllmRouterApplier
from agent.worker_set import WorkerSetApplier
from harness.gateways import FakeInferenceServer, free_port, publish, run_agent, weights_document
from harness.routers_llm import RouterProcess, start_router

pytestmark = [pytest.mark.services, pytest.mark.slow, pytest.mark.timeout(120)]

APPLIERS: dict[str, type[WorkerSetApplier]] = {"smg": SmgApplier, "vllm-router": VllmRouterApplier}
N = 30  # requests per phase: 10 per server under round robin


@pytest.fixture
def servers() -> Iterator[dict[str, FakeInferenceServer]]:
    fleet = {name: FakeInferenceServer(name, base_delay_s=0.002) for name in ("a", "b", "c")}
    yield fleet
    for srv in fleet.values():
        srv.stop()


def wait_until(check: Callable[[], bool], timeout_s: float, what: str) -> float:
    """Seconds until ``check()`` held; fails the test after ``timeout_s``."""
    start = time.monotonic()
    while time.monotonic() - start < timeout_s:
        if check():
            return time.monotonic() - start
        time.sleep(0.02)
    raise AssertionError(f"not within {timeout_s}s: {what}")


def traffic(router: RouterProcess, servers: dict[str, FakeInferenceServer], n: int = N) -> dict[str, int]:
    """``n`` chat completions through the router; the completions each server answered."""
    before = {name: srv.requests for name, srv in servers.items()}
    for _ in range(n):
        status, body = router.chat()
        assert status == 200, body
    return {name: srv.requests - before[name] for name, srv in servers.items()}


@pytest.mark.parametrize("kind", ["smg", "vllm-router"])
def test_router_follows_the_weights(tmp_path, redis_client, group, servers, kind) -> None:
    addresses = {name: srv.address for name, srv in servers.items()}
    router = start_router(kind, addresses, tmp_path, defence=False)  # round robin: shares are exact
    applier = APPLIERS[kind](router.url, router_workers=[f"http://{a}" for a in addresses.values()])
    agent = Agent(GatewayClient(redis_client, group, poll_interval_s=1.0), applier)
    stop, thread = run_agent(agent, resync_interval_s=60)
    routable = router.routable
    try:
        publish(redis_client, weights_document(group, 1, addresses))
        wait_until(lambda: agent.state.version == 1, 5, "version 1 applied")
        assert traffic(router, servers) == {"a": 10, "b": 10, "c": 10}

        # Quarantined: removed, no new request.
        publish(redis_client, weights_document(group, 2, addresses, quarantined=("b",)))
        wait_until(lambda: addresses["b"] not in (routable() or {addresses["b"]}), 5, "b removed")
        shares = traffic(router, servers)
        assert shares["b"] == 0 and shares["a"] + shares["c"] == N, shares

        # Soft-degraded: these routers have no weights; the node stays (worker_set's docstring).
        publish(redis_client, weights_document(group, 3, addresses, quarantined=("b",), weights={"c": 25}))
        wait_until(lambda: agent.state.version == 3, 5, "version 3 applied")
        assert routable() == {addresses["a"], addresses["c"]}
        assert agent.state.last_error == ""

        # Restored: registered again, its share back.
        publish(redis_client, weights_document(group, 4, addresses))
        wait_until(lambda: routable() == set(addresses.values()), 10, "b registered again")
        assert traffic(router, servers) == {"a": 10, "b": 10, "c": 10}

        # A node the router does not know is skipped and reported, never registered.
        stranger = f"127.0.0.1:{free_port()}"
        publish(redis_client, weights_document(group, 5, {**addresses, "z": stranger}))
        wait_until(lambda: agent.state.version == 5, 5, "version 5 applied")
        assert agent.state.missing == [f"z ({stranger})"]
        assert stranger not in (routable() or set())

        # Stale: the document stops being re-stamped and fails open, every node back (smg: once the
        # removed worker has drained, 5 s by default).
        publish(redis_client, weights_document(group, 6, addresses, quarantined=("b",), stale_after_s=3.0))
        wait_until(lambda: routable() == {addresses["a"], addresses["c"]}, 3, "b out")
        wait_until(lambda: routable() == set(addresses.values()), 10, "fail open: every node back")
        wait_until(lambda: agent.state.mode == "fail_open", 2, "the agent in fail-open")
        assert agent.state.version == 6

        # Never the last worker: a document taking every node out is refused; the router keeps its set.
        errors = agent.state.apply_errors
        publish(redis_client, weights_document(group, 7, addresses, quarantined=("a", "b", "c")))
        wait_until(lambda: agent.state.apply_errors > errors, 5, "version 7 refused")
        assert "no backend left" in agent.state.last_error and agent.state.version == 6
        assert routable() == set(addresses.values())
        assert traffic(router, servers) == {"a": 10, "b": 10, "c": 10}

        # The router down: the apply is retried with backoff, counted, and the router is left as it was.
        failures = APPLY_FAILURES[kind]
        router.stop()
        publish(redis_client, weights_document(group, 8, addresses, quarantined=("c",)))
        # Each of the call's tries counted (the agent then retries the apply with backoff).
        wait_until(lambda: APPLY_FAILURES[kind] >= failures + 3, 15, "three failed tries counted")
        assert "Connection refused" in agent.state.last_error or "failed after" in agent.state.last_error
        assert agent.state.version == 6
    finally:
        stop.set()
        thread.join(timeout=10)
        router.stop()


def applied(agent: Agent) -> bool:
    """One pull and apply; False while the router refuses it (smg: a worker still draining)."""
    try:
        return agent.run_once()
    except ApplyError:
        return False


@pytest.mark.parametrize("kind", ["smg", "vllm-router"])
def test_remove_below_takes_a_degraded_node_out(tmp_path, redis_client, group, servers, kind) -> None:
    """With ``remove_below`` 0.5, a node cut under half its base weight is removed like a quarantined
    one, and registered again when its weight comes back over the line."""
    addresses = {name: srv.address for name, srv in servers.items()}
    router = start_router(kind, addresses, tmp_path, defence=False)
    applier = APPLIERS[kind](router.url, remove_below=0.5)
    agent = Agent(GatewayClient(redis_client, group), applier)
    try:
        publish(redis_client, weights_document(group, 1, addresses, weights={"c": 25}))
        assert agent.run_once()
        assert router.routable() == {addresses["a"], addresses["b"]}
        assert traffic(router, servers, 10)["c"] == 0
        publish(redis_client, weights_document(group, 2, addresses, weights={"c": 60}))
        wait_until(lambda: applied(agent), 10, "version 2 applied (smg: once c has drained)")
        wait_until(lambda: router.routable() == set(addresses.values()), 10, "c registered again")
    finally:
        router.stop()


def test_smg_answers_a_refusal_without_retrying(tmp_path, servers) -> None:
    """A refusal (401: the gateway has an API key the agent was not given) is not retried: it raises
    at once, is counted, and names the status."""
    addresses = {name: srv.address for name, srv in servers.items()}
    router = start_router("smg", addresses, tmp_path, defence=False, api_key="sk-router-admin")
    try:
        failures = APPLY_FAILURES["smg"]
        with pytest.raises(ApplyError, match="HTTP 401"):
            SmgApplier(router.url).list_workers()
        # Every failed try is counted: one, so it was not retried (three tries if it had been).
        assert APPLY_FAILURES["smg"] == failures + 1
        assert len(SmgApplier(router.url, api_key="sk-router-admin").list_workers()) == 3
    finally:
        router.stop()


@pytest.mark.parametrize("kind", ["smg", "vllm-router"])
def test_the_agent_command_drives_the_router(tmp_path, settings, redis_client, group, servers, kind) -> None:
    """``python -m agent --once`` with the harness's ``agent_args`` (what the drill runs and the docs
    show): the quarantined node is taken out, the exit status is 0."""
    addresses = {name: srv.address for name, srv in servers.items()}
    router = start_router(kind, addresses, tmp_path, defence=True)  # with the documented defence
    try:
        publish(redis_client, weights_document(group, 1, addresses, quarantined=("c",)))
        done = subprocess.run([sys.executable, "-m", "agent", *router.agent_args(), "--group", group,
                               "--redis-url", settings.REDIS_URL, "--once"],
                              capture_output=True, text=True, timeout=60, check=False)
        assert done.returncode == 0, done.stderr
        wait_until(lambda: router.routable() == {addresses["a"], addresses["b"]}, 5, "c removed")
        assert "removed worker" in done.stderr
    finally:
        router.stop()
