"""The simulated fleet of the demo: the simulator's vLLM V1 step engines, fed by the real traces, in real time.

Nothing here is a second model. The cluster is a :class:`sim.scenario.Scenario` (two groups
on the step engine of :mod:`sim.vllm` with their measured profiles, the demo's faults as
resources, ``scenarios/SCHEMA.md``); the requests come from :func:`sim.workload.build_requests`
(arrival gaps and token pairs of the Azure LLM 2023 conversation trace); and a
:class:`sim.engine.Simulation` runs them — the same event loop, engines and fault model as
``python -m sim`` — advanced to the wall clock (:meth:`Simulation.advance`). What this module
adds is that clock and the HTTP faces of the nodes:

* :meth:`SimulatedFleet.advance` runs the simulation up to now: arrivals are routed through each
  group's *gateway* (the published weights read by a :class:`agent.client.GatewayClient`,
  weighted random over nodes with weight > 0, like a real weighted balancer) and the requests that
  completed (or timed out at the client) since the last call come back as access-log records.
* :class:`CanaryServer` is one node's ``/v1/completions`` — a canary probe is one more request in
  that node's engine, answered when the engine finishes it, so it waits behind the node's batch and
  sees its faults — and its ``/metrics``: the engine's own page (vLLM V1 names:
  inter-token, TTFT, prefill, queue and e2e histograms, running/waiting, KV usage, prefix-cache and
  preemption counters, :meth:`sim.metrics.EngineMetrics.render`), which the control plane
  scrapes (``Node.metrics_url``) for the streamed decode and queue-free prefill signals.

The workload is an hour (``HORIZON_S``); each hour the fleet starts a new simulation of it, as if
every server restarted (their counters reset, which the scraper treats as a restart; the faults of
the schedule come back).
"""

from __future__ import annotations

import json
import math
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import numpy as np

from outlier_admin.demo.config import DemoConfig
from sim.engine import GroupContext, Policy, Precomputed, Simulation
from sim.scenario import Scenario, parse_scenario
from sim.workload import build_requests

LARGE, SMALL = "demo-llama3-70b-h100", "demo-qwen2-72b-a100"
THERMAL_NODE, PCIE_NODE = 5, 2
HORIZON_S = 3600.0  # the workload is built for an hour and replayed after that
PROBE_PROMPT_TOKENS = 10  # the canary's prompt (outlier_admin.control.canary)


def node_name(group_index: int, i: int) -> str:
    return f"{'h100' if group_index == 0 else 'a100'}-{i:02d}"


def demo_scenario(cfg: DemoConfig) -> Scenario:
    """The demo cluster as a scenario document (``scenarios/SCHEMA.md``), validated by the simulator.

    Both groups run the default engine (vLLM V1 with vLLM's defaults) on their hardware's profile:
    Llama-3-70B on 8xH100 and Qwen2-72B on 8xA100 (tp 8; the profiles are llama2-70b's, the
    same shapes). ``prefill/decode_ms_per_token`` and ``max_concurrency`` are fields of the schema's
    per-request model, required by the format and not read by the step engine."""
    wl = {"trace": "azure_llm_2023_conv", "prompt_tokens": {"median": 1000, "sigma": 1.0, "max": 8000},
          "completion_tokens": {"median": 180, "sigma": 0.9, "max": 1000}}
    per_request = {"prefill_ms_per_token": 0.12, "decode_ms_per_token": 14.0, "max_concurrency": 24}
    doc = {
        "name": "outlier-admin-demo", "seed": cfg.seed, "duration_s": HORIZON_S,
        "groups": [
            {"name": LARGE, "nodes": 32, **per_request, "node_speed_spread": 0.03,
             "engine": {"hardware": "h100", "tp": 8}},
            {"name": SMALL, "nodes": 8, **per_request, "node_speed_spread": 0.03,
             "engine": {"hardware": "a100", "tp": 8}},
        ],
        "workload": [{"group": LARGE, "rate_rps": cfg.rate_large, **wl}, {"group": SMALL, "rate_rps": cfg.rate_small, **wl}],
        "faults": [
            {"group": LARGE, "node": THERMAL_NODE, "kind": "thermal_throttle", "start_s": cfg.fault_at_s,
             "end_s": cfg.heal_at_s, "slowdown": 3.0},
            {"group": SMALL, "node": PCIE_NODE, "kind": "pcie_downgrade", "start_s": cfg.pcie_at_s,
             "end_s": cfg.heal_at_s, "decode_slowdown": 2.5, "prefill_slowdown": 1.5},
        ],
        "probe": {"prompt_tokens": PROBE_PROMPT_TOKENS, "completion_tokens": 32},
    }
    return parse_scenario(doc, source="outlier_admin.demo")


