"""Fast mode: false-alarm rates from many simulated node-hours of *healthy* nodes on the step engine.

Many node-hours cannot go through the event loop (64 nodes run ~80x real time on the engine alone),
so fast mode **replays the step engine** (:mod:`sim.vllm`) instead of modelling it again:

1. **Calibration** (:meth:`EngineReplay.recording`, once per load level, lazily): a run of the real
   engine — a healthy group of ``cal_nodes`` nodes (h100, tp 8, vLLM's defaults, round robin as the
   gateway's weighted round robin is at equal weights) serving ``cycles`` passes over the Azure LLM
   2023 conversation trace at ``level * rate_per_node`` requests/s per node (a whole pass: slices of
   the trace differ by up to 2.6x in mean completion length, so a short run would calibrate one slice)
   — records every node's state per tick of ``tick_s``: the progress row of its ``/metrics``
   (rendered, parsed by the control plane's parser and turned into a row by
   :func:`detector.engine_metrics.progress_row`: tokens, inter-token ms, prefills, queue-free prefill
   ms and tokens, running batch, prefill work, KV usage) and the access-log lines of the requests that
   completed during that tick. The first ``warm_s`` (the engine filling up) are left out. Load levels
   are multiples of :data:`LEVEL_STEP` of ``rate_per_node``, all on the same requests in the same order.
2. **Replay** (:meth:`EngineReplay.draw`, a block bootstrap): the group advances one *phase* through
   the recordings (the fraction of the requests served; at a higher level it advances faster), so all
   nodes see the same stretch of the trace at the same time, as peers behind one gateway do; node
   ``i`` replays calibration node ``c_i`` at ``phase + d_i`` (``d_i`` within one block), both drawn
   again every ``block_s``; a load-level change goes on at the same phase of the new level's
   recording. Whatever the engine does within a block — batch-dependent per-token times, chunked
   prefill sharing every step, one step time for all streams, KV fill, the correlation of consecutive
   ticks — is in the samples as the engine produced it.
3. **Fleet on top**: the group's load ``load(t)`` (a diurnal-like sinusoid, period 1 h, ±40 %, and a
   random step every 10 minutes; nearest level), and per node a speed factor — the per-VM offsets of
   the Azure VM-noise data (across VMs) times a slow drift (a random walk whose 1-hour sd is the
   within-VM sd of that data) — that multiplies every time of the node's samples (inter-token and
   prefill ms, TTFT, total; a timed-out request stays at the timeout). Recordings are made at speed
   1: scaling their times is first order (a 5 % slower node would also hold a slightly larger batch).

The replay matches the engine by construction up to sampling error;
``tests/sim/test_sim_engine.py`` checks it against an independent engine run (another seed):
per tick, the mean and the spread (sd) across ticks of ms per token, tokens, running batch, KV usage,
queue-free prefill ms, completed requests per node and their latency within :data:`MATCH_TOLERANCE`
(10 % on means, 20 % on sds; measured: within 6 %), the lag-1 autocorrelation of a node's ms per
token within 0.1 — and that a replay of the level 20 % busier fails the same check.

Detectors fed: ``default`` (a :class:`detector.GroupDetector` fed the records and, with ``streams``,
the rows; a quarantined node is probed with one of the samples of its level and may recover, as in
production) and ``seed_zscore`` (seed 000 as written, vectorised: a quarantined node is counted and
then returned to service, as an operator would after finding nothing). The result counts degrades
and quarantines (false by construction) per 1,000 node-hours, as entries (a node going from full
weight and in service to cut or out) with their 95 % Garwood intervals; for ``default`` also per node
(``nodes_cut``: cut at least once) and the capacity the cuts took: ``below_base_node_s`` (node-seconds
under base weight) and ``weight_s_taken`` (the weight lost, integrated: seconds of one node's share),
each per 1,000 node-hours.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from detector.engine_metrics import ROW_FIELDS
from sim import seed
from sim.default_policy import EPOCH
from sim.engine import GroupContext, Policy
from sim.traces import healthy_vm_offsets, vm_noise_spread

LEVEL_STEP = 0.1  # load levels calibrated: multiples of this of rate_per_node
MAX_LEVEL = 2.0
#: A progress row without its node, time and interval (:data:`detector.engine_metrics.ROW_FIELDS`).
ROW_COLUMNS = ROW_FIELDS[3:]
RECORD_COLUMNS = ("prompt", "completion", "ttft_ms", "total_ms", "status")
TIMED = (ROW_COLUMNS.index("token_ms"), ROW_COLUMNS.index("prefill_ms"))  # row columns scaled by speed
# Replay against an independent engine run: |mean_fast / mean_engine - 1| and |sd_fast / sd_engine - 1|
# per statistic (tests/sim/test_sim_engine.py).
MATCH_TOLERANCE = {"mean": 0.10, "sd": 0.20}


class SeedZScoreVec:
    """Seed 000's evaluation on arrays (:mod:`sim.seed`; the rules of :class:`sim.policies.SeedZScore`
    without its safeguard and canary: a quarantined node is put back at once, fresh)."""

    def __init__(self, n: int, alpha: float = seed.ALPHA) -> None:
        self.alpha = alpha
        self.ema = np.zeros(n)
        self.samples = np.zeros(n, dtype=np.int64)
        self.slow = np.zeros(n, dtype=np.int64)
        self.quarantined = np.zeros(n, dtype=bool)
        self.degraded = np.zeros(n, dtype=bool)
        self.quarantines = 0
        self.degrades = 0

    def ingest(self, node: np.ndarray, prompt: np.ndarray, completion: np.ndarray, total: np.ndarray) -> None:
        x = seed.t_norm(prompt, completion, total)
        order = np.argsort(node, kind="stable")
        node, x = node[order], x[order]
        # rank of each sample within its node, then apply EMA step by step over ranks (vectorised per rank)
        starts = np.searchsorted(node, node, side="left")
        rank = np.arange(len(node)) - starts
        for r in range(int(rank.max()) + 1 if len(rank) else 0):
            m = rank == r
            nd, xv = node[m], x[m]
            first = self.samples[nd] == 0
            self.ema[nd] = np.where(first, xv, self.alpha * xv + (1 - self.alpha) * self.ema[nd])
            self.samples[nd] += 1

    def evaluate(self) -> None:
        pb = seed.zscores(self.ema, self.samples, self.quarantined)
        if pb.peers < seed.MIN_NODES:
            return
        z = pb.z
        judged = (self.samples > 5) & ~self.quarantined
        with np.errstate(invalid="ignore"):
            hi = judged & (z >= seed.QUARANTINE_Z)
            mid = judged & (z >= seed.DEGRADE_Z) & (z < seed.QUARANTINE_Z)
            low = judged & (z < seed.DEGRADE_Z)
        self.slow[hi] += 1
        newq = hi & (self.slow >= seed.SLOW_EVALUATIONS)
        self.quarantines += int(newq.sum())
        # As an operator would: the quarantined node is checked, found healthy and put back (fresh EMA).
        self.slow[newq] = 0
        self.samples[newq] = 0
        self.degrades += int((mid & ~self.degraded).sum())
        self.degraded = (self.degraded | mid) & ~low & ~newq
        self.slow[low] = 0


# -- calibration: the step engine, recorded per node and tick ------------------------------------------
@dataclass(frozen=True)
class Recording:
    """One load level of the step engine: ``rows[c, k]`` the progress row (:data:`ROW_COLUMNS`, NaN
    where the row had no value or no row was made) of calibration node ``c`` at tick ``k``; the
    records (:data:`RECORD_COLUMNS`) completed in that tick are ``records[offsets[c*T+k]:offsets[c*T+k+1]]``."""

    rate_per_node: float
    tick_s: float
    rows: np.ndarray  # (nodes, T, len(ROW_COLUMNS))
    offsets: np.ndarray  # (nodes * T + 1,)
    records: np.ndarray  # (n, len(RECORD_COLUMNS))
    cpu_s: float

    @property
    def ticks(self) -> int:
        return self.rows.shape[1]


class _Recorder(Policy):
    """Round robin over the calibration group; keeps each tick's rows and completed records."""

    name = "fast_calibration"
    wants_records = True
    wants_progress = True
    reads_metrics = True

    def __init__(self, ctx: GroupContext) -> None:
        super().__init__(ctx)
        self.tick_s = ctx.sim.scn.tick_s
        self.i = -1
        self.prev: dict[int, tuple[float, Any]] = {}
        self.rows = np.full((ctx.n, len(ROW_COLUMNS)), np.nan)
        self.recs: list[tuple[int, float, float, float, float, float]] = []
        self.ticks: list[tuple[float, np.ndarray, list[tuple[int, float, float, float, float, float]]]] = []

    def pick(self, now: float) -> int:
        self.i = (self.i + 1) % self.ctx.n
        return self.i

    def on_record(self, node: int, now: float, prompt: int, completion: int, ttft_ms: float,
                  total_ms: float, status: int) -> None:
        self.recs.append((node, prompt, completion, ttft_ms, total_ms, status))

    def on_scrape(self, now: float, scrapes: list[tuple[int, Any]]) -> None:
        from detector.engine_metrics import progress_row

        for local, counters in scrapes:
            row = progress_row(self.ctx.node_ids[local], self.prev.get(local), now, counters)
            self.prev[local] = (now, counters)
            if row is not None:
                self.rows[local] = [math.nan if v is None else float(v) for v in row[3:]]

    def on_tick(self, now: float) -> None:
        self.ticks.append((now, self.rows, self.recs))
        self.rows = np.full((self.ctx.n, len(ROW_COLUMNS)), np.nan)
        self.recs = []


