"""The drill's load generator (Poisson arrivals, open loop, timeouts counted) against a real loopback
server, and its figures (onset -> cut / quarantine, false cuts, shares) from transition rows."""

from __future__ import annotations

import itertools
import time

import pytest

from bench.drill.load import PoissonLoad, arrivals
from bench.drill.report import is_cut, is_quarantine, summarise
from harness.gateways import FakeInferenceServer


def test_arrivals_are_a_poisson_process_of_the_rate_and_bounded():
    offsets = arrivals(2.0, 2000.0, seed=7)
    assert 3800 <= len(offsets) <= 4200  # 4000 expected, sd ~63
    gaps = [b - a for a, b in itertools.pairwise(offsets)]
    mean = sum(gaps) / len(gaps)
    assert 0.47 <= mean <= 0.53
    # Exponential gaps: the standard deviation equals the mean (a fixed-rate clock would have ~0).
    sd = (sum((g - mean) ** 2 for g in gaps) / len(gaps)) ** 0.5
    assert 0.85 * mean <= sd <= 1.15 * mean
    assert arrivals(2.0, 2000.0, seed=7) == offsets  # seeded
    for rate, dur in ((0, 10), (1000, 10), (1, 0), (1, 99999)):
        with pytest.raises(ValueError):
            arrivals(rate, dur, seed=1)


def test_open_loop_load_records_every_request_and_counts_timeouts():
    fast = FakeInferenceServer("fast", base_delay_s=0.01)
    slow = FakeInferenceServer("slow", base_delay_s=3.0)
    try:
        load = PoissonLoad(f"http://{fast.address}", rate=20.0, duration_s=1.0, seed=2, timeout_s=5.0,
                           header="X-Served-By")
        t0 = time.monotonic()
        reqs = load.run()
        assert time.monotonic() - t0 < 30  # a hang guard: one second of load against a fast server
        assert len(reqs) == len(load.offsets) >= 10
        assert {r.outcome for r in reqs} == {"ok"} and {r.served_by for r in reqs} == {"fast"}
        assert all(8 <= r.prompt_words <= 120 and 16 <= r.max_tokens <= 40 for r in reqs)
        # Open loop: sends stay on the schedule while a slow server holds every answer.
        slow_load = PoissonLoad(f"http://{slow.address}", rate=10.0, duration_s=0.6, seed=3, timeout_s=1.0)
        reqs = slow_load.run()
        assert len(reqs) >= 2
        sent = [r.sent_at - slow_load.started_at for r in reqs]
        assert all(abs(s - o) < 0.2 for s, o in zip(sent, slow_load.offsets, strict=True))
        assert {r.outcome for r in reqs} == {"timeout"} and all(r.latency_s == 1.0 for r in reqs)
    finally:
        fast.stop()
        slow.stop()
    with pytest.raises(ValueError):
        PoissonLoad("http://example.invalid:80", rate=1, duration_s=1)  # loopback only


def test_states_that_cut_and_quarantine():
    assert is_cut("degraded") and is_cut("pending_approval") and is_cut("quarantined") and is_cut("probing")
    assert not is_cut("healthy") and not is_cut("warming") and not is_cut("recovering")
    assert is_quarantine("quarantined") and is_quarantine("probing") and not is_quarantine("degraded")


def test_summary_of_a_run():
    onset, end = 1000.0, 1100.0
    a, b, bad = "127.0.0.1:1", "127.0.0.1:2", "127.0.0.1:3"

    def req(t: float, node: str, lat: float, outcome: str = "ok") -> dict:
        return {"sent_at": t, "served_by": node if outcome == "ok" else None, "latency_s": lat, "outcome": outcome}

    requests = [req(990 + i, n, 1.0) for i, n in enumerate([a, b, bad] * 3)]  # before: a third each
    requests += [req(1001 + i, bad if i < 4 else (a if i % 2 else b), 20.0 if i < 4 else 1.0) for i in range(20)]
    requests += [req(1050, None, 60.0, "timeout")]

    def tr(t: float, node: str, frm: str, to: str) -> dict:
        return {"at": t, "address": node, "from": frm, "to": to, "reason": "r"}

    transitions = [tr(950, a, "warming", "healthy"), tr(1004.2, bad, "healthy", "degraded"),
                   tr(1012, bad, "degraded", "quarantined"), tr(1030, b, "healthy", "degraded"),
                   tr(1040, b, "degraded", "healthy")]
    changes = [{"seen_at": 990, "nodes": {a: [100, "healthy"], b: [100, "healthy"], bad: [100, "healthy"]}},
               {"seen_at": 1004.7, "nodes": {a: [100, "healthy"], b: [100, "healthy"], bad: [40, "degraded"]}}]
    f = summarise(requests=requests, transitions=transitions, weights_changes=changes, onset=onset, end=end,
                  faulty=bad, addresses=[a, b, bad])
    assert f["onset_to_first_cut_s"] == 4.2 and f["first_cut_state"] == "degraded"
    assert f["first_cut_published_s"] == 4.7
    assert f["onset_to_quarantine_s"] == 12.0
    # Its first request after the onset was sent at +1 s (none was in flight on it at the onset).
    assert f["faulty_busy_from_s"] == 1.0 and f["busy_to_first_cut_s"] == 3.2
    assert f["false_cuts"] == 1 and f["false_quarantines"] == 0
    assert f["faulty_share_before"] == pytest.approx(1 / 3, abs=0.001)
    assert f["faulty_share_after"] == 0.2  # 4 of the 20 answered
    assert f["faulty_share_after_cut"] == 0.0  # sent from +4.2 s on: none to it
    after = f["latency_after_onset"]
    assert after["n"] == 21 and after["timeouts"] == 1 and after["max_s"] == 60.0 and after["p50_s"] == 1.0
    assert f["states_at_onset"] == {a: "healthy", b: "healthy", bad: "healthy"}


