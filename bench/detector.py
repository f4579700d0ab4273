"""Detector benchmark: prints a table and writes JSON. Not a test: figures, not assertions.

    python -m bench.detector --out bench.json [--quick]

Measures, on synthetic traffic with known costs:

- ``tick_ms``: one :meth:`GroupDetector.evaluate` (baseline + Z + detectors + state machine for every
  node) at 100 / 1,000 / 10,000 nodes, median over repeated ticks (the 30 s tail-window pass and the
  cost-model refit are timed separately: they do not run on every tick);
- ``updates_per_s``: samples applied per second by :meth:`GroupDetector.ingest` (validation, three
  signals, EW statistics, windows, error counters) in batches of 100,000 over 1,000 nodes;
- ``speedup_vs_loop_10000``: a full tick (ingest one tick's samples + evaluate) against a
  straightforward per-node Python loop of seed 000's algorithm on the same samples, at 10,000 nodes;
- ``speedup_vs_same_work_loop_10000``: the same tick against the core of *our* algorithm (three
  signals, evidence CUSUM, median/MAD baseline, materiality, persistence, degrade weight) as a per-node Python
  loop: the gain from vectorising rather than from doing less;
- ``bytes_per_node``: the serialised state (``to_bytes``) divided by the number of nodes.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import time
from pathlib import Path

import numpy as np

from detector.group import GroupDetector
from detector.samples import SampleBatch
from detector.thresholds import Thresholds


def synthetic_batch(rng: np.random.Generator, nodes: list[str], k: int, t0: float, dt: float) -> SampleBatch:
    """``k`` requests with Azure-conv-like token counts on a 0.12 / 14 ms-per-token fleet."""
    n = len(nodes)
    idx = rng.integers(0, n, k)
    p = np.minimum(rng.lognormal(np.log(1000), 1.0, k), 16000).round()
    c = np.maximum(np.minimum(rng.lognormal(np.log(180), 0.9, k), 2000).round(), 1)
    f = rng.lognormal(0, 0.08, k)
    ttft = (0.12 * p + 20) * f
    return SampleBatch.from_columns(
        node=np.asarray(nodes, dtype=object)[idx], ts=t0 + np.sort(rng.uniform(0, dt, k)),
        prompt_tokens=p, completion_tokens=c, ttft_ms=ttft, total_ms=ttft + 14.0 * c * f,
        status=np.full(k, 200),
    )


class SeedLoopNode:
    """Seed 000's ``InferenceNode``, transcribed: a per-node object updated one sample at a time."""

    __slots__ = ("base", "ema", "samples", "slow_count", "state", "weight")

    def __init__(self) -> None:
        self.ema, self.samples, self.state, self.base, self.weight, self.slow_count = 0.0, 0, 0, 100, 100, 0

    def record(self, latency: float) -> None:
        self.ema = latency if self.samples == 0 else 0.15 * latency + 0.85 * self.ema
        self.samples += 1


def seed_loop_tick(nodes: dict[str, SeedLoopNode], batch: SampleBatch) -> None:
    """Seed 000's RecordLatency per sample, then evaluateClusterHealth, as plain Python."""
    for node, total, p, c in zip(batch.node, batch.total_ms, batch.prompt_tokens, batch.completion_tokens, strict=True):
        nodes[node].record(total / (p * 0.25 + c))
    seed_loop_evaluate(nodes)


def seed_loop_evaluate(nodes: dict[str, SeedLoopNode]) -> None:
    """Seed 000's evaluateClusterHealth: population mean/std, then a Python loop over every node."""
    active = [n.ema for n in nodes.values() if n.state != 2 and n.samples > 5]
    if len(active) < 3:
        return
    mean = sum(active) / len(active)
    std = math.sqrt(sum((v - mean) ** 2 for v in active) / len(active))
    for n in nodes.values():
        if n.samples <= 5 or n.state == 2:
            continue
        z = (n.ema - mean) / (std + 1e-6)
        if z >= 3.5:
            n.slow_count += 1
            if n.slow_count >= 3:
                n.state, n.weight, n.slow_count = 2, 0, 0
        elif z >= 2.0:
            n.state, n.weight = 1, max(int(n.base * 2 ** -(z - 2.0)), 1)
        else:
            n.slow_count = 0
            if n.state == 1:
                n.state, n.weight = 0, n.base