TRACE = "azure_llm_2023_conv"


def calibration_scenario(rate_per_node: float, nodes: int, duration_s: float, tick_s: float, seed: int) -> Any:
    """The healthy group a level is calibrated on (a scenario document, ``scenarios/SCHEMA.md``)."""
    from sim.scenario import parse_scenario

    doc = {
        "name": f"fast-calibration-{rate_per_node:g}rps", "seed": seed, "duration_s": duration_s, "tick_s": tick_s,
        # prefill/decode_ms_per_token and max_concurrency belong to the per-request model; the step
        # engine (the default ``engine``) takes its times from the measured profiles.
        "groups": [{"name": "fast", "nodes": nodes, "prefill_ms_per_token": 0.12, "decode_ms_per_token": 14.0,
                    "max_concurrency": 24, "node_speed_spread": 0.0}],
        "workload": [{"group": "fast", "rate_rps": rate_per_node * nodes, "trace": TRACE,
                      "prompt_tokens": {"median": 1000, "sigma": 1.0, "max": 16000},
                      "completion_tokens": {"median": 180, "sigma": 0.9, "max": 2000}}],
        "client": {"timeout_s": 30, "retries": 0},
    }
    return parse_scenario(doc, source="sim.fastmode")


def record_engine(rate_per_node: float, tick_s: float, *, nodes: int = 16, seconds: float = 600.0,
                  warm_s: float = 60.0, seed: int = 1) -> Recording:
    """Run the step engine on :func:`calibration_scenario` and keep the ticks after ``warm_s``."""
    from sim.engine import Precomputed, Simulation
    from sim.workload import build_requests

    c0 = time.process_time()
    scn = calibration_scenario(rate_per_node, nodes, warm_s + seconds, tick_s, seed)
    pre = Precomputed.build(scn, build_requests(scn))
    recorders: list[_Recorder] = []

    def factory(ctx: GroupContext) -> Policy:
        recorders.append(_Recorder(ctx))
        return recorders[-1]

    Simulation(scn, pre, factory).run()
    ticks = [(t, rows, recs) for t, rows, recs in recorders[0].ticks if warm_s <= t <= warm_s + seconds]
    if not ticks:
        raise ValueError(f"calibration of {seconds:g} s at tick {tick_s:g} s recorded no tick")
    T = len(ticks)
    rows = np.stack([r for _, r, _ in ticks], axis=1)  # (nodes, T, columns)
    per: list[list[list[tuple[float, ...]]]] = [[[] for _ in range(T)] for _ in range(nodes)]
    for k, (_, _, recs) in enumerate(ticks):
        for node, *values in recs:
            per[node][k].append(tuple(values))
    flat = [rec for node_ticks in per for tick_recs in node_ticks for rec in tick_recs]
    counts = [len(tick_recs) for node_ticks in per for tick_recs in node_ticks]
    offsets = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
    records = np.asarray(flat, dtype=np.float64).reshape(-1, len(RECORD_COLUMNS))
    return Recording(rate_per_node=rate_per_node, tick_s=tick_s, rows=rows, offsets=offsets, records=records,
                     cpu_s=time.process_time() - c0)


