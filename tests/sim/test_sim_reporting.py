"""Like-for-like reporting (issue 15, item 5): seeds, default_logs, where each delay went, safeguard credit."""

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


def test_default_logs_reads_no_stream_and_its_first_evidence_is_a_log_line(seeded):
    logs = seeded["policies"]["default_logs"]["runs"][0]
    full = seeded["policies"]["default"]["runs"][0]
    assert not logs["read_progress"] and full["read_progress"]
    f_logs, f_full = logs["faults"][0], full["faults"][0]
    assert f_logs["evidence"] == "line"
    # streamed progress can show the slowdown at the first scrape; a completed request only later
    assert f_full["to_evidence_s"] <= f_logs["to_evidence_s"]


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


def test_a_policy_block_is_the_same_without_the_baseline_run(seeded):
    """``baseline=False`` (bench.sweep, which reads only the policies) leaves out the round-robin baseline
    and its signal quality; every policy draws from its own seeded generators, so its block is the same."""
    lean = run_seeds(parse_scenario(faulty_doc()), ["default"], seeds=3, baseline=False)
    assert "baseline" not in lean and "signal_quality" not in lean
    assert lean["policies"]["default"] == seeded["policies"]["default"]
