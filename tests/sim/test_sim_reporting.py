"""Like-for-like reporting (issue 15, item 5): seeds, default_logs, each policy's bound, safeguard credit."""

import numpy as np
import pytest
from sim_helpers import tiny_vllm

from sim.report import SAFEGUARD_FRACTION, policy_report
from sim.runner import run_scenario, run_seeds
from sim.scenario import parse_scenario

pytestmark = pytest.mark.slow  # several multi-seed simulations with the detector


def faulty_doc(**changes):
    d = tiny_vllm(duration_s=60, faults=[{"group": "g", "node": 1, "kind": "resource", "start_s": 30,
                                          "hbm_slowdown": 3.0, "sm_slowdown": 3.0}],
                  expect={"faulty": [{"group": "g", "node": 1}]}, **changes)
    d["groups"][0]["nodes"] = 6
    d["workload"][0].update(rate_rps=24, trace="azure_llm_2023_conv")
    d["workload"][0]["completion_tokens"]["max"] = 300
    return d


@pytest.fixture(scope="module")
def seeded():
    return run_seeds(parse_scenario(faulty_doc()), ["round_robin", "default_logs", "default"], seeds=3)


def test_seeds_keep_every_run_and_report_the_median_with_an_interval(seeded):
    assert seeded["seeds"] == [1, 2, 3]
    for name in ("round_robin", "default_logs", "default"):
        p = seeded["policies"][name]
        assert len(p["runs"]) == 3
        runs = [r["p99_ms"] for r in p["runs"]]
        assert p["p99_ms"] == pytest.approx(float(np.median(runs)), abs=1e-3)
        lo, hi = p["interval"]["p99_ms"]
        assert min(runs) <= lo <= p["p99_ms"] <= hi <= max(runs)
    d = seeded["policies"]["default"]["faults"][0]
    assert d["node"] == 1 and d["onset_s"] == 30  # identity keys are not averaged
    delays = [r["faults"][0]["first_degrade_s"] for r in seeded["policies"]["default"]["runs"]]
    assert all(x is not None for x in delays)
    assert d["first_degrade_s"] == pytest.approx(float(np.median(delays)), abs=1e-3)


def test_default_logs_reads_no_stream_and_is_judged_against_its_records_bound(seeded):
    logs = seeded["policies"]["default_logs"]["runs"][0]
    full = seeded["policies"]["default"]["runs"][0]
    assert not logs["read_progress"] and full["read_progress"]
    f_logs, f_full = logs["faults"][0], full["faults"][0]
    assert not any("itl_row" in c for c in f_logs["bound_basis"]["candidates"])
    assert "itl_row (histogram)" in f_full["bound_basis"]["candidates"]
    # streamed progress sees the slowdown within a few scrapes; completed records only later
    assert f_full["bound_s"] < f_logs["bound_s"]


def test_no_credit_for_a_detection_while_the_safeguard_fraction_of_healthy_nodes_is_out():
    scn = parse_scenario(faulty_doc())
    report = run_scenario(scn, ["round_robin"], keep_sims=True)
    sim = report["_sims"]["round_robin"]
    gi = 0
    # As if a sweep took 3 of the 5 healthy nodes out at 31 s and the faulty one with them.
    for node in (0, 2, 3):
        sim.log.changes[(gi, node)] = [(31.0, 0.0, True)]
    sim.log.changes[(gi, 1)] = [(31.5, 0.0, True)]
    assert SAFEGUARD_FRACTION < 3 / 6
    f = policy_report(scn, sim)["faults"][0]
    assert f["first_degrade_s"] is None and f["quarantine_s"] is None
    assert f["uncredited"] == ["first_degrade_s", "quarantine_s"]
    sim.log.changes = {(gi, 1): [(31.5, 0.0, True)]}  # alone: credited
    assert policy_report(scn, sim)["faults"][0]["quarantine_s"] == pytest.approx(1.5)


def test_scrape_period_and_apply_delay_are_scenario_fields():
    d = faulty_doc(scrape_s=1.0, apply_delay_s=1.0)
    scn = parse_scenario(d)
    assert (scn.tick_s, scn.scrape_s, scn.apply_delay_s) == (0.2, 1.0, 1.0)
    fast = run_scenario(parse_scenario(faulty_doc()), ["default"])["policies"]["default"]["faults"][0]
    slow = run_scenario(scn, ["default"])["policies"]["default"]["faults"][0]
    assert slow["first_degrade_s"] is not None and fast["first_degrade_s"] is not None
    assert slow["first_degrade_s"] >= fast["first_degrade_s"]


