"""End to end on the real LiteLLM proxy (its own venv, .venv-litellm: scripts/ensure-litellm-venv.sh)
with the outlier-admin callback loaded from its YAML, in front of three fake inference servers; the
weights documents written to the real Redis as the control plane writes them. Each server's share is
counted by the server itself. LiteLLM's plain ``simple-shuffle`` strategy, so shares follow the
callback alone. The proxy takes 10-60 s to start on a busy two-core machine: one proxy, every phase.
"""

from __future__ import annotations

import time

import pytest

from harness.gateways import FakeInferenceServer, publish, weights_document
from harness.routers_llm import LITELLM_VENV, litellm_venv, start_router

pytestmark = [pytest.mark.services, pytest.mark.slow, pytest.mark.timeout(900)]  # may wait for `make test`'s background venv


def test_litellm_callback_follows_the_weights(tmp_path, settings, redis_client, group) -> None:
    if litellm_venv() is None:
        pytest.skip(f"no LiteLLM venv: `bash scripts/ensure-litellm-venv.sh` could not make {LITELLM_VENV}")
    servers = {name: FakeInferenceServer(name, base_delay_s=0.002) for name in ("a", "b", "c")}
    addresses = {name: srv.address for name, srv in servers.items()}
    # Quarantined before the proxy starts: b never gets a request (the group's first request reads it).
    # Fresh for 10 minutes: the proxy may take longer to start than the harness's 60 s.
    publish(redis_client, weights_document(group, 1, addresses, quarantined=("b",), stale_after_s=600))
    router = start_router("litellm", addresses, tmp_path, defence=False, outlier_group=group,
                          redis_url=settings.REDIS_URL, ready_timeout_s=240)

    def traffic(n: int) -> dict[str, int]:
        before = {name: srv.requests for name, srv in servers.items()}
        for _ in range(n):
            status, body = router.chat()
            assert status == 200, body
        return {name: srv.requests - before[name] for name, srv in servers.items()}

    def settle(version: int, check, what: str, timeout_s: float = 5.0) -> float:
        """Publish ``version`` was done; seconds until a request shows ``check`` (one request a poll)."""
        started = time.monotonic()
        while time.monotonic() - started < timeout_s:
            if check():
                return time.monotonic() - started
            time.sleep(0.02)
        raise AssertionError(f"version {version}: {what} not within {timeout_s}s")

    try:
        assert servers["b"].requests == 0  # not even the readiness probe
        shares = traffic(30)
        assert shares["b"] == 0 and shares["a"] + shares["c"] == 30, shares

        # Restored: its share back.
        publish(redis_client, weights_document(group, 2, addresses))
        settle(2, lambda: traffic(3)["b"] > 0, "b served again")
        shares = traffic(60)
        assert shares["b"] >= 8, shares  # 20 expected

        # Degraded to 25 of 100: kept in a quarter of the requests' choices, 1/12 of the traffic.
        publish(redis_client, weights_document(group, 3, addresses, weights={"c": 25}))
        time.sleep(1.5)  # > the poll interval: the watcher has it whatever pub/sub did
        shares = traffic(120)
        assert 1 <= shares["c"] <= 22 and min(shares["a"], shares["b"]) > 2 * shares["c"], shares  # 10 expected

        # Quarantined live, then the document goes stale: every deployment back (fail open).
        published = time.monotonic()
        publish(redis_client, weights_document(group, 4, addresses, quarantined=("a",), stale_after_s=10.0))
        time.sleep(1.5)
        assert traffic(20)["a"] == 0
        time.sleep(max(0.0, published + 10.0 - time.monotonic()))
        settle(4, lambda: traffic(3)["a"] > 0, "a back after the document went stale")
    finally:
        router.stop()
        for srv in servers.values():
            srv.stop()
    assert "Traceback" not in router.log_tail(20_000), router.log_tail()
