"""The vLLM V1 step engine (``sim/vllm.py``) on its measured step model (``profile.py``)."""

import heapq
import json
import math

import numpy as np
import pytest
from sim_helpers import simulate, tiny_vllm

from sim.engine import Precomputed, Simulation
from sim.policies import policy_factory
from sim.profile import HEALTHY, Resources, splitwise_points, step_model
from sim.scenario import load_scenario, parse_scenario
from sim.vllm import NodeEngine, NodeSettings
from sim.workload import build_requests


class Harness:
    """One node engine driven by a private event queue: ``submit`` at times, ``run`` to the end."""

    def __init__(self, settings=None, state=None, speed=1.0, tp=8):
        self.model = step_model("h100", tp)
        self.heap = []
        self.first, self.done, self.admitted = {}, {}, {}
        self.state = state or (lambda now: (HEALTHY, 1.0, 1.0))
        self.eng = NodeEngine(
            self.model, settings or NodeSettings(step_jitter_cv=0.0), speed,
            push=lambda t, ver: heapq.heappush(self.heap, (t, ver)),
            on_first_token=lambda att, t: self.first.__setitem__(att, t),
            on_finish=lambda att, t: self.done.__setitem__(att, t),
            state=lambda now: self.state(now), jitter=lambda: 1.0,
            on_admit=lambda att, t: self.admitted.__setitem__(att, t))

    def run(self, until=1e9, arrivals=()):
        arrivals = sorted(arrivals)  # (t, att, prompt, completion)
        i = 0
        while True:
            t_ev = self.heap[0][0] if self.heap else np.inf
            t_arr = arrivals[i][0] if i < len(arrivals) else np.inf
            if min(t_ev, t_arr) > until:
                return
            if t_arr <= t_ev:
                t, att, p, c = arrivals[i]
                i += 1
                self.eng.submit(att, p, c, t)
            else:
                t, ver = heapq.heappop(self.heap)
                self.eng.phase_end(t, ver)


def test_step_model_reproduces_splitwise_measurements():
    """tp=2 (Splitwise's setting): decode iterations within 15 %, prefill up to 8192 tokens within 30 %."""
    m = step_model("h100", 2, 32768)
    for prompt, batch, prompt_ms, token_ms in splitwise_points():
        decode = m.step_ms(batch, batch, batch * (prompt + 64), 0.0)
        assert decode == pytest.approx(token_ms, rel=0.15), (prompt, batch)
        if prompt * batch <= 8192:
            prefill = m.step_ms(prompt * batch, 0, 0.0, batch * prompt * prompt / 2.0)
            assert prefill == pytest.approx(prompt_ms, rel=0.30), (prompt, batch)


def test_faults_act_on_their_resource():
    m = step_model("h100", 8)
    decode = (24, 24, 24 * 1200.0, 0.0)
    prefill = (4096, 0, 0.0, 4096 * 2048.0)

    def ratio(args, res):
        return m.step_ms(*args, res) / m.step_ms(*args)

    # SM clock: prefill (compute-bound) slows almost fully, a small decode batch much less.
    assert ratio(prefill, Resources(sm=3.0)) > 2.2  # (the collectives and fixed cost do not slow)
    assert 1.0 < ratio(decode, Resources(sm=3.0)) < 1.8
    # HBM: the reverse.
    assert ratio(decode, Resources(hbm=2.0)) > 1.4
    assert ratio(prefill, Resources(hbm=2.0)) < 1.05
    # Interconnect: only the collective share of the step (tp=8).
    net = ratio(decode, Resources(net=2.0))
    comm_share = m.parts(*decode)[3] / m.step_ms(*decode)
    assert net == pytest.approx(1.0 + comm_share, rel=1e-9) and 0.2 < comm_share < 0.5
    # The prefill path only: decode untouched.
    assert ratio(decode, Resources(prefill=5.0)) == pytest.approx(1.0)
    assert ratio(prefill, Resources(prefill=5.0)) > 3.5
    assert step_model("h100", 1).parts(*decode)[3] == 0.0  # no collectives without tensor parallelism