# --- each policy's bound at its own false-cut rate (issue 25, item 1) -------------------------------


def test_the_budget_is_the_95_percent_upper_bound_of_the_measured_false_alarm_rate():
    from sim.report import false_alarm_budget, poisson_rate_upper

    assert poisson_rate_upper(0, 2.0) == pytest.approx(2.9957 / 2.0, rel=1e-4)  # no false alarm: rule of three
    assert poisson_rate_upper(1, 1.0) == pytest.approx(4.7439, rel=1e-4)  # chi2(0.95, 4) / 2
    assert poisson_rate_upper(10, 1.0) == pytest.approx(16.962, rel=1e-4)
    assert [poisson_rate_upper(k, 1.0) for k in range(5)] == sorted(poisson_rate_upper(k, 1.0) for k in range(5))
    b = false_alarm_budget(0, 1.0667, "healthy runs: healthy-64-long")
    assert b["budget_per_1000h"] == pytest.approx(1000 * 2.9957 / 1.0667, rel=1e-3)
    assert b["node_hours_per_alarm"] == pytest.approx(1.0667 / 2.9957, rel=1e-3)
    assert b["rate_per_1000h"] == 0.0 and b["false_alarms"] == 0
    # The bound is calibrated to the measured rate, or with no false cut to its upper bound.
    assert b["rate_per_node_hour"] == pytest.approx(2.9957 / 1.0667, rel=1e-3)
    four = false_alarm_budget(4, 2.0, "test")
    assert four["rate_per_node_hour"] == 2.0 and four["upper_per_node_hour"] == pytest.approx(9.1535 / 2.0, rel=1e-3)


def test_each_policy_bound_is_calibrated_to_its_own_false_cut_rate():
    from sim.report import false_alarm_budget

    scn = parse_scenario(faulty_doc())
    strict = false_alarm_budget(0, 10_000.0 * 2.9957, "test")  # one false cut per 10,000 node-hours
    loose = false_alarm_budget(40, 1.0, "test")  # a policy that cut 40 healthy nodes in an hour
    assert loose["rate_per_node_hour"] == 40.0 and strict["rate_per_node_hour"] == strict["upper_per_node_hour"]
    bounds = {}
    for name, budget in (("strict", strict), ("loose", loose)):
        block = run_scenario(scn, ["default"], budgets={"default": budget})["policies"]["default"]
        assert block["floor_budget"] == budget
        bounds[name] = block["faults"][0]
    assert bounds["loose"]["bound_basis"]["h"] < bounds["strict"]["bound_basis"]["h"]
    assert bounds["strict"]["bound_basis"]["h_method"] in ("extrapolated", "wald")
    assert bounds["loose"]["bound_s"] <= bounds["strict"]["bound_s"]
    # Without a suite's healthy runs, a run's bound uses its own healthy nodes' false cuts.
    own = run_scenario(scn, ["default"])["policies"]["default"]
    assert own["floor_budget"]["source"] == "this run"
    assert own["floor_budget"]["node_hours"] == pytest.approx(own["healthy_node_hours"])


def test_a_suite_pools_the_healthy_runs_per_policy_and_shows_the_budget_in_the_table():
    from sim.__main__ import markdown_table
    from sim.runner import healthy_budgets

    reports = [
        {"scenario": "healthy-64-long", "policies": {
            "default": {"runs": [{"false_degrades": 0, "healthy_node_hours": 1.0}, {"false_degrades": 1, "healthy_node_hours": 1.0}]},
            "default_logs": {"false_degrades": 6, "healthy_node_hours": 2.0}}},
        {"scenario": "periodic-stall-16", "policies": {
            "default": {"runs": [{"false_degrades": 0, "healthy_node_hours": 0.5}]},
            "default_logs": {"false_degrades": 2, "healthy_node_hours": 0.5}}},
    ]
    b = healthy_budgets(reports, ["default", "default_logs"])
    assert (b["default"]["false_alarms"], b["default"]["node_hours"]) == (1, 2.5)
    assert (b["default_logs"]["false_alarms"], b["default_logs"]["node_hours"]) == (8, 2.5)
    assert b["default_logs"]["budget_per_1000h"] > b["default"]["budget_per_1000h"]
    assert b["default"]["source"] == "healthy runs: healthy-64-long, periodic-stall-16"
    scn = parse_scenario(faulty_doc())
    report = run_scenario(scn, ["default"], budgets={"default": b["default"]})
    table = markdown_table(report)
    assert "calibrated to" in table and "1 false cuts in 2.5 node-h" in table
