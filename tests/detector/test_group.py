"""GroupDetector behaviour on synthetic fleets with known faults (real numbers, no mocks)."""

import math

import numpy as np
import pytest

from detector.group import GroupDetector
from detector.samples import RejectReason, SampleBatch
from detector.states import OUT_OF_SERVICE, IllegalTransition, NodeState, Reason
from detector.thresholds import Thresholds
from harness.fleet import Fleet, run

S = NodeState


def _states(evs, i):
    return [S(int(ev.states[i])) for ev in evs]


def _first(evs, i, state):
    for ev in evs:
        if ev.states[i] == state:
            return ev.at
    return None


def test_thermal_throttle_is_degraded_then_quarantined_quickly():
    fleet = Fleet(32, seed=1)
    gd = GroupDetector(Thresholds(), fleet.nodes)
    warm = run(gd, fleet, 0, 30)
    assert all(not ev.transitions or all(t.to_state != S.QUARANTINED for t in ev.transitions) for ev in warm)
    fleet.slow[7] = 2.86
    evs = run(gd, fleet, 30, 10)
    degraded_at = _first(evs, 7, S.DEGRADED) or _first(evs, 7, S.QUARANTINED)
    quarantined_at = _first(evs, 7, S.QUARANTINED)
    assert degraded_at is not None and degraded_at - 30 <= 1.5
    assert quarantined_at is not None and quarantined_at - 30 <= 4.0
    q = next(t for ev in evs for t in ev.transitions if t.to_state == S.QUARANTINED)
    assert q.node == fleet.nodes[7] and q.reason == "z_quarantine"
    assert q.z >= 3.5 and q.ema / q.baseline >= 1.5 and q.samples > 5
    assert q.thresholds["quarantine_z"] == 3.5
    others = [i for i in range(32) if i != 7]
    assert all(evs[-1].states[i] in (S.HEALTHY, S.DEGRADED) for i in others)


def test_degrade_weight_is_base_times_two_to_minus_z_minus_2():
    fleet = Fleet(16, seed=5)
    gd = GroupDetector(Thresholds(quarantine_persistence=10_000), fleet.nodes)
    run(gd, fleet, 0, 20)
    fleet.slow[3] = 1.2
    checked, held = 0, math.inf

    def allowed(z: float) -> float:
        return min(max(100 * 2 ** -(z - 2.0), 5.0), 100.0)  # floored at min_weight_fraction

    for ev in run(gd, fleet, 20, 20):
        z = np.nanmax([v[3] for v in ev.z_by_signal.values()])  # a degraded node's cut: its largest Z
        if ev.states[3] == S.DEGRADED:
            # never above what its deciding Z (Evaluation.z) allowed earlier in this stretch
            held = min(held, allowed(ev.z[3]))
            assert math.isclose(ev.weights[3], min(allowed(z), held), rel_tol=1e-9)
            checked += 1
        else:
            held = math.inf
    assert checked > 0
    # The spec's own example: Z = 2.5 -> base * 2^-0.5.
    gd.a.state[3] = S.DEGRADED
    gd.a.cut_weight[3] = math.nan  # new to DEGRADED: no hold yet
    score = np.zeros(16)
    score[3] = 2.5
    assert math.isclose(__import__("detector.weights").weights.weights(gd.a, gd.thresholds, score)[3], 100 * 2**-0.5)


def test_safeguard_never_quarantines_more_than_30_percent():
    fleet = Fleet(10, seed=2, rate=120)
    gd = GroupDetector(Thresholds(), fleet.nodes)
    run(gd, fleet, 0, 20)
    for i in range(5):
        fleet.slow[i] = 3.0 + i
    evs = run(gd, fleet, 20, 20)
    for ev in evs:
        out = np.isin(ev.states, [int(s) for s in OUT_OF_SERVICE]).sum()
        assert out <= 3
    assert any(ev.safeguard for ev in evs)
    msg = next(ev.safeguard_reason for ev in evs if ev.safeguard)
    assert "cap is 3 (30%)" in msg
    last = evs[-1]
    out_nodes = {i for i in range(10) if last.states[i] in (S.QUARANTINED, S.PROBING)}
    assert out_nodes <= {0, 1, 2, 3, 4} and len(out_nodes) == 3
    # the slow nodes held back by the cap stay in service at a cut weight
    for i in {0, 1, 2, 3, 4} - out_nodes:
        assert last.states[i] == S.DEGRADED and last.weights[i] < 50


