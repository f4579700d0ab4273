"""The simulated fleet of the demo: the simulator's node model, fed by the real traces, in real time.

Nothing here is a second model: the cluster is a :class:`detector.sim.scenario.Scenario` (two
groups, the faults of the demo), the requests come from :func:`detector.sim.workload.build_requests`
(arrival gaps and token pairs of the Azure LLM 2023 conversation trace), and every service time uses
the engine's per-node speed, Splitwise decode-vs-batch curve, per-request noise and fault factors
(:class:`detector.sim.engine.Simulation`, used as a model; its discrete-event loop is not run).
What this module adds is the wall clock:

* :meth:`SimulatedFleet.advance` dispatches the requests whose arrival time has passed, routing each
  through the group's *gateway* (a :class:`outlier_admin.gateway_client.GatewayClient` reading the
  published weights, weighted random over nodes with weight > 0, like a real weighted balancer) and
  returns the access-log records of the requests that have *completed*:
  ``total = prefill + decode`` with ``b`` = requests running on the node when it started.
* :class:`CanaryServer` answers ``POST /v1/completions`` for one node with the same model, so canary
  probes see the node as slow while its fault lasts and as healthy after it heals, and ``GET
  /metrics`` with vLLM's inter-token-latency histogram (:meth:`SimulatedFleet.itl`): the tokens its
  requests have streamed so far, which the control plane scrapes (``Node.metrics_url``) for the
  streamed decode signal.
"""

from __future__ import annotations

import heapq
import json
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import numpy as np

from detector.sim.engine import Precomputed, Simulation
from detector.sim.scenario import Scenario, parse_scenario
from detector.sim.workload import build_requests
from outlier_admin.demo.config import DemoConfig

LARGE, SMALL = "demo-llama3-70b-h100", "demo-qwen2-72b-a100"
THERMAL_NODE, PCIE_NODE = 5, 2
HORIZON_S = 3600.0  # the workload is built for an hour and replayed cyclically after that


def node_name(group_index: int, i: int) -> str:
    return f"{'h100' if group_index == 0 else 'a100'}-{i:02d}"


def demo_scenario(cfg: DemoConfig) -> Scenario:
    """The demo cluster as a scenario document (``scenarios/SCHEMA.md``), validated by the simulator."""
    wl = {"trace": "azure_llm_2023_conv", "prompt_tokens": {"median": 1000, "sigma": 1.0, "max": 8000},
          "completion_tokens": {"median": 180, "sigma": 0.9, "max": 1000}}
    doc = {
        "name": "outlier-admin-demo", "seed": cfg.seed, "duration_s": HORIZON_S,
        "groups": [
            {"name": LARGE, "nodes": 32, "prefill_ms_per_token": 0.12, "decode_ms_per_token": 14.0,
             "max_concurrency": 24, "jitter_cv": 0.08, "node_speed_spread": 0.03},
            {"name": SMALL, "nodes": 8, "prefill_ms_per_token": 0.2, "decode_ms_per_token": 22.0,
             "max_concurrency": 16, "jitter_cv": 0.08, "node_speed_spread": 0.03},
        ],
        "workload": [{"group": LARGE, "rate_rps": cfg.rate_large, **wl}, {"group": SMALL, "rate_rps": cfg.rate_small, **wl}],
        "faults": [
            {"group": LARGE, "node": THERMAL_NODE, "kind": "thermal_throttle", "start_s": cfg.fault_at_s,
             "end_s": cfg.heal_at_s, "slowdown": 3.0},
            {"group": SMALL, "node": PCIE_NODE, "kind": "pcie_downgrade", "start_s": cfg.pcie_at_s,
             "end_s": cfg.heal_at_s, "decode_slowdown": 2.5, "prefill_slowdown": 1.5},
        ],
    }
    return parse_scenario(doc, source="outlier_admin.demo")


