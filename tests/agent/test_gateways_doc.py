"""docs/gateways.md's copy-paste configurations are ones the appliers accept and drive as the page says."""

from __future__ import annotations

import json
import re
import time

import pytest

from agent.caddy import plan_handler
from agent.client import effective_weights
from agent.envoy import plan_assignment
from agent.traefik import parked_service, plan_service_file
from contract.weights_document import parse_document
from harness.gateways import weights_document
from tests.test_compose import ROOT

# The page's examples use 10.0.0.x; test data stays on loopback (nothing here is contacted anyway).
DOC = (ROOT / "docs" / "gateways.md").read_text().replace("10.0.0.", "127.0.0.")
NODES = {"n7": "127.0.0.7:8000", "n8": "127.0.0.8:8000"}


def section(title: str) -> str:
    return DOC.split(f"\n## {title}\n", 1)[1].split("\n## ", 1)[0]


def json_block(title: str) -> dict:
    blocks = re.findall(r"```json\n(.*?)```", section(title), re.S)
    assert len(blocks) == 1, title
    return json.loads(blocks[0])


def eff(**kw):
    return effective_weights(parse_document(json.dumps(weights_document("llama-70b", 1, NODES, **kw))), time.time())


def test_envoy_seed_file_of_the_page():
    body, result, _ = plan_assignment(json_block("Envoy"), eff(quarantined=("n8",)), "llm")
    eps = body["resources"][0]["endpoints"][0]["lb_endpoints"]
    assert [e["health_status"] for e in eps] == ["HEALTHY", "DRAINING"] and not result.missing


def test_traefik_agent_file_of_the_page():
    body, result, routed = plan_service_file(json_block("Traefik"), eff(weights={"n7": 35}), "llm")
    assert routed == {"127.0.0.7:8000": 35, "127.0.0.8:8000": 100} and not result.missing
    assert body["http"]["services"]["llm"]["loadBalancer"]["strategy"] == "wrr"  # kept
    body, _, routed = plan_service_file(json_block("Traefik"), eff(quarantined=("n7",)), "llm")
    assert routed == {"127.0.0.8:8000": 100} and parked_service("llm") in body["http"]["services"]


@pytest.mark.parametrize("strategy", ["leasttime", "p2c", "hrw"])
def test_traefik_applies_quarantine_only_under_a_strategy_that_is_not_wrr(strategy):
    """A rewrite resets leasttime's samples (docs/gateways.md, Traefik): weights stay the operator's."""
    seed = json_block("Traefik")
    seed["http"]["services"]["llm"]["loadBalancer"]["strategy"] = strategy
    body, result, routed = plan_service_file(seed, eff(weights={"n7": 35}), "llm")
    assert routed == {"127.0.0.7:8000": 100, "127.0.0.8:8000": 100} and body == seed
    assert "quarantine only" in result.note and "n7" in result.note and not result.changes
    body, result, routed = plan_service_file(seed, eff(quarantined=("n7",)), "llm")
    assert routed == {"127.0.0.8:8000": 100} and parked_service("llm") in body["http"]["services"]
    assert result.changes == ["127.0.0.7:8000 quarantined: moved to llm-outlier-quarantined"]


def test_caddy_handler_of_the_page():
    config = json_block("Caddy")
    handler = config["apps"]["http"]["servers"]["llm"]["routes"][0]["handle"][0]
    assert handler["@id"] == "outlier-llm" and "--caddy-handler-id outlier-llm" in section("Caddy")
    new, result, _ = plan_handler(handler, eff(weights={"n8": 35}), {})
    assert new["load_balancing"]["selection_policy"]["weights"] == [5, 2] and not result.missing