# -- replay -------------------------------------------------------------------------------------------
@dataclass
class TickSample:
    """One tick of a fast group: ``rows`` (nodes x :data:`ROW_COLUMNS`) and the completed records
    (``node`` index and :data:`RECORD_COLUMNS` columns)."""

    rows: np.ndarray
    node: np.ndarray
    records: np.ndarray


class EngineReplay:
    """Per-tick samples of a healthy group drawn from recordings of the step engine (module docstring).

    Levels are calibrated on first use (``level_index * LEVEL_STEP * rate_per_node`` requests/s per
    node), all on the same requests (``cycles`` passes over the trace, in the same order): a level's
    recording lasts ``cycles * len(trace) / (rate * cal_nodes)`` seconds. The group replays them at
    one *phase* (the fraction of those requests served so far: a busier level advances it faster), so
    every node sees the same stretch of the trace at the same time, as peers behind one gateway do;
    node ``i`` replays calibration node ``c_i`` at ``phase + d_i`` (``d_i`` within one block), both
    drawn again every ``block_s``. ``recordings`` may be handed in (tests, reuse across runs)."""

    def __init__(self, rate_per_node: float = 3.0, tick_s: float = 1.0, *, seed: int = 1, cal_nodes: int = 16,
                 cycles: float = 2.0, warm_s: float = 60.0, block_s: float = 300.0,
                 progress: Callable[[str], None] | None = None,
                 recordings: dict[int, Recording] | None = None) -> None:
        self.rate_per_node, self.tick_s, self.seed = rate_per_node, tick_s, seed
        self.cal_nodes, self.cycles, self.warm_s = cal_nodes, cycles, warm_s
        self.block = max(1, round(block_s / tick_s))
        self.progress = progress
        self.recordings: dict[int, Recording] = dict(recordings or {})
        self.phase = 0.0
        self.c = self.left = np.zeros(0, dtype=np.int64)
        self.d = np.zeros(0)

    @staticmethod
    def level_index(load: float) -> int:
        """The calibrated level nearest to ``load`` (a multiple of :data:`LEVEL_STEP`, at least one step)."""
        return int(min(max(round(load / LEVEL_STEP), 1), round(MAX_LEVEL / LEVEL_STEP)))

    def recording(self, level: int) -> Recording:
        rec = self.recordings.get(level)
        if rec is None:
            from sim.traces import load_trace

            rate = level * LEVEL_STEP * self.rate_per_node
            seconds = self.cycles * len(load_trace(TRACE)[1]) / (rate * self.cal_nodes)
            if self.progress is not None:
                self.progress(f"fast mode: calibrating the step engine at {rate:.2f} req/s per node "
                              f"({self.cal_nodes} nodes, {seconds:.0f} s)")
            rec = record_engine(rate, self.tick_s, nodes=self.cal_nodes, seconds=seconds, warm_s=self.warm_s,
                                seed=self.seed)
            self.recordings[level] = rec
        return rec

    def start(self, nodes: int, rng: np.random.Generator) -> None:
        """Fresh replay state: a random phase; each node's first tick starts a new block."""
        self.phase = float(rng.random())
        self.c = np.zeros(nodes, dtype=np.int64)
        self.d = np.zeros(nodes)
        self.left = np.zeros(nodes, dtype=np.int64)

    def draw(self, rng: np.random.Generator, load: float, speed: np.ndarray | None = None) -> TickSample:
        """The next tick of every node at group load ``load`` (times multiplied by ``speed`` per node)."""
        rec = self.recording(self.level_index(load))
        n = len(self.c)
        T = rec.ticks
        new = self.left <= 0
        k = int(new.sum())
        if k:
            self.c[new] = rng.integers(rec.rows.shape[0], size=k)
            self.d[new] = rng.random(k) * min(self.block, T) / T
            self.left[new] = self.block
        pos = (((self.phase + self.d) % 1.0) * T).astype(np.int64)
        rows = rec.rows[self.c, pos].copy()
        flat = self.c * T + pos
        lo, hi = rec.offsets[flat], rec.offsets[flat + 1]
        counts = hi - lo
        node = np.repeat(np.arange(n), counts)
        idx = np.arange(int(counts.sum())) + np.repeat(lo - np.cumsum(counts) + counts, counts)
        records = rec.records[idx].copy()
        self.phase = (self.phase + 1.0 / T) % 1.0
        self.left -= 1
        if speed is not None:
            for col in TIMED:
                rows[:, col] *= speed
            f = speed[node]
            ok = records[:, 4] != 0  # a client timeout is logged at the timeout, whatever the node's speed
            records[:, 2] *= f
            records[:, 3] = np.where(ok, records[:, 3] * f, records[:, 3])
        return TickSample(rows=rows, node=node, records=records)