class LoopNode:
    """Our per-node statistics as a plain object: EMA and EW variance of three signals."""

    __slots__ = ("count", "evidence", "mean", "over_q", "sq", "state", "weight")

    def __init__(self) -> None:
        self.mean, self.sq, self.count = [0.0, 0.0, 0.0], [0.0, 0.0, 0.0], [0, 0, 0]
        self.state, self.over_q, self.weight, self.evidence = 1, 0, 100.0, 0.0

    def record(self, values: tuple[float, float, float], alpha: float = 0.15) -> None:
        for s, x in enumerate(values):
            if x != x:  # NaN: signal unknown for this request
                continue
            if self.count[s] == 0:
                self.mean[s], self.sq[s] = x, x * x
            else:
                self.mean[s] = alpha * x + (1 - alpha) * self.mean[s]
                self.sq[s] = alpha * x * x + (1 - alpha) * self.sq[s]
            self.count[s] += 1


def same_work_loop_tick(nodes: dict[str, LoopNode], batch: SampleBatch, coef: np.ndarray,
                        decode_base: float = 14.0) -> None:
    """The core of our tick written the straightforward way, node by node in Python: three signals per
    sample and the decode evidence CUSUM, then per signal the median/MAD peer baseline, Z with the
    relative floor, materiality, the 10-sample persistence and the degrade weight (no tail/error
    detectors, no explanations)."""
    a, b, c = (float(v) for v in coef)
    line, sigma, k, cap = math.log(1.15), 0.08, 0.5, 8.0 / 3 + 0.5
    for node, p, comp, ttft, total in zip(
        batch.node, batch.prompt_tokens, batch.completion_tokens, batch.ttft_ms, batch.total_ms, strict=True
    ):
        decode = (total - ttft) / max(comp - 1, 1) if comp >= 2 else math.nan
        n = nodes[node]
        n.record((total / (a * p + b * comp + c), ttft / max(p, 1), decode))
        if decode > 0:
            x = (math.log(decode / decode_base) - line) / sigma
            n.evidence = max(0.0, n.evidence + min(max(x, -cap), cap) - k)
    for s in range(3):
        values = sorted(n.mean[s] for n in nodes.values() if n.count[s] > 5)
        if len(values) < 3:
            continue
        base = statistics.median(values)
        spread = max(1.4826 * statistics.median(abs(v - base) for v in values), 0.05 * base)
        for n in nodes.values():
            if n.count[s] <= 5:
                continue
            z = (n.mean[s] - base) / spread
            excess = n.mean[s] / base
            if z >= 3.5 and excess >= 1.5:
                n.over_q += 1
                if n.over_q >= 10:
                    n.state, n.weight = 3, 0.0
            elif z >= 2.0 and excess >= 1.15 and n.evidence >= 8.0:
                n.state, n.weight = 2, max(100.0 * 2 ** -(z - 2.0), 5.0)
            elif n.state == 2:
                n.state, n.weight, n.over_q = 1, 100.0, 0


def bench_same_work_loop(nodes: list[str], batches: list[SampleBatch], rng: np.random.Generator) -> float:
    loop = {n: LoopNode() for n in nodes}
    coef = np.array([0.12, 14.0, 20.0])
    same_work_loop_tick(loop, synthetic_batch(rng, nodes, len(nodes) * 40, 0.0, 10.0), coef)
    times = []
    for b in batches[:10]:
        t0 = time.perf_counter()
        same_work_loop_tick(loop, b, coef)
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def _primed(n: int, rng: np.random.Generator) -> tuple[GroupDetector, list[str]]:
    nodes = [f"node-{i}" for i in range(n)]
    gd = GroupDetector(Thresholds(), nodes)
    per_node = 40
    gd.ingest(synthetic_batch(rng, nodes, n * per_node, 0.0, 10.0))
    gd.evaluate(10.0)
    return gd, nodes


