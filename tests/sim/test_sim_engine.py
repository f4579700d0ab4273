"""The simulator's pieces: cost model, queueing, every fault kind, client timeout/retry, determinism."""

import json

import numpy as np
import pytest
from sim_helpers import simulate, tiny

from sim.runner import run_scenario
from sim.scenario import parse_scenario


def served(sim, node, t0=0.0, t1=1e9):
    """Service times (ms, no queueing) of client attempts started on ``node`` in [t0, t1)."""
    a = sim.attempts()
    m = (a["node"] == node) & (a["kind"] == 0) & (a["start"] >= t0) & (a["start"] < t1) & (a["status"] == 200)
    return a["service_ms"][m]


def test_healthy_cost_model_is_the_schema_formula():
    sim = simulate(tiny())
    s = served(sim, 0)
    # prefill 0.1 * 1000 + decode 10 * 50, no noise, no spread, flat batch curve
    assert len(s) > 50
    np.testing.assert_allclose(s, 600.0)
    a = sim.attempts()
    ok = a["gw_status"] == 200
    np.testing.assert_allclose((a["ttft"] - a["start"])[ok] * 1000, 110.0)  # prefill + first token


def test_splitwise_batch_curve_slows_decode_under_load():
    d = tiny()
    del d["groups"][0]["decode_batch_curve"]  # default: measured Splitwise curve
    d["workload"][0]["rate_rps"] = 20
    s = served(simulate(d), 0)
    # normalised at a full batch (8): lighter batches are faster, by up to 1/g(8) = 0.93
    assert s.max() <= 600.0 + 1e-9
    assert s.min() < 0.95 * 600.0
    assert s.max() / s.min() > 1.03  # several requests in flight -> g(b) > 1


def test_queueing_when_slots_are_full():
    d = tiny()
    d["groups"][0].update(nodes=1, max_concurrency=1)
    d["workload"][0]["rate_rps"] = 3  # 3 * 0.6 s > 1 slot: requests must wait
    sim = simulate(d)
    a = sim.attempts()
    ok = a["gw_status"] == 200
    wait = (a["start"] - a["t"])[ok]
    assert wait.max() > 1.0
    # one slot: service intervals never overlap
    order = np.argsort(a["start"][ok])
    assert np.all(a["start"][ok][order][1:] >= a["end"][ok][order][:-1] - 1e-9)
    total = (a["gw_t"] - a["t"])[ok] * 1000
    np.testing.assert_allclose(total, wait * 1000 + 600.0, atol=1e-6)


def fault_doc(fault, **wl):
    node = "all" if fault["kind"] == "surge" else 0
    d = tiny(faults=[{"group": "g", "node": node, "start_s": 20, "end_s": 40, **fault}])
    d["workload"][0].update(wl)
    return d


@pytest.mark.parametrize(("fault", "expected"), [
    ({"kind": "thermal_throttle", "slowdown": 2.86}, 600 * 2.86),
    ({"kind": "pcie_downgrade", "decode_slowdown": 2.0}, 100 + 500 * 2.0),
    ({"kind": "pcie_downgrade", "decode_slowdown": 2.0, "prefill_slowdown": 3.0}, 300 + 1000),
    ({"kind": "surge", "slowdown": 1.5}, 900),
])
def test_step_faults_scale_service_time_inside_the_window_only(fault, expected):
    sim = simulate(fault_doc(fault))
    np.testing.assert_allclose(served(sim, 0, 20.5, 39.0), expected, rtol=1e-9)
    np.testing.assert_allclose(served(sim, 0, 0, 19.0), 600.0)
    np.testing.assert_allclose(served(sim, 0, 41.0), 600.0)
    healthy = served(sim, 1, 20.5, 39.0)
    np.testing.assert_allclose(healthy, expected if fault["kind"] == "surge" else 600.0)


def test_step_fault_stretches_requests_already_running():
    d = fault_doc({"kind": "thermal_throttle", "slowdown": 2.0})
    sim = simulate(d)
    a = sim.attempts()
    m = (a["node"] == 0) & (a["start"] < 20) & (a["end"] > 20) & (a["start"] > 19.4)
    assert m.any()
    for s, e in zip(a["start"][m], a["end"][m], strict=True):
        done_before = 20 - s
        assert e == pytest.approx(20 + (0.6 - done_before) * 2.0)
    # The stretch is service time (the report's floor reads it), not queueing.
    np.testing.assert_allclose(a["service_ms"][m], (a["end"][m] - a["start"][m]) * 1000.0, rtol=1e-9)
    assert (a["service_ms"][m] > 600.0).all()


