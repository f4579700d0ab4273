"""Fast mode: false-alarm rates from many simulated node-hours of *healthy* per-request samples.

No event loop: each tick every node gets ``Poisson(rate * tick_s * load(t))`` requests whose latency is
drawn from the healthy cost model::

    total = (prefill_ms * N_prompt + decode_ms * g(b) * N_completion) * speed_node(t) * noise

- ``speed_node(t)``: heterogeneous hardware, the per-VM offsets of the Azure VM-noise data (across
  VMs) times a slow per-node drift (a random walk whose 1-hour sd is the within-VM sd of that data).
- ``g(b)``: the Splitwise decode-vs-batch curve at the node's current batch ``b ≈ load(t) * b_mean``,
  and a queueing term ``1 + q * max(0, load(t) - 1)``: load swings move every node together.
- ``load(t)``: a diurnal-like sinusoid (period 1 h, ±40 %) with a random step every 10 minutes.
- tokens: resampled (prompt, completion) pairs of the Azure conv trace.
- streamed progress (``streams=True``, as a streaming gateway): per node and tick,
  ``Poisson(b_mean * load(t))`` requests decoding, each at ``decode_ms * g(b) * speed * noise`` per
  token with its own noise, as a :class:`detector.ProgressBatch` row.

Detectors fed: ``default`` (a :class:`detector.GroupDetector`; a quarantined node is probed with a
healthy sample and may recover, as in production) and ``seed_zscore`` (seed 000 as written, vectorised:
a quarantined node is counted and then returned to service, as an operator would after finding nothing).
The result counts quarantines (false by construction) per 1,000 node-hours.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from detector.sim.default_policy import EPOCH
from detector.sim.traces import healthy_vm_offsets, load_trace, splitwise_decode_curve, vm_noise_spread


class SeedZScoreVec:
    """Seed 000's evaluation on arrays (same rules as :class:`detector.sim.policies.SeedZScore`)."""

    def __init__(self, n: int, alpha: float = 0.15, w: float = 0.25) -> None:
        self.alpha, self.w = alpha, w
        self.ema = np.zeros(n)
        self.samples = np.zeros(n, dtype=np.int64)
        self.slow = np.zeros(n, dtype=np.int64)
        self.quarantined = np.zeros(n, dtype=bool)
        self.degraded = np.zeros(n, dtype=bool)
        self.quarantines = 0
        self.degrades = 0

    def ingest(self, node: np.ndarray, prompt: np.ndarray, completion: np.ndarray, total: np.ndarray) -> None:
        x = total / (prompt * self.w + completion)
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
        ok = ~self.quarantined & (self.samples > 5)
        if ok.sum() < 3:
            return
        v = self.ema[ok]
        mean, std = v.mean(), v.std()
        z = (self.ema - mean) / (std + 1e-6)
        judged = (self.samples > 5) & ~self.quarantined
        hi = judged & (z >= 3.5)
        self.slow[hi] += 1
        newq = hi & (self.slow >= 3)
        self.quarantines += int(newq.sum())
        # As an operator would: the quarantined node is checked, found healthy and put back (fresh EMA).
        self.slow[newq] = 0
        self.samples[newq] = 0
        mid = judged & (z >= 2.0) & (z < 3.5)
        self.degrades += int((mid & ~self.degraded).sum())
        self.degraded = (self.degraded | mid) & ~(judged & (z < 2.0)) & ~newq
        self.slow[judged & (z < 2.0)] = 0


def _progress_rows(rng: np.random.Generator, ids: np.ndarray, now: float, tick_s: float, batch: float,
                   cx: np.ndarray, cy: np.ndarray, node_ms: np.ndarray, sig: float) -> Any:
    """One tick of streamed progress: per node ``Poisson(batch)`` streams, each with its own noise, at
    the node's per-token cost times the decode curve at that node's batch."""
    from detector import ProgressBatch

    k = rng.poisson(batch, len(ids))
    node = np.repeat(np.arange(len(ids)), k)
    ms = node_ms[node] * np.interp(k[node], cx, cy) * np.exp(sig * rng.standard_normal(len(node)) - sig**2 / 2)
    tokens = np.bincount(node, weights=tick_s * 1000.0 / ms, minlength=len(ids))
    has = k > 0
    return ProgressBatch.from_columns(node=ids[has], ts=np.full(int(has.sum()), now), interval_s=np.full(int(has.sum()), tick_s),
                                      tokens=tokens[has], token_ms=(k * tick_s * 1000.0)[has])


