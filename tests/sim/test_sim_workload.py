"""Arrivals run until ``duration_s`` at the configured rate (issue 15, item 4)."""

import numpy as np
import pytest
from sim_helpers import tiny

from sim.scenario import load_scenario, parse_scenario
from sim.workload import build_requests, warp_inverse


@pytest.mark.parametrize("scenario", ["small-group-8", "surge-16", "seed-drill-32"])
def test_trace_arrivals_cover_the_run_at_the_configured_rate(scenario):
    scn = load_scenario(f"scenarios/{scenario}.json")
    req = build_requests(scn)
    wl = scn.workload[0]
    rate = wl.rate_rps
    # Before the fix small-group-8 stopped at 151.8 s of 180 at 41 req/s, surge-16 at 168.7 s.
    assert req.t[-1] > scn.duration_s - 5.0 / rate
    assert req.t[0] >= 0.0 and req.t[-1] < scn.duration_s
    expected = warp_inverse(scn.duration_s, wl.rate_profile) * rate  # the profile's mean multiplier
    assert len(req) == pytest.approx(expected, abs=2)


def test_poisson_arrivals_rate_is_within_sampling_error_and_reach_the_end():
    doc = tiny(duration_s=600)
    doc["workload"][0]["rate_rps"] = 20
    for seed in range(5):
        doc["seed"] = seed
        scn = parse_scenario(doc)
        req = build_requests(scn)
        n_exp = 20 * 600
        assert abs(len(req) - n_exp) < 4 * np.sqrt(n_exp)  # Poisson count: sd = sqrt(mean)
        assert req.t[-1] > 600 - 1.0


def test_rate_profile_steps_the_rate_and_still_reaches_the_end():
    doc = tiny(duration_s=200)
    doc["workload"][0].update(rate_rps=10, trace="azure_llm_2023_conv", rate_profile=[[0, 1.0], [100, 2.0]])
    req = build_requests(parse_scenario(doc))
    first, second = (req.t < 100).sum(), (req.t >= 100).sum()
    assert first + second == pytest.approx(3000, abs=2)
    assert 1.5 < second / first < 2.6  # the trace's own burstiness moves the split a little
    assert req.t[-1] > 199.0
