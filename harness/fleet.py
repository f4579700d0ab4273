"""Synthetic traffic for detector tests: a group of nodes with known per-token costs."""

from __future__ import annotations

import numpy as np

from detector.samples import ProgressBatch, SampleBatch


class Fleet:
    """N nodes costing ``prefill_ms``/prompt token and ``decode_ms``/output token, times a per-node speed
    factor and log-normal per-request noise; ``slow`` multiplies chosen nodes' latency."""

    def __init__(
        self,
        n: int,
        *,
        seed: int = 0,
        prefill_ms: float = 0.12,
        decode_ms: float = 14.0,
        overhead_ms: float = 20.0,
        speed_spread: float = 0.03,
        jitter: float = 0.08,
        rate: float = 180.0,
    ) -> None:
        self.rng = np.random.default_rng(seed)
        self.n = n
        self.nodes = [f"127.0.0.{i}:8000" for i in range(n)]
        self.prefill_ms, self.decode_ms, self.overhead_ms = prefill_ms, decode_ms, overhead_ms
        self.speed = 1.0 + speed_spread * self.rng.standard_normal(n)
        self.jitter = jitter
        self.rate = rate
        self.slow: dict[int, float] = {}
        self.wait_ms: dict[int, float] = {}  # queueing: added to a node's latency, not scaled by tokens
        self.logs_ttft = True
        self.logs_tokens = True
        self.logs_queue = False
        self.surge = 1.0
        self.prefill_slow: dict[int, float] = {}  # a fault that slows only prefill (decode unchanged)
        self.cache_hit: dict[int, float] = {}  # fraction of a node's prompt tokens served from its cache

    def batch(self, t0: float, dt: float, *, status: dict[int, int] | None = None) -> SampleBatch:
        k = max(int(self.rate * dt), 1)
        node = self.rng.integers(0, self.n, k)
        p = np.minimum(self.rng.lognormal(np.log(1000), 1.0, k), 16000).round()
        c = np.maximum(np.minimum(self.rng.lognormal(np.log(180), 0.9, k), 2000).round(), 1)
        f = self.speed[node] * self.rng.lognormal(0, self.jitter, k) * self.surge
        for i, factor in self.slow.items():
            f = np.where(node == i, f * factor, f)
        pf = np.array([self.prefill_slow.get(i, 1.0) for i in node])
        cached = np.round(p * np.array([self.cache_hit.get(i, 0.0) for i in node]))
        ttft = ((p - cached) * self.prefill_ms + self.overhead_ms) * f * pf
        total = ttft + c * self.decode_ms * f
        queue = np.zeros(k)
        for i, wait in self.wait_ms.items():
            queue = np.where(node == i, wait, queue)
        ttft, total = ttft + queue, total + queue
        st = np.full(k, 200)
        for i, code in (status or {}).items():
            st[node == i] = code
        return SampleBatch.from_columns(
            node=[self.nodes[i] for i in node], ts=t0 + np.sort(self.rng.uniform(0, dt, k)),
            prompt_tokens=p if self.logs_tokens else np.full(k, np.nan),
            completion_tokens=c if self.logs_tokens else np.full(k, np.nan),
            ttft_ms=ttft if self.logs_ttft else None, total_ms=total, status=st,
            cached_tokens=cached if self.cache_hit else None, queue_ms=queue if self.logs_queue else None,
        )

    def progress(self, t_end: float, dt: float, *, streams: dict[int, int] | None = None, per_stream: float = 0.0,
                 stall: dict[int, float] | None = None, prefill: bool = False,
                 running: bool = False) -> ProgressBatch:
        """What a streaming gateway saw over ``(t_end - dt, t_end]``: every node with 20 requests
        decoding (or ``streams[i]``) at its per-token cost times ``slow``, a one-interval ``stall``
        factor, and ``1 + per_stream * (streams - 20)`` (a bigger batch decodes each token slower).
        Every stream of a node shares one step time (one batch on a continuous-batching engine), so
        its noise is one draw per node and interval, not one per stream.

        ``prefill``: also the model server's queue-free prefill columns (the node's share of the
        group's arrivals, each prefill ``(computed tokens * prefill_ms + overhead)`` times its speed,
        ``slow`` and ``prefill_slow``; cache hits are not computed). ``running``: report the batch."""
        k = np.full(self.n, 20)
        for i, s in (streams or {}).items():
            k[i] = s
        out_tokens = np.zeros(self.n)
        prefills, prefill_ms, prefill_tokens = np.zeros(self.n), np.zeros(self.n), np.zeros(self.n)
        for i in range(self.n):
            ms = self.decode_ms * self.speed[i] * self.rng.lognormal(0, self.jitter) * self.surge
            ms *= self.slow.get(i, 1.0) * (stall or {}).get(i, 1.0) * (1 + per_stream * (k[i] - 20))
            out_tokens[i] = k[i] * dt * 1000.0 / ms
            if prefill:
                m = self.rng.poisson(self.rate * dt / self.n)
                p = np.minimum(self.rng.lognormal(np.log(1000), 1.0, m), 16000).round()
                computed = np.round(p * (1.0 - self.cache_hit.get(i, 0.0)))
                f = self.speed[i] * self.rng.lognormal(0, self.jitter, m) * self.surge
                f *= self.slow.get(i, 1.0) * self.prefill_slow.get(i, 1.0)
                prefills[i], prefill_tokens[i] = m, computed.sum()
                prefill_ms[i] = float(((computed * self.prefill_ms + self.overhead_ms) * f).sum())
        return ProgressBatch.from_columns(
            node=self.nodes, ts=np.full(self.n, t_end), interval_s=np.full(self.n, dt), tokens=out_tokens,
            token_ms=k * dt * 1000.0, prefills=prefills if prefill else None,
            prefill_ms=prefill_ms if prefill else None, prefill_tokens=prefill_tokens if prefill else None,
            running=k.astype(float) if running else None)


def run(gd, fleet: Fleet, t0: float, seconds: float, tick: float = 0.2, probe=None):
    """Drive ``gd`` for ``seconds``; returns the list of evaluations. ``probe(node, t)`` answers canaries."""
    evs = []
    t = t0
    for _ in range(round(seconds / tick)):
        gd.ingest(fleet.batch(t, tick))
        t += tick
        ev = gd.evaluate(t)
        evs.append(ev)
        for node in ev.probes_due:
            if probe is not None:
                probe(node, t)
    return evs