def test_whole_group_surge_quarantines_nobody():
    fleet = Fleet(16, seed=3, rate=100)
    gd = GroupDetector(Thresholds(), fleet.nodes)
    run(gd, fleet, 0, 20)
    fleet.surge = 1.5
    evs = run(gd, fleet, 20, 40)
    fleet.surge = 1.0
    evs += run(gd, fleet, 60, 20)
    assert not any(t.to_state in OUT_OF_SERVICE for ev in evs for t in ev.transitions)


def test_warm_up_requests_do_not_quarantine_a_new_node():
    fleet = Fleet(12, seed=4, rate=70)
    gd = GroupDetector(Thresholds(), fleet.nodes[:11])
    run(gd, fleet.__class__(11, seed=4, rate=64), 0, 20)
    gd.add_node(fleet.nodes[11], now=20)
    assert gd.state_of(fleet.nodes[11]) == S.WARMING
    fleet.slow[11] = 8.0
    evs, warm_weights = [], []
    t = 20.0
    while gd.state_of(fleet.nodes[11]) == S.WARMING and t < 120:
        evs += run(gd, fleet, t, 1.0)
        warm_weights.append(evs[-1].weights[11])
        t += 1.0
        if gd.a.warm_samples[11] >= 40:
            fleet.slow.pop(11, None)  # warm-up over: the node is now as fast as its peers
    assert warm_weights[0] < 50 and warm_weights == sorted(warm_weights)  # slow start ramps up
    evs += run(gd, fleet, t, 40)
    assert S.QUARANTINED not in _states(evs, 11)
    assert evs[-1].states[11] == S.HEALTHY


def _probe_with(fleet, gd, factor_of):
    def probe(node, t):
        i = fleet.nodes.index(node)
        f = fleet.speed[i] * factor_of(i, t)
        gd.record_probe(node, t, 1000, 100, (0.12 * 1000 + 20) * f, (0.12 * 1000 + 20 + 1400) * f, True)

    return probe


def test_canary_three_passes_then_stepwise_restore_and_a_failed_step_doubles_the_interval():
    fleet = Fleet(16, seed=6, rate=120)
    t = Thresholds(canary_interval_s=5, recovery_step_s=5)
    gd = GroupDetector(t, fleet.nodes)
    run(gd, fleet, 0, 20)
    fleet.slow[2] = 3.0
    healed_at = {"t": 1e9}
    probe = _probe_with(fleet, gd, lambda i, now: fleet.slow.get(i, 1.0))
    evs = run(gd, fleet, 20, 15, probe=probe)
    assert evs[-1].states[2] in (S.QUARANTINED, S.PROBING)
    first_q = gd.a.next_probe[2]
    fleet.slow.pop(2)
    healed_at["t"] = 35
    evs = run(gd, fleet, 35, 60, probe=probe)
    seq = [s for k, s in enumerate(_states(evs, 2)) if k == 0 or s != _states(evs, 2)[k - 1]]
    assert seq[-3:] == [S.PROBING, S.RECOVERING, S.HEALTHY]
    rec_weights = sorted({round(ev.weights[2]) for ev in evs if ev.states[2] == S.RECOVERING})
    assert rec_weights == [25, 50, 100] or rec_weights == [25, 50]
    assert evs[-1].weights[2] == 100
    assert first_q > 0

    # Now a relapse during recovery: back to quarantine, next probe interval doubled (2nd ejection).
    fleet.slow[2] = 3.0
    evs = run(gd, fleet, 95, 15, probe=probe)
    fleet.slow.pop(2)
    evs += run(gd, fleet, 110, 40, probe=probe)
    gd2 = GroupDetector(t, fleet.nodes)
    run(gd2, fleet, 0, 1)
    tr = [tr for ev in evs for tr in ev.transitions if tr.node == fleet.nodes[2]]
    assert tr[0].to_state == S.DEGRADED or tr[0].to_state == S.QUARANTINED
    fleet.slow[2] = 3.0
    # third episode: fault returns while recovering
    evs = run(gd, fleet, 150, 40, probe=probe)
    failed = [x for ev in evs for x in ev.transitions if x.reason == "recovery_step_failed"]
    quarantines = [x for ev in evs for x in ev.transitions if x.to_state == S.QUARANTINED and x.node == fleet.nodes[2]]
    assert quarantines
    if failed:
        assert "next probe in" in failed[0].detail