def test_ecc_replay_stalls_a_fraction_of_requests():
    sim = simulate(fault_doc({"kind": "ecc_replay", "stall_prob": 0.3, "stall_ms": 4000}, rate_rps=40))
    s = served(sim, 0, 20, 40)
    stalled = np.isclose(s, 4600.0)
    assert set(np.round(s)) <= {600.0, 4600.0}
    assert 0.2 < stalled.mean() < 0.4
    assert np.all(served(sim, 0, 0, 20) == 600.0)


def test_kv_swap_grows_with_inflight_load():
    f = {"kind": "kv_swap", "swap_factor": 4.0, "swap_threshold": 0.25}
    sim = simulate(fault_doc(f, rate_rps=24))
    a = sim.attempts()
    m = (a["node"] == 0) & (a["start"] >= 20) & (a["start"] < 40) & (a["gw_status"] == 200)
    s = a["service_ms"][m]
    assert s.min() >= 600 - 1e-9 and s.max() > 900  # 1 + 4 * (b/8 - 0.25) with b in flight
    factors = s / 600.0
    b = np.round(((factors - 1) / 4 + 0.25) * 8)
    np.testing.assert_allclose(factors[b > 2], 1 + 4 * (b[b > 2] / 8 - 0.25), atol=1e-9)


def test_warmup_node_joins_late_and_is_slow_for_its_first_requests():
    d = tiny(faults=[{"group": "g", "node": 0, "kind": "warmup", "start_s": 20, "requests": 5, "slowdown": 8.0}])
    sim = simulate(d)
    a = sim.attempts()
    on0 = (a["node"] == 0) & (a["kind"] == 0)
    assert a["t"][on0].min() >= 20.0  # not routed before it joins
    order = np.argsort(a["start"][on0])
    s = a["service_ms"][on0][order]
    np.testing.assert_allclose(s[:5], 4800.0)
    np.testing.assert_allclose(s[5:], 600.0)


def test_crash_answers_fast_errors_and_client_retries_elsewhere():
    d = tiny(faults=[{"group": "g", "node": 0, "kind": "crash", "start_s": 20, "end_s": 40, "error_after_ms": 5}],
             client={"timeout_s": 30, "retries": 1})
    sim = simulate(d)
    a = sim.attempts()
    err = (a["gw_status"] == 503) & (a["t"] >= 20)  # (requests running at the crash fail at once)
    assert err.sum() > 20
    assert np.all(a["node"][err] == 0)
    np.testing.assert_allclose((a["gw_t"] - a["t"])[err], 0.005, atol=1e-9)
    s = sim.summary_arrays()
    all_err = a["gw_status"] == 503
    # every failed attempt is retried, except the last attempt of a request that failed for good
    assert len(a["req"]) - len(sim.r_t) == all_err.sum() - (s["final_status"] == 503).sum()
    assert (s["final_status"] == 200).mean() > 0.9


def test_drift_ramps_linearly():
    d = tiny(faults=[{"group": "g", "node": 0, "kind": "drift", "start_s": 10, "slowdown": 3.0, "ramp_s": 20}])
    sim = simulate(d)
    a = sim.attempts()
    m = (a["node"] == 0) & (a["start"] >= 10) & (a["start"] < 29) & (a["gw_status"] == 200)
    # service at start time t is 600 * (1 + 2 * (t - 10) / 20), within one drift step of the running stretch
    expected = 600 * (1 + 2 * (a["start"][m] - 10) / 20)
    np.testing.assert_allclose(a["service_ms"][m], expected, rtol=1e-9)
    np.testing.assert_allclose(served(sim, 0, 31), 1800.0)


