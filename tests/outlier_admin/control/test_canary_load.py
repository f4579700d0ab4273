"""A canary probe sends its peers' load at once (:mod:`outlier_admin.control.probe_load`) to a real
local HTTP server, and is stored as its median answer."""

from __future__ import annotations

import json
import re
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import numpy as np
import pytest

from contract import keys
from detector.group import GroupDetector
from detector.samples import ProgressBatch, SampleBatch
from outlier_admin.control.actions import do_create_group, do_register_node
from outlier_admin.control.canary import PROMPT, probe_node, run_due_probes
from outlier_admin.control.probe_load import ProbeLoad

pytestmark = [pytest.mark.django_db, pytest.mark.services]


class Engine(BaseHTTPRequestHandler):
    """Answers request ``k`` of a probe after ``0.3 + 0.1 k`` s with ``max_tokens - k`` tokens (which
    answer a probe kept is then read off its tokens, not off a wall clock); ``fail_k`` gets a 500."""

    lock = threading.Lock()
    running = peak = 0
    bodies: list = []
    fail_k: int | None = None

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        k = int(m.group(1)) if (m := re.match(r"probe [0-9a-f]+-(\d+):", body["prompt"])) else 0
        cls = type(self)
        with cls.lock:
            cls.bodies.append(body)
            cls.running += 1
            cls.peak = max(cls.peak, cls.running)
        time.sleep(0.3 + 0.1 * k)
        with cls.lock:
            cls.running -= 1
        status = 500 if k == cls.fail_k else 200
        payload = json.dumps({"choices": [{"text": "1, 2"}], "usage": {
            "prompt_tokens": len(body["prompt"].split()), "completion_tokens": body["max_tokens"] - k}}).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def log_message(self, *args):
        pass


@pytest.fixture
def node():
    Engine.running = Engine.peak = 0
    Engine.bodies, Engine.fail_k = [], None
    srv = ThreadingHTTPServer(("127.0.0.1", 0), Engine)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    group = do_create_group("g", actor="t")
    yield do_register_node(group, f"127.0.0.1:{srv.server_address[1]}", actor="t", name="n0")
    srv.shutdown()
    srv.server_close()


def test_a_probe_sends_the_peers_batch_at_once_and_keeps_the_median_answer(node, redis_client):
    probe = probe_node(node, load=ProbeLoad(8, 200, 50))
    assert len(Engine.bodies) == 8 and Engine.peak == 8  # all eight in flight together
    prompts = [b["prompt"] for b in Engine.bodies]
    assert len(set(prompts)) == 8 and all(len(p.split()) == 200 and p.endswith(PROMPT) for p in prompts)
    assert {b["max_tokens"] for b in Engine.bodies} == {50}
    # Answers after 0.3 .. 1.0 s, 0.1 s apart: the stored one is the upper median, request 4's (46 tokens,
    # no sooner than its 0.7 s), not the first or the last answer.
    assert probe.ok and (probe.prompt_tokens, probe.completion_tokens) == (200, 46)
    assert probe.total_ms >= 700.0, probe.total_ms


def test_a_probe_with_one_request_failed_is_failed(node, redis_client):
    Engine.fail_k = 6
    probe = probe_node(node, load=ProbeLoad(8, 100, 20))
    assert (probe.ok, probe.status, probe.error) == (False, 500, "http_status")


def test_the_canary_reads_the_peers_load_off_the_groups_detector(node, redis_client):
    names = ["n0", *(f"peer-{i}" for i in range(5))]
    gd = GroupDetector(nodes=names)
    gd.ingest(SampleBatch.from_columns(node=names[1:] * 40, ts=np.linspace(0, 5, 200), prompt_tokens=[300] * 200,
                                       completion_tokens=[40] * 200, total_ms=[2500.0] * 200, status=[200] * 200))
    gd.ingest_progress(ProgressBatch.from_rows([[n, 5.0, 1.0, 60.0, 2700.0, None, None, None, float(b), None, None]
                                                for n, b in zip(names, [0, 5, 6, 6, 7, 9], strict=True)]))
    redis_client.hset(keys.state("g"), "detector", gd.to_bytes())
    redis_client.hset(keys.probes("g"), "n0", node.address)
    assert run_due_probes() == 1
    assert len(Engine.bodies) == 6 and {len(b["prompt"].split()) for b in Engine.bodies} == {300}
    assert {b["max_tokens"] for b in Engine.bodies} == {40}


def test_the_demos_node_server_answers_a_probes_whole_batch(db, redis_client):
    """The demo's node (its engine in the simulator) takes a probe's batch of connections at once."""
    from outlier_admin.demo.config import DemoConfig
    from outlier_admin.demo.fleet import CanaryServer, SimulatedFleet

    fleet = SimulatedFleet(DemoConfig.from_env({}), lambda gi: None)
    fleet.started -= 20.0  # 20 s of traffic to simulate
    fleet.advance()
    server = CanaryServer(fleet, 1, 3).start()
    try:
        group = do_create_group("demo-a100", actor="t")
        node = do_register_node(group, server.address, actor="t", name="a100-03")
        # Four probes: with socketserver's listen backlog of 5, the kernel reset some connections of
        # two batches in five.
        probes = [probe_node(node, load=ProbeLoad(48, 50, 4)) for _ in range(4)]
        assert [(p.ok, p.error, p.prompt_tokens, p.completion_tokens) for p in probes] == [(True, "", 50, 4)] * 4
    finally:
        server.stop()