def test_failed_recovery_step_doubles_probe_interval():
    fleet = Fleet(16, seed=7, rate=160)
    t = Thresholds(canary_interval_s=4, recovery_step_s=3)
    gd = GroupDetector(t, fleet.nodes)
    run(gd, fleet, 0, 20)
    fleet.slow[5] = 3.0
    state = {"probe_factor": 1.0}
    probe = _probe_with(fleet, gd, lambda i, now: state["probe_factor"])  # probes look fine...
    evs = run(gd, fleet, 20, 60, probe=probe)  # ...but live traffic is still slow
    failed = [x for ev in evs for x in ev.transitions if x.reason == "recovery_step_failed"]
    assert len(failed) >= 2
    intervals = [float(x.detail.split("next probe in ")[1].split(" s")[0]) for x in failed[:2]]
    assert intervals == [8.0, 16.0]


def test_crashed_node_answering_fast_errors_is_ejected():
    fleet = Fleet(8, seed=8, rate=80)
    gd = GroupDetector(Thresholds(), fleet.nodes)
    run(gd, fleet, 0, 10)
    evs = []
    t = 10.0
    for _ in range(20):
        b = fleet.batch(t, 0.2, status={1: 503})
        b = SampleBatch.from_columns(
            node=b.node, ts=b.ts, prompt_tokens=b.prompt_tokens, completion_tokens=b.completion_tokens,
            ttft_ms=np.where(b.status == 503, 1.0, b.ttft_ms), total_ms=np.where(b.status == 503, 2.0, b.total_ms),
            status=b.status,
        )
        gd.ingest(b)
        t += 0.2
        evs.append(gd.evaluate(t))
    tr = [x for ev in evs for x in ev.transitions if x.node == fleet.nodes[1]]
    assert tr and tr[0].to_state == S.QUARANTINED and tr[0].reason == "consecutive_errors"


def test_when_every_node_is_out_traffic_goes_to_the_least_slow():
    fleet = Fleet(4, seed=9, rate=40)
    gd = GroupDetector(Thresholds(), fleet.nodes)
    run(gd, fleet, 0, 10)
    for n in fleet.nodes:
        gd.force_quarantine(n, now=10)
    ev = gd.evaluate(10.2)
    assert ev.fallback and "least slow" in ev.fallback_reason
    assert (ev.weights > 0).sum() == 1


def test_serialise_restore_gives_identical_decisions():
    fleet = Fleet(24, seed=10)
    gd = GroupDetector(Thresholds(), fleet.nodes)
    run(gd, fleet, 0, 15)
    fleet.slow[3] = 2.0
    run(gd, fleet, 15, 2)
    clone = GroupDetector.from_bytes(gd.to_bytes())
    f1, f2 = Fleet(24, seed=11), Fleet(24, seed=11)
    f1.slow[3] = f2.slow[3] = 2.0
    e1, e2 = run(gd, f1, 17, 10), run(clone, f2, 17, 10)
    for a, b in zip(e1, e2, strict=True):
        np.testing.assert_array_equal(a.states, b.states)
        np.testing.assert_array_equal(a.weights, b.weights)
        assert [t.to_dict() for t in a.transitions] == [t.to_dict() for t in b.transitions]


def test_approval_policy_holds_at_floor_until_approved_or_rejected():
    fleet = Fleet(12, seed=12, rate=120)
    gd = GroupDetector(Thresholds(require_approval=True), fleet.nodes)
    run(gd, fleet, 0, 15)
    fleet.slow[0] = 3.0
    evs = run(gd, fleet, 15, 8)
    assert evs[-1].states[0] == S.PENDING_APPROVAL
    assert evs[-1].weights[0] == pytest.approx(5.0)  # min_weight_fraction * base
    gd.approve(fleet.nodes[0], now=23)
    assert gd.state_of(fleet.nodes[0]) == S.QUARANTINED
    gd.release(fleet.nodes[0], now=24)
    assert gd.state_of(fleet.nodes[0]) == S.HEALTHY
    with pytest.raises(ValueError, match="cannot approve"):
        gd.approve(fleet.nodes[1], now=24)