def test_timeout_is_logged_at_the_deadline_and_the_node_keeps_working():
    d = tiny(faults=[{"group": "g", "node": 0, "kind": "thermal_throttle", "slowdown": 100, "start_s": 10}],
             client={"timeout_s": 5, "retries": 1})
    sim = simulate(d)
    a = sim.attempts()
    to = a["gw_status"] == 0
    assert to.sum() > 10
    np.testing.assert_allclose((a["gw_t"] - a["t"])[to], 5.0)
    assert not np.any(a["end"][to] <= a["gw_t"][to])  # still queued or running after the client gave up
    # every timed-out attempt was retried once through the gateway
    s = sim.summary_arrays()
    retried = np.unique(a["req"][to])
    assert np.all(s["attempts"][retried] >= 2)


def test_same_seed_same_report_and_different_seed_differs():
    d = tiny(faults=[{"group": "g", "node": 0, "kind": "thermal_throttle", "slowdown": 3, "start_s": 20}])
    d["groups"][0].update(nodes=6, jitter_cv=0.1, node_speed_spread=0.03)
    d["workload"][0]["trace"] = "azure_llm_2023_conv"
    d["expect"] = {"faulty": [{"group": "g", "node": 0}]}
    scn = parse_scenario(d)
    pols = ["round_robin", "least_conn", "p2c_ewma", "seed_zscore"]
    r1 = run_scenario(scn, pols)
    r2 = run_scenario(scn, pols)
    r1.pop("speed"), r2.pop("speed")
    assert json.dumps(r1, sort_keys=True) == json.dumps(r2, sort_keys=True)
    d["seed"] = 2
    r3 = run_scenario(parse_scenario(d), pols)
    assert r3["policies"]["round_robin"]["p99_ms"] != r1["policies"]["round_robin"]["p99_ms"]


def test_a_gateway_without_ttft_gives_the_detector_total_latency_only():
    """``gateway.logs_ttft: false`` (nginx's default log) and no streaming: the default policy's
    detector gets no TTFT, so it has no decode baseline and decides on the learned ``norm``; with TTFT
    it decides on decode, and so it does without TTFT when the gateway streams."""
    d = tiny(duration_s=60)
    d["groups"][0]["nodes"] = 4  # a baseline needs 3 peers
    d["workload"][0]["rate_rps"] = 10  # and the cost model 200 samples
    d["gateway"] = {"streams": False}
    with_ttft = run_scenario(parse_scenario(d), ["default"], keep_sims=True)
    d["gateway"] = {"logs_ttft": False, "streams": False}
    without = run_scenario(parse_scenario(d), ["default"], keep_sims=True)
    d["gateway"] = {"logs_ttft": False}
    streamed = run_scenario(parse_scenario(d), ["default"], keep_sims=True)

    def last_eval(report):
        policy = report["_sims"]["default"].policies[0]
        return policy.last_eval

    assert last_eval(with_ttft).decision_signal == "decode"
    ev = last_eval(without)
    assert ev.decision_signal == "norm" and np.isnan(ev.ema["decode"]).all() and np.isfinite(ev.ema["norm"]).all()
    ev = last_eval(streamed)
    assert ev.decision_signal == "decode" and np.isfinite(ev.ema["decode"]).all()


def test_the_first_evidence_of_a_noise_free_fleet_is_its_first_record_after_the_onset():
    d = tiny(duration_s=60, faults=[{"group": "g", "node": 0, "kind": "thermal_throttle", "slowdown": 3, "start_s": 30}])
    d["groups"][0]["nodes"] = 4
    d["workload"][0]["rate_rps"] = 10
    d["expect"] = {"faulty": [{"group": "g", "node": 0}]}
    report = run_scenario(parse_scenario(d), ["round_robin", "seed_zscore"], keep_sims=True)
    a = report["_sims"]["seed_zscore"].attempts()
    mine = (a["node"] == 0) & (a["gw_t"] > 30)
    # The seed reads completed records only: the first one of node 0 logged after the onset was
    # in service after it, the first sample that could show the slowdown.
    first = float(np.min(a["gw_t"][mine]))
    f = report["policies"]["seed_zscore"]["faults"][0]
    assert f["evidence"] == "line" and f["to_evidence_s"] == pytest.approx(first - 30, abs=1e-3)
    assert f["to_work_s"] is not None and f["to_work_s"] <= f["to_evidence_s"]
    # (the seed's population Z never reaches 2 among 4 nodes: sqrt(3), Samuelson; no cut, no share)
    assert f["first_degrade_s"] is None and f["detector_s"] is None