def test_one_request_prefills_in_one_step_then_decodes_one_token_per_step():
    h = Harness()
    h.run(arrivals=[(0.0, 1, 1000, 5)])
    m = h.model
    pre = m.step_ms(1000, 0, 0.0, 1000 * 500.0) / 1000
    assert h.first[1] == pytest.approx(pre)
    # four more tokens, each one decode step at the growing context
    dec = sum(m.step_ms(1, 1, 1001 + i, 0.0) for i in range(4)) / 1000
    assert h.done[1] == pytest.approx(pre + dec, rel=1e-3)
    c = h.eng.m
    assert c.itl.total == 4 and c.prefill.total == 1 and c.queue.sum == 0.0 and c.prompt.sum == 1000
    assert c.prompt_tokens == 1000 and c.generation_tokens == 5
    assert h.eng.kv_used == pytest.approx(0.0)


def test_streams_of_a_node_share_one_step_and_a_long_prefill_stalls_them_all():
    h = Harness()
    h.eng.keep_observations = True
    arrivals = [(0.0, i, 200, 400) for i in range(8)] + [(2.0, 100, 30000, 10)]
    h.run(until=1.9, arrivals=arrivals[:8])
    h.eng.progress_to(1.9)
    per_token = h.eng.m.itl.sum / h.eng.m.itl.total
    assert per_token == pytest.approx(h.model.step_ms(8, 8, 8 * 350.0, 0.0) / 1000, rel=0.05)
    h.run(arrivals=arrivals[8:])
    c = h.eng.m
    # 30000 prompt tokens at 8192 per step minus the decodes: 4 chunks, during which every stream's
    # token takes the long step (the old engine gave each request its own, unaffected rate).
    steps = [s for kind, s in h.eng.observations if kind == "itl"]
    assert max(steps) > 10 * per_token
    assert max(steps) == pytest.approx(h.model.step_ms(8192, 8, 8 * 420.0, 8184 * (8184 * 2.5)) / 1000, rel=0.2)
    assert h.first[100] - 2.0 > 3 * max(steps)
    assert set(h.done) == {*range(8), 100}
    # every token counted once: the first from the prefill, the rest as inter-token samples
    assert c.itl.total + len(h.done) == 8 * 400 + 10


def test_max_num_seqs_queues_and_ttft_includes_the_queue():
    h = Harness(NodeSettings(max_num_seqs=2, step_jitter_cv=0.0))
    h.run(arrivals=[(0.0, i, 100, 50) for i in range(5)])
    assert set(h.done) == set(range(5))
    assert h.eng.m.queue.total == 5 and h.eng.m.queue.sum > 0
    # requests 2..4 wait for slots: admitted only after earlier ones finish
    assert h.admitted[2] >= min(h.done[0], h.done[1]) - 1e-12
    assert h.first[4] > h.done[0]


def test_kv_capacity_preempts_the_last_sequence_and_recomputes_it():
    # 6 sequences of 300 + 600 tokens cannot all hold their cache in 3000 tokens
    h = Harness(NodeSettings(kv_capacity_tokens=3000, step_jitter_cv=0.0))
    h.run(arrivals=[(0.0, i, 300, 600) for i in range(6)])
    c = h.eng.m
    assert c.preemptions > 0
    assert set(h.done) == set(range(6))
    assert c.itl.total + 6 == 6 * 600  # recompute regenerates no token twice
    assert c.prompt_tokens > 6 * 300  # ...but recomputes prompts (vLLM counts prompt tokens as computed)
    assert h.eng.kv_used == pytest.approx(0.0) and not h.eng.running
    # without the limit: no preemption, and sooner
    h2 = Harness()
    h2.run(arrivals=[(0.0, i, 300, 600) for i in range(6)])
    assert h2.eng.m.preemptions == 0 and max(h2.done.values()) < max(h.done.values())