def run_fast(nodes: int = 64, hours: float = 1.0, rate_per_node: float = 3.0, tick_s: float = 1.0,
             seed: int = 1, policies: tuple[str, ...] = ("default", "seed_zscore"),
             prefill_ms: float = 0.12, decode_ms: float = 14.0, mean_batch: float = 16.0,
             jitter_cv: float = 0.08, progress: Callable[[str], None] | None = None,
             thresholds: dict[str, Any] | None = None, streams: bool = True) -> dict[str, Any]:
    """Simulate ``hours`` of a healthy group of ``nodes`` and count (false) quarantines per policy."""
    rng = np.random.default_rng(seed)
    _, tp, tc = load_trace("azure_llm_2023_conv")
    across = healthy_vm_offsets()
    within_sd = vm_noise_spread()["within"]
    base_speed = np.exp(rng.choice(across, nodes))
    drift = np.zeros(nodes)
    drift_step = within_sd * math.sqrt(tick_s / 3600.0)
    curve = splitwise_decode_curve()
    cx = np.asarray([c[0] for c in curve])
    cy = np.asarray([c[1] for c in curve])
    sig = math.sqrt(math.log1p(jitter_cv**2))
    ids = np.asarray([f"n{i}" for i in range(nodes)], dtype=object)
    gd = None
    if "default" in policies:
        from detector import GroupDetector, Thresholds
        from detector.states import OUT_OF_SERVICE

        th = Thresholds.from_dict(thresholds) if thresholds else Thresholds()
        gd = GroupDetector(thresholds=th, nodes=list(ids), now=EPOCH)
        out_states = {int(s) for s in OUT_OF_SERVICE}  # the traffic table's DRAIN states
        prev_out = np.zeros(nodes, dtype=bool)
        prev_cut = np.zeros(nodes, dtype=bool)
    seed_vec = SeedZScoreVec(nodes) if "seed_zscore" in policies else None
    default_q = default_deg = 0
    n_ticks = int(hours * 3600 / tick_s)
    step = 0.0
    samples = 0
    t_wall = time.perf_counter()
    for k in range(n_ticks):
        t = k * tick_s
        if k % max(1, int(600 / tick_s)) == 0:
            step = rng.normal(0, 0.1)
        load = max(0.2, 1.0 + 0.4 * math.sin(2 * math.pi * t / 3600.0) + step)
        drift += drift_step * rng.standard_normal(nodes)
        drift *= 0.999  # weak mean reversion: a VM's long-run offset is bounded
        counts = rng.poisson(rate_per_node * tick_s * load, nodes)
        n = int(counts.sum())
        if n == 0:
            continue
        samples += n
        node = np.repeat(np.arange(nodes), counts)
        j = rng.integers(len(tp), size=n)
        p, c = tp[j].astype(np.float64), tc[j].astype(np.float64)
        g = float(np.interp(mean_batch * load, cx, cy))
        queue = 1.0 + 0.5 * max(0.0, load - 1.0)
        speed = (base_speed * np.exp(drift))[node]
        noise = np.exp(sig * rng.standard_normal(n) - sig**2 / 2)
        pre = prefill_ms * p * speed * noise * queue
        dec = decode_ms * g * c * speed * noise
        total = pre + dec
        ttft = pre + dec / c
        now = EPOCH + t + tick_s
        if gd is not None:
            from detector import SampleBatch

            gd.ingest(SampleBatch.from_columns(node=ids[node], ts=np.full(n, now), prompt_tokens=p,
                                               completion_tokens=c, ttft_ms=ttft, total_ms=total,
                                               status=np.full(n, 200)))
            if streams:
                gd.ingest_progress(_progress_rows(rng, ids, now, tick_s, mean_batch * load, cx, cy,
                                                  decode_ms * (base_speed * np.exp(drift)), sig))
            ev = gd.evaluate(now)
            out = np.isin(ev.states, list(out_states))
            cut = (ev.weights < 0.999 * ev.base_weights) & ~out
            default_q += int((out & ~prev_out).sum())
            default_deg += int((cut & ~prev_cut).sum())
            prev_out, prev_cut = out, cut
            for nid in ev.probes_due:
                i = int(nid[1:])
                pp, cc = 256.0, 32.0
                tot = (prefill_ms * pp + decode_ms * g * cc) * float(base_speed[i] * np.exp(drift[i]))
                gd.record_probe(nid, now, pp, cc, prefill_ms * pp, tot, True)
        if seed_vec is not None:
            seed_vec.ingest(node, p, c, total)
            seed_vec.evaluate()
        if progress is not None and k % max(1, n_ticks // 20) == 0:
            progress(f"fast mode: {t / 3600:.1f}/{hours:.1f} h, {time.perf_counter() - t_wall:.0f} s wall")
    node_hours = nodes * hours
    result: dict[str, Any] = {"nodes": nodes, "hours": hours, "node_hours": node_hours, "tick_s": tick_s,
                              "rate_per_node": rate_per_node, "samples": samples,
                              "wall_s": round(time.perf_counter() - t_wall, 1), "policies": {}}
    if gd is not None:
        result["policies"]["default"] = {"false_quarantines": default_q, "false_degrades": default_deg,
                                         "per_1000_node_hours": round(1000 * default_q / node_hours, 4)}
    if seed_vec is not None:
        result["policies"]["seed_zscore"] = {"false_quarantines": seed_vec.quarantines,
                                             "false_degrades": seed_vec.degrades,
                                             "per_1000_node_hours": round(1000 * seed_vec.quarantines / node_hours, 4)}
    return result
