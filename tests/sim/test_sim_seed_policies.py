"""The seeds' baselines as their texts state them (issue 25 item 2): seed 000's safeguard and canary
recovery, seed 001's "3 windows of 30 s" confirming at the 3rd window, and its rule on raw latency
next to the same rule on the normalised per-token latency ``default`` reads."""

import numpy as np
from sim_helpers import tiny

from sim.engine import Precomputed, Simulation
from sim.policies import (
    KNOWN_POLICIES,
    POLICY_INPUTS,
    SEED_SAFEGUARD_FRACTION,
    policy_factory,
)
from sim.scenario import parse_scenario
from sim.workload import build_requests


def started(doc, policy):
    scn = parse_scenario(doc)
    sim = Simulation(scn, Precomputed.build(scn, build_requests(scn)), policy_factory(policy))
    sim.begin()
    return sim, sim.policies[0]


def run(doc, policy):
    scn = parse_scenario(doc)
    return Simulation(scn, Precomputed.build(scn, build_requests(scn)), policy_factory(policy)).run()


def test_every_policy_names_its_inputs():
    assert set(POLICY_INPUTS) == set(KNOWN_POLICIES)


def test_seed_zscore_pauses_isolation_at_30_percent_of_the_group():
    doc = tiny()
    doc["groups"][0]["nodes"] = 20
    _, pol = started(doc, "seed_zscore")
    pol.samples = [10] * 20
    pol.ema = [1.0 + 0.001 * i for i in range(20)]
    now = 0.0
    cap = int(SEED_SAFEGUARD_FRACTION * 20)
    for slow in range(cap + 1):  # one node at a time far out: its population Z is sqrt(M - 1) > 3.5
        pol.ema[slow] = 1000.0
        for _ in range(3):
            now += 0.2
            pol.on_tick(now)
    assert [pol.state[i] == 2 for i in range(cap + 2)] == [True] * cap + [False, False]
    assert pol.weight[cap] == pol.BASE  # held in service (the seed's code leaves its weight)
    pol.state[0], pol.ema[0] = 0, 1.0  # one back in service, healthy: the next may go
    for _ in range(3):
        now += 0.2
        pol.on_tick(now)
    assert pol.state[cap] == 2


def test_seed_zscore_canary_returns_a_quarantined_node_after_three_passing_probes():
    doc = tiny(duration_s=120, faults=[{"group": "g", "node": 0, "kind": "thermal_throttle", "slowdown": 10,
                                        "start_s": 10, "end_s": 40}])
    doc["groups"][0]["nodes"] = 16
    doc["workload"][0]["rate_rps"] = 32
    doc["probe"] = {"prompt_tokens": 2000, "completion_tokens": 50}  # T_norm 1.27 on a healthy node, clients' 2.0
    sim = run(doc, "seed_zscore")
    changes = sim.log.changes[(0, 0)]
    q = next(t for t, w, out in changes if out)
    back = next(t for t, w, out in changes if t > q and not out)
    assert 10 < q < 20
    # probes every 10 s; three in a row within mu + 1 sigma once the fault is over (the first one
    # sent within 10 s of its end)
    assert 40 + 2 * 10 <= back <= 40 + 3 * 10 + 1
    assert next(w for t, w, out in changes if t == back) == 0.25
    assert changes[-1][1] == 1.0 and not changes[-1][2]  # then the Z rule restores it to 100
    a = sim.attempts()
    assert (a["kind"] == 1).sum() >= 3


def test_seed_p99p50_confirms_at_the_third_anomalous_window_and_a_normal_one_resets():
    doc = tiny()
    doc["groups"][0]["nodes"] = 6
    sim, pol = started(doc, "seed_p99p50")
    rng = np.random.default_rng(1)
    for i in range(6):
        pol.window[i].extend((1000 + rng.integers(0, 100, 200)).tolist())
    tail = [1000] * 190 + [10_000] * 10  # P99/P50 = 10
    pol.window[0].clear()
    pol.window[0].extend(tail)
    pol.on_tick(30.0)
    pol.on_tick(60.0)
    assert not pol.removed[0] and pol.status[0] == "suspect"
    pol.on_tick(90.0)
    assert pol.removed[0] and sim.log.changes[(0, 0)] == [(90.0, 0.0, True)]
    # a normal window in between starts the count again
    pol.window[1].clear()
    pol.window[1].extend(tail)
    pol.on_tick(120.0)
    pol.on_tick(150.0)
    pol.window[1].clear()
    pol.window[1].extend([1000] * 200)
    pol.on_tick(180.0)
    pol.window[1].clear()
    pol.window[1].extend(tail)
    pol.on_tick(210.0)
    pol.on_tick(240.0)
    assert not pol.removed[1]
    pol.on_tick(270.0)
    assert pol.removed[1]


def test_the_p99p50_rule_on_raw_latency_flags_healthy_nodes_and_on_per_token_latency_finds_the_slow_one():
    doc = tiny(duration_s=130, faults=[{"group": "g", "node": 3, "kind": "thermal_throttle", "slowdown": 3,
                                        "start_s": 0}])
    doc["groups"][0]["nodes"] = 8
    doc["workload"][0]["rate_rps"] = 40
    doc["workload"][0]["completion_tokens"].update(sigma=1.2, max=2000)
    doc["workload"][0]["prompt_tokens"].update(sigma=1.0, max=8000)
    raw = run(doc, "seed_p99p50")
    norm = run(doc, "seed_p99p50_norm")
    raw_out = {n for (g, n), ch in raw.log.changes.items() if any(out for _, _, out in ch)}
    norm_out = {n: ch for (g, n), ch in norm.log.changes.items() if any(out for _, _, out in ch)}
    assert len(raw_out - {3}) >= 4  # healthy nodes' raw P99/P50 is over 3: removed
    assert set(norm_out) == {3}  # 3x slower per token than its peers' median: the cross-P50 check
    analysed = [t for t, _, _ in norm.log.series[(0, 3)]]  # one trace per window with enough samples
    assert norm_out[3][0][0] == analysed[2]  # removed at its 3rd anomalous window, not the 4th