def test_abort_frees_the_slot():
    h = Harness(NodeSettings(max_num_seqs=1, step_jitter_cv=0.0))
    h.run(until=0.5, arrivals=[(0.0, 1, 100, 5000), (0.1, 2, 100, 5)])
    assert 2 not in h.admitted
    h.eng.abort(1, 0.5)
    h.run(arrivals=[])
    assert 1 not in h.done and 2 in h.done and h.done[2] < 1.0


def test_node_wide_stall_stops_every_stream_at_once():
    h = Harness()
    h.run(until=1.0, arrivals=[(0.0, i, 100, 1000) for i in range(4)])
    h.eng.progress_to(1.0)
    before, n_before = h.eng.m.itl.sum, h.eng.m.itl.total
    slow_before = sum(h.eng.m.itl.counts[8:])  # inter-token times above 0.3 s
    h.eng.stall(0.4, 1.0)
    h.run(until=1.6, arrivals=[])
    h.eng.progress_to(1.6)
    step = h.model.step_ms(4, 4, 4 * 300.0, 0.0) / 1000
    # all four streams produced nothing for 0.4 s: about (0.6 - 0.4)/step tokens each...
    assert (h.eng.m.itl.total - n_before) / 4 == pytest.approx(0.2 / step, abs=3)
    # ...and the first token after the gap carries it, in every stream at once (vLLM's inter-token
    # latency is the time since the stream's previous token)
    assert sum(h.eng.m.itl.counts[8:]) - slow_before == 4
    assert h.eng.m.itl.sum - before == pytest.approx(4 * 0.6, abs=4 * step)  # each stream: 0.6 s of gaps


def test_simulation_on_the_step_engine_is_deterministic_and_reports_engine_counters():
    d = tiny_vllm(duration_s=30)
    d["workload"][0]["rate_rps"] = 10
    a, b = simulate(d), simulate(d)
    assert json.dumps(a.attempts()["end"].tolist()) == json.dumps(b.attempts()["end"].tolist())
    engines = [e for e in a.eng if e is not None]
    assert len(engines) == 2
    att = a.attempts()
    done = att["gw_status"] == 200
    assert sum(e.m.e2e.total for e in engines) == done.sum()
    # TTFT covers queue + prefill: at least one prefill step of the prompt
    pre = step_model("h100", 8).step_ms(1000, 0, 0, 1000 * 500.0) / 1000
    assert ((att["ttft"] - att["t"])[done] >= pre * 0.9).all()  # (step jitter: 2 %)


@pytest.mark.parametrize("path", sorted(__import__("glob").glob("scenarios/*.json")))
def test_every_scenario_file_runs_on_the_step_engine(path):
    from sim.engine import Precomputed, Simulation
    from sim.policies import policy_factory
    from sim.workload import build_requests

    scn = load_scenario(path)
    scn = scn.with_duration(min(scn.duration_s, 20.0))
    sim = Simulation(scn, Precomputed.build(scn, build_requests(scn)), policy_factory("round_robin")).run()
    a = sim.attempts()
    assert (a["gw_status"] == 200).mean() > 0.9


def fault_run(fault, rate=12, duration=40, **engine):
    d = tiny_vllm(duration_s=duration, faults=[{"group": "g", "node": 0, "start_s": 10, **fault}])
    d["workload"][0]["rate_rps"] = rate
    if engine:
        d["groups"][0]["engine"] = engine
    return simulate(d)


def node_stats(sim, node, t0, t1):
    a = sim.attempts()
    m = (a["node"] == node) & (a["gw_status"] == 200) & (a["start"] >= t0) & (a["start"] < t1)
    c = np.asarray(sim.r_comp)[a["req"][m]]
    ttft = np.median((a["ttft"] - a["start"])[m])
    tpot = np.median((a["end"] - a["ttft"])[m] / np.maximum(c - 1, 1))
    return ttft, tpot


