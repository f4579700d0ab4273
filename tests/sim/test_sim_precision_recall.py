"""Precision and recall of cuts over a suite (issue 25 item 4), next to Minder's published figures."""

import pytest
from sim_helpers import tiny

from sim.__main__ import precision_recall_table
from sim.engine import Precomputed, Simulation
from sim.policies import policy_factory
from sim.report import cut_counts
from sim.runner import MINDER, precision_recall
from sim.scenario import parse_scenario
from sim.workload import build_requests


def test_cut_events_on_a_faulty_node_after_its_onset_are_true_and_every_other_cut_false():
    doc = tiny(faults=[{"group": "g", "node": 1, "kind": "thermal_throttle", "slowdown": 3, "start_s": 30}],
               expect={"faulty": [{"group": "g", "node": 1}, {"group": "g", "node": 2}]})
    doc["groups"][0]["nodes"] = 4
    scn = parse_scenario(doc)
    sim = Simulation(scn, Precomputed.build(scn, build_requests(scn)), policy_factory("round_robin"))
    sim.log.changes = {
        (0, 0): [(5.0, 0.5, False), (6.0, 0.2, False), (7.0, 1.0, False), (8.0, 0.0, True)],  # 2 false cuts
        (0, 1): [(20.0, 0.5, False), (21.0, 1.0, False), (31.0, 0.3, False), (32.0, 0.0, True),
                 (40.0, 1.0, False), (41.0, 0.5, False)],  # 1 false (before its onset), 2 true
    }
    assert cut_counts(scn, sim) == {"true": 2, "false": 3, "faulty_nodes": 2, "faulty_nodes_cut": 1}


def test_the_suite_pools_every_run_of_every_scenario():
    def run(t, f, n, k):
        return {"cuts": {"true": t, "false": f, "faulty_nodes": n, "faulty_nodes_cut": k}}

    reports = [
        {"scenario": "a", "policies": {"p": {"runs": [run(3, 1, 2, 2), run(2, 0, 2, 1)]}}},
        {"scenario": "healthy", "policies": {"p": run(0, 4, 0, 0), "q": run(0, 0, 0, 0)}},
    ]
    pr = precision_recall(reports, ["p", "q"])
    assert pr["p"]["precision"] == pytest.approx(5 / 10) and pr["p"]["recall"] == pytest.approx(3 / 4)
    assert pr["p"]["f1"] == pytest.approx(2 * 0.5 * 0.75 / 1.25, abs=1e-4)
    assert (pr["p"]["false_negatives"], pr["p"]["runs"]) == (1, 3)
    assert pr["q"]["precision"] is None and pr["q"]["recall"] is None  # nothing to judge
    table = precision_recall_table(pr)
    assert f"| Minder (NSDI '25, published) | | | | {MINDER['precision']} |" in table
    assert "| p | 5 | 5 | 3/4 | 0.5 | 0.75 | 0.6 |" in table
