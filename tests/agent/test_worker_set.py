"""The worker-API routers' plan (agent/worker_set.py): membership from the weights, pure."""

from __future__ import annotations

import json
import time

import pytest

from agent.base import ApplyError
from agent.client import effective_weights
from agent.worker_set import check_router_url, plan_worker_set, worker_address
from contract.weights_document import parse_document
from harness.gateways import weights_document

NODES = {"a": "127.0.0.1:8001", "b": "127.0.0.1:8002", "c": "127.0.0.1:8003"}
ALL = set(NODES.values())


def eff(nodes: dict[str, str] = NODES, **kw):
    return effective_weights(parse_document(json.dumps(weights_document("g", 1, nodes, **kw))), time.time())


def test_quarantined_removed_restored_added_degraded_kept() -> None:
    plan = plan_worker_set(ALL, ALL, eff(quarantined=("b",), weights={"c": 20}))
    assert plan.remove == [NODES["b"]] and plan.add == []
    plan = plan_worker_set(ALL - {NODES["b"]}, ALL, eff())
    assert plan.add == [NODES["b"]] and plan.remove == []


def test_remove_below_takes_a_cut_node_out_and_back() -> None:
    assert plan_worker_set(ALL, ALL, eff(weights={"c": 20}), remove_below=0.25).remove == [NODES["c"]]
    assert plan_worker_set(ALL, ALL, eff(weights={"c": 25}), remove_below=0.25).remove == []
    assert plan_worker_set(ALL - {NODES["c"]}, ALL, eff(weights={"c": 30}), remove_below=0.25).add == [NODES["c"]]


def test_a_node_the_router_does_not_know_is_skipped_never_added() -> None:
    nodes = {**NODES, "z": "127.0.0.1:9999"}
    plan = plan_worker_set(ALL, ALL, eff(nodes))
    assert plan.add == [] and plan.result.missing == ["z (127.0.0.1:9999)"]
    # A removed worker the agent may add back (known) is added; the unknown one still is not.
    plan = plan_worker_set(ALL - {NODES["a"]}, ALL, eff(nodes))
    assert plan.add == [NODES["a"]]


def test_workers_no_node_names_are_left_alone() -> None:
    plan = plan_worker_set(ALL | {"127.0.0.1:7000"}, ALL, eff(quarantined=("a",)))
    assert plan.result.unknown == ["127.0.0.1:7000"] and plan.remove == [NODES["a"]]


def test_never_the_last_worker() -> None:
    with pytest.raises(ApplyError, match="no backend left"):
        plan_worker_set(ALL, ALL, eff(quarantined=("a", "b", "c")))
    with pytest.raises(ApplyError, match="no backend left"):  # b and c: not the router's, never added
        plan_worker_set({NODES["a"]}, {NODES["a"]}, eff(quarantined=("a",)))
    # The others known: added first, then a removed.
    plan = plan_worker_set({NODES["a"]}, ALL, eff(quarantined=("a",)))
    assert plan.add == [NODES["b"], NODES["c"]] and plan.remove == [NODES["a"]]
    # An unknown worker still routing is a backend: the change goes through.
    plan = plan_worker_set(ALL | {"127.0.0.1:7000"}, ALL, eff(quarantined=("a", "b", "c")))
    assert sorted(plan.remove) == sorted(ALL)


@pytest.mark.parametrize("url,address", [("http://127.0.0.1:8001", "127.0.0.1:8001"),
                                         ("http://127.0.0.1:8001/", "127.0.0.1:8001"),
                                         ("https://gpu-7:8443", "gpu-7:8443"),
                                         ("http://[::1]:8000", "[::1]:8000"), ("http://gpu-7", "gpu-7:80")])
def test_worker_address(url: str, address: str) -> None:
    assert worker_address(url) == address


@pytest.mark.parametrize("url", ["127.0.0.1:30000", "ftp://127.0.0.1:1", "http://127.0.0.1:1/admin", "http://"])
def test_router_url_must_be_a_base_url(url: str) -> None:
    with pytest.raises(ValueError):
        check_router_url(url)
