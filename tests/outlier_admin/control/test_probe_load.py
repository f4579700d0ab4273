"""A canary probe carries its healthy peers' load (:mod:`outlier_admin.control.probe_load`), so that a
node out of service, idle, is judged against what its peers do under the same load.

The end-to-end test runs a small fleet on the simulator's vLLM step engine (the demo's A100 group:
8 nodes, 16 req/s of the Azure conversation trace) with the detector deciding: the gateway routes by
its weights, every node's ``/metrics`` is scraped into progress rows each second, due probes are sent
on the node's own engine and judged by ``GroupDetector.record_probe``. Node 2 is faulty from +20 s to
+200 s — every step 5x slower, or the demo's PCIe downgrade (decode 2.5x, prefill 1.5x slower) —; the
detector quarantines it; its probes must fail until the fault heals, then pass. One short request
alone on the idle engine (the canary before) passed the PCIe-degraded node's probes."""

from __future__ import annotations

import math

import numpy as np
import pytest

from detector.engine_metrics import advance, parse
from detector.group import GroupDetector
from detector.samples import ProgressBatch, SampleBatch
from detector.states import NodeState
from detector.thresholds import Thresholds
from outlier_admin.control.probe_load import (
    MAX_CONCURRENCY,
    MAX_PROMPT_TOKENS,
    ProbeLoad,
    load_of,
    median_answer,
    peer_load,
    prompt_of,
)

NODES = [f"a100-{i:02d}" for i in range(8)]
SLOWER_5X = {"kind": "thermal_throttle", "slowdown": 5.0}  # output tokens/s at equal load down to 1/5
PCIE = {"kind": "pcie_downgrade", "decode_slowdown": 2.5, "prefill_slowdown": 1.5}  # the demo's fault


def test_the_load_is_the_median_batch_and_request_of_the_peers_in_service():
    gd = GroupDetector(Thresholds(), NODES)
    rng = np.random.default_rng(3)
    n = 400
    prompt = rng.lognormal(math.log(1000), 0.5, n).round()
    completion = rng.lognormal(math.log(180), 0.4, n).round()
    gd.ingest(SampleBatch.from_columns(
        node=[NODES[i % 8] for i in range(n)], ts=np.linspace(0, 10, n), prompt_tokens=prompt,
        completion_tokens=completion, ttft_ms=0.12 * prompt + 40, total_ms=0.12 * prompt + 40 + 45 * completion,
        status=[200] * n))
    running = [36, 60, 0, 37, 12, 32, 31, 54]  # node 2 idle (out of rotation)
    gd.ingest_progress(ProgressBatch.from_rows([
        [name, 10.0, 1.0, 30.0 * b, 45.0 * 30.0 * b, None, None, None, float(b), None, 0.3]
        for name, b in zip(NODES, running, strict=True)]))
    load = peer_load(gd)
    # The idle node reports 0 and does not count: the median of the seven others' batches.
    assert load.concurrency == 36
    rows = gd.signals.reservoir.rows()
    assert load.prompt_tokens == round(float(np.median(rows["p"]))) and 900 < load.prompt_tokens < 1100
    assert load.completion_tokens == round(float(np.median(rows["c"]))) and 160 < load.completion_tokens < 200
    assert load_of(gd.to_bytes()) == load


def test_without_a_reported_batch_a_probe_is_one_short_request_and_the_bounds_hold():
    gd = GroupDetector(Thresholds(), NODES)
    assert peer_load(gd) == ProbeLoad() and load_of(None) == ProbeLoad() and load_of(b"garbage") == ProbeLoad()
    gd.ingest(SampleBatch.from_columns(node=NODES, ts=[0.0] * 8, prompt_tokens=[20_000] * 8,
                                       completion_tokens=[100] * 8, total_ms=[9000.0] * 8, status=[200] * 8))
    gd.ingest_progress(ProgressBatch.from_rows([[name, 1.0, 1.0, 10.0, 500.0, None, None, None, 500.0, None, None]
                                                for name in NODES]))
    load = peer_load(gd)
    assert load.concurrency == MAX_CONCURRENCY and load.prompt_tokens == MAX_PROMPT_TOKENS


def test_each_request_of_a_probe_has_its_own_prompt_of_the_peers_size():
    base = "Count from one to twenty, separated by commas:"
    prompts = [prompt_of(base, 1000, k, "ab12") for k in range(36)]
    assert len(set(p.split()[1] for p in prompts)) == 36  # no two share a first token after "probe"
    assert all(len(p.split()) == 1000 and p.endswith(base) for p in prompts)
    assert prompt_of(base, None, 0) == base
    answers = [(0, 900.0), (1, 1200.0), (2, 700.0), (3, 5000.0)]
    assert median_answer(answers, lambda a: a[1]) == (1, 1200.0)