class StreamRecorder:
    """A round-robin policy that asks for the streamed progress and keeps every row."""

    def __init__(self, ctx):
        from sim.policies import policy_factory

        self.inner = policy_factory("round_robin")(ctx)
        self.ctx, self.tick_s, self.rows = ctx, 0.2, []

    wants_records, wants_progress = False, True

    def pick(self, now):
        return self.inner.pick(now)

    def on_record(self, *args):
        pass

    def on_tick(self, now):
        pass

    def add_node(self, node, now):
        pass

    def on_progress(self, now, interval_s, tokens, token_ms):
        self.rows.append((now, list(tokens), list(token_ms)))


def test_streamed_progress_counts_every_token_at_its_current_rate():
    from sim.engine import Precomputed, Simulation
    from sim.workload import build_requests

    doc = tiny(duration_s=20, faults=[{"group": "g", "node": 0, "kind": "thermal_throttle", "slowdown": 2,
                                       "start_s": 10.1, "end_s": 15.05}])
    doc["groups"][0]["prefill_ms_per_token"] = 1.0  # a 1 s prefill: some run across the fault's edges
    scn = parse_scenario(doc)
    holder = {}

    def factory(ctx):
        holder["p"] = StreamRecorder(ctx)
        return holder["p"]

    sim = Simulation(scn, Precomputed.build(scn, build_requests(scn)), factory).run()
    rows = holder["p"].rows
    a = sim.attempts()
    done = a["gw_status"] == 200
    # Every output token after the first was streamed once: 49 per completed request (50 tokens),
    # including requests whose prefill the fault's end shortened.
    streamed = sum(sum(tok) for _, tok, _ in rows)
    assert streamed == pytest.approx(49 * done.sum(), rel=1e-6)
    # Per-token time as streamed: 10 ms on the healthy node throughout, 10 then 20 ms on node 0.
    for now, tok, ms in rows:
        if tok[1] > 0:
            assert ms[1] / tok[1] == pytest.approx(10.0)
        if tok[0] > 0 and not 10.1 < now < 10.3 and not 15.05 < now < 15.25:
            assert ms[0] / tok[0] == pytest.approx(20.0 if 10.1 < now < 15.05 else 10.0)
    # The tick that straddles the onset (10.0 -> 10.2) holds both rates, each for its share of the time.
    straddle = next((tok[0], ms[0]) for now, tok, ms in rows if 10.1 < now < 10.3)
    assert 11.0 < straddle[1] / straddle[0] < 19.0


# -- fast mode: the step engine replayed (sim/fastmode.py) ------------------------------------
def _tick_stats(rows, node_of_row, totals, records_per_row):
    """Per-tick statistics of a group: ms per token, tokens, running batch, KV usage, queue-free
    prefill ms, completed records per node and tick, their total latency; and the lag-1
    autocorrelation of a node's ms per token."""
    with np.errstate(invalid="ignore", divide="ignore"):
        ms = rows[:, 1] / rows[:, 0]
        pf = rows[:, 3] / np.where(rows[:, 2] > 0, rows[:, 2], np.nan)
    lag = []
    for n in np.unique(node_of_row):
        x = ms[node_of_row == n]
        x = x[np.isfinite(x)]
        lag.append(np.corrcoef(x[:-1], x[1:])[0, 1])
    return {"ms_per_token": ms, "tokens": rows[:, 0], "running": rows[:, 5], "kv_usage": rows[:, 7],
            "prefill_ms": pf, "records": records_per_row, "total_ms": totals}, float(np.mean(lag))


def _engine_stats(rec):
    nodes, T, cols = rec.rows.shape
    return _tick_stats(rec.rows.reshape(-1, cols), np.repeat(np.arange(nodes), T), rec.records[:, 3],
                       np.diff(rec.offsets))


def _replay_stats(replay, load, nodes, ticks):
    rng = np.random.default_rng(5)
    replay.start(nodes, rng)
    rows, owner, totals, counts = [], [], [], []
    for _ in range(ticks):
        s = replay.draw(rng, load)
        rows.append(s.rows)
        owner.append(np.arange(nodes))
        totals.append(s.records[:, 3])
        counts.append(np.bincount(s.node, minlength=nodes))
    return _tick_stats(np.concatenate(rows), np.concatenate(owner), np.concatenate(totals), np.concatenate(counts))


