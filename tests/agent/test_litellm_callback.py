"""The LiteLLM callback's filter (agent/litellm_callback.py) without LiteLLM: which
deployments a request may go to, from a weights document in the real Redis. The proxy itself runs in
test_e2e_litellm.py."""

from __future__ import annotations

import asyncio
import json
import random
import time

import pytest

from agent.client import effective_weights, parse_document
from agent.litellm_callback import (
    REDIS_TIMEOUT_S,
    DeploymentFilter,
    FilterStats,
    OutlierFilter,
    deployment_address,
    filter_deployments,
    parse_groups,
)
from harness.gateways import free_port, publish, weights_document

ADDRESSES = {"a": "127.0.0.1:8001", "b": "127.0.0.1:8002", "c": "127.0.0.1:8003"}


def deployments(addresses: dict[str, str] = ADDRESSES) -> list[dict]:
    return [{"model_name": "llama", "model_info": {"id": name},
             "litellm_params": {"model": "openai/llama", "api_base": f"http://{addr}/v1"}}
            for name, addr in addresses.items()]


def weights(version: int = 1, **kwargs):
    doc = parse_document(json.dumps(weights_document("llama", version, ADDRESSES, **kwargs)))
    return effective_weights(doc, time.time())


def ids(kept: list[dict]) -> list[str]:
    return [d["model_info"]["id"] for d in kept]


def test_quarantined_deployment_is_dropped_and_the_rest_kept() -> None:
    kept = filter_deployments(deployments(), weights(quarantined=("b",)), random.Random(1))
    assert ids(kept) == ["a", "c"]


def test_degraded_deployment_is_kept_in_proportion_to_its_weight() -> None:
    rng, stats = random.Random(7), FilterStats()
    n, w, given = 20_000, weights(weights={"c": 25}), deployments()
    kept = [ids(filter_deployments(given, w, rng, stats)) for _ in range(n)]
    share_kept = sum("c" in k for k in kept) / n
    assert 0.23 < share_kept < 0.27  # weight 25 of base 100
    assert all(k[:2] == ["a", "b"] for k in kept)  # full-weight nodes always in
    assert stats.dropped_degraded["llama"] == n - sum("c" in k for k in kept)


def test_never_empty() -> None:
    rng = random.Random(3)
    # Every node in service degraded, sampling drops both sometimes: one is drawn by weight instead.
    w, given = weights(quarantined=("a",), weights={"b": 10, "c": 30}), deployments()
    heavy = [ids(filter_deployments(given, w, rng)) for _ in range(4000)]
    assert all(len(k) >= 1 and "a" not in k for k in heavy)
    # Every deployment quarantined: LiteLLM keeps all of them rather than fail the request.
    stats = FilterStats()
    everything = filter_deployments(deployments(), weights(quarantined=("a", "b", "c")), rng, stats)
    assert ids(everything) == ["a", "b", "c"] and stats.all_quarantined["llama"] == 1


def test_unknown_deployments_are_left_alone_and_missing_nodes_reported() -> None:
    stranger = {"model_info": {"id": "x"}, "litellm_params": {"model": "openai/llama", "api_base": "http://127.0.0.1:9/v1"}}
    no_base = {"model_info": {"id": "y"}, "litellm_params": {"model": "gpt-4o"}}
    stats = FilterStats()
    kept = filter_deployments([*deployments({"a": ADDRESSES["a"]}), stranger, no_base],
                              weights(quarantined=("a",)), random.Random(1), stats)
    assert ids(kept) == ["x", "y"]
    assert stats.missing["llama"] == [f"b ({ADDRESSES['b']})", f"c ({ADDRESSES['c']})"]


def test_stale_document_fails_open() -> None:
    doc = parse_document(json.dumps(
        weights_document("llama", 1, ADDRESSES, quarantined=("b",), generated_at=time.time() - 120)))
    stale = effective_weights(doc, time.time())
    assert stale.mode == "fail_open"
    assert ids(filter_deployments(deployments(), stale, random.Random(1))) == ["a", "b", "c"]


def test_no_document_filters_nothing() -> None:
    assert ids(filter_deployments(deployments(), None, random.Random(1))) == ["a", "b", "c"]


