"""The ``default`` policy: our detector (:class:`detector.GroupDetector`) driving a weighted gateway.

Per group and per tick (``scenario.tick_s``, 200 ms): the access-log lines that completed since the
last tick become one :class:`detector.SampleBatch` (node, ts, tokens, ttft_ms, total_ms, status; a
timeout is status 0 with ``total = timeout``), ``ingest`` then ``evaluate(now)``; the weights go to a
smooth weighted round robin (:class:`detector.SmoothWeightedRoundRobin`). Each node in ``probes_due`` gets one
canary request of the scenario's probe size through the simulated node, reported with
``record_probe`` when it completes (at most one probe in flight per node). When the gateway streams
(``gateway.streams``), each tick first hands the detector every node's streamed decode progress as a
:class:`detector.ProgressBatch` (``ingest_progress``). On the step engine that progress is what
production computes: each node's ``/metrics`` page is rendered, parsed by
:func:`detector.engine_metrics.parse` and turned into a row by :func:`detector.engine_metrics.progress_row`
against the previous scrape (:meth:`DefaultPolicy.on_scrape`).

``default_logs`` is the same detector fed only the access log (what the seeds get: one line per
completed request, with TTFT when the gateway logs it), no streamed progress and no ``/metrics``: the
like-for-like comparison with the seeds. Weights published at a tick reach the gateway
``scenario.apply_delay_s`` later (publish + agent apply; 0 by default).

Simulated time is offset by ``EPOCH`` so the detector sees realistic epoch timestamps.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from detector.picking import SmoothWeightedRoundRobin
from detector.states import DEFAULT_BASE_WEIGHT
from sim.engine import GroupContext, Policy

EPOCH = 1_700_000_000.0


class DefaultPolicy(Policy):
    name = "default"
    wants_records = True
    wants_progress = True
    reads_metrics = True

    def __init__(self, ctx: GroupContext, thresholds: Any, logs_only: bool = False,
                 balancer: str = "round_robin") -> None:
        from detector.group import GroupDetector
        from detector.samples import ProgressBatch, SampleBatch
        from detector.states import OUT_OF_SERVICE, NodeState

        super().__init__(ctx)
        # How the gateway spreads requests over the published weights: "round_robin" (nginx's smooth
        # weighted round robin, the default of nginx and HAProxy) or "leastconn" (the fewest open
        # requests per unit of weight: HAProxy's `balance leastconn`, nginx's `least_conn`, Envoy's
        # LEAST_REQUEST all honour the weights).
        if balancer not in ("round_robin", "leastconn"):
            raise ValueError(f"unknown balancer {balancer!r}")
        self.balancer = balancer
        if balancer == "leastconn":
            self.name = "default_lc"
            self.rand = np.random.default_rng(int(ctx.rng.integers(1 << 31)))
        if logs_only:
            self.name = "default_logs"
            self.wants_progress = False
            self.reads_metrics = False
        self.tick_s = ctx.sim.scn.tick_s
        self.scrape_s = ctx.sim.scn.scrape_s or self.tick_s
        self.last_scrape = -1e18
        self.apply_delay_s = ctx.sim.scn.apply_delay_s
        self.pending: list[tuple[float, np.ndarray]] = []
        self._batch_cls = SampleBatch
        self._progress_cls = ProgressBatch
        self._out_of_service = {int(s) for s in OUT_OF_SERVICE}  # the traffic table's DRAIN states
        self._warming = int(NodeState.WARMING)
        members = [i for i in range(ctx.n) if ctx.members[i]]
        self.gd = GroupDetector(thresholds=thresholds, nodes=[ctx.node_ids[i] for i in members], now=EPOCH)
        self.base = float(DEFAULT_BASE_WEIGHT)
        w = np.zeros(ctx.n)
        w[members] = self.base
        self.swrr = SmoothWeightedRoundRobin(w)
        self.pos = {nid: i for i, nid in enumerate(ctx.node_ids)}
        self.buf: tuple[list, ...] = ([], [], [], [], [], [], [])
        self.probing: set[int] = set()
        self.last_eval: Any = None
        self.logs_ttft = ctx.sim.scn.logs_ttft
        self.prev_scrape: dict[int, tuple[float, Any]] = {}

    def add_node(self, node: int, now: float) -> None:
        self.gd.add_node(self.ctx.node_ids[node], base_weight=self.base, now=now + EPOCH)
        w = self.swrr.weights.copy()
        w[node] = self.base * 0.1  # slow start until the detector's first evaluation sets it
        self.swrr.set_weights(w)

    def pick(self, now: float) -> int:
        while self.pending and self.pending[0][0] <= now:
            self.swrr.set_weights(self.pending.pop(0)[1])
        if self.swrr.total <= 0:
            return int(np.argmax(self.ctx.members))
        if self.balancer == "leastconn":
            return self._least_conn()
        return self.swrr.pick()

    def _least_conn(self) -> int:
        """Weighted least connections: the node with the fewest open requests per unit of weight
        among those with a weight, ties broken at random."""
        w = self.swrr.weights
        live = np.flatnonzero(w > 0)
        load = np.asarray([self.ctx.outstanding[i] for i in live], dtype=np.float64) / w[live]
        best = live[load <= load.min() * (1 + 1e-12)]
        return int(best[0] if len(best) == 1 else best[int(self.rand.integers(len(best)))])

    def on_record(self, node: int, now: float, prompt: int, completion: int, ttft_ms: float,
                  total_ms: float, status: int) -> None:
        b = self.buf
        b[0].append(self.ctx.node_ids[node])
        b[1].append(now + EPOCH)
        b[2].append(prompt)
        b[3].append(completion)
        b[4].append(ttft_ms if self.logs_ttft else math.nan)
        b[5].append(total_ms)
        b[6].append(status)

    def on_progress(self, now: float, interval_s: float, tokens: list[float], token_ms: list[float]) -> None:
        rows = [i for i, k in enumerate(tokens) if k > 0 and self.ctx.node_ids[i] in self.gd]
        if rows:
            self.gd.ingest_progress(self._progress_cls.from_columns(
                node=[self.ctx.node_ids[i] for i in rows], ts=[now + EPOCH] * len(rows),
                interval_s=[interval_s] * len(rows), tokens=[tokens[i] for i in rows],
                token_ms=[token_ms[i] for i in rows]))

    def on_scrape(self, now: float, scrapes: list[tuple[int, Any]]) -> None:
        from detector.engine_metrics import progress_row

        if now - self.last_scrape < self.scrape_s - 1e-9:
            return  # the scraper's period (scenario ``scrape_s``) may be longer than the tick
        self.last_scrape = now
        ts = now + EPOCH
        rows = []
        for local, counters in scrapes:
            nid = self.ctx.node_ids[local]
            row = progress_row(nid, self.prev_scrape.get(local), ts, counters)
            self.prev_scrape[local] = (ts, counters)
            if row is not None and row[3] > 0 and nid in self.gd:
                rows.append(row)
        if rows:
            self.gd.ingest_progress(self._progress_cls.from_rows(rows))

    def on_tick(self, now: float) -> None:
        ctx = self.ctx
        b = self.buf
        if b[0]:
            batch = self._batch_cls.from_columns(node=b[0], ts=b[1], prompt_tokens=b[2], completion_tokens=b[3],
                                                 ttft_ms=b[4], total_ms=b[5], status=b[6])
            self.gd.ingest(batch)
            self.buf = ([], [], [], [], [], [], [])
        ev = self.gd.evaluate(now + EPOCH)
        self.last_eval = ev
        w = np.zeros(ctx.n)
        for k, nid in enumerate(ev.nodes):
            i = self.pos[nid]
            wk = float(ev.weights[k])
            w[i] = wk
            frac = wk / self.base
            st = int(ev.states[k])
            # A warming node's weight ramps up (slow start, as Envoy's slow_start_window): not a cut.
            # The report counts a weight under base as a detection, so it is noted at base.
            ctx.note(i, now, 1.0 if st == self._warming else frac, st in self._out_of_service)
            if i in ctx.tracked:
                z = float(ev.z[k])
                ctx.trace(i, now, z if math.isfinite(z) else math.nan, frac)
        if self.apply_delay_s > 0:
            self.pending.append((now + self.apply_delay_s, w))
        else:
            self.swrr.set_weights(w)
        for nid in ev.probes_due:
            i = self.pos[nid]
            if i in self.probing:
                continue
            self.probing.add(i)
            ctx.send_probe(i, now, self._probe_callback(nid, i))

    def _probe_callback(self, nid: str, i: int):
        scn = self.ctx.sim.scn

        def done(now: float, ttft_ms: float, total_ms: float, ok: bool) -> None:
            self.probing.discard(i)
            ttft = ttft_ms if self.logs_ttft and math.isfinite(ttft_ms) else None
            self.gd.record_probe(nid, now + EPOCH, scn.probe_prompt_tokens, scn.probe_completion_tokens,
                                 ttft, total_ms, ok)

        return done


def make_default_policy(options: dict[str, Any], logs_only: bool = False, balancer: str = "round_robin"):
    """Factory for the engine. ``options`` may hold ``thresholds``: a dict for ``Thresholds.from_dict``;
    ``logs_only``: the ``default_logs`` policy; ``balancer``: how the gateway spreads requests over the
    weights (``leastconn``: the ``default_lc`` policy)."""
    from detector.thresholds import Thresholds

    thresholds = Thresholds.from_dict(options["thresholds"]) if options.get("thresholds") else Thresholds()

    def factory(ctx: GroupContext) -> Policy:
        return DefaultPolicy(ctx, thresholds, logs_only, balancer)

    return factory