# -- the fast run -------------------------------------------------------------------------------------
class _Fleet:
    """The group's load and its nodes' speeds over time (module docstring, step 3): a sinusoid of
    period 1 h (±40 %) plus a random step every 10 minutes, and per node an Azure per-VM offset
    times a slowly drifting factor."""

    def __init__(self, nodes: int, tick_s: float, rng: np.random.Generator) -> None:
        self.tick_s = tick_s
        self.base_speed = np.exp(rng.choice(healthy_vm_offsets(), nodes))
        self.drift = np.zeros(nodes)
        # A random walk whose sd over one hour is the within-VM sd of the VM-noise data.
        self.drift_step = vm_noise_spread()["within"] * math.sqrt(tick_s / 3600.0)
        self.step = 0.0

    def advance(self, k: int, rng: np.random.Generator) -> tuple[float, float, np.ndarray]:
        """Tick ``k``'s time, group load (at least 0.2) and per-node speed factors."""
        t = k * self.tick_s
        if k % max(1, int(600 / self.tick_s)) == 0:
            self.step = rng.normal(0, 0.1)
        load = max(0.2, 1.0 + 0.4 * math.sin(2 * math.pi * t / 3600.0) + self.step)
        self.drift += self.drift_step * rng.standard_normal(len(self.drift))
        self.drift *= 0.999  # weak mean reversion: a VM's long-run offset is bounded
        return t, load, self.base_speed * np.exp(self.drift)