class SimulatedFleet:
    """Real-time replay of the demo scenario (see module docstring). Not thread-safe for
    :meth:`advance` (one caller, the demo loop); :meth:`service_ms` is safe for the canary servers."""

    def __init__(self, cfg: DemoConfig, pick_weights: Callable[[int], dict[str, int] | None]) -> None:
        self.scn = demo_scenario(cfg)
        requests = build_requests(self.scn)
        self.pre = Precomputed.build(self.scn, requests)
        # The engine object is the node model: speeds, decode curve, fault factors.
        self.model = Simulation(self.scn, self.pre, factory=lambda ctx: None)  # type: ignore[arg-type,return-value]
        self.pick_weights = pick_weights
        self.groups = [g.name for g in self.scn.groups]
        self.nodes = [[node_name(gi, i) for i in range(g.nodes)] for gi, g in enumerate(self.scn.groups)]
        self.rng = np.random.default_rng([cfg.seed, 11])
        self.cursor = 0
        self.cycle = 0
        self.started = time.time()
        self.in_flight: list[list[float]] = [[] for _ in range(len(self.model.speed))]  # heaps of end times
        self.pending: list[tuple[float, int, dict[str, Any]]] = []  # completion time, seq, record
        # Per node: requests streaming (first token at, end at, seconds per token, tokens after the
        # first) and the inter-token histogram of the finished ones ([sum_s, count]).
        self.streams: list[list[tuple[float, float, float, int]]] = [[] for _ in range(len(self.model.speed))]
        self.itl_done = [[0.0, 0] for _ in range(len(self.model.speed))]
        self.seq = 0
        self._lock = threading.Lock()

    def rel(self, wall: float | None = None) -> float:
        return (time.time() if wall is None else wall) - self.started

    def fault_factors(self, gi: int, local: int, t_rel: float) -> tuple[float, float]:
        """``(F_prefill, F_decode)`` of a node at demo time ``t_rel`` (the engine's fault model)."""
        return self.model.factors(self.model.offset[gi] + local, t_rel % HORIZON_S)

    def service_ms(self, gi: int, local: int, prompt: int, completion: int, t_rel: float, noise: float = 1.0
                   ) -> tuple[float, float]:
        """``(ttft_ms, total_ms)`` of a request started at ``t_rel`` (engine formula, see module doc)."""
        n = self.model.offset[gi] + local
        with self._lock:
            running = self.in_flight[n]
            while running and running[0] <= t_rel:
                heapq.heappop(running)
            b = min(len(running) + 1, len(self.model.curve[gi]) - 1)
        f_pre, f_dec = self.fault_factors(gi, local, t_rel)
        k = noise * self.model.speed[n]
        pre = self.model.pre_ms[n] * prompt * k * f_pre
        dec = self.model.dec_ms[n] * self.model.curve[gi][b] * completion * k * f_dec
        return pre + dec / max(completion, 1), pre + dec

    def itl(self, gi: int, local: int, t_rel: float | None = None) -> tuple[float, int]:
        """``(sum_s, count)`` of the node's inter-token gaps streamed up to ``t_rel`` (now), as vLLM's
        ``inter_token_latency_seconds`` histogram counts them."""
        t_rel = self.rel() if t_rel is None else t_rel
        n = self.model.offset[gi] + local
        with self._lock:
            done = self.itl_done[n]
            running = []
            for first, end, per_token, tokens in self.streams[n]:
                if end <= t_rel:
                    done[0] += per_token * tokens
                    done[1] += tokens
                else:
                    running.append((first, end, per_token, tokens))
            self.streams[n] = running
            total_s, count = done
            for first, _end, per_token, tokens in running:
                streamed = min(max(int((t_rel - first) / per_token), 0), tokens)
                total_s += streamed * per_token
                count += streamed
        return total_s, count

    def _pick(self, gi: int) -> int:
        weights = self.pick_weights(gi)
        names = self.nodes[gi]
        if weights:
            w = np.array([max(weights.get(nm, 0), 0) for nm in names], dtype=np.float64)
            if w.sum() > 0:
                return int(self.rng.choice(len(names), p=w / w.sum()))
        return int(self.rng.integers(len(names)))  # no document yet: round robin's long-run share

    def advance(self, wall: float | None = None) -> dict[str, list[dict[str, Any]]]:
        """Dispatch arrivals up to now; return the completed requests' records per group."""
        wall = time.time() if wall is None else wall
        now = self.rel(wall)
        req = self.pre.requests
        while True:
            if self.cursor >= len(req):
                self.cursor, self.cycle = 0, self.cycle + 1
            t = float(req.t[self.cursor]) + self.cycle * HORIZON_S
            if t > now:
                break
            i = self.cursor
            self.cursor += 1
            gi = int(req.group[i])
            local = self._pick(gi)
            prompt, completion = int(req.prompt[i]), int(req.completion[i])
            ttft, total = self.service_ms(gi, local, prompt, completion, t, float(self.pre.noise[i]))
            end = t + total / 1000.0
            with self._lock:
                n = self.model.offset[gi] + local
                heapq.heappush(self.in_flight[n], end)
                if completion >= 2:
                    self.streams[n].append((t + ttft / 1000.0, end, (total - ttft) / 1000.0 / (completion - 1),
                                            completion - 1))
            record = {"ts": round(self.started + end, 3), "group": self.groups[gi], "node": self.nodes[gi][local],
                      "prompt_tokens": prompt, "completion_tokens": completion,
                      "ttft_ms": round(ttft, 2), "total_ms": round(total, 2), "status": 200}
            self.seq += 1
            heapq.heappush(self.pending, (end, self.seq, record))
        out: dict[str, list[dict[str, Any]]] = {}
        while self.pending and self.pending[0][0] <= now:
            _, _, record = heapq.heappop(self.pending)
            out.setdefault(record["group"], []).append(record)
        return out