@pytest.mark.parametrize("api_base,address", [("http://127.0.0.1:8001/v1", "127.0.0.1:8001"),
                                              ("https://gpu-7.example:443/v1/", "gpu-7.example:443"),
                                              ("http://[::1]:8000", "[::1]:8000"),
                                              ("http://gpu-7", "gpu-7:80")])
def test_deployment_address(api_base: str, address: str) -> None:
    assert deployment_address({"litellm_params": {"api_base": api_base}}) == address


def test_parse_groups() -> None:
    assert parse_groups(" llama = llama-70b , qwen=qwen/7b ") == {"llama": "llama-70b", "qwen": "qwen/7b"}
    for bad in ("llama", "=g", "llama=", "llama=bad group"):
        with pytest.raises(ValueError, match="model=group"):
            parse_groups(bad)


@pytest.mark.services
def test_filter_follows_redis_without_a_round_trip_per_request(settings, redis_client) -> None:
    group = f"litellm-{free_port()}"
    publish(redis_client, weights_document(group, 1, ADDRESSES, quarantined=("b",)))
    filt = DeploymentFilter(redis_url=settings.REDIS_URL, groups={"llama": group}, poll_interval_s=1.0)
    try:
        # The group's first request reads the document once: b never gets it.
        assert ids(filt.filter("llama", deployments())) == ["a", "c"]
        assert ids(filt.filter("other-model", deployments())) == ["a", "b", "c"]  # not mapped: untouched
        publish(redis_client, weights_document(group, 2, ADDRESSES))
        deadline = time.monotonic() + 3
        while ids(filt.filter("llama", deployments())) != ["a", "b", "c"]:
            assert time.monotonic() < deadline, "the watcher did not bring b back"
            time.sleep(0.01)
        # A request reads memory only: 1,000 filters make no read of their own (the watcher's polls,
        # one a second, are all the reads there are; how fast a filter is, is a figure, not asserted).
        stats = filt.clients()[group].stats
        fetches = stats.fetches
        for _ in range(1000):
            filt.filter("llama", deployments())
        assert stats.fetches - fetches < 100, stats.fetches - fetches
    finally:
        filt.close()


def test_redis_unreachable_filters_nothing_and_does_not_hang() -> None:
    filt = DeploymentFilter(redis_url=f"redis://127.0.0.1:{free_port()}/0", groups={"llama": "llama"})
    try:
        started = time.monotonic()
        assert ids(filt.filter("llama", deployments())) == ["a", "b", "c"]
        # The first request's one read failed (refused, or cut at REDIS_TIMEOUT_S) and was counted; the
        # time is a hang guard only.
        assert time.monotonic() - started < 10 * REDIS_TIMEOUT_S
        stats = filt.clients()["llama"].stats
        assert stats.redis_errors >= 1 and stats.last_error.startswith(("ConnectionError", "TimeoutError"))
        assert ids(filt.filter("llama", deployments())) == ["a", "b", "c"]
    finally:
        filt.close()


def test_the_callback_without_litellm_returns_the_filtered_list() -> None:
    filt = DeploymentFilter(redis_url=f"redis://127.0.0.1:{free_port()}/0", groups={})
    callback = OutlierFilter(filt)
    given = deployments()
    assert asyncio.run(callback.async_filter_deployments("llama", given, None)) == given
    assert asyncio.run(callback.async_filter_deployments("llama", {"one": "deployment"}, None)) == {"one": "deployment"}


@pytest.mark.services
def test_metrics(settings, redis_client) -> None:
    from prometheus_client import CollectorRegistry, generate_latest

    group = f"litellm-{free_port()}"
    publish(redis_client, weights_document(group, 1, {**ADDRESSES, "z": "127.0.0.1:9"}, quarantined=("b",)))
    filt = DeploymentFilter(redis_url=settings.REDIS_URL, groups={"llama": group})
    registry = CollectorRegistry()
    try:
        assert filt.register_metrics(registry)
        for _ in range(3):
            filt.filter("llama", deployments())
        text = generate_latest(registry).decode()
        assert f'outlier_litellm_requests_total{{group="{group}"}} 3.0' in text
        assert f'outlier_litellm_dropped_total{{group="{group}",reason="quarantined"}} 3.0' in text
        assert f'outlier_litellm_missing_nodes{{group="{group}"}} 1.0' in text
        assert f'outlier_litellm_fail_open{{group="{group}"}} 0.0' in text
    finally:
        filt.close()
