from __future__ import annotations

import time

import numpy as np
import pytest

from outlier_admin.demo.config import DemoConfig, DemoConfigError
from outlier_admin.demo.fleet import LARGE, PCIE_NODE, SMALL, THERMAL_NODE, demo_scenario, node_name
from outlier_admin.demo.runner import choose_redis


def test_defaults_inject_faults_a_minute_in_and_heal_later():
    cfg = DemoConfig.from_env({})
    assert (cfg.port, cfg.seconds, cfg.fault_at_s, cfg.pcie_at_s) == (8000, 0.0, 60.0, 75.0)
    assert cfg.heal_at_s == 255.0


def test_env_overrides_and_clear_errors():
    cfg = DemoConfig.from_env({"PORT": "9001", "DEMO_SECONDS": "25", "DEMO_FAULT_AT_S": "3", "DEMO_PCIE_AT_S": "4",
                               "DEMO_HEAL_AT_S": "14", "DEMO_RATE_RPS": "64,16"})
    assert (cfg.port, cfg.seconds, cfg.fault_at_s, cfg.pcie_at_s, cfg.heal_at_s) == (9001, 25, 3, 4, 14)
    assert (cfg.rate_large, cfg.rate_small) == (64, 16)
    with pytest.raises(DemoConfigError, match="DEMO_SECONDS"):
        DemoConfig.from_env({"DEMO_SECONDS": "soon"})
    with pytest.raises(DemoConfigError, match="DEMO_HEAL_AT_S"):
        DemoConfig.from_env({"DEMO_FAULT_AT_S": "30", "DEMO_HEAL_AT_S": "20"})
    with pytest.raises(DemoConfigError, match="DEMO_SMALL_POLICY"):
        DemoConfig.from_env({"DEMO_SMALL_POLICY": "yolo"})


def test_the_heal_after_failed_probes_is_a_whole_number_of_probes():
    assert DemoConfig.from_env({}).heal_after_probes is None
    assert DemoConfig.from_env({"DEMO_HEAL_AFTER_PROBES": "4"}).heal_after_probes == 4
    for bad in ("0", "2.5", "some"):
        with pytest.raises(DemoConfigError, match="DEMO_HEAL_AFTER_PROBES"):
            DemoConfig.from_env({"DEMO_HEAL_AFTER_PROBES": bad})


def test_the_canary_interval_is_the_groups_own_unless_set_within_the_thresholds_range():
    assert DemoConfig.from_env({}).canary_interval_s is None
    assert DemoConfig.from_env({"DEMO_CANARY_INTERVAL_S": "2"}).canary_interval_s == 2.0
    for bad in ("0.01", "7200", "-1", "often"):
        with pytest.raises(DemoConfigError, match="DEMO_CANARY_INTERVAL_S"):
            DemoConfig.from_env({"DEMO_CANARY_INTERVAL_S": bad})


def test_scenario_is_two_groups_of_32_and_8_with_the_two_faults():
    scn = demo_scenario(DemoConfig.from_env({"DEMO_FAULT_AT_S": "10", "DEMO_HEAL_AT_S": "100"}))
    assert [(g.name, g.nodes) for g in scn.groups] == [(LARGE, 32), (SMALL, 8)]
    kinds = {(f.group, f.node, f.kind, f.start_s, f.end_s) for f in scn.faults}
    assert kinds == {(LARGE, THERMAL_NODE, "thermal_throttle", 10, 100), (SMALL, PCIE_NODE, "pcie_downgrade", 25, 100)}
    assert all(w.trace == "azure_llm_2023_conv" for w in scn.workload)


def _tpot(records, node, t0, t1, started):
    """Median decode ms per token of ``node``'s completed records that ended in [t0, t1) (demo time)."""
    sel = [r for r in records if r["node"] == node and r["status"] == 200 and t0 <= r["ts"] - started < t1
           and r["completion_tokens"] > 1]
    assert len(sel) > 20
    return float(np.median([(r["total_ms"] - r["ttft_ms"]) / (r["completion_tokens"] - 1) for r in sel]))


