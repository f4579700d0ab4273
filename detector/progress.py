"""What a group takes in besides single requests: streamed progress rows and pooled requests.

:class:`ProgressIngest` is the part of :class:`~detector.group.GroupDetector` that applies a
:class:`~detector.samples.ProgressBatch` (:meth:`~ProgressIngest.ingest_progress`: the decode signal
as tokens leave a node, seconds before its requests complete, and the queue-free prefill time where
the model server reports it), and the per-tick pooling of completed requests' queue-free samples
(:meth:`~ProgressIngest._apply_pooled_requests`): one observation per node and tick, in units of the
spread of such observations across the group (:meth:`~ProgressIngest._row_spread`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np

from detector import inflight
from detector.baseline import robust_sd
from detector.detectors import zscore
from detector.nodes import POOLED
from detector.samples import (
    ProgressBatch,
    RejectReason,
    validate_progress,
)
from detector.signals import QUEUE_FREE
from detector.states import NodeState
from detector.thresholds import (
    COMPARABLE_LOAD_FRACTION,
    POOL_MAX_STEPS,
    POOL_OBSERVATION_S,
    PREFILL_STALL_S,
)

S = NodeState


@dataclass(frozen=True)
class IngestResult:
    accepted: int
    rejected: list[tuple[int, RejectReason]]
    unknown_nodes: list[str]
    ignored: int = 0  # valid samples that carry neither latency nor error (4xx)


class ProgressIngest:
    """Streamed progress rows and pooled requests of :class:`~detector.group.GroupDetector` (module
    docstring); it uses the detector's node table, signals and references."""

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