class _DefaultTally:
    """The ``default`` policy on the replay: a :class:`detector.group.GroupDetector` fed each tick's
    access-log records (and, with ``streams``, progress rows), its canary probes answered from the
    level's samples, and what it did to the (healthy) nodes: entries into a cut or out of service,
    the nodes ever cut or out, and the capacity taken (node-seconds under base weight, weight-seconds
    lost)."""

    def __init__(self, nodes: int, thresholds: dict[str, Any] | None) -> None:
        from detector.group import GroupDetector
        from detector.states import OUT_OF_SERVICE
        from detector.thresholds import Thresholds

        th = Thresholds.from_dict(thresholds) if thresholds else Thresholds()
        self.ids = np.asarray([f"n{i}" for i in range(nodes)], dtype=object)
        self.gd = GroupDetector(thresholds=th, nodes=list(self.ids), now=EPOCH)
        self.out_states = list({int(s) for s in OUT_OF_SERVICE})  # the traffic table's DRAIN states
        self.prev_out = np.zeros(nodes, dtype=bool)
        self.prev_cut = np.zeros(nodes, dtype=bool)
        self.ever_cut = np.zeros(nodes, dtype=bool)
        self.ever_out = np.zeros(nodes, dtype=bool)
        self.below_s = self.taken_s = 0.0
        self.quarantines = self.degrades = 0
        self.rows_fed = 0

    def ingest(self, tick: TickSample, now: float, tick_s: float, streams: bool) -> None:
        """Feed one tick: its completed requests as samples, and with ``streams`` the rows of the
        nodes that streamed tokens."""
        from detector.samples import ProgressBatch, SampleBatch

        ids, rec = self.ids, tick.records
        n = len(rec)
        if n:
            ok = rec[:, 4] == 200
            self.gd.ingest(SampleBatch.from_columns(
                node=ids[tick.node], ts=np.full(n, now), prompt_tokens=rec[:, 0], completion_tokens=rec[:, 1],
                ttft_ms=np.where(ok, rec[:, 2], np.nan), total_ms=rec[:, 3], status=rec[:, 4].astype(np.int64)))
        if streams:
            r = tick.rows
            has = r[:, 0] > 0  # as the default policy: a row that streamed no token is not fed
            m = int(has.sum())
            if m:
                self.rows_fed += m
                r = r[has]
                self.gd.ingest_progress(ProgressBatch.from_columns(
                    node=ids[has], ts=np.full(m, now), interval_s=np.full(m, tick_s),
                    **{name: r[:, k] for k, name in enumerate(ROW_COLUMNS)}))

    def evaluate(self, now: float, tick_s: float, replay: EngineReplay, load: float, speed: np.ndarray,
                 rng: np.random.Generator) -> None:
        """Evaluate, count the tick's entries and their cost until the next tick, and answer the
        canary probes due (one of the level's completed requests, :func:`_probe_pool`, at the node's
        speed)."""
        ev = self.gd.evaluate(now)
        out = np.isin(ev.states, self.out_states)
        cut = (ev.weights < 0.999 * ev.base_weights) & ~out
        # Entries (a node going from full weight to cut, or from in service to out), and what they
        # cost until the next tick: the seconds under base weight and the weight taken.
        self.quarantines += int((out & ~self.prev_out).sum())
        self.degrades += int(((cut | out) & ~(self.prev_cut | self.prev_out)).sum())
        self.ever_cut |= cut | out
        self.ever_out |= out
        below = cut | out
        self.below_s += tick_s * int(below.sum())
        frac = np.where(out, 0.0, np.clip(ev.weights / np.maximum(ev.base_weights, 1e-9), 0.0, 1.0))
        self.taken_s += tick_s * float((1.0 - frac)[below].sum())
        self.prev_out, self.prev_cut = out, cut
        if ev.probes_due:
            probe = _probe_pool(replay, load)
            for nid in ev.probes_due:
                i = int(nid[1:])
                pp, cc, ttft, tot = probe[rng.integers(len(probe))]
                f = float(speed[i])
                self.gd.record_probe(nid, now, pp, cc, ttft * f, tot * f, True)

    def per_node(self, node_hours: float) -> dict[str, Any]:
        """Per node (an SRE's count: a node cut at least once), and the capacity the cuts took."""
        below_s, taken_s = self.below_s, self.taken_s
        return {"nodes_cut": int(self.ever_cut.sum()), "nodes_quarantined": int(self.ever_out.sum()),
                "below_base_node_s": round(below_s, 1), "weight_s_taken": round(taken_s, 1),
                "below_base_node_s_per_1000h": round(1000 * below_s / node_hours, 2),
                "weight_s_taken_per_1000h": round(1000 * taken_s / node_hours, 2),
                "below_base_fraction": round(below_s / (node_hours * 3600.0), 8)}