def test_a_rejected_and_silenced_node_stays_degraded_until_the_silence_ends():
    """Finding: a rejected latency proposal came back 2 s later, and a silence that only rejected it
    again left the node cycling through pending_approval at the floor weight. Silenced, latency
    causes do not take the node out: it stays degraded at its computed weight."""
    fleet = Fleet(12, seed=12, rate=120)
    gd = GroupDetector(Thresholds(require_approval=True), fleet.nodes)
    run(gd, fleet, 0, 15)
    fleet.slow[0] = 3.0
    assert run(gd, fleet, 15, 8)[-1].states[0] == S.PENDING_APPROVAL
    gd.reject(fleet.nodes[0], now=23)
    gd.silence_latency({fleet.nodes[0]: 53.0})
    evs = run(gd, fleet, 23, 29)  # the silence ends at 53 s
    states = {int(ev.states[0]) for ev in evs[5:]}
    assert states == {S.DEGRADED}
    assert sum(len(ev.transitions) for ev in evs[5:]) == 0  # no cycling, no records every few seconds
    after = run(gd, fleet, 52, 10)
    assert after[-1].states[0] == S.PENDING_APPROVAL  # the silence ended: proposed again


def test_forced_states_expire_and_pins_override_weights():
    fleet = Fleet(6, seed=13, rate=60)
    gd = GroupDetector(Thresholds(), fleet.nodes)
    run(gd, fleet, 0, 5)
    gd.force_quarantine(fleet.nodes[0], now=5, until=8)
    gd.force_active(fleet.nodes[1], now=5, until=8)
    gd.pin_weight(fleet.nodes[2], 7, now=5, until=8)
    ev = gd.evaluate(6)
    assert ev.weights[0] == 0 and ev.weights[1] == 100 and ev.weights[2] == 7
    ev = gd.evaluate(8.5)
    states = {tr.node: tr.to_state for tr in ev.transitions}
    assert states[fleet.nodes[1]] == S.HEALTHY
    assert gd.state_of(fleet.nodes[0]) in (S.QUARANTINED, S.PROBING)
    assert ev.weights[2] == 100


def test_unknown_nodes_and_bad_samples_are_reported_not_applied():
    gd = GroupDetector(Thresholds(), ["a", "b"])
    b = SampleBatch.from_records(
        [
            {"node": "a", "ts": 1, "prompt_tokens": 10, "completion_tokens": 5, "total_ms": 100},
            {"node": "zz", "ts": 1, "prompt_tokens": 10, "completion_tokens": 5, "total_ms": 100},
            {"node": "b", "ts": 1, "prompt_tokens": 10, "completion_tokens": 5, "total_ms": -1},
        ]
    )
    res = gd.ingest(b)
    assert res.accepted == 1 and res.unknown_nodes == ["zz"]
    assert res.rejected == [(1, RejectReason.UNKNOWN_NODE), (2, RejectReason.NEGATIVE)]
    assert gd.rejected_total == {"negative": 1}


def test_illegal_edges_are_refused():
    gd = GroupDetector(Thresholds(), ["a"])
    with pytest.raises(IllegalTransition):
        gd._set(0, S.RECOVERING, 0.0, reason=Reason.RECOVERED)


def test_set_thresholds_keeps_learned_state_and_resizes_windows():
    fleet = Fleet(8, seed=14, rate=400)
    gd = GroupDetector(Thresholds(), fleet.nodes)
    run(gd, fleet, 0, 10)
    before = gd.window.percentiles()
    ema = gd.ewma["norm"].mean.copy()
    gd.set_thresholds(Thresholds(window_size=200, cost_model_reservoir=1000, quarantine_z=5.0, ema_alpha=0.2))
    assert gd.window.size == 200 and (gd.window.filled == np.minimum(200, gd.window.filled)).all()
    np.testing.assert_array_equal(gd.ewma["norm"].mean, ema)
    assert gd.ewma["norm"].alpha == 0.2 and gd.signals.reservoir.filled == 1000
    after = gd.window.percentiles()
    np.testing.assert_allclose(after[0], before[0], rtol=0.1)  # the newest samples carry over
    ev = gd.evaluate(10.2)
    assert ev.transitions == [] or all(t.thresholds["quarantine_z"] == 5.0 for t in ev.transitions)


def test_a_snapshot_without_newer_counters_still_restores():
    import io

    fleet = Fleet(6, seed=15, rate=60)
    gd = GroupDetector(Thresholds(), fleet.nodes)
    run(gd, fleet, 0, 5)
    with np.load(io.BytesIO(gd.to_bytes())) as z:
        arrays = {k: z[k] for k in z.files if k != "a.over_q_evals"}
    buf = io.BytesIO()
    np.savez(buf, **arrays)
    old = GroupDetector.from_bytes(buf.getvalue())
    assert (old.a.over_q_evals == 0).all()
    run(old, fleet, 5, 2)  # evaluates without a KeyError