class _Gateway(Policy):
    """A group's gateway inside the simulation: routes by the published weights, logs every request."""

    name = "demo_gateway"
    wants_records = True

    def __init__(self, ctx: GroupContext, fleet: SimulatedFleet) -> None:
        super().__init__(ctx)
        self.fleet = fleet

    def pick(self, now: float) -> int:
        return self.fleet._pick(self.ctx.group_index)

    def on_record(self, node: int, now: float, prompt: int, completion: int, ttft_ms: float,
                  total_ms: float, status: int) -> None:
        self.fleet._record(self.ctx.group_index, node, now, prompt, completion, ttft_ms, total_ms, status)


class SimulatedFleet:
    """The demo scenario's simulation, advanced to the wall clock (see module docstring). Every call
    takes one lock: the demo loop (:meth:`advance`) and the node servers' threads (:meth:`metrics_page`,
    :meth:`probe`) each first bring the simulation to now."""

    def __init__(self, cfg: DemoConfig, pick_weights: Callable[[int], dict[str, int] | None]) -> None:
        self.scn = demo_scenario(cfg)
        self.pre = Precomputed.build(self.scn, build_requests(self.scn))
        self.pick_weights = pick_weights
        self.groups = [g.name for g in self.scn.groups]
        self.nodes = [[node_name(gi, i) for i in range(g.nodes)] for gi, g in enumerate(self.scn.groups)]
        self.rng = np.random.default_rng([cfg.seed, 11])
        self.cycle = 0
        self.started = time.time()
        self.pending: dict[str, list[dict[str, Any]]] = {}
        self._lock = threading.RLock()
        self.sim = self._new_simulation()

    def _new_simulation(self) -> Simulation:
        sim = Simulation(self.scn, self.pre, lambda ctx: _Gateway(ctx, self)).begin()
        sim.end_all = HORIZON_S  # the next hour is a new simulation
        return sim

    def rel(self, wall: float | None = None) -> float:
        return (time.time() if wall is None else wall) - self.started

    def _to(self, t_rel: float) -> float:
        """Advance the simulation to demo time ``t_rel``; the simulation's own time (within the hour)."""
        while t_rel >= (self.cycle + 1) * HORIZON_S:
            self.sim.advance(HORIZON_S)
            self.cycle += 1
            self.sim = self._new_simulation()
        now = t_rel - self.cycle * HORIZON_S
        self.sim.advance(now)
        return now

    def engine(self, gi: int, local: int) -> Any:
        """The :class:`sim.vllm.NodeEngine` of a node (of the current hour's simulation)."""
        return self.sim.eng[self.sim.offset[gi] + local]

    def _pick(self, gi: int) -> int:
        weights = self.pick_weights(gi)
        names = self.nodes[gi]
        if weights:
            w = np.array([max(weights.get(nm, 0), 0) for nm in names], dtype=np.float64)
            if w.sum() > 0:
                return int(self.rng.choice(len(names), p=w / w.sum()))
        return int(self.rng.integers(len(names)))  # no document yet: round robin's long-run share

    def _record(self, gi: int, local: int, now: float, prompt: int, completion: int, ttft_ms: float,
                total_ms: float, status: int) -> None:
        ok = status == 200 and math.isfinite(ttft_ms)
        self.pending.setdefault(self.groups[gi], []).append({
            "ts": round(self.started + self.cycle * HORIZON_S + now, 3), "group": self.groups[gi],
            "node": self.nodes[gi][local], "prompt_tokens": prompt, "completion_tokens": completion,
            "ttft_ms": round(ttft_ms, 2) if ok else None, "total_ms": round(total_ms, 2), "status": status})

    def advance(self, wall: float | None = None) -> dict[str, list[dict[str, Any]]]:
        """Run the simulation up to now; return the records of the requests that ended since the last
        call, per group (a client timeout is status 0 at the timeout, as the simulator logs it)."""
        with self._lock:
            self._to(self.rel(wall))
            out, self.pending = self.pending, {}
        return out

    def heal(self, wall: float | None = None) -> float:
        """End the injected faults now rather than at ``DEMO_HEAL_AT_S`` (``DEMO_HEAL_AFTER_PROBES``);
        returns the demo time of the heal. This hour's simulation only: a later hour replays the
        schedule, as it replays the workload."""
        with self._lock:
            now = self._to(self.rel(wall))
            for fi in range(len(self.sim.scn.faults)):
                self.sim.end_fault(fi, now)
            return self.cycle * HORIZON_S + now

    def metrics_page(self, gi: int, local: int, wall: float | None = None) -> str:
        """The node's ``GET /metrics`` now: its engine's page (:meth:`EngineMetrics.render`)."""
        with self._lock:
            now = self._to(self.rel(wall))
            eng = self.engine(gi, local)
            eng.progress_to(now)  # the steps finished by now are counted, as a live server has
            return eng.m.render(model_name=self.groups[gi])

    def probe(self, gi: int, local: int, completion: int, timeout_s: float = 30.0,
              prompt: int = PROBE_PROMPT_TOKENS) -> tuple[float, float, bool]:
        """One canary request (``prompt`` + ``completion`` tokens) on the node's engine, waited for in
        real time: ``(ttft_ms, total_ms, ok)``."""
        done = threading.Event()
        result: list[tuple[float, float, bool]] = []

        def finished(now: float, ttft_ms: float, total_ms: float, ok: bool) -> None:
            result.append((ttft_ms, total_ms, ok))
            done.set()

        with self._lock:
            now = self._to(self.rel())
            self.sim.send_probe(gi, local, now, finished, tokens=(prompt, completion))
        deadline = time.time() + timeout_s
        while not done.wait(0.02) and time.time() < deadline:
            with self._lock:
                self._to(self.rel())
        return result[0] if result else (math.nan, timeout_s * 1000.0, False)


