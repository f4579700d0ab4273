"""Helpers for the simulator tests: tiny deterministic scenarios.

``TINY`` selects the per-request engine (``engine.kind: per_request``): the tests built on it check
that model's exact formula (service time = prefill + decode, fixed at admission). The vLLM step
engine, the default, has its own tests (``test_sim_step_engine.py``); ``tiny_vllm()`` drops the
selection.
"""

from __future__ import annotations

import copy
from typing import Any

from sim.engine import Precomputed, Simulation
from sim.policies import policy_factory
from sim.scenario import parse_scenario
from sim.workload import build_requests

TINY: dict[str, Any] = {
    "name": "tiny",
    "seed": 1,
    "duration_s": 60,
    "groups": [{"name": "g", "nodes": 2, "prefill_ms_per_token": 0.1, "decode_ms_per_token": 10.0,
                "max_concurrency": 8, "jitter_cv": 0.0, "node_speed_spread": 0.0, "decode_batch_curve": "flat",
                "engine": {"kind": "per_request"}}],
    "workload": [{"group": "g", "rate_rps": 4,
                  "prompt_tokens": {"dist": "lognormal", "median": 1000, "sigma": 0.0, "max": 1000},
                  "completion_tokens": {"dist": "lognormal", "median": 50, "sigma": 0.0, "max": 50}}],
    "client": {"timeout_s": 30, "retries": 0},
    "faults": [],
    "expect": {"faulty": []},
}


def tiny(**changes: Any) -> dict[str, Any]:
    d = copy.deepcopy(TINY)
    for k, v in changes.items():
        d[k] = v
    return d


def tiny_vllm(**changes: Any) -> dict[str, Any]:
    """``tiny`` on the default engine (vLLM V1 step loop, h100 tp8 profile)."""
    d = tiny(**changes)
    del d["groups"][0]["engine"]
    return d


def simulate(doc: dict[str, Any], policy: str = "round_robin") -> Simulation:
    scn = parse_scenario(doc)
    pre = Precomputed.build(scn, build_requests(scn))
    return Simulation(scn, pre, policy_factory(policy)).run()