def _false_alarm_rates(q: int, d: int, node_hours: float) -> dict[str, Any]:
    """A policy's (false) quarantines ``q`` and degrades ``d`` over ``node_hours``: counts, rates per
    1,000 node-hours and their 95 % Garwood intervals."""
    from sim.intervals import rate_per_1000h

    return {"false_quarantines": q, "false_degrades": d,
            "false_quarantines_per_1000h": round(1000 * q / node_hours, 4),
            "false_degrades_per_1000h": round(1000 * d / node_hours, 4),
            "per_1000_node_hours": round(1000 * q / node_hours, 4),
            "false_cuts": rate_per_1000h(d, node_hours),
            "false_quarantine_events": rate_per_1000h(q, node_hours)}


def _engine_summary(replay: EngineReplay, tick_s: float) -> dict[str, Any]:
    """How the replay was calibrated: its load levels, calibration nodes, trace passes and seconds
    per level, block length and the calibration's CPU seconds."""
    recs = replay.recordings.values()
    return {"method": "block bootstrap of step-engine recordings per load level (sim.fastmode)",
            "levels_req_per_s_per_node": sorted(round(r.rate_per_node, 3) for r in recs),
            "calibration_nodes": replay.cal_nodes, "trace_cycles": replay.cycles,
            "calibration_s": {f"{r.rate_per_node:.3g}": round(r.ticks * tick_s) for r in recs},
            "block_s": replay.block * tick_s, "calibration_cpu_s": round(sum(r.cpu_s for r in recs), 1)}


