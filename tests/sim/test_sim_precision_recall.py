"""Detection counted per incident, as an SRE counts it (issue 34 item 2): one true positive per fault
detected, one false positive per healthy node cut, however often; pooled over a suite with 95 %
intervals, and what the false cuts cost in capacity."""

import pytest
from sim_helpers import tiny

from sim.__main__ import detection_quality_table
from sim.engine import Precomputed, Simulation
from sim.policies import policy_factory
from sim.report import capacity_taken, incidents
from sim.runner import MINDER, detection_quality
from sim.scenario import parse_scenario
from sim.workload import build_requests


def _sim(doc):
    scn = parse_scenario(doc)
    return scn, Simulation(scn, Precomputed.build(scn, build_requests(scn)), policy_factory("round_robin"))


def test_a_fault_detected_is_one_true_positive_and_a_healthy_node_cut_one_false_positive():
    doc = tiny(faults=[{"group": "g", "node": 1, "kind": "thermal_throttle", "slowdown": 3, "start_s": 30},
                       {"group": "g", "node": 2, "kind": "thermal_throttle", "slowdown": 3, "start_s": 30,
                        "end_s": 40}],
               expect={"faulty": [{"group": "g", "node": 1}, {"group": "g", "node": 2}]})
    doc["groups"][0]["nodes"] = 10
    scn, sim = _sim(doc)
    sim.log.changes = {
        (0, 0): [(5.0, 0.5, False), (6.0, 0.2, False), (7.0, 1.0, False), (8.0, 0.0, True)],  # healthy, cut twice
        (0, 1): [(20.0, 0.5, False), (21.0, 1.0, False), (31.0, 0.3, False), (32.0, 0.0, True),
                 (40.0, 1.0, False), (41.0, 0.5, False)],  # cut before its onset (false), then detected
        (0, 2): [(45.0, 0.5, False)],  # cut only after its fault ended: a miss
    }
    assert incidents(scn, sim) == {"faulty": 2, "detected": 1, "false_nodes": 2, "healthy_nodes": 8}
    # A node already held cut at the onset is detected.
    sim.log.changes = {(0, 1): [(29.0, 0.5, False)], (0, 2): [(35.0, 0.0, True)]}
    assert incidents(scn, sim) == {"faulty": 2, "detected": 2, "false_nodes": 1, "healthy_nodes": 8}


def test_capacity_taken_is_the_time_under_base_weight_and_the_weight_lost():
    changes = [(10.0, 0.5, False), (20.0, 0.0, True), (30.0, 1.0, False), (50.0, 0.25, False)]
    cost = capacity_taken(changes, 0.0, 60.0)
    assert cost["below_base_s"] == pytest.approx(10 + 10 + 10)
    assert cost["weight_s"] == pytest.approx(10 * 0.5 + 10 * 1.0 + 10 * 0.75)
    assert cost["out_s"] == pytest.approx(10)
    # A node that joined at 15 s is counted from then; a change after the end is not.
    assert capacity_taken(changes, 15.0, 25.0)["below_base_s"] == pytest.approx(10)
    assert capacity_taken([(70.0, 0.0, True)], 0.0, 60.0) == {"below_base_s": 0.0, "weight_s": 0.0, "out_s": 0.0}


def test_the_suite_pools_every_run_with_wilson_and_garwood_intervals():
    def run(detected, faulty, false_nodes, cuts, hours, below=0.0, taken=0.0):
        return {"incidents": {"faulty": faulty, "detected": detected, "false_nodes": false_nodes,
                              "healthy_nodes": 10},
                "false_degrades": cuts, "false_quarantines": 0, "healthy_node_hours": hours,
                "healthy_below_base_node_s": below, "healthy_weight_s_taken": taken}

    reports = [
        {"scenario": "a", "policies": {"p": {"runs": [run(1, 1, 1, 3, 0.5, 30.0, 10.0), run(0, 1, 0, 0, 0.5)]}}},
        {"scenario": "healthy", "policies": {"p": run(0, 0, 2, 2, 1.0, 60.0, 20.0), "q": run(0, 0, 0, 0, 0.0)}},
    ]
    dq = detection_quality(reports, ["p", "q"])
    p = dq["p"]
    assert (p["true_positives"], p["false_positives"], p["faults"], p["false_negatives"], p["runs"]) == (1, 3, 2, 1, 3)
    assert p["precision"]["value"] == 0.25 and p["recall"]["value"] == 0.5
    # Wilson 95 %: 1 of 4 -> [0.0456, 0.6994]; 1 of 2 -> [0.0945, 0.9055]
    assert p["precision"]["ci95"] == pytest.approx([0.0456, 0.6994], abs=1e-4)
    assert p["recall"]["ci95"] == pytest.approx([0.0945, 0.9055], abs=1e-4)
    assert p["f1"] == pytest.approx(2 * 0.25 * 0.5 / 0.75, abs=1e-4)
    # Garwood 95 %: 3 events in 2 node-hours -> [0.6187, 8.7673] / 2 per node-hour
    assert p["false_cut_nodes"]["per_1000h"] == 1500.0
    assert p["false_cut_nodes"]["ci95"] == pytest.approx([309.3, 4383.6], abs=0.1)
    assert p["false_cuts"]["events"] == 5
    assert p["below_base_node_s_per_1000h"] == pytest.approx(1000 * 90 / 2)
    assert p["weight_s_taken_per_1000h"] == pytest.approx(1000 * 30 / 2)
    q = dq["q"]
    assert q["precision"]["value"] is None and q["recall"]["value"] is None and q["false_cuts"]["ci95"] is None
    table = detection_quality_table(dq)
    assert "| p | 1/2 | 3 | 0.25 [0.0456–0.699] | 0.5 [0.0945–0.905] |" in table
    assert f"precision {MINDER['precision']}" in table and "not the same kind" in table


def test_no_event_in_n_node_hours_has_the_garwood_upper_end():
    from sim.intervals import garwood, rate_per_1000h

    assert garwood(0, 1.0) == pytest.approx((0.0, 3.6889), abs=1e-4)
    # 1 event in 1,024 node-hours: 0.98 per 1,000, and up to 5.44 at 95 % (two-sided)
    r = rate_per_1000h(1, 1024.0)
    assert r["per_1000h"] == pytest.approx(0.977, abs=1e-3) and r["ci95"] == pytest.approx([0.025, 5.441], abs=1e-3)