def test_the_fleet_runs_the_simulators_step_engine_and_its_faults():
    from outlier_admin.demo.fleet import SimulatedFleet
    from sim.vllm import NodeEngine

    fleet = SimulatedFleet(DemoConfig.from_env({"DEMO_FAULT_AT_S": "20", "DEMO_PCIE_AT_S": "20", "DEMO_HEAL_AT_S": "60"}),
                           lambda gi: None)
    assert all(isinstance(e, NodeEngine) for e in fleet.sim.eng)  # every node is a vLLM V1 step engine
    assert {(g.engine.kind, g.engine.hardware) for g in fleet.scn.groups} == {("vllm_v1", "h100"), ("vllm_v1", "a100")}
    records = []
    for t in range(1, 91):  # 90 s of demo time, driven by the clock argument
        for recs in fleet.advance(fleet.started + t).values():
            records += recs
    assert {r["status"] for r in records} <= {0, 200} and len(records) > 90 * 128 * 0.8
    slow, peer = node_name(0, THERMAL_NODE), node_name(0, 1)
    before = _tpot(records, slow, 5, 20, fleet.started) / _tpot(records, peer, 5, 20, fleet.started)
    during = _tpot(records, slow, 30, 60, fleet.started) / _tpot(records, peer, 30, 60, fleet.started)
    after = _tpot(records, slow, 70, 90, fleet.started) / _tpot(records, peer, 70, 90, fleet.started)
    # thermal throttle (SM clock / 3): the decode steps of the throttled node are slower, every stream
    assert 0.8 < before < 1.25 and during > 1.6 and 0.8 < after < 1.25
    # its engine's own counters (what /metrics shows) saw the same: one batch, one step time
    assert fleet.engine(0, THERMAL_NODE).m.itl.sum / fleet.engine(0, THERMAL_NODE).m.itl.total > \
        fleet.engine(0, 1).m.itl.sum / fleet.engine(0, 1).m.itl.total


def test_unreachable_redis_falls_back_to_the_in_process_stand_in():
    client, desc = choose_redis("redis://127.0.0.1:1/0")
    assert "fakeredis" in desc
    client.set("k", "v")
    assert client.get("k") == b"v"


def test_a_node_serves_its_engines_metrics_page_and_answers_completions_from_its_engine():
    import httpx

    from detector.engine_metrics import parse
    from outlier_admin.demo.fleet import CanaryServer, SimulatedFleet

    fleet = SimulatedFleet(DemoConfig.from_env({}), lambda gi: None)
    fleet.started -= 30.0  # 30 s of traffic to simulate
    fleet.advance()
    server = CanaryServer(fleet, 0, 3).start()
    try:
        text = httpx.get(f"http://{server.address}/metrics", timeout=5).text
        engine = fleet.engine(0, 3).m
        # The engine's own page, vLLM V1's families (not only the inter-token histogram)...
        for family in ("vllm:inter_token_latency_seconds_bucket", "vllm:time_to_first_token_seconds_count",
                       "vllm:request_prefill_time_seconds_sum", "vllm:request_queue_time_seconds_sum",
                       "vllm:e2e_request_latency_seconds_count", "vllm:num_requests_running",
                       "vllm:kv_cache_usage_perc", "vllm:num_preemptions_total", "vllm:prefix_cache_queries_total"):
            assert family in text, family
        counters = parse(text)
        # ...as the production parser reads it: the engine's counters at the scrape
        assert counters.itl_count >= 1000 and counters.itl_count <= engine.itl.total
        assert 0.010 < counters.itl_sum_s / counters.itl_count < 0.05  # h100 tp8 healthy: ~15-25 ms/token
        assert counters.prefill_count > 0 and counters.running is not None
        # a completion is a request in that node's engine: it takes its steps' time, in real time (a
        # lower bound only: a loaded machine makes it longer, never shorter; the client's timeout
        # guards against a hang)
        t0 = time.perf_counter()
        resp = httpx.post(f"http://{server.address}/v1/completions", json={"prompt": "x", "max_tokens": 16},
                          timeout=10)
        took = time.perf_counter() - t0
        assert resp.status_code == 200 and resp.json()["usage"] == {"prompt_tokens": 10, "completion_tokens": 16,
                                                                   "total_tokens": 26}
        assert took > 16 * 0.010
        later = parse(httpx.get(f"http://{server.address}/metrics", timeout=5).text)
        assert later.ttft_count > counters.ttft_count  # (the probe's first token among them)
        # A canary probe of the peers' size (control.probe_load): its prompt runs at its length.
        resp = httpx.post(f"http://{server.address}/v1/completions",
                          json={"prompt": " ".join(["word"] * 300), "max_tokens": 8}, timeout=10)
        assert resp.json()["usage"] == {"prompt_tokens": 300, "completion_tokens": 8, "total_tokens": 308}
    finally:
        server.stop()
