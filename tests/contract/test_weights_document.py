"""The weights document has one type (``contract.weights_document``) for its writers and its
readers, and one pin range: a pin at the limit (the base weight) goes through the action, is
published by the tick and applied by the gateway client; a pin past it is refused by the action,
and a detector whose base is under an existing pin publishes the pin at base (never a weight a
gateway would refuse, which would drop the node)."""

from __future__ import annotations

import json
import time

import numpy as np
import pytest

from agent.client import GatewayClient
from contract.weights_document import (
    DEFAULT_BASE_WEIGHT,
    DEFAULT_STALE_AFTER_S,
    DocumentError,
    NodeWeight,
    WeightsDocument,
    pin_range,
)
from detector.group import GroupDetector
from harness.records import make_records
from outlier_admin.control.actions import ActionError, do_pin_weight
from outlier_admin.control.publish import build_document, read_weights
from outlier_admin.control.redis_conn import get_redis
from outlier_admin.control.tick import run_tick
from outlier_admin.fleet.models import Node
from outlier_admin.ingest.pipeline import submit

PINNED = "127.0.0.1:9002"


def test_the_document_round_trips_through_its_json():
    doc = WeightsDocument("g", 7, 1000.5, 30, True, (NodeWeight("a", "127.0.0.1:8000", 35, "degraded", 100),
                                                    NodeWeight("b", "127.0.0.1:8001", 0, "quarantined", 200)))
    back = WeightsDocument.from_json(doc.to_json(), expected_group="g")
    assert back == doc and json.loads(doc.to_json())["nodes"][1]["base_weight"] == 200
    with pytest.raises(DocumentError, match="expected 'h'"):
        WeightsDocument.from_json(doc.to_json(), expected_group="h")


def test_a_reader_assumes_the_publishers_defaults():
    raw = json.dumps({"group": "g", "version": 1, "generated_at": 0.0,
                      "nodes": [{"node": "a", "address": "127.0.0.1:8000", "weight": 40}]})
    doc = WeightsDocument.from_json(raw)
    assert doc.stale_after_s == DEFAULT_STALE_AFTER_S == 30
    assert doc.nodes[0].base_weight == DEFAULT_BASE_WEIGHT == 100
    assert doc.is_stale(30.5) and not doc.is_stale(29.5)


def test_the_publisher_leaves_out_what_a_gateway_refuses_and_says_why():
    nodes = [{"node": "a", "address": "127.0.0.1:8000", "weight": 100, "state": "healthy", "base_weight": 100},
             {"node": "b", "address": "127.0.0.1:8001", "weight": 101, "state": "healthy", "base_weight": 100}]
    doc = build_document("wd-g", 3, nodes, safeguard=False, now=1000.0, stale_after_s=30)
    assert [n.node for n in doc.nodes] == ["a"] and "weight 101 outside 0..100" in doc.skipped[0]
    assert [n.node for n in WeightsDocument.from_json(doc.to_json()).nodes] == ["a"]


def test_a_pin_above_the_detectors_base_is_published_at_base():
    gd = GroupDetector(nodes=["a", "b", "c"], base_weights=[100.0, 60.0, 100.0])
    gd.pin_weight("b", 100, now=1.0, until=100.0)
    ev = gd.evaluate(2.0)
    assert dict(zip(ev.nodes, ev.weights.tolist(), strict=True)) == {"a": 100.0, "b": 60.0, "c": 100.0}


@pytest.mark.django_db
@pytest.mark.services
def test_a_pin_at_the_limit_is_published_and_applied_by_the_gateway(redis_client, make_group):
    make_group("g1")
    rng = np.random.default_rng(3)
    t0 = time.time()
    recs = make_records(t0, rng=rng)
    assert submit([(i + 1, r, None) for i, r in enumerate(recs)], source="test").accepted == len(recs)
    run_tick("g1", now=t0 + 0.5)
    node = Node.objects.get(name=PINNED)
    assert pin_range(node.base_weight) == (0, 100)
    with pytest.raises(ActionError, match=r"\[0, 100\]"):
        do_pin_weight(node, 101, actor="alice", reason="past the limit")
    do_pin_weight(node, 100, actor="alice", reason="at the limit")
    res = run_tick("g1", now=t0 + 1.5)
    assert res.weights[PINNED] == 100
    published = {n["node"]: n for n in read_weights("g1")["nodes"]}
    assert published[PINNED]["weight"] == 100 and len(published) == 8

    client = GatewayClient(get_redis(), "g1")
    assert client.refresh() and client.document.skipped == ()
    assert client.weights()[PINNED] == 100