def test_without_ttft_a_queue_that_drains_is_not_quarantined_but_a_slow_gpu_is():
    """Without TTFT the latency includes the queue. Node 5's requests wait 4 s in a queue until 8 s
    after its weight is cut (its queue then has drained); node 9's GPU is 3x slower whatever its load.
    Both get cut; only node 9 is quarantined, on requests dispatched queue_drain_s after the cut."""
    fleet = Fleet(16, seed=4)
    fleet.logs_ttft = False
    t = Thresholds()
    gd = GroupDetector(t, fleet.nodes)
    run(gd, fleet, 0, 30)
    fleet.wait_ms[5] = 4000.0
    fleet.slow[9] = 3.0
    evs, now, cut_5, cut_9 = [], 30.0, None, None
    while now < 90:
        gd.ingest(fleet.batch(now, 0.2))
        now += 0.2
        ev = gd.evaluate(now)
        evs.append(ev)
        if cut_5 is None and ev.weights[5] < 100:
            cut_5 = now
        if cut_9 is None and ev.weights[9] < 100:
            cut_9 = now
        if cut_5 is not None and now > cut_5 + 8.0:
            fleet.wait_ms.pop(5, None)  # the cut has emptied its queue: requests dispatched since wait less
    assert ev.decision_signal == "norm"
    assert cut_5 is not None and cut_9 is not None
    assert all(ev.states[5] not in OUT_OF_SERVICE for ev in evs)
    q9 = _first(evs, 9, S.QUARANTINED)
    assert q9 is not None and q9 - cut_9 >= t.queue_drain_s


def test_the_queue_free_signal_decides_and_a_queue_only_deepens_a_cut():
    """One rule, stated in detectors.zscore: the decode Z decides (and is ``Evaluation.z``); a queue
    alone never cuts a node; a node judged slow that also built a queue is cut by the largest Z of any
    signal until the queue drains, then by the least its decode Z allowed since the cut."""
    fleet = Fleet(12, seed=4)
    gd = GroupDetector(nodes=fleet.nodes, now=0.0)
    run(gd, fleet, 0.0, 30.0)
    fleet.wait_ms[2] = 3000.0  # node 2: a 3 s queue, a healthy GPU
    fleet.slow[5] = 1.2  # node 5: a 1.2x slow GPU with the same queue
    fleet.wait_ms[5] = 3000.0
    ev = run(gd, fleet, 30.0, 30.0)[-1]
    q, s = ev.index(fleet.nodes[2]), ev.index(fleet.nodes[5])
    assert ev.z_by_signal["prefill"][q] > 50 and ev.z[q] == pytest.approx(ev.z_by_signal["decode"][q]) and ev.z[q] < 2
    assert NodeState(int(ev.states[q])) is NodeState.HEALTHY and ev.weights[q] == 100
    z_dec = ev.z_by_signal["decode"][s]
    assert ev.decision_signal == "decode" and ev.z[s] == pytest.approx(z_dec) and 2 < z_dec < 10
    assert NodeState(int(ev.states[s])) is NodeState.DEGRADED and ev.weights[s] == 5  # its queue deepens the cut
    fleet.wait_ms[5] = 0.0  # the queue drains: then the decode Z alone sets the weight
    ev = run(gd, fleet, 60.0, 30.0)[-1]
    z_dec = ev.z_by_signal["decode"][s]
    assert NodeState(int(ev.states[s])) is NodeState.DEGRADED
    # ... held at the least its decode Z allowed since it was cut (detector.weights.hold_cut)
    held = 100 * gd.a.cut_weight[s]
    assert held <= min(100.0, max(5.0, 100 * 2 ** -(z_dec - 2))) + 1e-9
    assert ev.weights[s] == pytest.approx(min(held, 100 * 2 ** -(max(z_dec, ev.z_by_signal["norm"][s],
                                                                   ev.z_by_signal["prefill"][s]) - 2)))
    assert ev.weights[s] > 5


def test_pending_approval_is_kept_at_the_floor_by_the_one_traffic_table():
    from detector.states import TRAFFIC, Traffic, traffic_of

    assert traffic_of("pending_approval") is Traffic.FLOOR and traffic_of(NodeState.PROBING) is Traffic.DRAIN
    assert traffic_of("no-such-state") is None  # a gateway then follows the weight alone
    assert {s for s, rule in TRAFFIC.items() if rule is Traffic.DRAIN} == OUT_OF_SERVICE