def _default_cycles(nodes: int, rate_per_node: float, hours: float) -> float:
    """Passes over the trace per calibrated level: 2, or fewer for a run that serves fewer requests
    than two passes hold (at least 0.1)."""
    from sim.traces import load_trace

    run_requests = nodes * rate_per_node * hours * 3600.0
    return float(min(2.0, max(0.1, 2.0 * run_requests / len(load_trace(TRACE)[1]))))


def run_fast(nodes: int = 64, hours: float = 1.0, rate_per_node: float = 3.0, tick_s: float = 1.0,
             seed: int = 1, policies: tuple[str, ...] = ("default", "seed_zscore"),
             progress: Callable[[str], None] | None = None, thresholds: dict[str, Any] | None = None,
             streams: bool = True, cal_nodes: int = 16, cycles: float | None = None, block_s: float = 300.0,
             replay: EngineReplay | None = None) -> dict[str, Any]:
    """Simulate ``hours`` of a healthy group of ``nodes`` on the replayed step engine and count (false)
    degrades and quarantines per policy (calibration: :class:`EngineReplay`). ``cycles`` (passes over
    the trace per calibrated level) defaults to 2, or less for a run that serves fewer requests
    (a run of a minute needs no hour of calibration)."""
    rng = np.random.default_rng(seed)
    if cycles is None:
        cycles = _default_cycles(nodes, rate_per_node, hours)
    if replay is None:
        replay = EngineReplay(rate_per_node, tick_s, seed=seed, cal_nodes=cal_nodes, cycles=cycles, block_s=block_s,
                              progress=progress)
    replay.start(nodes, rng)
    fleet = _Fleet(nodes, tick_s, rng)
    default = _DefaultTally(nodes, thresholds) if "default" in policies else None
    seed_vec = SeedZScoreVec(nodes) if "seed_zscore" in policies else None
    n_ticks = int(hours * 3600 / tick_s)
    samples = 0
    t_wall = time.perf_counter()
    c_wall = time.process_time()
    for k in range(n_ticks):
        t, load, speed = fleet.advance(k, rng)
        tick = replay.draw(rng, load, speed)
        rec = tick.records
        samples += len(rec)
        if default is not None:
            now = EPOCH + t + tick_s
            default.ingest(tick, now, tick_s, streams)
            default.evaluate(now, tick_s, replay, load, speed, rng)
        if seed_vec is not None and len(rec):
            seed_vec.ingest(tick.node, rec[:, 0], rec[:, 1], rec[:, 3])
            seed_vec.evaluate()
        if progress is not None and k % max(1, n_ticks // 20) == 0:
            progress(f"fast mode: {t / 3600:.1f}/{hours:.1f} h, {time.perf_counter() - t_wall:.0f} s wall")
    node_hours = nodes * hours
    result: dict[str, Any] = {
        "nodes": nodes, "hours": hours, "node_hours": node_hours, "tick_s": tick_s, "rate_per_node": rate_per_node,
        "samples": samples, "progress_rows": default.rows_fed if default is not None else 0,
        "wall_s": round(time.perf_counter() - t_wall, 1), "cpu_s": round(time.process_time() - c_wall, 1),
        "engine": _engine_summary(replay, tick_s), "policies": {}}
    if default is not None:
        result["policies"]["default"] = {**_false_alarm_rates(default.quarantines, default.degrades, node_hours),
                                         **default.per_node(node_hours)}
    if seed_vec is not None:
        result["policies"]["seed_zscore"] = _false_alarm_rates(seed_vec.quarantines, seed_vec.degrades, node_hours)
    return result


def _probe_pool(replay: EngineReplay, load: float) -> np.ndarray:
    """``(prompt, completion, ttft_ms, total_ms)`` of the completed requests of the level at ``load``:
    a canary probe of a healthy node is one more of them."""
    rec = replay.recording(replay.level_index(load)).records
    ok = rec[rec[:, 4] == 200]
    return ok[:, :4] if len(ok) else np.asarray([[256.0, 32.0, 100.0, 1000.0]])