def _mismatches(ref, fast):
    from sim.fastmode import MATCH_TOLERANCE

    out = []
    for k, a in ref.items():
        b = fast[k]
        for what, fa, fb in (("mean", np.nanmean(a), np.nanmean(b)), ("sd", np.nanstd(a), np.nanstd(b))):
            if abs(fb / fa - 1) > MATCH_TOLERANCE[what]:
                out.append(f"{k} {what}: engine {fa:.4g}, replay {fb:.4g}")
    return out


@pytest.fixture(scope="module")
def calibrated():
    """A level calibrated on one pass over the trace (8 nodes, 3 req/s each, 2 s ticks), the level
    20 % above it, and an independent engine run at the first level (another seed: other step
    jitter, another rotation of the trace, another arrival phase)."""
    from sim.fastmode import EngineReplay, record_engine
    from sim.traces import load_trace

    replay = EngineReplay(3.0, 2.0, seed=11, cal_nodes=8, cycles=1.0, block_s=60.0)
    replay.recording(10)
    replay.recording(12)
    seconds = len(load_trace("azure_llm_2023_conv")[1]) / (3.0 * 8)
    ref = record_engine(3.0, 2.0, nodes=8, seconds=seconds, seed=12)
    return replay, ref


def test_fast_mode_replay_matches_an_independent_run_of_the_step_engine(calibrated):
    replay, ref = calibrated
    eng, eng_lag = _engine_stats(ref)
    assert np.nanmean(eng["running"]) > 5 and np.nanmean(eng["ms_per_token"]) > 14  # a loaded batch
    fast, fast_lag = _replay_stats(replay, 1.0, 8, ref.ticks)
    # mean and spread per tick of every statistic within MATCH_TOLERANCE (10 %, 20 %)...
    assert _mismatches(eng, fast) == []
    # ...and consecutive ticks of a node as correlated as on the engine (blocks are replayed whole)
    assert eng_lag > 0.2 and fast_lag == pytest.approx(eng_lag, abs=0.1)
    # The check discriminates: a replay of the level 20 % busier fails it.
    busier, _ = _replay_stats(replay, 1.2, 8, ref.ticks)
    assert any(m.startswith(("running mean", "tokens mean")) for m in _mismatches(eng, busier))


def test_fast_mode_replay_scales_a_node_times_by_its_speed(calibrated):
    replay, _ = calibrated
    replay.start(4, np.random.default_rng(1))
    plain = replay.draw(np.random.default_rng(2), 1.0)
    replay.start(4, np.random.default_rng(1))  # the same phase, nodes and offsets
    speed = np.array([1.0, 2.0, 1.0, 0.5])
    slow = replay.draw(np.random.default_rng(2), 1.0, speed)
    np.testing.assert_allclose(slow.rows[:, 1], plain.rows[:, 1] * speed)  # inter-token ms
    np.testing.assert_allclose(slow.rows[:, 0], plain.rows[:, 0])  # tokens: the same
    ok = plain.records[:, 4] == 200
    np.testing.assert_allclose(slow.records[ok, 3], plain.records[ok, 3] * speed[plain.node[ok]])


def test_fast_mode_on_the_engine_counts_false_alarms_per_1000_node_hours(calibrated):
    from sim.fastmode import EngineReplay, run_fast

    rec = calibrated[0].recording(10)
    replay = EngineReplay(3.0, 2.0, cal_nodes=8, recordings=dict.fromkeys(range(1, 21), rec))  # no calibration here
    res = run_fast(nodes=8, hours=0.05, tick_s=2.0, replay=replay)
    assert res["progress_rows"] > 0.9 * 8 * 90 and res["samples"] > 8 * 180 * 3 * 0.5
    for r in res["policies"].values():
        assert r["false_quarantines_per_1000h"] == pytest.approx(1000 * r["false_quarantines"] / res["node_hours"])
        assert r["false_degrades_per_1000h"] == pytest.approx(1000 * r["false_degrades"] / res["node_hours"])