def test_a_node_busy_at_the_onset_is_busy_from_zero_and_an_idle_one_from_its_next_request():
    from bench.drill.report import faulty_busy_from

    bad = "127.0.0.1:3"
    in_flight = [{"sent_at": 998.0, "served_by": bad, "latency_s": 5.0, "outcome": "ok"}]
    assert faulty_busy_from(in_flight, bad, 1000.0) == 0.0
    ended = [{"sent_at": 990.0, "served_by": bad, "latency_s": 2.0, "outcome": "ok"},
             {"sent_at": 1003.5, "served_by": bad, "latency_s": 9.0, "outcome": "ok"}]
    assert faulty_busy_from(ended, bad, 1000.0) == 3.5
    assert faulty_busy_from(ended[:1], bad, 1000.0) is None


def test_harmed_requests_are_those_slower_than_three_times_the_runs_healthy_median_or_failed():
    from bench.drill.report import harmed

    before = [{"latency_s": v, "outcome": "ok"} for v in (1.0, 2.0, 3.0)]  # median 2 s: the line is 6 s
    after = [{"latency_s": v, "outcome": "ok"} for v in (1.0, 5.9, 6.1, 30.0)]
    after += [{"latency_s": 60.0, "outcome": "timeout"}, {"latency_s": 0.1, "outcome": "error"}]
    h = harmed(before, after)
    assert h == {"harmed": 4, "harmed_fraction": round(4 / 6, 4), "harm_line_s": 6.0}
    assert harmed([], after)["harmed"] is None  # no healthy median, no line


def test_token_share_and_busy_come_from_every_servers_own_counters():
    from bench.drill.report import fleet_busy, last_tokens_s, token_share

    def sample(at: float, s0: float, s1: float, cpu: float = 0.0) -> dict:
        return {"at": at, "label": "", "s0": {"gen": s0, "prompt": 0.0, "cpu": cpu},
                "s1": {"gen": s1, "prompt": 0.0, "cpu": cpu}}

    samples = [sample(0, 0, 0, 0.0), sample(10, 100, 100, 5.0), sample(15, 110, 150, 6.0), sample(20, 110, 190, 8.0)]
    assert token_share(samples, "s0", 0, 10) == 0.5
    assert token_share(samples, "s0", 10) == round(10 / 100, 4)  # after 10: s0 +10, s1 +90
    assert last_tokens_s(samples, "s0", 10) == 5.0  # its counter last moved between +0 and +5 s
    assert last_tokens_s(samples, "s1", 10) == 10.0
    assert fleet_busy(samples, 0, 20, cores=2) == round((8.0 * 2) / 20 / 2, 3)
    # A server that did not answer a sample: no share rather than a wrong one.
    samples[-1]["s1"] = None
    assert token_share(samples, "s0", 10) is None
    assert token_share(samples[:1], "s0", 0) is None


def test_the_clients_token_share_leaves_out_the_control_planes_canary_probes():
    from bench.drill.report import client_token_share

    samples = [{"at": 0, "label": "", "s0": {"gen": 0.0}, "s1": {"gen": 0.0}},
               {"at": 10, "label": "", "s0": {"gen": 40.0}, "s1": {"gen": 100.0}}]
    names = {"s0": "127.0.0.1:1", "s1": "127.0.0.1:2"}
    probes = [{"at": 5, "address": "127.0.0.1:1", "completion_tokens": 30},
              {"at": 5, "address": "127.0.0.1:2", "completion_tokens": 10},
              {"at": 50, "address": "127.0.0.1:1", "completion_tokens": 99}]  # after the last sample: not in it
    assert client_token_share(samples, "s0", 0, probes, names) == 0.1  # (40 - 30) / (10 + 90)
    assert client_token_share(samples, "s0", 0, [], names) == round(40 / 140, 4)


def test_max_weight_after_cut_is_the_largest_share_of_its_weight_between_cut_and_quarantine():
    from bench.drill.report import max_weight_after_cut

    a = "127.0.0.1:18944"
    docs = [{"seen_at": t, "nodes": {a: [w, st], "127.0.0.1:18940": [100, "healthy"]}}
            for t, w, st in [(0.0, 100, "healthy"), (65.0, 5, "degraded"), (70.0, 87, "degraded"),
                             (80.0, 100, "healthy"), (90.0, 0, "quarantined"), (95.0, 100, "recovering")]]
    assert max_weight_after_cut(docs, a, 64.0, 90.0) == 1.0  # flapped back to full weight at +80
    assert max_weight_after_cut(docs, a, 64.0, 75.0) == 0.87
    assert max_weight_after_cut(docs, a, None, None) is None  # never cut
