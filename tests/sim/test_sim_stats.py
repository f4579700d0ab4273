"""Workload generation, trace statistics, fast mode."""

import numpy as np
import pytest
from sim_helpers import tiny

from sim.fastmode import SeedZScoreVec, run_fast
from sim.scenario import parse_scenario
from sim.traces import load_trace, splitwise_decode_curve, vm_noise_spread
from sim.workload import build_requests, warp_inverse, warp_times


def test_rate_profile_time_warp():
    prof = ((0.0, 1.0), (10.0, 2.0), (20.0, 0.5))
    assert warp_inverse(10, prof) == 10 and warp_inverse(20, prof) == 30 and warp_inverse(30, prof) == 35
    t = warp_times(np.array([5.0, 10.0, 20.0, 30.0, 35.0]), prof)
    np.testing.assert_allclose(t, [5, 10, 15, 20, 30])


def test_workload_rate_profile_and_trace_rescaling():
    d = tiny(duration_s=600)
    d["workload"][0].update(rate_rps=50, trace="azure_llm_2023_conv", rate_profile=[[0, 1.0], [300, 2.0]])
    req = build_requests(parse_scenario(d))
    first, second = (req.t < 300).sum() / 300, (req.t >= 300).sum() / 300
    assert first == pytest.approx(50, rel=0.1)
    assert second == pytest.approx(100, rel=0.1)
    _, p, _c = load_trace("azure_llm_2023_conv")
    assert req.prompt.max() <= 1000 and req.completion.max() <= 50  # the scenario's max caps
    assert np.median(np.minimum(p, 1000)) == pytest.approx(np.median(req.prompt), rel=0.15)


def test_calibration_data():
    curve = dict(splitwise_decode_curve())
    assert curve[1.0] == 1.0 and 1.2 < curve[32.0] < 1.35 and 1.5 < curve[64.0] < 1.8
    spread = vm_noise_spread()
    assert 0.03 < spread["across"] < 0.1 and 0.01 < spread["within"] < 0.05


def test_seed_vector_ema_matches_one_at_a_time():
    v = SeedZScoreVec(3)
    node = np.array([0, 1, 0, 0, 2, 1])
    p = np.full(6, 100.0)
    c = np.full(6, 75.0)  # denominator 100 -> x = total / 100
    total = np.array([100.0, 200.0, 300.0, 500.0, 50.0, 400.0])
    v.ingest(node, p, c, total)
    e0 = 1.0
    e0 = 0.15 * 3.0 + 0.85 * e0
    e0 = 0.15 * 5.0 + 0.85 * e0
    np.testing.assert_allclose(v.ema, [e0, 0.15 * 4.0 + 0.85 * 2.0, 0.5])


def test_fast_mode_counts_quarantines_of_healthy_nodes():
    res = run_fast(nodes=16, hours=0.02, tick_s=1.0, policies=("seed_zscore",))
    r = res["policies"]["seed_zscore"]
    assert res["samples"] > 16 * 0.02 * 3600 * 3 * 0.5
    assert r["per_1000_node_hours"] == pytest.approx(1000 * r["false_quarantines"] / res["node_hours"])
