"""Canary probes read the engine's own timings (llama.cpp ``timings``, Ollama's ns durations) when the
answer carries them, bounded like any untrusted number; a real local HTTP server answers the probe."""

from __future__ import annotations

import json
import time
from http.server import BaseHTTPRequestHandler

import pytest

from harness.records import http_server
from outlier_admin.control.actions import do_create_group, do_register_node
from outlier_admin.control.canary import TIMING_SLACK_MS, engine_timings, probe_node
from tests.conftest import FIXTURES

pytestmark = [pytest.mark.django_db, pytest.mark.services]

#: A real llama.cpp answer to the canary's request (tests/fixtures/llamacpp/README.md): prompt 83.348 ms,
#: generation 182.4 ms, 11 prompt and 16 generated tokens.
LLAMACPP = json.loads((FIXTURES / "llamacpp" / "v1_completion.json").read_text())


class Engine(BaseHTTPRequestHandler):
    answer: dict = {}
    delay_s = 0.0

    def do_POST(self):
        self.rfile.read(int(self.headers["Content-Length"]))
        time.sleep(type(self).delay_s)  # a queue in front of the engine, or a slow network
        body = json.dumps(type(self).answer).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


@pytest.fixture
def node():
    with http_server(Engine) as url:
        group = do_create_group("g", actor="t")
        yield do_register_node(group, url.removeprefix("http://"), actor="t")


def test_llamacpp_timings_are_the_probe_queue_free(node):
    Engine.answer, Engine.delay_s = LLAMACPP, 0.4
    probe = probe_node(node)
    # 400 ms waited before the answer; the engine's own times are the probe's.
    assert probe.ok and probe.ttft_ms == pytest.approx(83.348) and probe.total_ms == pytest.approx(265.748)
    assert (probe.prompt_tokens, probe.completion_tokens) == (11, 16)


def test_ollama_durations_in_nanoseconds_and_its_counts_without_usage(node):
    Engine.answer, Engine.delay_s = {"response": "1, 2", "done": True, "prompt_eval_count": 12, "eval_count": 9,
                                     "prompt_eval_duration": 40_000_000, "eval_duration": 90_500_000}, 0.2
    probe = probe_node(node)
    assert probe.ttft_ms == pytest.approx(40.0) and probe.total_ms == pytest.approx(130.5)
    assert (probe.prompt_tokens, probe.completion_tokens) == (12, 9)


def test_timings_that_cannot_be_this_request_leave_the_wall_time(node):
    # 10 s of "engine time" in an answer that came back at once: not a measurement of this request.
    Engine.answer = {**LLAMACPP, "timings": {**LLAMACPP["timings"], "predicted_ms": 10_000.0}}
    Engine.delay_s = 0.0
    probe = probe_node(node)
    assert probe.ok and probe.ttft_ms is None and probe.total_ms < 5_000


@pytest.mark.parametrize("timings", [
    {"prompt_ms": "83", "predicted_ms": 100},  # a string
    {"prompt_ms": -1.0, "predicted_ms": 100},  # negative
    {"prompt_ms": float("nan"), "predicted_ms": 100},
    {"prompt_ms": True, "predicted_ms": 100},  # a boolean is not a duration
    {"prompt_ms": 0, "predicted_ms": 0},  # nothing
    {"predicted_ms": 100},  # missing
])
def test_engine_timings_refuse_what_is_not_a_duration(timings):
    assert engine_timings({"timings": timings}, wall_ms=1000.0) is None


def test_engine_timings_bounds():
    t = {"timings": {"prompt_ms": 50.0, "predicted_ms": 100.0, "prompt_n": 3, "predicted_n": 4}}
    assert engine_timings(t, wall_ms=150.0) == (50.0, 150.0, 3, 4)
    assert engine_timings(t, wall_ms=150.0 - TIMING_SLACK_MS + 0.1) is not None  # the clocks' rounding
    assert engine_timings(t, wall_ms=150.0 - TIMING_SLACK_MS - 0.1) is None
    assert engine_timings({"choices": []}, 100.0) is None and engine_timings([1], 100.0) is None
