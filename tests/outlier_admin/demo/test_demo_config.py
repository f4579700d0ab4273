from __future__ import annotations

import pytest

from outlier_admin.demo.config import DemoConfig, DemoConfigError
from outlier_admin.demo.fleet import LARGE, PCIE_NODE, SMALL, THERMAL_NODE, demo_scenario
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


def test_scenario_is_two_groups_of_32_and_8_with_the_two_faults():
    scn = demo_scenario(DemoConfig.from_env({"DEMO_FAULT_AT_S": "10", "DEMO_HEAL_AT_S": "100"}))
    assert [(g.name, g.nodes) for g in scn.groups] == [(LARGE, 32), (SMALL, 8)]
    kinds = {(f.group, f.node, f.kind, f.start_s, f.end_s) for f in scn.faults}
    assert kinds == {(LARGE, THERMAL_NODE, "thermal_throttle", 10, 100), (SMALL, PCIE_NODE, "pcie_downgrade", 25, 100)}
    assert all(w.trace == "azure_llm_2023_conv" for w in scn.workload)


def test_faulty_node_is_slower_only_while_its_fault_lasts():
    from outlier_admin.demo.fleet import SimulatedFleet

    fleet = SimulatedFleet(DemoConfig.from_env({"DEMO_FAULT_AT_S": "10", "DEMO_PCIE_AT_S": "10", "DEMO_HEAL_AT_S": "20"}), lambda gi: None)
    before = fleet.service_ms(0, THERMAL_NODE, 100, 50, 5.0)[1]
    during = fleet.service_ms(0, THERMAL_NODE, 100, 50, 15.0)[1]
    after = fleet.service_ms(0, THERMAL_NODE, 100, 50, 25.0)[1]
    assert during == pytest.approx(3.0 * before)  # thermal throttle: slowdown 3
    assert after == pytest.approx(before)


def test_unreachable_redis_falls_back_to_the_in_process_stand_in():
    client, desc = choose_redis("redis://127.0.0.1:1/0")
    assert "fakeredis" in desc
    client.set("k", "v")
    assert client.get("k") == b"v"


def test_a_node_metrics_count_the_tokens_streamed_so_far():
    from detector.engine_metrics import parse
    from outlier_admin.demo.fleet import CanaryServer, SimulatedFleet

    fleet = SimulatedFleet(DemoConfig.from_env({}), lambda gi: None)
    fleet.started -= 30.0  # 30 s of traffic to dispatch
    fleet.advance()
    per_node = [fleet.itl(0, i, 10.0) for i in range(32)]
    later = [fleet.itl(0, i, 30.0) for i in range(32)]
    assert all(b[1] >= a[1] and b[0] >= a[0] for a, b in zip(per_node, later, strict=True))
    total_s, count = map(sum, zip(*later, strict=True))
    # The group's healthy per-token time (14 ms at a full batch; less on lighter ones).
    assert count > 10_000 and 0.005 < total_s / count < 0.016
    server = CanaryServer(fleet, 0, 3).start()
    try:
        import httpx

        text = httpx.get(f"http://{server.address}/metrics", timeout=5).text
    finally:
        server.stop()
    counters = parse(text)
    s, c = counters.itl_sum_s, counters.itl_count
    assert c >= later[3][1] and s == pytest.approx(fleet.itl(0, 3)[0], rel=0.5)
