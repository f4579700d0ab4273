"""Canary probes against a real local HTTP server (configurable delay / failure)."""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from contract import keys
from outlier_admin.control.actions import ActionError, do_create_group, do_register_node
from outlier_admin.control.canary import probe_node, run_due_probes
from outlier_admin.control.models import CanaryProbe
from outlier_admin.fleet.models import Node

pytestmark = [pytest.mark.django_db, pytest.mark.services]


class FakeVLLM(BaseHTTPRequestHandler):
    delay_s = 0.0
    status = 200
    bodies: list = []

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        type(self).bodies.append((self.path, body))
        time.sleep(self.delay_s)
        payload = json.dumps({"choices": [{"text": "1, 2, 3"}],
                              "usage": {"prompt_tokens": 11, "completion_tokens": body["max_tokens"]}}).encode()
        if self.status >= 400:  # what an internal admin endpoint might answer: never to be stored
            payload = b"INTERNAL-SECRET-abc123 stack trace"
        self.send_response(self.status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def log_message(self, *args):
        pass


@pytest.fixture
def server():
    FakeVLLM.delay_s, FakeVLLM.status, FakeVLLM.bodies = 0.0, 200, []
    srv = ThreadingHTTPServer(("127.0.0.1", 0), FakeVLLM)
    thread = threading.Thread(target=srv.serve_forever, daemon=True)
    thread.start()
    yield srv
    srv.shutdown()
    srv.server_close()


@pytest.fixture
def node(server):
    group = do_create_group("g", actor="t")
    return do_register_node(group, f"127.0.0.1:{server.server_address[1]}", actor="t")


def test_probe_measures_latency_and_tokens(node, settings):
    settings.CANARY_MAX_TOKENS = 16
    FakeVLLM.delay_s = 0.2
    probe = probe_node(node)
    assert probe.ok and probe.status == 200 and probe.total_ms >= 200
    assert (probe.prompt_tokens, probe.completion_tokens) == (11, 16)
    assert probe.normalised_latency is None  # set by the tick that judges it, on the detector's scale
    assert FakeVLLM.bodies[0][0] == "/v1/completions" and FakeVLLM.bodies[0][1]["max_tokens"] == 16


def test_http_error_and_timeout_are_failed_probes_with_a_reason_code_never_the_body(node, settings):
    FakeVLLM.status = 500
    probe = probe_node(node)
    assert (probe.ok, probe.status, probe.error) == (False, 500, "http_status")
    assert "SECRET" not in str(CanaryProbe.objects.filter(pk=probe.pk).values().get())
    FakeVLLM.status, FakeVLLM.delay_s = 200, 1.5
    settings.CANARY_TIMEOUT_S = 1
    probe = probe_node(node)
    assert (probe.ok, probe.status, probe.error) == (False, 0, "timeout")


def test_the_probe_url_is_rebuilt_from_the_address_never_taken_from_data(server, db):
    """Finding: a node auto-registered under ``http://127.0.0.1:P/internal/admin?token=x#`` was probed
    at that path. Such a name is refused at registration; a row that holds one anyway (written before
    validation) is not probed at all, and a valid address is probed at /v1/completions only."""
    port = server.server_address[1]
    group = do_create_group("g", actor="t")
    with pytest.raises(ActionError, match="host:port only"):
        do_register_node(group, f"http://127.0.0.1:{port}/internal/admin?token=x#", actor="t")
    legacy = Node.objects.create(group=group, name="legacy", address=f"http://127.0.0.1:{port}/internal/admin?token=x#")
    probe = probe_node(legacy)
    assert (probe.ok, probe.error) == (False, "bad_address") and FakeVLLM.bodies == []
    good = do_register_node(group, f"http://127.0.0.1:{port}/", actor="t", name="good")
    assert probe_node(good).ok and [p for p, _ in FakeVLLM.bodies] == ["/v1/completions"]


def test_connection_refused_is_a_failed_probe(db):
    node = do_register_node(do_create_group("g2", actor="t"), "127.0.0.1:9", actor="t")
    probe = probe_node(node)
    assert not probe.ok and probe.status == 0 and probe.error


def test_due_probes_go_once_per_interval(node, redis_client):
    redis_client.hset(keys.probes("g"), node.name, node.address)
    assert run_due_probes() == 1
    assert run_due_probes() == 0  # in flight / interval guard
    assert node.probes.count() == 1 and node.probes.get().passed is None


def test_tick_feeds_probe_results_to_the_state_machine(server, redis_client, settings, make_group):
    """Quarantined node -> tick marks a probe due -> canary probes the real server -> next tick
    judges it (``passed`` set, node moves on from quarantine after enough passes)."""
    import numpy as np

    from harness.records import make_records
    from outlier_admin.control.tick import run_tick
    from outlier_admin.ingest.pipeline import submit

    make_group("g1")
    rng = np.random.default_rng(7)
    t0 = time.time()
    for k in range(6):
        recs = make_records(t0 + k, rng=rng, slow={3: 3.0} if k >= 2 else {})
        submit([(i, r, None) for i, r in enumerate(recs)], source="t")
        res = run_tick("g1", now=t0 + k + 0.5)
    assert res.states["127.0.0.1:9003"] == "quarantined"
    # The node's address now points at the local server (its name, the detector id, stays).
    Node.objects.filter(name="127.0.0.1:9003").update(address=f"127.0.0.1:{server.server_address[1]}")
    res = run_tick("g1", now=t0 + 300)  # past the first probe delay
    assert redis_client.hkeys(keys.probes("g1")) == [b"127.0.0.1:9003"]
    assert run_due_probes() == 1
    run_tick("g1", now=t0 + 301)
    probe = CanaryProbe.objects.get()
    assert probe.ok and probe.passed is not None and probe.applied_at is not None
    # Stored on the detector's scale (latency over the learned cost model): a quick local server
    # answering 11 + 32 tokens in a few ms is far below what the group's requests cost.
    assert probe.normalised_latency is not None and 0 < probe.normalised_latency < 1