class _NodeHTTPServer(ThreadingHTTPServer):
    """A canary probe opens its peers' batch of connections at once (``control.probe_load``: ~34 in
    the demo); with socketserver's listen backlog of 5 the kernel reset up to 14 of 48 of them."""

    daemon_threads = True
    request_queue_size = 128


class CanaryServer:
    """``POST /v1/completions`` and ``GET /metrics`` of one simulated node on 127.0.0.1:<ephemeral port>.

    A completion is a request in the node's engine (a prompt of one token per word, at least the
    canary's ~10, and ``max_tokens`` completion tokens), answered OpenAI-style with ``usage`` when the
    engine has produced its last token. Requests sent at once run at once (a threaded server)."""

    PROMPT_TOKENS = PROBE_PROMPT_TOKENS

    def __init__(self, fleet: SimulatedFleet, gi: int, local: int) -> None:
        self.fleet, self.gi, self.local = fleet, gi, local
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                try:
                    body = json.loads(self.rfile.read(length) or b"{}")
                    completion = max(1, min(int(body.get("max_tokens") or 16), 4096))
                    prompt = max(outer.PROMPT_TOKENS, min(len(str(body.get("prompt") or "").split()), 32_768))
                except (ValueError, TypeError, AttributeError):
                    self.send_error(400, "body must be JSON with an integer max_tokens")
                    return
                _, _, ok = outer.fleet.probe(outer.gi, outer.local, completion, prompt=prompt)
                if not ok:
                    self.send_error(503, "the request did not complete")
                    return
                doc = {"object": "text_completion", "model": outer.fleet.groups[outer.gi],
                       "choices": [{"index": 0, "text": " 1, 2, 3", "finish_reason": "length"}],
                       "usage": {"prompt_tokens": prompt, "completion_tokens": completion,
                                 "total_tokens": prompt + completion}}
                self._send(json.dumps(doc).encode(), "application/json")

            def do_GET(self) -> None:
                if self.path.split("?")[0] != "/metrics":
                    self.send_error(404)
                    return
                page = outer.fleet.metrics_page(outer.gi, outer.local)
                self._send(page.encode(), "text/plain; version=0.0.4; charset=utf-8")

            def _send(self, data: bytes, content_type: str) -> None:
                self.send_response(200)
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args: object) -> None:
                return

        self.server = _NodeHTTPServer(("127.0.0.1", 0), Handler)
        self.address = f"127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, name=f"canary-{self.address}", daemon=True)

    def start(self) -> CanaryServer:
        self.thread.start()
        return self

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()