class MiniFleet:
    """The offline fleet of the module docstring; ``load`` sizes each probe from the detector."""

    FAULTY, FAULT_S, HEAL_S = 2, 20.0, 200.0

    def __init__(self, load, fault: dict) -> None:
        from sim.engine import Policy, Precomputed, Simulation
        from sim.scenario import parse_scenario
        from sim.workload import build_requests

        wl = {"trace": "azure_llm_2023_conv", "prompt_tokens": {"median": 1000, "sigma": 1.0, "max": 8000},
              "completion_tokens": {"median": 180, "sigma": 0.9, "max": 1000}}
        scn = parse_scenario({
            "name": "probe-load", "seed": 7, "duration_s": 600,
            "groups": [{"name": "a100", "nodes": 8, "prefill_ms_per_token": 0.12, "decode_ms_per_token": 14.0,
                        "max_concurrency": 24, "node_speed_spread": 0.03, "engine": {"hardware": "a100", "tp": 8}}],
            "workload": [{"group": "a100", "rate_rps": 16, **wl}],
            "faults": [{"group": "a100", "node": self.FAULTY, "start_s": self.FAULT_S, "end_s": self.HEAL_S, **fault}],
            "probe": {"prompt_tokens": 10, "completion_tokens": 32},
        }, source="test_probe_load")
        fleet = self
        self.load, self.weights, self.records = load, None, []
        self.rng = np.random.default_rng(11)

        class Gateway(Policy):
            wants_records = True

            def pick(self, now: float) -> int:
                w = fleet.weights
                if w is None or not (w > 0).any():
                    return int(fleet.rng.integers(8))
                return int(fleet.rng.choice(8, p=w / w.sum()))

            def on_record(self, node, now, prompt, completion, ttft_ms, total_ms, status) -> None:
                fleet.records.append((NODES[node], now, prompt, completion, ttft_ms, total_ms, status))

        self.sim = Simulation(scn, Precomputed.build(scn, build_requests(scn)), Gateway).begin()
        self.gd = GroupDetector(Thresholds(), NODES)
        self.scraped: dict[str, tuple] = {}
        self.inflight: dict[str, list] = {}
        self.judged: list[tuple[float, str, bool | None, float]] = []  # (at, node, passed, normalised)
        self.state_after: list[NodeState] = []  # the node's state right after each judged probe

    def scrape(self, now: float) -> list:
        rows = []
        for i, name in enumerate(NODES):
            eng = self.sim.eng[self.sim.offset[0] + i]
            eng.progress_to(now)
            row, keep = advance(name, self.scraped.get(name), now, parse(eng.m.render(model_name="a100")))
            self.scraped[name] = (now, keep)
            if row is not None:
                rows.append(row)
        return rows

    def probe(self, name: str, now: float) -> None:
        load = self.load(self.gd)
        tokens = (load.prompt_tokens or 10, load.completion_tokens or 32)
        answers: list = []
        self.inflight[name] = [load.concurrency, tokens, answers]
        for _ in range(load.concurrency):
            self.sim.send_probe(0, NODES.index(name), now, lambda t, ttft, total, ok: answers.append((total, ok)),
                                tokens=tokens)

    def run(self, until: float) -> None:
        for t in np.arange(1.0, until + 1.0, 1.0):
            self.sim.advance(float(t))
            progress = self.scrape(float(t))
            recs, self.records = self.records, []
            if recs:
                cols = list(zip(*recs, strict=True))
                self.gd.ingest(SampleBatch.from_columns(node=cols[0], ts=cols[1], prompt_tokens=cols[2],
                                                        completion_tokens=cols[3], ttft_ms=cols[4], total_ms=cols[5],
                                                        status=cols[6]))
            if progress:
                self.gd.ingest_progress(ProgressBatch.from_rows(progress))
            for name, (count, tokens, answers) in list(self.inflight.items()):
                if len(answers) < count:
                    continue
                del self.inflight[name]
                ok = all(a[1] for a in answers)
                total = median_answer(answers, lambda a: a[0])[0] if ok else None
                passed = self.gd.record_probe(name, float(t), tokens[0], tokens[1], None, total, ok)
                value = self.gd.probe_value(tokens[0], tokens[1], None, total) if ok else math.nan
                self.judged.append((float(t), name, passed, value))
                self.state_after.append(self.gd.state_of(name))
            ev = self.gd.evaluate(float(t))
            self.weights = np.asarray(ev.weights, dtype=np.float64)
            for name in ev.probes_due:
                if name not in self.inflight:
                    self.probe(name, float(t))


def faulty_probes(fleet: MiniFleet) -> tuple[list, list]:
    """The verdicts on the faulty node's probes while faulty and after it healed."""
    name = NODES[MiniFleet.FAULTY]
    during = [(t, p, v) for t, n, p, v in fleet.judged if n == name and p is not None and t < MiniFleet.HEAL_S]
    after = [(t, p, v) for t, n, p, v in fleet.judged if n == name and p is not None and t >= MiniFleet.HEAL_S]
    return during, after


@pytest.mark.slow
@pytest.mark.parametrize("fault", [SLOWER_5X, PCIE], ids=["5x-per-token", "pcie"])
def test_a_slow_node_fails_its_probes_and_passes_once_recovered(fault):
    fleet = MiniFleet(peer_load, fault)
    fleet.run(MiniFleet.HEAL_S)
    during, _ = faulty_probes(fleet)
    assert len(during) >= 3, fleet.judged  # quarantined early in the fault, probed again once answered
    assert not any(p for _, p, _ in during), during
    assert fleet.gd.state_of(NODES[MiniFleet.FAULTY]) in (NodeState.QUARANTINED, NodeState.PROBING)
    fleet.run(MiniFleet.HEAL_S + 120)
    _, after = faulty_probes(fleet)
    assert [p for _, p, _ in after][:3] == [True, True, True], after  # the recovered node passes
    # ... and its third pass starts its stepwise restore (what follows is the detector's restore).
    third = fleet.judged.index(next(j for j in fleet.judged if j[0] == after[2][0]))
    assert fleet.state_after[third] == NodeState.RECOVERING


@pytest.mark.slow
def test_one_short_probe_on_the_idle_node_passed_while_its_pcie_link_was_degraded():
    """The canary before: one 10+32-token request, alone on the idle engine, beats the loaded peers."""
    fleet = MiniFleet(lambda gd: ProbeLoad(), PCIE)
    fleet.run(MiniFleet.HEAL_S)
    during, _ = faulty_probes(fleet)
    assert during and any(p for _, p, _ in during), during