def bench_tick(n: int, rng: np.random.Generator, repeats: int) -> dict[str, float]:
    gd, nodes = _primed(n, rng)
    tick_samples = max(n // 5, 50)  # ~5 req/s per node at 1 s ticks... per 200 ms tick
    batches = [synthetic_batch(rng, nodes, tick_samples, 10.0 + 0.2 * k, 0.2) for k in range(repeats)]
    eval_ms, full_ms = [], []
    now = 10.0
    for b in batches:
        now += 0.2
        t0 = time.perf_counter()
        gd.ingest(b)
        t1 = time.perf_counter()
        gd.evaluate(now)
        t2 = time.perf_counter()
        eval_ms.append((t2 - t1) * 1e3)
        full_ms.append((t2 - t0) * 1e3)
    # The once-per-window pass (percentiles of every window) and a cost-model refit, timed alone.
    t0 = time.perf_counter()
    gd.window.percentiles((50.0, 99.0))
    tail_ms = (time.perf_counter() - t0) * 1e3
    t0 = time.perf_counter()
    gd.signals.refit()
    refit_ms = (time.perf_counter() - t0) * 1e3
    return {
        "tick_ms": statistics.median(eval_ms),
        "tick_p99_ms": float(np.percentile(eval_ms, 99)),
        "full_tick_ms": statistics.median(full_ms),
        "tail_window_ms": tail_ms,
        "refit_ms": refit_ms,
        "bytes_per_node": len(gd.to_bytes()) / n,
        "tick_samples": tick_samples,
        "batches": batches,
        "nodes": nodes,
    }


def bench_updates(rng: np.random.Generator, total: int) -> float:
    gd, nodes = _primed(1000, rng)
    batches = [synthetic_batch(rng, nodes, 100_000, 10.0 + k, 1.0) for k in range(max(total // 100_000, 1))]
    t0 = time.perf_counter()
    for b in batches:
        gd.ingest(b)
    return sum(len(b) for b in batches) / (time.perf_counter() - t0)


def bench_loop(nodes: list[str], batches: list[SampleBatch], rng: np.random.Generator) -> tuple[float, float]:
    """Median ms of the seed loop's full tick and of its evaluation alone."""
    loop = {n: SeedLoopNode() for n in nodes}
    seed_loop_tick(loop, synthetic_batch(rng, nodes, len(nodes) * 40, 0.0, 10.0))
    full, evaluate = [], []
    for b in batches:
        t0 = time.perf_counter()
        seed_loop_tick(loop, b)
        t1 = time.perf_counter()
        seed_loop_evaluate(loop)
        full.append((t1 - t0) * 1e3)
        evaluate.append((time.perf_counter() - t1) * 1e3)
    return statistics.median(full), statistics.median(evaluate)


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=None, help="write the figures as JSON here")
    ap.add_argument("--quick", action="store_true", help="fewer repetitions (smoke run)")
    args = ap.parse_args(argv)
    rng = np.random.default_rng(42)
    repeats = 10 if args.quick else 40
    results: dict = {"tick_ms": {}, "tick_p99_ms": {}, "full_tick_ms": {}, "tail_window_ms": {}, "refit_ms": {}}
    big = None
    for n in (100, 1000, 10000):
        r = bench_tick(n, rng, repeats)
        for key in ("tick_ms", "tick_p99_ms", "full_tick_ms", "tail_window_ms", "refit_ms"):
            results[key][str(n)] = round(r[key], 3)
        if n == 10000:
            big = r
        results.setdefault("bytes_per_node_by_size", {})[str(n)] = round(r["bytes_per_node"], 1)
    results["bytes_per_node"] = results["bytes_per_node_by_size"]["1000"]
    results["updates_per_s"] = round(bench_updates(rng, 300_000 if args.quick else 1_000_000))
    loop_ms, loop_eval_ms = bench_loop(big["nodes"], big["batches"], rng)
    results["seed_loop_tick_ms_10000"] = round(loop_ms, 3)
    results["seed_loop_evaluate_ms_10000"] = round(loop_eval_ms, 3)
    results["speedup_vs_loop_10000"] = round(loop_ms / results["full_tick_ms"]["10000"], 1)
    results["evaluate_speedup_vs_loop_10000"] = round(loop_eval_ms / results["tick_ms"]["10000"], 1)
    same_ms = bench_same_work_loop(big["nodes"], big["batches"], rng)
    results["same_work_loop_tick_ms_10000"] = round(same_ms, 3)
    results["speedup_vs_same_work_loop_10000"] = round(same_ms / results["full_tick_ms"]["10000"], 1)
    results["note"] = (
        "tick_ms = evaluate() only; full_tick_ms = ingest of one 200 ms tick's samples + evaluate; the "
        "seed loop does the same work per tick (RecordLatency per sample + evaluateClusterHealth)"
    )

    print(f"{'nodes':>8} {'tick ms':>9} {'p99 ms':>8} {'full ms':>9} {'tail-pass ms':>13} {'refit ms':>9} {'B/node':>8}")
    for n in ("100", "1000", "10000"):
        print(
            f"{n:>8} {results['tick_ms'][n]:>9.3f} {results['tick_p99_ms'][n]:>8.3f} {results['full_tick_ms'][n]:>9.3f}"
            f" {results['tail_window_ms'][n]:>13.2f} {results['refit_ms'][n]:>9.2f} {results['bytes_per_node_by_size'][n]:>8.0f}"
        )
    print(f"sample updates/s: {results['updates_per_s']:,}")
    print(
        f"seed per-node loop at 10,000 nodes: {loop_ms:.1f} ms/tick (evaluate alone {loop_eval_ms:.1f} ms) -> "
        f"speedup {results['speedup_vs_loop_10000']}x full tick, {results['evaluate_speedup_vs_loop_10000']}x evaluate"
    )
    print(
        f"our core tick written as a per-node Python loop at 10,000 nodes: {same_ms:.1f} ms/tick -> "
        f"speedup {results['speedup_vs_same_work_loop_10000']}x"
    )
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(results, indent=2) + "\n")
        print(f"wrote {args.out}")
    return results


if __name__ == "__main__":
    main()
