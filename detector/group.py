"""One model group's detector: samples in, weights and explained transitions out.

:class:`GroupDetector` composes the modules of this package, each one concept:

1. :meth:`GroupDetector.ingest` validates a :class:`~detector.samples.SampleBatch` and applies it in one
   vectorised step: the error counts (:mod:`detector.detectors.errors`), each request's signals and
   the nodes' EW statistics (:mod:`detector.signals`), the tail windows
   (:mod:`detector.detectors.tail`) and the evidence on the deciding signal
   (:mod:`detector.detectors.zscore`). :meth:`GroupDetector.ingest_progress` applies streamed decode
   progress (:class:`~detector.samples.ProgressBatch`): the decode signal seconds before the requests
   complete (:mod:`detector.progress`, with the per-tick pooling of completed requests).
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

from collections.abc import Sequence
from dataclasses import replace
from itertools import repeat

import numpy as np

from detector import ejection, evaluation, explain, snapshot
from detector import weights as weighing
from detector.baseline import References
from detector.detectors import zscore
from detector.detectors.cross_p50 import CrossP50Detector
from detector.detectors.errors import ErrorDetector
from detector.detectors.tail import TailDetector
from detector.detectors.verdict import Detector
from detector.detectors.zscore import ZScoreDetector
from detector.explain import Evaluation
from detector.moves import Moves
from detector.nodes import NodeArrays
from detector.operator import NodeActions
from detector.progress import IngestResult, ProgressIngest
from detector.samples import (
    RejectReason,
    SampleBatch,
    classify_status,
    is_cancelled,
    node_order,
    validate,
)
from detector.signals import QUEUE_FREE, SIGNALS, SignalModel
from detector.states import DEFAULT_BASE_WEIGHT, NodeState, Transition
from detector.thresholds import (
    ROWS_FRESH_S,
    Thresholds,
)
from detector.window import SlidingWindows

S = NodeState


class GroupDetector(NodeActions, ProgressIngest):
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
        weighing.hold_cut(a, t, d.cut_z)
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