def test_prefill_only_fault_slows_ttft_not_the_token_rate():
    sim = fault_run({"kind": "resource", "prefill_slowdown": 5.0}, rate=4)
    ttft0, tpot0 = node_stats(sim, 1, 12, 40)
    ttft, tpot = node_stats(sim, 0, 12, 40)
    assert ttft > 3.0 * ttft0
    # decode steps without a prefill chunk are untouched; those with one are slower for every stream of
    # the node (one batch), so the token rate suffers too, but less than the first token
    assert 1.0 < tpot / tpot0 < ttft / ttft0


def test_hbm_fault_slows_the_token_rate():
    sim = fault_run({"kind": "resource", "hbm_slowdown": 2.0})
    _, tpot0 = node_stats(sim, 1, 12, 40)
    _, tpot = node_stats(sim, 0, 12, 40)
    assert 1.3 < tpot / tpot0 < 2.1


def test_kv_loss_preempts_and_the_node_keeps_serving():
    sim = fault_run({"kind": "kv_loss", "fraction": 0.95}, rate=20, kv_cache_tokens=200_000)
    e0, e1 = sim.eng[0], sim.eng[1]
    assert e0.m.preemptions > 0 and e1.m.preemptions == 0
    a = sim.attempts()
    assert ((a["node"] == 0) & (a["gw_status"] == 200) & (a["start"] > 12)).sum() > 10


def test_periodic_stall_stops_every_stream_of_the_node_together():
    from sim.engine import Precomputed, Simulation
    from sim.scenario import parse_scenario
    from sim.workload import build_requests

    doc = tiny_vllm(duration_s=30, faults=[{"group": "g", "node": 0, "kind": "periodic_stall", "start_s": 10,
                                            "period_s": 2.0, "stall_ms": 400}])
    doc["workload"][0]["rate_rps"] = 12
    scn = parse_scenario(doc)
    holder = {}

    def factory(ctx):
        from test_sim_engine import StreamRecorder

        holder["p"] = StreamRecorder(ctx)
        return holder["p"]

    Simulation(scn, Precomputed.build(scn, build_requests(scn)), factory).run()
    rows = holder["p"].rows  # (now, tokens per node, inter-token ms per node) every 200 ms
    tok0 = np.asarray([r[1][0] for r in rows])
    tok1 = np.asarray([r[1][1] for r in rows])
    t = np.asarray([r[0] for r in rows])
    # In the 200 ms ticks that lie inside a stall (ticks start at a random phase), node 0 emits far
    # fewer tokens than node 1
    phase = (t - 10.0) % 2.0
    after = (phase >= 0.25) & (phase <= 0.4) & (t > 10) & (t < 29)
    assert after.sum() >= 8
    assert tok0[after].sum() < 0.2 * tok1[after].sum()
    # and a stall is not slow decoding: outside the stalls a token takes about as long on both nodes
    calm = (phase >= 1.0) & (phase <= 1.8) & (t > 10)
    ms0 = sum(r[2][0] for r, c in zip(rows, calm, strict=True) if c) / tok0[calm].sum()
    ms1 = sum(r[2][1] for r, c in zip(rows, calm, strict=True) if c) / tok1[calm].sum()
    assert ms0 == pytest.approx(ms1, rel=0.3)


def test_the_scraped_page_parses_to_the_counters_of_the_full_page_at_every_scrape():
    """The simulator scrapes the lines the control plane's parser reads (``scrape_page``); at every
    scrape of a run with queueing, preemptions and a fault, the full page parses to the same counters."""
    from detector.engine_metrics import parse
    from sim.engine import Policy, Precomputed, Simulation
    from sim.scenario import parse_scenario
    from sim.vllm import scrape_page
    from sim.workload import build_requests

    doc = tiny_vllm(duration_s=20, faults=[{"group": "g", "node": 0, "kind": "kv_loss", "start_s": 5,
                                            "fraction": 0.97}])
    doc["workload"][0]["rate_rps"] = 20
    doc["groups"][0]["engine"] = {"kv_cache_tokens": 200_000, "max_num_seqs": 8}
    scn = parse_scenario(doc)
    seen = []

    class Check(Policy):
        wants_records = wants_progress = reads_metrics = True
        tick_s = 0.2

        def pick(self, now):
            return int(now * 5) % 2

        def on_scrape(self, now, scrapes):
            for local, counters in scrapes:
                eng = self.ctx.sim.eng[local]
                assert counters == parse(eng.m.render()) == parse(scrape_page(eng.m))
                seen.append((counters.preemptions, counters.waiting, counters.itl_count))

    Simulation(scn, Precomputed.build(scn, build_requests(scn)), Check).run()
    assert len(seen) > 150
    assert max(s[0] for s in seen) > 0 and max(s[1] for s in seen) > 0 and seen[-1][2] > 1000