class CanaryServer:
    """``POST /v1/completions`` and ``GET /metrics`` of one simulated node on 127.0.0.1:<ephemeral port>.

    Sleeps the model's service time for the probe (prompt ~10 tokens, ``max_tokens`` completion
    tokens) and answers OpenAI-style with ``usage``, so the canary sees the node's current speed.
    """

    PROMPT_TOKENS = 10

    def __init__(self, fleet: SimulatedFleet, gi: int, local: int) -> None:
        self.fleet, self.gi, self.local = fleet, gi, local
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                try:
                    body = json.loads(self.rfile.read(length) or b"{}")
                    completion = max(1, min(int(body.get("max_tokens") or 16), 4096))
                except (ValueError, TypeError):
                    self.send_error(400, "body must be JSON with an integer max_tokens")
                    return
                _, total = outer.fleet.service_ms(outer.gi, outer.local, outer.PROMPT_TOKENS, completion,
                                                  outer.fleet.rel())
                time.sleep(total / 1000.0)
                doc = {"object": "text_completion", "model": outer.fleet.groups[outer.gi],
                       "choices": [{"index": 0, "text": " 1, 2, 3", "finish_reason": "length"}],
                       "usage": {"prompt_tokens": outer.PROMPT_TOKENS, "completion_tokens": completion,
                                 "total_tokens": outer.PROMPT_TOKENS + completion}}
                data = json.dumps(doc).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self) -> None:
                if self.path.split("?")[0] != "/metrics":
                    self.send_error(404)
                    return
                total_s, count = outer.fleet.itl(outer.gi, outer.local)
                name, model = "vllm:inter_token_latency_seconds", outer.fleet.groups[outer.gi]
                data = (f"# HELP {name} Histogram of inter-token latency in seconds.\n# TYPE {name} histogram\n"
                        f'{name}_bucket{{le="+Inf",model_name="{model}"}} {count}\n'
                        f'{name}_count{{model_name="{model}"}} {count}\n'
                        f'{name}_sum{{model_name="{model}"}} {total_s!r}\n').encode()
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args: object) -> None:
                return

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.address = f"127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, name=f"canary-{self.address}", daemon=True)

    def start(self) -> CanaryServer:
        self.thread.start()
        return self

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()
