"""A small scenario end to end through every policy, and the CLI."""

import json

import pytest
from sim_helpers import tiny_vllm

from sim.__main__ import main
from sim.policies import ALL_POLICIES
from sim.runner import run_scenario
from sim.scenario import parse_scenario


def small_doc():
    # The whole GPU 3x slower (SM and HBM clocks): on the step engine a thermal throttle of the SM
    # clock alone slows a small decode batch only ~1.3x, too little for this test's cut-traffic bound.
    d = tiny_vllm(duration_s=90, faults=[{"group": "g", "node": 2, "kind": "resource", "start_s": 30,
                                          "end_s": 70, "sm_slowdown": 3.0, "hbm_slowdown": 3.0}],
             expect={"faulty": [{"group": "g", "node": 2}]})
    d["groups"][0].update(nodes=10, jitter_cv=0.08, node_speed_spread=0.03, max_concurrency=16)
    del d["groups"][0]["decode_batch_curve"]
    d["workload"][0].update(rate_rps=30, trace="azure_llm_2023_conv")
    d["workload"][0]["completion_tokens"]["max"] = 400
    d["workload"][0]["prompt_tokens"]["max"] = 4000
    return d


@pytest.fixture(scope="module")
def report():
    return run_scenario(parse_scenario(small_doc()), ALL_POLICIES)


def test_report_has_the_schema_keys(report):
    assert set(report) >= {"scenario", "requests", "policies", "baseline"}
    assert set(report["policies"]) == set(ALL_POLICIES)
    for r in report["policies"].values():
        assert set(r) >= {"p50_ms", "p99_ms", "p999_ms", "ttft_p99_ms", "timeouts", "timeout_rate", "errors",
                          "false_degrades", "false_quarantines", "healthy_node_hours", "faults"}
        f = r["faults"][0]
        assert set(f) >= {"group", "node", "kind", "onset_s", "first_degrade_s", "quarantine_s",
                          "traffic_share_after_detect"}
        assert r["healthy_node_hours"] == pytest.approx(9 * 90 / 3600)
    json.dumps(report)


def test_fault_hurts_round_robin_and_detectors_cut_the_node(report):
    pol = report["policies"]
    assert pol["round_robin"]["p99_ms"] > report["baseline"]["p99_ms"]
    assert pol["round_robin"]["faults"][0]["first_degrade_s"] is None
    z = pol["seed_zscore"]["faults"][0]
    assert z["first_degrade_s"] is not None and z["first_degrade_s"] < 20
    assert z["traffic_share_after_detect"] < 0.7
    d = pol["default"]["faults"][0]
    assert d["first_degrade_s"] is not None and d["first_degrade_s"] < 20
    assert d["traffic_share_after_detect"] < 0.7
    # Where the delay went: the first evidence (a row: default reads /metrics), then the detector's share.
    assert d["evidence"] == "row" and 0 <= d["to_work_s"] <= d["to_evidence_s"] < 1.0
    assert d["detector_s"] == pytest.approx(d["first_degrade_s"] - d["to_evidence_s"], abs=2e-3)
    assert d["detector_s"] >= 0 and d["detector_samples"] >= 1


def test_signal_quality_ranks_the_seed_normalisation_noisiest(report):
    sq = report["signal_quality"]["g"]
    assert sq["norm_seed"]["pooled"] > sq["norm_learned"]["pooled"]
    assert sq["decode"]["pooled"] < sq["norm_seed"]["pooled"]


def test_cli_run_and_bad_file(tmp_path, capsys):
    scn = tmp_path / "s.json"
    scn.write_text(json.dumps(small_doc()))
    out = tmp_path / "r.json"
    png = tmp_path / "r.png"
    rc = main(["run", str(scn), "--policies", "round_robin,seed_zscore", "--duration", "40", "--out", str(out),
               "--plot", str(png), "--quiet"])
    assert rc == 0
    rep = json.loads(out.read_text())
    assert set(rep["policies"]) == {"round_robin", "seed_zscore"} and rep["duration_s"] == 40
    assert png.stat().st_size > 10_000 and png.read_bytes()[:4] == b"\x89PNG"
    assert "| seed_zscore |" in capsys.readouterr().out
    bad = small_doc()
    bad["faults"][0]["slowdown"] = -1
    scn.write_text(json.dumps(bad))
    assert main(["run", str(scn), "--out", str(out), "--quiet"]) == 2
    assert "faults[0].slowdown" in capsys.readouterr().err


def test_default_lc_spreads_the_published_weights_by_weighted_least_connections():
    """``default_lc``: the same detector and weights, behind a gateway that picks the node with the
    fewest open requests per unit of weight (HAProxy ``leastconn``, nginx ``least_conn``), not a
    weighted round robin. Run only when named."""
    from sim_helpers import simulate

    from sim.policies import KNOWN_POLICIES

    assert "default_lc" in KNOWN_POLICIES and "default_lc" not in ALL_POLICIES
    doc = tiny_vllm(duration_s=5)
    doc["groups"][0]["nodes"] = 6
    sim = simulate(doc, "default_lc")
    pol = sim.policies[0]
    assert pol.name == "default_lc"
    n = sim.scn.groups[0].nodes
    pol.pending.clear()
    pol.swrr.set_weights([100.0, 5.0, 100.0, 0.0] + [100.0] * (n - 4))
    out = sim.outstanding[0]
    out[:] = [4, 0, 2, 0] + [9] * (n - 4)
    # Per unit of weight: 0.04, 0 (but a 5 % weight: one open request makes it 0.2), 0.02, never
    # (weight 0), 0.09: node 1 first, then node 2 while node 1 holds one request.
    assert pol.pick(sim.now) == 1
    out[1] = 1
    assert pol.pick(sim.now) == 2
    assert all(pol.pick(sim.now) != 3 for _ in range(20))  # a node at weight 0 gets nothing