def _tokens_per_s(state, batch: int) -> float:
    """Output tokens/s of one node decoding ``batch`` equal requests together (equal load)."""
    h = Harness(state=state)
    h.run(arrivals=[(0.0, i, 1000, 300) for i in range(batch)])
    return h.eng.m.itl.total / (max(h.done.values()) - max(h.first.values()))


@pytest.mark.parametrize("batch", [4, 32, 128])
def test_thermal_throttle_cuts_output_tokens_per_s_at_equal_load_as_the_seed_reports(batch):
    # Seed 000's drill: "inference throughput down 65 %" -> slowdown 1 / 0.35, at any decode load.
    doc = tiny_vllm(faults=[{"group": "g", "node": 0, "kind": "thermal_throttle", "slowdown": 1 / 0.35,
                             "start_s": 0}])
    scn = parse_scenario(doc)
    sim = Simulation(scn, Precomputed.build(scn, build_requests(scn)), policy_factory("round_robin"))
    throttled = sim.node_state(0, 1.0)
    assert throttled[0].sm == throttled[0].hbm == throttled[0].net > 1 / 0.35
    assert sim.node_state(1, 1.0)[0] is HEALTHY
    drop = 1 - _tokens_per_s(lambda now: throttled, batch) / _tokens_per_s(None, batch)
    assert drop == pytest.approx(0.65, abs=0.005)


def test_sm_throttle_slows_the_clock_only_so_decode_slows_far_less_than_the_clock():
    doc = tiny_vllm(faults=[{"group": "g", "node": 0, "kind": "sm_throttle", "slowdown": 2.86, "start_s": 0}])
    scn = parse_scenario(doc)
    sim = Simulation(scn, Precomputed.build(scn, build_requests(scn)), policy_factory("round_robin"))
    res = sim.node_state(0, 1.0)[0]
    assert (res.sm, res.hbm, res.net) == (2.86, 1.0, 1.0)
    ratio = _tokens_per_s(None, 32) / _tokens_per_s(lambda now: (res, 1.0, 1.0), 32)
    assert 1.2 < ratio < 1.6  # the memory-bound decode step: the old "thermal" of the step engine


def _throttled(end_s: float) -> Simulation:
    d = tiny_vllm(duration_s=50, faults=[{"group": "g", "node": 0, "kind": "thermal_throttle", "slowdown": 3,
                                          "start_s": 10, "end_s": end_s}])
    d["workload"][0]["rate_rps"] = 12
    scn = parse_scenario(d)
    return Simulation(scn, Precomputed.build(scn, build_requests(scn)), policy_factory("round_robin"))


def test_a_fault_ended_while_the_simulation_runs_is_the_fault_scheduled_to_end_then():
    """The demo's heal after N failed probes (``Simulation.end_fault``): every attempt of a run whose
    throttle is ended at 25 s from 20 s on is the same as in the run that scheduled its end at 25 s."""
    scheduled = _throttled(25.0).run().attempts()
    live = _throttled(40.0).begin().advance(20.0)
    with pytest.raises(ValueError, match="simulation is at"):
        live.end_fault(0, 19.0)  # the past is simulated already
    assert live.end_fault(0, 25.0)
    assert not live.end_fault(0, 30.0)  # over by then
    ended = live.advance(math.inf).attempts()
    assert all(np.array_equal(scheduled[k], ended[k], equal_nan=True) for k in scheduled)
    assert (scheduled["end"] > 30).any()  # the run goes on after the heal
