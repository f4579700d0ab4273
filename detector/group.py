"""One model group's detector: samples in, weights and explained transitions out.

:class:`GroupDetector` composes the modules of this package, each one concept:

1. :meth:`GroupDetector.ingest` validates a :class:`~detector.samples.SampleBatch` and applies it in one
   vectorised step: the error counts (:mod:`detector.detectors.errors`), each request's signals and
   the nodes' EW statistics (:mod:`detector.signals`), the tail windows
   (:mod:`detector.detectors.tail`) and the evidence on the deciding signal
   (:mod:`detector.detectors.zscore`). :meth:`GroupDetector.ingest_progress` applies streamed decode
   progress (:class:`~detector.samples.ProgressBatch`): the decode signal seconds before the requests
   complete.
2. :meth:`GroupDetector.evaluate` (one tick) refits the cost model, applies operator expiries and
   the end of warm-up, computes every signal's peer baseline and Z, and hands them with its detectors
   to :func:`detector.evaluation.evaluate` — the one evaluation sequence, which the threshold preview
   replays too: the deciding signal, each detector's verdict, the ejection layer
   (:mod:`detector.ejection`: persistence, cause priority, dry run, the safeguard cap, soft degrade
   with flap damping, restore, probes), every state edge through :class:`~detector.moves.Moves`.
   Weights follow from the states (:mod:`detector.weights`, with the
   traffic table of :mod:`detector.states`) and every edge gets its explanation
   (:mod:`detector.explain`).
3. Canary probes (:meth:`record_probe`) and operator actions move single nodes between evaluations.

Per-node state lives in one typed table (:class:`~detector.nodes.NodeArrays`); a snapshot
(:meth:`to_bytes`) restores exactly, and a snapshot from before a column existed still restores.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from itertools import repeat

import numpy as np

from detector import ejection, evaluation, explain, inflight, snapshot
from detector import weights as weighing
from detector.baseline import References, robust_sd
from detector.detectors import zscore
from detector.detectors.cross_p50 import CrossP50Detector
from detector.detectors.errors import ErrorDetector
from detector.detectors.tail import TailDetector
from detector.detectors.verdict import Detector
from detector.detectors.zscore import ZScoreDetector
from detector.explain import Evaluation
from detector.moves import Moves
from detector.nodes import POOLED, NodeArrays
from detector.operator import NodeActions
from detector.samples import (
    ProgressBatch,
    RejectReason,
    SampleBatch,
    classify_status,
    is_cancelled,
    node_order,
    validate,
    validate_progress,
)
from detector.signals import QUEUE_FREE, SIGNALS, SignalModel
from detector.states import DEFAULT_BASE_WEIGHT, NodeState, Transition
from detector.thresholds import (
    COMPARABLE_LOAD_FRACTION,
    POOL_MAX_STEPS,
    POOL_OBSERVATION_S,
    PREFILL_STALL_S,
    ROWS_FRESH_S,
    Thresholds,
)
from detector.window import SlidingWindows

S = NodeState


@dataclass(frozen=True)
class IngestResult:
    accepted: int
    rejected: list[tuple[int, RejectReason]]
    unknown_nodes: list[str]
    ignored: int = 0  # valid samples that carry neither latency nor error (4xx)


class GroupDetector(NodeActions):
    """Peer-outlier detector for one model group (see the module docstring)."""

    def __init__(self, thresholds: Thresholds | None = None, nodes: Sequence[str] = (),
                 base_weights: Sequence[float] | None = None, *, now: float = 0.0, warm: bool = True) -> None:
        """``warm=True`` (default) treats the initial nodes as already in service (no warm-up ramp):
        a control plane that starts against a running fleet must not slow-start all of it."""
        self.thresholds = t = thresholds or Thresholds()
        self.a = NodeArrays()
        self.signals = SignalModel(t)
        self.tail = TailDetector(0, t.window_size, now)
        self.errors = ErrorDetector(now)
        self._last = References()
        self._pending: list[Transition] = []
        self.rejected_total: dict[str, int] = {}
        self.accepted_total = 0
        for i, node in enumerate(nodes):
            bw = float(DEFAULT_BASE_WEIGHT) if base_weights is None else float(base_weights[i])
            self.add_node(node, base_weight=bw, now=now, warm=warm)

    # ---------------------------------------------------------------------------------- membership
    @property
    def nodes(self) -> tuple[str, ...]:
        return tuple(self.a.ids)

    @property
    def node_ids(self) -> list[str]:
        return self.a.ids

    @property
    def detectors(self) -> tuple[Detector, ...]:
        """The group's detectors in the ejection layer's priority order
        (:data:`~detector.thresholds.DETECTORS`: errors, Z, tail ratio, cross-P50)."""
        return (self.errors, ZScoreDetector(), self.tail, CrossP50Detector())

    @property
    def ewma(self) -> dict:
        return self.signals.ewma

    @property
    def window(self) -> SlidingWindows:
        return self.tail.window

    def __len__(self) -> int:
        return len(self.a)

    def __contains__(self, node: object) -> bool:
        return node in self.a

    def state_of(self, node: str) -> NodeState:
        return NodeState(int(self.a.state[self.index_of(node)]))

    def add_node(self, node: str, *, base_weight: float = float(DEFAULT_BASE_WEIGHT), now: float,
                 warm: bool = False) -> None:
        """Add a node. New nodes start ``WARMING`` (slow start, not judged) unless ``warm``."""
        if not base_weight > 0:
            raise ValueError(f"base_weight must be > 0, got {base_weight!r}")
        i = self.a.append(node)
        self.signals.append()
        self.tail.window.append(1)
        self.a.base[i] = base_weight
        self.a.state[i] = S.HEALTHY if warm or self.thresholds.warmup_samples == 0 else S.WARMING
        self.a.joined[i] = now
        self.a.healthy_since[i] = now

    def set_base_weight(self, node: str, base_weight: float) -> None:
        """An operator's new base weight: what the node's published weight is a share of, from the next
        evaluation on (its state and case against it are unchanged)."""
        if not base_weight > 0:
            raise ValueError(f"base_weight must be > 0, got {base_weight!r}")
        self.a.base[self.index_of(node)] = base_weight

    def remove_node(self, node: str) -> None:
        i = self.a.delete(node)
        self.signals.delete(i)
        self.tail.window.delete(i)

    def set_thresholds(self, thresholds: Thresholds) -> None:
        """Apply new thresholds to a running group, keeping what the nodes have learned: EW statistics
        carry over (the new ``ema_alpha`` applies from the next sample), a new ``window_size`` keeps each
        node's newest samples that fit, a new reservoir size the newest healthy samples. States are
        untouched: the next :meth:`evaluate` judges them against the new values."""
        old, self.thresholds = self.thresholds, thresholds
        self.signals.set_thresholds(thresholds)
        if thresholds.window_size != old.window_size:
            self.tail.resize(thresholds.window_size)

    # ----------------------------------------------------------------------------------- ingestion
    def ingest(self, batch: SampleBatch) -> IngestResult:
        """Validate and apply a batch. Invalid samples and samples of unknown nodes are reported, not
        applied; every sample is accounted for in the result."""
        keep, idx, rejected, unknown = self._admit(batch.node, *validate(batch))
        if not keep.any():
            return IngestResult(0, rejected, unknown)
        b = replace(batch, node=idx).take(self._node_time_order(keep, idx, batch.ts))
        a, t, n = self.a, self.thresholds, len(self.a)
        is_latency, is_error = classify_status(b.status)
        counted = is_latency | is_error
        # A cancellation (the client gave up) is latency, not an outcome: it neither counts as an
        # error nor breaks a run of them (detector.samples).
        outcome = counted & ~is_cancelled(b.status)
        self.errors.ingest(a, b.node[outcome], is_error[outcome])
        self._touch(b.node, b.ts)
        lat, lat_node = b.take(is_latency), b.node[is_latency]
        state = a.state[lat_node]
        self.signals.add_healthy(lat.take(state == S.HEALTHY))
        # Warming nodes are counted (slow start), not learned from: their first requests are 5-10x
        # slower by design (CUDA init, weight loading) and must not be judged.
        a.warm_samples += np.where(a.state == S.WARMING, np.bincount(lat_node, minlength=n), 0)
        learn = state != S.WARMING
        learned, node = lat.take(learn), lat_node[learn]
        signals = self.signals.per_request(learned, running=a.running[node])
        self.tail.ingest(node, signals, self._last.of("decode").baseline)
        # A node whose model server is scraped has its decode measured by its progress rows: every
        # token of these requests, queue-free and compared at equal load (batch, prefill work, KV),
        # where a request's own decode is corrected for its node's batch only. The requests would
        # count the same steps again, k times for k concurrent streams (they share every step), as
        # if independent: healthy nodes' evidence then crossed the line every few seconds.
        streamed = learned.ts - a.rows_at[node] <= ROWS_FRESH_S
        if streamed.any():
            signals["decode"] = np.where(streamed, np.nan, signals["decode"])
        pooled = self._pooled_signals()
        for s, x in signals.items():
            if s in pooled:
                # One observation per node and tick (see _apply_pooled_requests).
                ok = np.isfinite(x) & (x > 0)
                a.column(f"pool_sum_{s}")[:] += np.bincount(node[ok], weights=np.log(x[ok]), minlength=n)
                a.column(f"pool_n_{s}")[:] += np.bincount(node[ok], minlength=n)
            if s not in pooled or s not in QUEUE_FREE:  # queue-laden EMAs stay per request
                self.signals.update(s, node, x, self._last.of(s).baseline,
                                    self.signals.sample_weights(s, learned))
        per_node = np.bincount(node, minlength=n)
        a.new_samples += per_node
        a.new_requests += per_node
        # Requests dispatched once the node's weight had been cut for queue_drain_s (start = completion
        # - latency): the only latency a queue-laden signal can quarantine on (detectors.zscore).
        started = learned.ts - learned.total_ms / 1000.0
        with np.errstate(invalid="ignore"):
            drained = started >= a.cut_at[node] + t.queue_drain_s
        a.new_drained += np.bincount(node[drained], minlength=n)
        accepted = int(keep.sum())
        self.accepted_total += accepted
        return IngestResult(accepted, rejected, unknown, ignored=int((~counted).sum()))

    def ingest_progress(self, batch: ProgressBatch) -> IngestResult:
        """Apply streamed progress rows (:class:`~detector.samples.ProgressBatch`): the decode signal
        as tokens leave the node, where a completed request reports seconds later and only partly
        slowed when a fault began while it ran (while a node's rows come in, its completed requests
        no longer feed decode: :meth:`ingest`), and,
        where the model server reports it, the queue-free prefill time.

        A row is one sample of the EMA, of the evidence and of the quarantine count, whatever its
        number of streams: on a continuous-batching engine every stream of a node shares one step
        time, so what stalls one (a long prefill chunk, a host hiccup) stalls all of them, and ``k``
        streams are one observation, not ``k``. Its evidence unit is the spread of rows across the
        group (:meth:`_row_spread`). Invalid rows and rows of unknown nodes are reported, not applied;
        rows with neither tokens nor prefills are counted as ignored.
        """
        keep, idx, rejected, unknown = self._admit(batch.node, *validate_progress(batch))
        a, t = self.a, self.thresholds
        # Stalls are tracked over every admitted row (an idle row ends one), before empty rows go.
        whole = replace(batch, node=idx).take(self._node_time_order(keep, idx, batch.ts))
        stalled = inflight.stalled_rows(whole.node, whole.ts, whole.interval_s, whole.tokens, whole.token_ms,
                                        whole.running, a.stall_from, a.rows_at)
        bound, a.stall_from = inflight.stall_bounds(whole.node, whole.ts, whole.interval_s, stalled, a.stall_from)
        empty = (whole.tokens == 0) & ~(whole.prefills > 0) & ~stalled
        accepted = int((~empty).sum())
        self.accepted_total += accepted
        if not accepted:
            return IngestResult(0, rejected, unknown, ignored=int(empty.sum()))
        b, bound = whole.take(np.flatnonzero(~empty)), bound[~empty]
        self._touch(b.node, b.ts)
        reported = np.isfinite(b.running)
        a.running[b.node[reported]] = b.running[reported]  # time order within a node: the last one stays
        decoded = (b.tokens > 0) | np.isfinite(bound)  # a stalled node's decode is measured by its rows too
        a.rows_at[b.node[decoded]] = np.fmax(a.rows_at[b.node[decoded]], b.ts[decoded])
        learn = a.state[b.node] != S.WARMING
        healthy = a.state[b.node] == S.HEALTHY
        self.signals.add_healthy_rows(b.take(healthy))
        rows, bound = b.take(learn), bound[learn]
        node = rows.node
        feeding = zscore.evidence_signals(t, self._last)
        with np.errstate(invalid="ignore"):
            # A row within PREFILL_STALL_S of its node's preemption: the node is recomputing the KV
            # cache it evicted (NaN, never preempted: False).
            recomputing = self._since_preemption(rows) <= PREFILL_STALL_S
        passing = self._passing_prefill(rows, recomputing)
        for s, x in self.signals.per_row(rows, recomputing).items():
            base = self._last.of(s).baseline
            if s == "decode":
                x = np.where(passing, np.nan, x)
            censored = np.zeros(len(x), bool)
            if s == "decode" and np.isfinite(bound).any():
                # A stalled row: its streams waited at least `bound` for a token (detector.inflight).
                ewma = self.signals.ewma[s]
                own = np.where(ewma.count[node] > 0, ewma.mean[node], np.nan)
                at_load = bound * self.signals.batch_factor(rows.running, None, rows.kv_usage)
                censored = inflight.informative(bound, at_load, own, t.quarantine_persistence_s)
                x = np.where(censored, at_load, np.where(np.isfinite(bound), np.nan, x))
            self.signals.update(s, node, x, base)
            # The spread is the noise between healthy rows: a censored bound is not one of them.
            self._row_spread(s, node, np.where(censored, np.nan, x), base)
            if s in feeding:
                # Every stream of a node shares its step time (one batch), so a row is one
                # observation: its unit is how much rows differ across the group, not a per-request
                # spread / sqrt(k).
                sigma = self._last.of(s).rel_sd("row_rel_sd")
                zscore.feed_evidence(a, t, self._last, node, x, s, sigma,
                                     comparable=self._at_peer_load(rows.running, healthy[learn], recomputing))
        a.new_samples += np.bincount(node, minlength=len(a))  # one sample of time per row
        return IngestResult(accepted, rejected, unknown, ignored=int(empty.sum()))

    def _since_preemption(self, rows: ProgressBatch) -> np.ndarray:
        """Per row (grouped by node, time order within): seconds since the node's last preemption at
        or before the row (this batch's rows, else ``preempted_at``; NaN: none seen), and the node's
        ``preempted_at`` moved to its last preempting row. vLLM preempts when the KV cache cannot
        hold the next step's tokens: a node preempting is running as many streams as its memory
        holds, and what it computes next includes the evicted requests' prompts again."""
        a = self.a
        preempted = np.nan_to_num(rows.preempted) > 0
        at = a.preempted_at[rows.node]
        if preempted.any():
            # The last preempting row at or before each row, carried forward within the node's rows.
            last = np.maximum.accumulate(np.where(preempted, np.arange(len(rows)), 0))
            mine = preempted[last] & (rows.node[last] == rows.node)
            at = np.where(mine, rows.ts[last], at)
            a.preempted_at[rows.node[preempted]] = rows.ts[preempted]  # time order: the last one stays
        return rows.ts - at

    def _passing_prefill(self, rows: ProgressBatch, recomputing: np.ndarray) -> np.ndarray:
        """Per row (grouped by node, time order within): a row past the decode curve's prompt work
        (:meth:`~detector.signals.SignalModel.beyond_work`) less than :data:`~detector.thresholds.
        PREFILL_STALL_S` into an episode of such rows of its node (an episode ends after that long
        without one), and not ``recomputing`` (within that long of a preemption). One long prompt stalls
        every stream of a node for its chunked prefill (an 8k-token prompt made a healthy node's rows
        read 18x for 0.5 s, and it was cut): those rows are not decode samples. Prefill work that
        follows a preemption is the node recomputing the KV cache it evicted (a node short of KV
        memory, or swapping it), and prefill work that lasts is the same in bursts the counter did
        not show: both are the node's decode, and count."""
        a, hold = self.a, PREFILL_STALL_S
        beyond = self.signals.beyond_work(rows)
        if not beyond.any() and np.isnan(a.heavy_since[rows.node]).all():
            return beyond
        since = np.full(len(rows), np.nan)
        for k in np.flatnonzero(beyond):  # in order: a node's rows are in time order
            i, ts = rows.node[k], rows.ts[k]
            if math.isnan(a.heavy_since[i]) or ts - a.heavy_last[i] > hold:
                a.heavy_since[i] = ts
            a.heavy_last[i] = ts
            since[k] = a.heavy_since[i]
        with np.errstate(invalid="ignore"):
            ended = rows.ts - a.heavy_last[rows.node] > hold
        a.heavy_since[rows.node[ended]] = np.nan
        return beyond & ~recomputing & ~(rows.ts - since >= hold - 1e-9)

    def _at_peer_load(self, running: np.ndarray, healthy: np.ndarray, recomputing: np.ndarray) -> np.ndarray:
        """Per row: whether it ran at least :data:`~detector.thresholds.COMPARABLE_LOAD_FRACTION` of the
        median batch of this batch's healthy rows (True where batches are not reported, or too few
        healthy rows report one), or is ``recomputing`` (its node preempted within
        :data:`~detector.thresholds.PREFILL_STALL_S`). A node cut to a few streams while its peers run
        full batches is compared through the decode curve far below where the healthy rows now are:
        evidence enough for a cut, not for a quarantine (zscore.feed_evidence). A node that preempts
        runs as many streams as its own KV cache holds (one that lost most of it runs two): its small
        batch is its fault, not our cut, and its rows count."""
        ok = np.ones(len(running), dtype=bool)
        peers = running[healthy & np.isfinite(running)]
        if len(peers) < self.thresholds.min_peers:
            return ok
        with np.errstate(invalid="ignore"):
            at_load = running >= COMPARABLE_LOAD_FRACTION * float(np.median(peers))
        return ~np.isfinite(running) | at_load | recomputing

    def _pooled_signals(self) -> tuple[str, ...]:
        """The signals whose completed-request samples are pooled per node and tick (robust mode):
        the queue-free ones, and ``norm`` (:data:`~detector.nodes.POOLED`) when it feeds the evidence."""
        if self.thresholds.baseline_mode != "robust":
            return ()
        feeding = zscore.evidence_signals(self.thresholds, self._last)
        return tuple(s for s in POOLED if s in QUEUE_FREE or s in feeding)

    def _pool_steps(self, since: np.ndarray, requests: np.ndarray) -> np.ndarray:
        """How many EMA steps a node's pooled mean of this tick takes (:data:`POOL_OBSERVATION_S`):
        one per 250 ms ``since`` its last pooled observation (NaN: none yet), at least 1 and at most
        its number of ``requests`` and :data:`POOL_MAX_STEPS`."""
        with np.errstate(invalid="ignore"):
            steps = np.where(np.isfinite(since), np.floor(since / POOL_OBSERVATION_S + 1e-9), 1)
        return np.clip(steps, 1, np.minimum(requests, POOL_MAX_STEPS)).astype(np.int64)

    def _apply_pooled_requests(self, now: float) -> None:
        """Completed requests' queue-free samples enter the EMA, and every evidence signal's its
        CUSUM, as one observation per node and tick: the geometric mean of the node's requests that
        completed in the tick (the EMA takes it once per 250 ms the tick covers, :meth:`_pool_steps`;
        the CUSUM once), in units of the spread of those means across the group's healthy nodes
        (``pool_rel_sd``). Requests that ran on one node at the same time shared its steps
        (every stream of a continuous-batching engine waits for the same step) and its queue: a few
        long prompts slow all of them at once, so ``k`` of them are not ``k`` independent samples.
        Fed one by one at the per-request spread, a busy healthy node's evidence crossed the cut
        line every few seconds (the seed drill at 37 requests/s per node from access logs: 306
        false cuts in 150 s). Pooled per tick, not per ingest call: how a tick's records are split
        into batches changes nothing."""
        a, t = self.a, self.thresholds
        feeding = zscore.evidence_signals(t, self._last)
        since = now - a.pool_at
        pooled_now = np.zeros(len(a), bool)
        for s in POOLED:
            total, n = a.column(f"pool_sum_{s}"), a.column(f"pool_n_{s}")
            nodes = np.flatnonzero(n > 0)
            if not len(nodes):
                continue
            mean = np.exp(total[nodes] / n[nodes])
            steps = self._pool_steps(since[nodes], n[nodes])
            pooled_now[nodes] = True
            total[:] = 0.0
            n[:] = 0
            base = self._last.of(s).baseline
            if s in QUEUE_FREE:
                self.signals.update(s, np.repeat(nodes, steps), np.repeat(mean, steps), base)
            if s in feeding:
                self._row_spread(s, nodes, mean, base, kind="pool_rel_sd")
                sigma = self._last.of(s).rel_sd("pool_rel_sd")
                zscore.feed_evidence(a, t, self._last, nodes, mean, s, sigma)
        a.pool_at[pooled_now] = now

    def _row_spread(self, s: str, node: np.ndarray, x: np.ndarray, base: float, kind: str = "row_rel_sd") -> None:
        """The group's relative spread of progress rows of signal ``s``: robust (:func:`~detector.baseline.robust_sd` of
        ``log(row / baseline)``) over the rows of healthy nodes in this batch, EW-averaged across
        batches and floored at ``spread_floor``. It holds everything that makes one healthy node's
        row differ from another's: the shared step time's noise, batch sizes, hardware spread.
        (``kind``: which :class:`~detector.baseline.Reference` spread it is; per-batch means of requests
        keep theirs apart.)"""
        t = self.thresholds
        healthy = (self.a.state[node] == S.HEALTHY) & np.isfinite(x)
        if not (math.isfinite(base) and base > 0) or healthy.sum() < t.min_peers:
            return
        r = np.log(x[healthy] / base)
        r = r[np.isfinite(r)]
        if len(r) < t.min_peers:
            return
        sd = max(robust_sd(r), t.spread_floor)
        ref = self._last.at(s)
        old = getattr(ref, kind)
        old = sd if math.isnan(old) else old
        setattr(ref, kind, old + t.ema_alpha * (sd - old))

    def _admit(self, names: np.ndarray, valid: np.ndarray, rejected: list[tuple[int, RejectReason]]
               ) -> tuple[np.ndarray, np.ndarray, list[tuple[int, RejectReason]], list[str]]:
        """Node indices of a batch's rows, and which rows to apply: ``(keep, idx, rejected, unknown)``.
        Rows of nodes not in the group are refused as ``unknown_node`` (the caller decides whether to
        add them); other refusals are counted in ``rejected_total``."""
        get = self.a.index.get
        idx = np.fromiter(map(get, names, repeat(-1)), dtype=np.int64, count=len(names))
        unknown_mask = valid & (idx < 0)
        unknown = sorted({str(n) for n in names[unknown_mask]})
        rejected = sorted(rejected + [(int(i), RejectReason.UNKNOWN_NODE) for i in np.flatnonzero(unknown_mask)])
        for _, reason in rejected:
            if reason is not RejectReason.UNKNOWN_NODE:
                self.rejected_total[reason.value] = self.rejected_total.get(reason.value, 0) + 1
        return valid & (idx >= 0), idx, rejected, unknown

    def _touch(self, node: np.ndarray, ts: np.ndarray) -> None:
        """Advance each node's ``last_seen`` to its newest timestamp in a batch."""
        last = np.full(len(self.a), -np.inf)
        np.maximum.at(last, node, ts)
        self.a.last_seen = np.fmax(self.a.last_seen, np.where(np.isfinite(last), last, np.nan))

    @staticmethod
    def _node_time_order(keep: np.ndarray, idx: np.ndarray, ts: np.ndarray) -> np.ndarray:
        """Positions of the kept rows grouped by node, in time order within each node: the order every
        vectorised update expects, computed once per batch."""
        order = np.flatnonzero(keep)
        order = order[np.argsort(ts[order], kind="stable")]
        by_node = node_order(idx[order])
        return order if by_node is None else order[by_node]

    # ---------------------------------------------------------------------------------- evaluation
    def evaluate(self, now: float) -> Evaluation:
        """One tick: decide every node's state and weight at time ``now`` (epoch seconds)."""
        t, a = self.thresholds, self.a
        self._apply_pooled_requests(now)
        self.signals.refit(now)
        moves = Moves(a.state)
        ejection.expire_overrides(a, t, now, moves)
        ejection.finish_warmup(a, t, now, moves)
        view = zscore.peer_view(self.signals, a, t, now, self._last)
        out = evaluation.evaluate(a, t, now, view, self.detectors, moves,
                                  judged=self.signals.ewma["norm"].count > t.min_samples,
                                  explain=lambda r, i: explain.detail(r, a, i, t))
        d, ej, due = out.decision, out.ejection, out.probes_due
        weights, fallback_reason = weighing.with_fallback(a, t, d.weight_z, self.signals.ewma["norm"].mean)
        counts = {s: e.count for s, e in self.signals.ewma.items()}
        records = self._pending + explain.transitions(moves.taken, a, t, now, view, d, counts, weights)
        self._pending = []
        return Evaluation(
            at=now, nodes=self.nodes, states=a.state.copy(), weights=weights, base_weights=a.base.copy(),
            z=d.cut_z, z_by_signal=dict(zip(SIGNALS, view.z, strict=True)),
            ema=dict(zip(SIGNALS, view.ema, strict=True)), baseline=view.baseline, spread=view.spread,
            p50=a.p50.copy(), p99=a.p99.copy(), counts=counts["norm"].copy(), transitions=records,
            safeguard=ej.safeguard_reason is not None, safeguard_reason=ej.safeguard_reason,
            fallback=fallback_reason is not None, fallback_reason=fallback_reason,
            probes_due=[a.ids[i] for i in np.flatnonzero(due)], peers=view.peers, evidence=out.evidence,
            decision_signal=d.name, verdicts={v.reason.value: v.eject.copy() for v in out.verdicts},
            deciding=d.cut_which.copy(), cap=out.safeguard,
        )

    # ---------------------------------------------------------------------------- serialisation
    def to_bytes(self) -> bytes:
        """Exact snapshot (numpy ``.npz`` + JSON metadata); restore with :meth:`from_bytes`."""
        return snapshot.dump(self)

    @classmethod
    def from_bytes(cls, data: bytes) -> GroupDetector:
        return snapshot.load(cls, data)


__all__ = ["SIGNALS", "Evaluation", "GroupDetector", "IngestResult"]
