"""CUSUM theory and the oracle bound's statistics, workload generation, fast mode."""

import numpy as np
import pytest
from sim_helpers import tiny

from sim.cusum import (
    HistogramLLR,
    ShiftLLR,
    calibrate_threshold,
    cusum_alarms,
    cusum_min_delay,
    cusum_value,
    isotonic,
    siegmund_arl0,
    siegmund_arl1,
    threshold_for_arl0,
)
from sim.fastmode import SeedZScoreVec, run_fast
from sim.scenario import parse_scenario
from sim.traces import load_cusum_table, load_trace, splitwise_decode_curve, vm_noise_spread
from sim.workload import build_requests, warp_inverse, warp_times


@pytest.mark.parametrize("row", load_cusum_table(), ids=lambda r: f"d{r['shift_delta_sigma']}-arl{r['ARL0_target']:.0e}")
def test_siegmund_reproduces_the_shipped_cusum_table(row):
    delta, k = row["shift_delta_sigma"], row["cusum_k_sigma"]
    h = threshold_for_arl0(row["ARL0_target"], k)
    # the table's h is from the exact Markov chain; Siegmund's h is within 3 % of it
    assert h == pytest.approx(row["threshold_h_sigma"], rel=0.03)
    assert siegmund_arl1(h, delta, k) == pytest.approx(row["ARL1_siegmund_approx_samples"], rel=5e-3)
    assert cusum_min_delay(delta, row["ARL0_target"]) == pytest.approx(row["ARL1_siegmund_approx_samples"], rel=5e-3)


def test_cusum_floor_monotone_in_shift_and_budget():
    assert cusum_min_delay(0.5, 1e6) > cusum_min_delay(1.0, 1e6) > cusum_min_delay(2.0, 1e6)
    assert cusum_min_delay(1.0, 1e8) > cusum_min_delay(1.0, 1e4)
    assert cusum_min_delay(-1.0, 1e6) is None
    assert cusum_min_delay(50.0, 1e6) == 1.0
    assert siegmund_arl0(threshold_for_arl0(1e6, 0.5), 0.5) == pytest.approx(1e6, rel=1e-6)


def _page_reference(llr, h, start=0.0):
    """Page's CUSUM one sample at a time, restarted at 0 after each alarm (the plain reference)."""
    s, out = start, []
    for i, v in enumerate(llr):
        s = max(0.0, s + v)
        if s > h:
            out.append(i)
            s = 0.0
    return out, s


def test_cusum_alarms_match_the_sample_by_sample_recursion():
    rng = np.random.default_rng(5)
    for _ in range(20):
        llr = rng.standard_normal(int(rng.integers(1, 6000))) - 0.3
        h = float(rng.uniform(0.5, 6.0))
        start = float(rng.uniform(0, h))
        ref, _ = _page_reference(llr, h, start)
        assert cusum_alarms(llr, h, start=start) == ref
        assert cusum_alarms(llr, h, cap=2, start=start) == ref[:2]
        assert cusum_value(llr, h) == pytest.approx(_page_reference(llr, h)[1])
    # The statistic resets at 0: a dip between strong samples costs evidence, not the whole past.
    assert cusum_alarms(np.array([2.0, 2.0, -3.0, 2.0, 2.0]), 4.0) == [4]
    assert cusum_alarms(np.array([2.0, -5.0, 2.0, 2.0]), 4.0) == []


def test_histogram_llr_is_monotone_and_learns_a_heavy_tailed_shift():
    rng = np.random.default_rng(2)
    pre = rng.standard_t(3, 4000)  # heavy tails: a Gaussian oracle would call its tail a shift
    post = rng.standard_t(3, 60) + 1.5
    llr = HistogramLLR.fit(pre, post)
    assert np.all(np.diff(llr.table) >= -1e-12)  # the ratio of a slowdown grows with the value
    x = np.linspace(-4, 6, 50)
    assert llr(x)[0] < 0 < llr(x)[-1]
    assert llr(np.array([np.nan]))[0] == 0.0  # no value, no evidence
    # Mean LLR under each distribution: negative before the change, positive after (KL divergences).
    assert llr(rng.standard_t(3, 4000)).mean() < 0 < llr(rng.standard_t(3, 4000) + 1.5).mean()
    # Discrete signals (failures): one bin per value.
    fail = HistogramLLR.fit(np.zeros(500), np.r_[np.ones(20), np.zeros(20)])
    assert fail(np.array([1.0]))[0] > 2.0 and fail(np.array([0.0]))[0] < 0
    assert list(isotonic(np.array([1.0, 3.0, 2.0, 4.0]), np.ones(4))) == [1.0, 2.5, 2.5, 4.0]


def test_shift_llr_knows_the_post_law_from_the_pre_fault_shape_and_a_few_post_samples():
    rng = np.random.default_rng(3)
    pre = rng.standard_t(4, 5000) * 0.15
    post = rng.standard_t(4, 30) * 0.15 + 0.3  # a 1.35x slowdown of a time, in log
    shift = ShiftLLR.fit(pre, post)
    hist = HistogramLLR.fit(pre, post)
    after = rng.standard_t(4, 20000) * 0.15 + 0.3
    before = rng.standard_t(4, 20000) * 0.15
    # More evidence per post-onset sample (a larger KL divergence) than the histogram of 30, and
    # still negative on average before the change.
    assert shift(after).mean() > hist(after).mean() > 0
    assert shift(before).mean() < 0
    assert np.abs(shift(np.array([-50.0, 50.0]))).max() <= np.log(len(pre) + 1.0) + 1e-9


def test_threshold_is_calibrated_to_the_false_alarm_count_on_healthy_streams():
    rng = np.random.default_rng(4)
    pre = rng.standard_normal(5000)
    llr = HistogramLLR.fit(pre, rng.standard_normal(50) + 1.0)
    streams = [llr(rng.standard_normal(4000)) for _ in range(10)]
    hours = 10.0
    for rate in (0.5, 2.0):
        h, method = calibrate_threshold(streams, hours, rate)
        assert method == "counted"
        count = sum(len(cusum_alarms(s, h)) for s in streams)
        assert count <= rate * hours < sum(len(cusum_alarms(s, h - 0.05)) for s in streams)
    # fewer alarms allowed than the data can show: the tail of the count is extrapolated, and it is
    # near Wald's e^h (a CUSUM on the true LLR waits at least e^h samples for a false alarm)
    h, method = calibrate_threshold(streams, hours, 0.01)
    assert method == "extrapolated"
    assert h > calibrate_threshold(streams, hours, 0.5)[0]
    assert abs(h - np.log(4000 / 0.01)) < 4.0


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
