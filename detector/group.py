"""One model group's detector: samples in, weights and explained transitions out.

:class:`GroupDetector` holds numpy arrays over the group's nodes and composes the small modules of
this package:

1. :meth:`GroupDetector.ingest` validates a :class:`~detector.samples.SampleBatch`, normalises each
   request (learned cost model, :mod:`detector.costmodel`), and applies it in one vectorised step to
   the per-node EW statistics (:mod:`detector.ewma`), the sliding windows (:mod:`detector.window`) and
   the error counters (:mod:`detector.errors`). :meth:`GroupDetector.ingest_progress` applies
   streamed decode progress (:class:`~detector.samples.ProgressBatch`: per node and interval, the
   tokens its running requests streamed): the decode signal seconds before the requests complete.
2. :meth:`GroupDetector.evaluate` (one tick) refits the cost model on healthy nodes, computes the peer
   baseline and Z of every signal (:mod:`detector.baseline`), runs the tail and error detectors, moves
   every node through the state machine (:mod:`detector.states`) under the group safeguard, and returns
   an :class:`Evaluation` with weights, explanations and the canary probes that are due.

Decision rules (robust mode; ``score`` is the node's Z on the queue-free ``decode`` signal when the
gateway logs TTFT or streams, else its largest Z over ``norm`` and ``prefill``; ``excess`` is that
signal's ``EMA / baseline``):

- degrade when ``score >= degrade_z`` and ``excess >= degrade_materiality`` and the node's evidence
  (:mod:`detector.evidence`) reached ``degrade_evidence * 2^flaps`` (flap damping: ``flaps`` counts the
  cuts it came back from since it was last healthy for ``backoff_cap_s``), or the EMA is of
  quarantine strength: ``weight = base * 2^-(score - degrade_z)``, floored at
  ``min_weight_fraction * base``;
- quarantine when ``score >= quarantine_z`` and ``excess >= quarantine_materiality`` held for
  ``quarantine_persistence`` samples (a leaky count; a streamed row of ``k`` streams counts ``k``) over
  at least ``quarantine_min_evaluations`` evaluations — or the tail detector says *unhealthy*, the node's
  P50 is over ``cross_p50_ratio`` x its peers', or the error detector ejects it;
- safeguard: at most ``floor(max_quarantine_fraction * nodes)`` nodes out of service (and pending);
  further candidates stay degraded at the floor weight and the group raises ``safeguard``;
- canary: a quarantined node is probed after ``canary_interval_s * 2^(ejections-1)`` (capped), then
  every ``canary_interval_s``; ``canary_passes`` probes in a row within
  ``baseline + canary_tolerance_sigma * spread`` start a stepwise restore (``recovery_steps``);
  a bad step sends it back to quarantine with a doubled interval.
"""

from __future__ import annotations

import io
import json
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from itertools import repeat
from typing import Any

import numpy as np

from detector.baseline import PeerBaseline, robust_zscores, seed_zscores
from detector.costmodel import CostModel, Reservoir, fit_cost_model
from detector.errors import consecutive_error_runs, success_rate_outliers
from detector.evidence import cusum_update, excess_over_line
from detector.ewma import EwmaArrays
from detector.samples import (
    ProgressBatch,
    RejectReason,
    SampleBatch,
    classify_status,
    decode_per_token,
    node_order,
    prefill_per_token,
    seed_norm,
    validate,
    validate_progress,
)
from detector.states import (
    BASELINE_STATES,
    OUT_OF_SERVICE,
    TRAFFIC,
    NodeState,
    Reason,
    Traffic,
    Transition,
    check_edge,
)
from detector.tail import TailStatus, cross_p50_slow, tail_step
from detector.thresholds import Thresholds
from detector.window import SlidingWindows

SIGNALS: tuple[str, ...] = ("norm", "prefill", "decode")
DEFAULT_BASE_WEIGHT = 100.0
STATE_FORMAT_VERSION = 1
MAX_FLAP_DOUBLINGS = 5  # flap damping: at most 32x degrade_evidence

S = NodeState


def _lookup(states: Iterable[NodeState]) -> np.ndarray:
    """Boolean table indexed by state code: ``_lookup(X)[state_array]`` is ``state in X`` per node,
    one gather instead of ``np.isin`` (which sorts) on every tick."""
    table = np.zeros(len(NodeState), dtype=bool)
    table[[int(x) for x in states]] = True
    return table


_OUT = _lookup(OUT_OF_SERVICE)
_FLOORED = _lookup(s for s, rule in TRAFFIC.items() if rule is Traffic.FLOOR)
_BASELINE = _lookup(BASELINE_STATES)
_ACTIVE = _lookup((S.HEALTHY, S.DEGRADED))
_FORCED = _lookup((S.FORCED_ACTIVE, S.FORCED_QUARANTINE))
_HELD_OUT = _lookup((*OUT_OF_SERVICE, S.PENDING_APPROVAL))  # counted against the safeguard
_PROBED = _lookup((S.QUARANTINED, S.PROBING))

# The thresholds shown with every transition (the ones that decide states).
_EXPLAINED = (
    "degrade_z",
    "quarantine_z",
    "quarantine_persistence",
    "degrade_materiality",
    "quarantine_materiality",
    "spread_floor",
    "tail_ratio",
    "cross_p50_ratio",
    "consecutive_errors",
    "max_quarantine_fraction",
    "canary_tolerance_sigma",
)


@dataclass(frozen=True)
class IngestResult:
    accepted: int
    rejected: list[tuple[int, RejectReason]]
    unknown_nodes: list[str]
    ignored: int = 0  # valid samples that carry neither latency nor error (4xx)


@dataclass
class Evaluation:
    """The outcome of one tick for every node of the group (arrays aligned with ``nodes``)."""

    at: float
    nodes: tuple[str, ...]
    states: np.ndarray
    weights: np.ndarray
    base_weights: np.ndarray
    z: np.ndarray
    z_by_signal: dict[str, np.ndarray]
    ema: dict[str, np.ndarray]
    baseline: dict[str, float]
    spread: dict[str, float]
    p50: np.ndarray
    p99: np.ndarray
    counts: np.ndarray
    transitions: list[Transition] = field(default_factory=list)
    safeguard: bool = False
    safeguard_reason: str | None = None
    fallback: bool = False
    fallback_reason: str | None = None
    probes_due: list[str] = field(default_factory=list)
    peers: dict[str, int] = field(default_factory=dict)  # nodes in each signal's baseline
    # Per node: the sequential evidence that gates a weight cut (robust mode; see detector.evidence),
    # measured on ``decision_signal`` (decode once the gateway logs TTFT, else norm; None in seed mode,
    # which judges the highest Z of any signal).
    evidence: np.ndarray = field(default_factory=lambda: np.zeros(0))
    decision_signal: str | None = None

    def index(self, node: str) -> int:
        return self.nodes.index(node)

    def row(self, node: str) -> dict[str, Any]:
        """JSON-able summary of one node (NaN -> None)."""
        i = self.index(node)
        return {
            "node": node,
            "state": NodeState(int(self.states[i])).label,
            "weight": float(self.weights[i]),
            "base_weight": float(self.base_weights[i]),
            "z": _f(self.z[i]),
            "z_by_signal": {s: _f(v[i]) for s, v in self.z_by_signal.items()},
            "ema": {s: _f(v[i]) for s, v in self.ema.items()},
            "p50": _f(self.p50[i]),
            "p99": _f(self.p99[i]),
            "samples": int(self.counts[i]),
            "evidence": _f(self.evidence[i]) if len(self.evidence) else None,
            "decision_signal": self.decision_signal,
        }


def _nan_max(stack: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Row-wise max over signals ignoring NaN, and which signal gave it (-1 when all NaN)."""
    filled = np.where(np.isnan(stack), -np.inf, stack)
    arg = filled.argmax(axis=0)
    best = filled[arg, np.arange(stack.shape[1])]
    has = np.isfinite(best)
    return np.where(has, best, np.nan), np.where(has, arg, -1)


class GroupDetector:
    """Peer-outlier detector for one model group (see the module docstring for the rules)."""

    def __init__(
        self,
        thresholds: Thresholds | None = None,
        nodes: Sequence[str] = (),
        base_weights: Sequence[float] | None = None,
        *,
        now: float = 0.0,
        warm: bool = True,
    ) -> None:
        """``warm=True`` (default) treats the initial nodes as already in service (no warm-up ramp):
        a control plane that starts against a running fleet must not slow-start all of it."""
        self.thresholds = thresholds or Thresholds()
        self.node_ids: list[str] = []
        self._index: dict[str, int] = {}
        self._init_arrays(0)
        self._fit_norm: CostModel | None = None
        self._fit_prefill: CostModel | None = None
        self._res = Reservoir(("p", "c", "t", "f"), self.thresholds.cost_model_reservoir)
        self._last_tail_at = now
        self._interval_started = now
        self._last: dict[str, float] = {}
        self._pending: list[Transition] = []
        self.rejected_total: dict[str, int] = {}
        self.accepted_total = 0
        for i, node in enumerate(nodes):
            bw = DEFAULT_BASE_WEIGHT if base_weights is None else float(base_weights[i])
            self.add_node(node, base_weight=bw, now=now, warm=warm)

    # ---------------------------------------------------------------------------------- membership
    def _init_arrays(self, n: int) -> None:
        t = self.thresholds
        self.ewma = {s: EwmaArrays(n, t.ema_alpha) for s in SIGNALS}
        self.window = SlidingWindows(n, t.window_size)
        self.a: dict[str, np.ndarray] = {name: np.zeros(n, dtype=dt) for name, dt in _NODE_ARRAYS.items()}
        for name in _NAN_ARRAYS:
            self.a[name][:] = np.nan

    @property
    def nodes(self) -> tuple[str, ...]:
        return tuple(self.node_ids)

    def __len__(self) -> int:
        return len(self.node_ids)

    def __contains__(self, node: object) -> bool:
        return node in self._index

    def index_of(self, node: str) -> int:
        try:
            return self._index[node]
        except KeyError:
            raise KeyError(f"unknown node {node!r} in this group") from None

    def add_node(self, node: str, *, base_weight: float = DEFAULT_BASE_WEIGHT, now: float, warm: bool = False) -> None:
        """Add a node. New nodes start ``WARMING`` (slow start, not judged) unless ``warm``."""
        if node in self._index:
            raise ValueError(f"node {node!r} is already in the group")
        if not base_weight > 0:
            raise ValueError(f"base_weight must be > 0, got {base_weight!r}")
        self._index[node] = len(self.node_ids)
        self.node_ids.append(node)
        for e in self.ewma.values():
            e.append(1)
        self.window.append(1)
        for name, arr in self.a.items():
            fill = np.nan if name in _NAN_ARRAYS else 0
            self.a[name] = np.concatenate([arr, np.array([fill], dtype=arr.dtype)])
        i = len(self.node_ids) - 1
        self.a["base"][i] = base_weight
        self.a["state"][i] = S.HEALTHY if warm or self.thresholds.warmup_samples == 0 else S.WARMING
        self.a["joined"][i] = now
        self.a["healthy_since"][i] = now

    def remove_node(self, node: str) -> None:
        i = self.index_of(node)
        del self.node_ids[i]
        self._index = {n: k for k, n in enumerate(self.node_ids)}
        for e in self.ewma.values():
            e.delete(i)
        self.window.delete(i)
        for name in self.a:
            self.a[name] = np.delete(self.a[name], i)

    def set_thresholds(self, thresholds: Thresholds) -> None:
        """Apply new thresholds to a running group, keeping what the nodes have learned.

        EW statistics carry over (the new ``ema_alpha`` applies from the next sample). A new
        ``window_size`` keeps each node's newest samples that fit; a new ``cost_model_reservoir`` keeps
        the newest healthy samples. Node states are untouched: the next :meth:`evaluate` judges them
        against the new values.
        """
        old = self.thresholds
        self.thresholds = thresholds
        for e in self.ewma.values():
            e.alpha = thresholds.ema_alpha
        if thresholds.window_size != old.window_size:
            resized = SlidingWindows(len(self.node_ids), thresholds.window_size)
            w = self.window
            for i in range(len(self.node_ids)):  # once per change, not on the hot path
                k = int(w.filled[i])
                if k:
                    newest = np.roll(w.values[i], -int(w.pos[i]))[w.size - k :] if k == w.size else w.values[i, :k]
                    resized.add(np.full(k, i), newest)
            self.window = resized
        if thresholds.cost_model_reservoir != old.cost_model_reservoir:
            self._res = self._res.resized(thresholds.cost_model_reservoir)

    def state_of(self, node: str) -> NodeState:
        return NodeState(int(self.a["state"][self.index_of(node)]))

    # ----------------------------------------------------------------------------------- ingestion
    def ingest(self, batch: SampleBatch) -> IngestResult:
        """Validate and apply a batch. Invalid samples and samples of unknown nodes are reported, not
        applied; every sample is accounted for in the result."""
        keep, idx, rejected, unknown = self._admit(batch.node, *validate(batch))
        if not keep.any():
            return IngestResult(0, rejected, unknown)
        b = replace(batch, node=idx).take(self._node_time_order(keep, idx, batch.ts))
        node = b.node
        is_latency, is_error = classify_status(b.status)
        counted = is_latency | is_error
        n = len(self.node_ids)
        a = self.a

        a["consec_err"] = consecutive_error_runs(a["consec_err"], node[counted], is_error[counted])
        a["int_requests"] += np.bincount(node[counted], minlength=n)
        a["int_success"] += np.bincount(node[counted & ~is_error], minlength=n)
        self._touch(node, b.ts)

        lat = b.take(is_latency)
        lat_node = node[is_latency]
        state = a["state"][lat_node]
        self._reservoir_add(lat.take(state == S.HEALTHY))
        if self._fit_norm is None and self._res.filled >= self.thresholds.cost_model_min_samples:
            self._refit()
        # Warming nodes are counted (slow start), not learned from: their first requests are
        # 5-10x slower by design (CUDA init, weight loading) and must not be judged.
        per_node = np.bincount(lat_node, minlength=n)
        a["warm_samples"] += np.where(a["state"] == S.WARMING, per_node, 0)
        learn = state != S.WARMING
        learned = lat.take(learn)
        signals = self._signals(learned)
        learn_node = lat_node[learn]
        for s, x in signals.items():
            ok = np.isfinite(x)
            self.ewma[s].update(learn_node[ok], x[ok], self._ema_clip(s))
        # The tail window holds one unitless value per request: the queue-free decode time over the
        # group's decode baseline when the gateway logs TTFT, else the normalised total latency.
        # (Near saturation the total's P99/P50 widens on any node by queueing alone.)
        tail_x = signals["norm"]
        dec_base = self._last.get("baseline:decode", math.nan)
        if math.isfinite(dec_base) and dec_base > 0:
            tail_x = np.where(np.isfinite(signals["decode"]), signals["decode"] / dec_base, tail_x)
        ok = np.isfinite(tail_x)
        self.window.add(learn_node[ok], tail_x[ok].astype(np.float32))
        s = self._evidence_signal()
        if s is not None:
            self._add_evidence(learn_node, signals[s], s)
        a["new_samples"] += np.bincount(learn_node, minlength=n)
        a["new_requests"] += np.bincount(learn_node, minlength=n)
        # Requests dispatched once the node's weight had been cut for queue_drain_s (start = completion
        # - latency): the only latency a queue-laden signal can quarantine on (see evaluate).
        started = learned.ts - learned.total_ms / 1000.0
        with np.errstate(invalid="ignore"):
            drained = started >= a["cut_at"][learn_node] + self.thresholds.queue_drain_s
        a["new_drained"] += np.bincount(learn_node[drained], minlength=n)
        accepted = int(keep.sum())
        self.accepted_total += accepted
        return IngestResult(accepted, rejected, unknown, ignored=int((~counted).sum()))

    def ingest_progress(self, batch: ProgressBatch) -> IngestResult:
        """Apply streamed decode progress (see :class:`~detector.samples.ProgressBatch`).

        It reaches the decode signal as soon as tokens leave the node, where a completed request
        reports seconds later and only partly slowed when a fault began while it ran. Completed
        requests keep feeding the decode signal too: each is a whole request's measurement, and when
        requests are short they are the more plentiful samples (one row per scrape, many requests).

        A row is one sample of the EMA and of the sequential evidence, whatever the number of
        streams in it: both ask for persistence in *time*, and what stalls one stream of a node for
        a moment (a long prompt's prefill sharing the batch, a host hiccup) stalls all of them. A row
        of a node with ``k = token_ms / (interval * 1000)`` requests decoding on average counts as
        ``k`` samples toward ``quarantine_persistence`` (that many requests were over the line), so
        with many streams ``quarantine_min_evaluations`` rows over the line are what quarantine takes.
        Invalid rows and rows of unknown nodes are reported, not applied; rows with no tokens are
        counted as ignored.
        """
        keep, idx, rejected, unknown = self._admit(batch.node, *validate_progress(batch))
        empty = keep & (batch.tokens == 0)
        keep &= ~empty
        accepted = int(keep.sum())
        self.accepted_total += accepted
        if not accepted:
            return IngestResult(0, rejected, unknown, ignored=int(empty.sum()))
        b = replace(batch, node=idx).take(self._node_time_order(keep, idx, batch.ts))
        a = self.a
        n = len(self.node_ids)
        self._touch(b.node, b.ts)
        learn = a["state"][b.node] != S.WARMING
        node, x, streams = b.node[learn], b.decode_ms()[learn], b.streams()[learn]
        k = np.maximum(np.rint(streams), 1).astype(np.int64)
        self.ewma["decode"].update(node, x, self._ema_clip("decode"))
        if self._evidence_signal() == "decode":
            # A row of few streams is as noisy as those few requests, and the same requests fill the
            # next rows: one slow request on a quiet node must not read as a slow node. Its unit is
            # the per-request spread (of the normalised latency) over sqrt(streams), or more.
            per_request = self._last.get("request_rel_sd:norm", math.nan)
            sigma = self._last.get("request_rel_sd:decode", math.nan)
            if math.isfinite(per_request):
                sigma = np.maximum(sigma, per_request / np.sqrt(np.maximum(streams, 1.0)))
            self._add_evidence(node, x, "decode", sigma)
        a["new_samples"] += np.bincount(node, weights=k, minlength=n).astype(np.int64)
        return IngestResult(accepted, rejected, unknown, ignored=int(empty.sum()))

    def _admit(self, names: np.ndarray, valid: np.ndarray, rejected: list[tuple[int, RejectReason]]
               ) -> tuple[np.ndarray, np.ndarray, list[tuple[int, RejectReason]], list[str]]:
        """Node indices of a batch's rows, and which rows to apply: ``(keep, idx, rejected, unknown)``.
        Rows of nodes not in the group are refused as ``unknown_node`` (the caller decides whether to
        add them); other refusals are counted in ``rejected_total``."""
        idx = np.fromiter(map(self._index.get, names, repeat(-1)), dtype=np.int64, count=len(names))
        unknown_mask = valid & (idx < 0)
        unknown = sorted({str(n) for n in names[unknown_mask]})
        rejected = sorted(rejected + [(int(i), RejectReason.UNKNOWN_NODE) for i in np.flatnonzero(unknown_mask)])
        for _, reason in rejected:
            if reason is not RejectReason.UNKNOWN_NODE:
                self.rejected_total[reason.value] = self.rejected_total.get(reason.value, 0) + 1
        return valid & (idx >= 0), idx, rejected, unknown

    def _touch(self, node: np.ndarray, ts: np.ndarray) -> None:
        """Advance each node's ``last_seen`` to its newest timestamp in a batch."""
        last = np.full(len(self.node_ids), -np.inf)
        np.maximum.at(last, node, ts)
        self.a["last_seen"] = np.fmax(self.a["last_seen"], np.where(np.isfinite(last), last, np.nan))

    @staticmethod
    def _node_time_order(keep: np.ndarray, idx: np.ndarray, ts: np.ndarray) -> np.ndarray:
        """Positions of the kept rows grouped by node, in time order within each node: the order every
        vectorised update expects, computed once per batch (then one copy carries node indices,
        far cheaper to move than names)."""
        order = np.flatnonzero(keep)
        order = order[np.argsort(ts[order], kind="stable")]
        by_node = node_order(idx[order])
        return order if by_node is None else order[by_node]

    def _ema_clip(self, s: str) -> tuple[float, float] | None:
        """The bounds a sample of signal ``s`` is clipped to before it enters a node's EMA:
        ``baseline / ema_clip .. baseline * ema_clip`` of the last evaluation; none before the group
        has a baseline (ingest's own bounds on every number still hold then)."""
        base = self._last.get(f"baseline:{s}", math.nan)
        if not (math.isfinite(base) and base > 0):
            return None
        c = self.thresholds.ema_clip
        return base / c, base * c

    def _evidence_signal(self) -> str | None:
        """The signal the evidence CUSUM follows: decode once its baseline exists, else norm (robust
        mode only; seed mode has no evidence)."""
        if self.thresholds.baseline_mode != "robust":
            return None
        return "decode" if math.isfinite(self._last.get("baseline:decode", math.nan)) else "norm"

    def _add_evidence(self, node: np.ndarray, v: np.ndarray, s: str, sigma: float | np.ndarray | None = None) -> None:
        """Feed each sample's excess over the degrade materiality line into its node's CUSUM, on the
        signal that decides (decode when the gateway logs TTFT or streams), against the last tick's
        baseline, in units of ``sigma`` (default: the group's per-request spread of ``s``; per sample
        when an array). ``node`` is grouped by node, time order within."""
        t = self.thresholds
        base = self._last.get(f"baseline:{s}", math.nan)
        if sigma is None:
            sigma = self._last.get(f"request_rel_sd:{s}", math.nan)
        sigma = np.broadcast_to(np.asarray(sigma, dtype=np.float64), v.shape)
        if not (math.isfinite(base) and base > 0):
            return
        ok = np.isfinite(v) & (v > 0) & np.isfinite(sigma) & (sigma > 0)
        x = excess_over_line(v[ok], base, t.degrade_materiality, sigma[ok])
        self.a["evidence"] = cusum_update(
            self.a["evidence"], node[ok], x, allowance=t.evidence_allowance,
            cap=t.degrade_evidence / t.degrade_persistence + t.evidence_allowance,
        )

    def _signals(self, b: SampleBatch) -> dict[str, np.ndarray]:
        """Per-request signals. ``norm`` is NaN until the cost model is fitted (learned mode)."""
        t = self.thresholds
        if t.normalization == "seed":
            return {"norm": seed_norm(b, t.seed_prompt_weight), "prefill": prefill_per_token(b), "decode": decode_per_token(b)}
        norm = np.full(len(b), np.nan)
        if self._fit_norm is not None:
            pred = self._fit_norm.predict(np.column_stack([b.prompt_tokens, b.completion_tokens]))
            norm = b.total_ms / np.maximum(pred, 1e-6)
        prefill = np.full(len(b), np.nan)
        if self._fit_prefill is not None:
            pred = self._fit_prefill.predict(b.prompt_tokens[:, None])
            prefill = b.ttft_ms / np.maximum(pred, 1e-6)
        return {"norm": norm, "prefill": prefill, "decode": decode_per_token(b)}

    def _reservoir_add(self, b: SampleBatch) -> None:
        self._res.add(p=b.prompt_tokens, c=b.completion_tokens, t=b.total_ms, f=b.ttft_ms)

    def _refit(self, now: float | None = None) -> None:
        if self._res.filled < self.thresholds.cost_model_min_samples:
            return
        if now is not None:
            if now - self._last.get("fit_at", -math.inf) < self.thresholds.cost_model_refit_s:
                return
            self._last["fit_at"] = now
        r = self._res.rows()
        p, c, t, f = r["p"], r["c"], r["t"], r["f"]
        fit = fit_cost_model(np.column_stack([p, c]), t, start=self._fit_norm)
        if fit is not None:
            self._fit_norm = fit
        has_ttft = np.isfinite(f)
        if has_ttft.sum() >= self.thresholds.cost_model_min_samples:
            fit_p = fit_cost_model(p[has_ttft][:, None], f[has_ttft], start=self._fit_prefill)
            if fit_p is not None:
                self._fit_prefill = fit_p

    @property
    def cost_model(self) -> CostModel | None:
        """The fitted total-latency model (coefficients: ms/prompt token, ms/output token, ms)."""
        return self._fit_norm

    # ---------------------------------------------------------------------------------- evaluation
    def evaluate(self, now: float) -> Evaluation:
        """One tick: decide every node's state and weight at time ``now`` (epoch seconds)."""
        t = self.thresholds
        a = self.a
        n = len(self.node_ids)
        self._refit(now)
        moves: list[tuple[int, NodeState, NodeState, Reason, str]] = []
        moved = np.zeros(n, dtype=bool)

        def move(mask: np.ndarray, to: NodeState, reason: Reason, detail: str = "") -> None:
            # One record per edge taken: a node may take two edges in one tick (expiry, then probe).
            mask = mask & (a["state"] != to)
            for i in np.flatnonzero(mask):
                moves.append((int(i), NodeState(int(a["state"][i])), to, reason, detail))
            a["state"][mask] = to
            moved[mask] = True

        # Overrides that expired.
        expired = np.isfinite(a["override_until"]) & (a["override_until"] <= now)
        fq = expired & (a["state"] == S.FORCED_QUARANTINE)
        if fq.any():
            # Back under the detector's control, which may only hold nodes out within the cap.
            cap = math.floor(t.max_quarantine_fraction * n + 1e-9)
            held = int(_HELD_OUT[a["state"]].sum())
            held -= int((a["state"] == S.FORCED_QUARANTINE).sum())
            keep = np.flatnonzero(fq)[: max(cap - held, 0)]
            stay = np.zeros(n, dtype=bool)
            stay[keep] = True
            a["next_probe"][stay] = now
            move(stay, S.QUARANTINED, Reason.OVERRIDE_EXPIRED, "override expired: probing before restore")
            a["healthy_since"][fq & ~stay] = now
            move(fq & ~stay, S.HEALTHY, Reason.OVERRIDE_EXPIRED, "override expired; safeguard cap full")
        move(expired & (a["state"] == S.FORCED_ACTIVE), S.HEALTHY, Reason.OVERRIDE_EXPIRED)
        a["override_until"][expired] = np.nan
        pin_expired = np.isfinite(a["pin_until"]) & (a["pin_until"] <= now)
        a["pin"][pin_expired] = np.nan
        a["pin_until"][pin_expired] = np.nan

        # Warm-up done.
        warmed = (a["state"] == S.WARMING) & (a["warm_samples"] >= t.warmup_samples)
        a["healthy_since"][warmed] = now
        # Requests dispatched during warm-up still complete slowly after it: for one more warm-up's
        # worth of samples the node may be degraded (reversible) but not quarantined on latency.
        a["grace"][warmed] = t.warmup_samples
        move(warmed, S.HEALTHY, Reason.WARMED_UP)

        # Per-signal peer baseline and Z.
        state = a["state"]
        fresh = np.isfinite(a["last_seen"]) & (a["last_seen"] >= now - t.stale_after_s)
        out = _OUT[state]
        z_rows, ema_rows, base_d, spread_d, peers_d = [], [], {}, {}, {}
        for s in SIGNALS:
            e = self.ewma[s]
            if t.baseline_mode == "seed":
                pb = seed_zscores(e.mean, e.count, out)
            else:
                judged = fresh & (e.count > t.min_samples) & ~out & (state != S.WARMING)
                judged &= ~_FORCED[state]
                eligible = judged & _BASELINE[state]
                pb = robust_zscores(e.mean, judged, eligible, min_peers=t.min_peers, spread_floor=t.spread_floor)
            z_rows.append(pb.z)
            ema_rows.append(np.where(e.count > 0, e.mean, np.nan))
            base_d[s], spread_d[s], peers_d[s] = pb.baseline, pb.spread, pb.peers
            self._last[f"baseline:{s}"] = pb.baseline
            self._last[f"spread:{s}"] = pb.spread
            # Per-request spread (a canary probe is one request, not an EMA): median EW sd of peers.
            if s != "prefill" and t.baseline_mode == "robust" and pb.peers:
                sd = np.sqrt(e.variance()[eligible])
                if s == "norm":
                    self._last[f"request_sd:{s}"] = float(np.median(sd))
                # Per-request relative spread, for the evidence CUSUM (floored like the peer spread).
                rel = float(np.median(sd / e.mean[eligible]))
                self._last[f"request_rel_sd:{s}"] = max(rel, t.spread_floor)
        z_stack = np.vstack(z_rows) if n else np.zeros((len(SIGNALS), 0))
        score, which = _nan_max(z_stack)
        base_arr = np.array([base_d[s] for s in SIGNALS])
        ema_stack = np.vstack(ema_rows) if n else np.zeros((len(SIGNALS), 0))
        with np.errstate(invalid="ignore", divide="ignore"):
            excess = np.where(which >= 0, ema_stack[np.maximum(which, 0), np.arange(n)] / base_arr[np.maximum(which, 0)], np.nan)
        if t.baseline_mode == "seed":
            excess = np.where(np.isnan(excess), np.nan, np.inf)  # the seed has no materiality floor

        # Tail ratio and cross-node P50, once per window.
        if now - self._last_tail_at >= t.tail_window_s:
            self._last_tail_at = now
            q = self.window.percentiles((50.0, 99.0))
            a["p50"], a["p99"] = q[0], q[1]
            a["tail"], a["tail_windows"] = tail_step(
                a["tail"], a["tail_windows"], q[0], q[1], self.window.filled,
                min_samples=t.tail_min_samples, ratio=t.tail_ratio, windows=t.tail_windows,
            )
            enough = self.window.filled >= t.tail_min_samples
            peers = _BASELINE[state] & fresh
            a["cross_slow"] = cross_p50_slow(q[0], peers, enough, factor=t.cross_p50_ratio).astype(np.int8)
        tail_bad = a["tail"] == TailStatus.UNHEALTHY
        cross_bad = a["cross_slow"].astype(bool)

        # Errors.
        err_eject = a["consec_err"] >= t.consecutive_errors
        sr_bad = np.zeros(n, dtype=bool)
        if now - self._interval_started >= t.error_interval_s:
            sr_bad = success_rate_outliers(
                a["int_requests"], a["int_success"], min_hosts=t.success_rate_min_hosts,
                min_requests=t.success_rate_min_requests, stdev_factor=t.success_rate_stdev,
            )
            a["int_requests"][:] = 0
            a["int_success"][:] = 0
            self._interval_started = now

        # Hard evidence must be queue-free. TTFT and total latency include the wait for a batch slot,
        # and near saturation a node's queue grows by chance; quarantining it moves its load onto
        # peers whose queues then grow: a cascade that a healthy fleet at 70% load does not survive.
        # The per-token decode time is measured after the queue, so when it is known it alone decides
        # quarantine (every gray fault we model shows in it); ``norm`` decides only where the gateway
        # logs no TTFT. Degrading (reversible, capacity kept) still uses every signal.
        # Group level: a group whose gateway logs TTFT judges decode only; a node without enough
        # decode samples yet waits instead of being judged on its queue-laden total latency.
        dec = SIGNALS.index("decode")
        has_dec = np.full(n, math.isfinite(base_d["decode"]))
        with np.errstate(invalid="ignore", divide="ignore"):
            dec_excess = ema_stack[dec] / base_arr[dec] if t.baseline_mode == "robust" else np.full(n, np.inf)
        if t.baseline_mode == "seed":  # seed 000 judges its one signal as it is
            has_dec = np.zeros(n, dtype=bool)
        q_score = np.where(has_dec, z_stack[dec], score)
        q_excess = np.where(has_dec, dec_excess, excess)
        q_which = np.where(has_dec & np.isfinite(q_score), dec, np.where(has_dec, -1, which))
        tail_bad &= ~has_dec | (dec_excess >= t.degrade_materiality)
        cross_bad &= ~has_dec | (dec_excess >= t.degrade_materiality)
        # Without TTFT the only latency is queue-laden, and near saturation a node's queue grows by
        # chance: quarantining it pushes its load onto peers whose queues then grow (in the simulator's
        # healthy 64-node hour at up to 1.4x load: 173 false quarantines). A slow GPU stays slow once
        # its queue has drained; a queue does not. So a queue-laden signal quarantines only on requests
        # dispatched queue_drain_s after the node's weight was cut, and the tail tests only on a node
        # cut that long ago and still over the degrade line.
        queue_laden = ~has_dec & (t.baseline_mode == "robust")
        new = np.where(queue_laden, a["new_drained"], a["new_samples"])
        cut_long = np.isfinite(a["cut_at"]) & (now - a["cut_at"] >= t.queue_drain_s)
        drained_over = cut_long & np.isfinite(q_score) & (q_score >= t.degrade_z) & (
            q_excess >= t.degrade_materiality)
        tail_bad &= ~queue_laden | drained_over
        cross_bad &= ~queue_laden | drained_over

        # Z persistence: samples at or above the quarantine line, as a leaky count rather than a run.
        # A request already running at the onset completes only partly slowed and dips the EMA once;
        # restarting the count for it would throw away the evidence before it. Each sample under the
        # line takes one back, so a node that is over the line half the time or less never gets there.
        over_q = np.isfinite(q_score) & (q_score >= t.quarantine_z) & (q_excess >= t.quarantine_materiality)
        a["over_q"] = np.where(over_q, a["over_q"] + new, np.maximum(a["over_q"] - new, 0))
        # ...and over enough evaluations: one tick can bring hundreds of samples of a busy node, and
        # the EMA at its end says nothing about how many of them were over the line (seed 000: 3).
        seen = new > 0
        a["over_q_evals"] = np.where(seen & over_q, a["over_q_evals"] + 1,
                                     np.where(seen, np.maximum(a["over_q_evals"] - 1, 0), a["over_q_evals"]))
        z_sustained = (a["over_q"] >= t.quarantine_persistence) & (
            a["over_q_evals"] >= t.quarantine_min_evaluations
        )
        over_d = np.isfinite(q_score) & (q_score >= t.degrade_z) & (q_excess >= t.degrade_materiality)
        # A weight cut needs more than the EMA over the line, unless the evidence is already of
        # quarantine strength: a one-tick spike (a CPU-starved host, a GC pause) moves an EMA too.
        # Robust mode asks the node's sequential evidence of being over the materiality line (a
        # steadily 12%-slower node whose EMA wanders over a 15% line is not cut; the CUSUM's
        # per-request cap makes degrade_persistence the fewest samples that reach it); seed mode,
        # which has no materiality, asks for degrade_persistence samples in a row.
        a["over_d"] = np.where(over_d, a["over_d"] + a["new_samples"], 0)
        if t.baseline_mode == "robust":
            # Flap damping (as BGP's, RFC 2439): each cut the node came back from since it was last
            # healthy for backoff_cap_s doubles the evidence the next one needs. A node that sits on
            # the line (14% slower hardware, its speed moving with its load) is otherwise cut and
            # restored every few seconds; a real fault still climbs the doubled line in a few samples.
            # (tolerance: p capped increments of h/p sum to a hair under h in floating point)
            held = a["evidence"] >= _evidence_line(t, a["flaps"]) * (1 - 1e-9)
        else:
            held = a["over_d"] >= t.degrade_persistence
        degrade_now = over_d & (held | over_q)
        # Leaving DEGRADED needs a clear margin (hysteresis), or the node flaps at the line.
        still_d = np.isfinite(q_score) & (q_score >= t.degrade_z - t.degrade_hysteresis) & (
            q_excess >= 1.0 + (t.degrade_materiality - 1.0) / 2
        )

        # Candidates for leaving service, by cause (errors first: they are unambiguous).
        active = _ACTIVE[a["state"]]
        cause = np.full(n, -1, dtype=np.int8)
        causes = [
            (err_eject, Reason.CONSECUTIVE_ERRORS),
            (sr_bad, Reason.SUCCESS_RATE),
            (z_sustained, Reason.Z_QUARANTINE),
            (tail_bad, Reason.TAIL_RATIO),
            (cross_bad, Reason.CROSS_P50),
        ]
        for k, (mask, _) in enumerate(causes):
            cause[(cause < 0) & mask] = k
        cause[(a["grace"] > 0) & (cause >= 2)] = -1  # latency causes wait out the post-warm-up grace
        want = active & (cause >= 0)

        # Safeguard: never more than max_quarantine_fraction of the group out (or pending).
        cap = math.floor(t.max_quarantine_fraction * n + 1e-9)
        held = int(_HELD_OUT[a["state"]].sum())
        slots = max(cap - held, 0)
        cand = np.flatnonzero(want)
        rank_key = np.where(cause[cand] <= 1, np.inf, np.nan_to_num(q_score[cand], nan=0.0))
        cand = cand[np.argsort(-rank_key, kind="stable")]
        allowed, blocked = cand[:slots], cand[slots:]
        safeguard_reason = None
        if len(blocked):
            safeguard_reason = (
                f"detector wants {len(cand)} more node(s) out of service, but {held} of {n} already are "
                f"and the cap is {cap} ({t.max_quarantine_fraction:.0%}); holding "
                f"{len(blocked)} node(s) at the floor weight: a group-wide slowdown is not a node fault"
            )
        for i in allowed:
            reason = causes[cause[i]][1]
            detail = _detail(reason, a, i, t)
            if t.require_approval:
                a["pending_since"][i] = now
                move(np.arange(n) == i, S.PENDING_APPROVAL, reason, f"{detail}; awaiting operator approval")
            else:
                self._enter_quarantine(i, now)
                move(np.arange(n) == i, S.QUARANTINED, reason, detail)
        blocked_mask = np.zeros(n, dtype=bool)
        blocked_mask[blocked] = True
        move(blocked_mask & (a["state"] == S.HEALTHY), S.DEGRADED, Reason.Z_DEGRADE, "safeguard: held at floor weight")

        # Soft degrade and its way back.
        state = a["state"]
        to_deg = (state == S.HEALTHY) & degrade_now
        move(to_deg, S.DEGRADED, Reason.Z_DEGRADE)
        back = (state == S.DEGRADED) & ~still_d & ~blocked_mask & ~moved
        a["flaps"][back] += 1
        a["evidence"][back] = 0.0  # back under the line: a new cut needs new evidence
        a["healthy_since"][back] = now
        move(back, S.HEALTHY, Reason.Z_RECOVERED)
        cleared = (state == S.PENDING_APPROVAL) & ~over_d & (cause < 0)
        a["pending_since"][cleared] = np.nan
        move(cleared, S.HEALTHY, Reason.CONDITION_CLEARED)

        # Recovering: a bad step sends the node back; a good one advances the restore.
        rec = a["state"] == S.RECOVERING
        rec_judged = rec & (self.ewma["norm"].count > t.min_samples)
        bad_now = rec & (z_sustained | err_eject | (cause == 1))
        step_over = rec & (now - a["step_started"] >= t.recovery_step_s)
        bad_step = bad_now | (step_over & rec_judged & over_d)
        for i in np.flatnonzero(bad_step):
            self._enter_quarantine(i, now)
            interval = a["next_probe"][i] - now
            move(np.arange(n) == i, S.QUARANTINED, Reason.RECOVERY_STEP_FAILED,
                 f"slow again at restore step {int(a['step'][i]) + 1}; next probe in {interval:g} s")
        advance = step_over & ~bad_step & (rec_judged | (a["new_samples"] == 0))
        a["step"][advance] += 1
        a["step_started"][advance] = now
        done = advance & (a["step"] >= len(t.recovery_steps))
        a["healthy_since"][done] = now
        move(done, S.HEALTHY, Reason.RECOVERED)

        # Ejection backoff decays after a long healthy stretch.
        long_ok = (a["state"] == S.HEALTHY) & (now - a["healthy_since"] >= t.backoff_cap_s)
        a["ejections"][long_ok] = 0
        a["flaps"][long_ok] = 0

        # Canary probes due.
        due = _PROBED[a["state"]] & (a["next_probe"] <= now)
        move(due & (a["state"] == S.QUARANTINED), S.PROBING, Reason.PROBE_DUE)
        a["next_probe"][due] = now + t.canary_interval_s
        probes_due = [self.node_ids[i] for i in np.flatnonzero(due)]

        # Evidence is about a node in service; out of it (or warming) it starts again from nothing.
        a["evidence"][(a["state"] != S.HEALTHY) & (a["state"] != S.DEGRADED)] = 0.0
        # When the node's weight was cut (degraded or held pending approval), for the drain rule.
        cut = (a["state"] == S.DEGRADED) | (a["state"] == S.PENDING_APPROVAL)
        a["cut_at"] = np.where(cut, np.where(np.isfinite(a["cut_at"]), a["cut_at"], now), np.nan)

        # The deciding signal's Z sets the weight, as it ranks the safeguard's candidates: the queue-laden
        # signals' Z (a queue of 3 s reads as Z 600) would floor a node whose GPU is 1.2x slow.
        weights = self._weights(q_score)
        fallback_reason = None
        if n and not (weights > 0).any():
            pick = self._least_slow(q_score)
            weights[pick] = a["base"][pick]
            fallback_reason = (
                f"every node is unavailable; sending traffic to the least slow node "
                f"{self.node_ids[pick]!r} instead of nowhere"
            )
        # Counted in completed requests: streamed rows of a node just out of warm-up come from the
        # slow requests it was given during warm-up, and they stream for a while.
        a["grace"] = np.maximum(a["grace"] - a["new_requests"], 0)
        a["new_samples"][:] = 0
        a["new_requests"][:] = 0
        a["new_drained"][:] = 0
        transitions = self._pending
        self._pending = []
        thr = {k: getattr(t, k) for k in _EXPLAINED}
        for i, src, dst, reason, detail in moves:
            w = int(q_which[i])  # the signal that decided, so the explanation shows the evidence used
            sig = SIGNALS[w] if w >= 0 else None
            transitions.append(
                Transition(
                    node=self.node_ids[i], at=now, from_state=src, to_state=dst, reason=reason.value,
                    signal=sig, z=_f(z_stack[w, i]) if sig else None, baseline=_f(base_d[sig]) if sig else None,
                    spread=_f(spread_d[sig]) if sig else None, ema=_f(ema_stack[w, i]) if sig else None,
                    p50=_f(a["p50"][i]), p99=_f(a["p99"][i]),
                    samples=int(self.ewma[sig].count[i]) if sig else 0, weight=float(weights[i]),
                    detail=detail or _detail(reason, a, i, t), thresholds=thr,
                )
            )
        self._validate_edges(transitions)
        return Evaluation(
            at=now, nodes=self.nodes, states=a["state"].copy(), weights=weights, base_weights=a["base"].copy(),
            z=q_score, z_by_signal=dict(zip(SIGNALS, z_rows, strict=True)),
            ema=dict(zip(SIGNALS, ema_rows, strict=True)), baseline=base_d, spread=spread_d,
            p50=a["p50"].copy(), p99=a["p99"].copy(), counts=self.ewma["norm"].count.copy(),
            transitions=transitions, safeguard=safeguard_reason is not None, safeguard_reason=safeguard_reason,
            fallback=fallback_reason is not None, fallback_reason=fallback_reason, probes_due=probes_due,
            peers=peers_d, evidence=a["evidence"].copy(),
            decision_signal=None if t.baseline_mode == "seed" else SIGNALS[dec] if has_dec.any() else "norm",
        )

    def _weights(self, score: np.ndarray) -> np.ndarray:
        t = self.thresholds
        a = self.a
        base, state = a["base"], a["state"]
        w = base.copy()
        floor = t.min_weight_fraction * base
        deg = state == S.DEGRADED
        factor = np.power(2.0, -(np.nan_to_num(score, nan=t.degrade_z) - t.degrade_z))
        w[deg] = np.clip(base * factor, floor, base)[deg]
        warming = state == S.WARMING
        ramp = t.warmup_min_weight_fraction + (1 - t.warmup_min_weight_fraction) * np.minimum(
            a["warm_samples"] / max(t.warmup_samples, 1), 1.0
        )
        w[warming] = (base * ramp)[warming]
        w[_FLOORED[state]] = floor[_FLOORED[state]]
        w[_OUT[state]] = 0.0
        rec = state == S.RECOVERING
        steps = np.array(t.recovery_steps)
        w[rec] = (base * steps[np.minimum(a["step"], len(steps) - 1)])[rec]
        pinned = np.isfinite(a["pin"])
        w[pinned] = a["pin"][pinned]
        return w

    def _least_slow(self, score: np.ndarray) -> int:
        """The node to keep serving when every node is out: lowest score, forced ones last."""
        key = np.nan_to_num(score, nan=np.inf).copy()
        key[self.a["state"] == S.FORCED_QUARANTINE] = np.inf
        if np.isinf(key).all():
            key = np.nan_to_num(self.ewma["norm"].mean, nan=np.inf)
        return int(np.argmin(key))

    def _enter_quarantine(self, i: int, now: float) -> None:
        t = self.thresholds
        a = self.a
        a["ejections"][i] += 1
        interval = min(t.canary_interval_s * 2.0 ** (a["ejections"][i] - 1), t.backoff_cap_s)
        a["next_probe"][i] = now + interval
        a["passes"][i] = 0
        a["over_q"][i] = 0
        a["over_q_evals"][i] = 0
        a["consec_err"][i] = 0
        a["tail"][i] = TailStatus.INSUFFICIENT
        a["tail_windows"][i] = 0
        a["cross_slow"][i] = 0
        a["pending_since"][i] = np.nan

    def _start_recovery(self, i: int, now: float) -> None:
        # A fresh start: the EMA from before the quarantine describes the fault, not the node now.
        mask = np.arange(len(self.node_ids)) == i
        for e in self.ewma.values():
            e.reset(mask)
        self.window.clear(mask)
        self.a["step"][i] = 0
        self.a["step_started"][i] = now
        self.a["p50"][i] = np.nan
        self.a["p99"][i] = np.nan

    @staticmethod
    def _validate_edges(transitions: Iterable[Transition]) -> None:
        for tr in transitions:
            check_edge(tr.from_state, tr.to_state)

    # ------------------------------------------------------------------------------ canary probes
    def probe_threshold(self) -> float:
        """The largest normalised probe latency that passes: ``baseline + tolerance * sigma``.

        A probe is one request, so ``sigma`` is the larger of the peers' spread and the per-request
        spread of healthy peers (their median EW standard deviation): judging a single request
        against the spread of *averages* fails a healthy node a third of the time.
        """
        t = self.thresholds
        base = self._last.get("baseline:norm", float("nan"))
        spread = max(self._last.get("spread:norm", float("nan")), self._last.get("request_sd:norm", 0.0))
        if not (math.isfinite(base) and math.isfinite(spread)):
            # No peer baseline yet: for the learned ratio "as predicted" is 1.0.
            base = 1.0 if t.normalization == "learned" else float("nan")
            spread = t.spread_floor * base
        return base + t.canary_tolerance_sigma * spread

    def probe_value(
        self, prompt_tokens: float, completion_tokens: float, ttft_ms: float | None, total_ms: float | None
    ) -> float:
        """A probe's latency on the scale it is judged on (``norm``: latency / the group's cost model,
        or the seed's formula in seed normalisation); NaN when it cannot be computed."""
        if total_ms is None or not math.isfinite(total_ms):
            return math.nan
        b = SampleBatch.from_columns(
            node=["probe"], ts=[0.0], prompt_tokens=[prompt_tokens], completion_tokens=[completion_tokens],
            total_ms=[total_ms], ttft_ms=[np.nan if ttft_ms is None else ttft_ms], status=[200],
        )
        return float(self._signals(b)["norm"][0])

    def record_probe(
        self,
        node: str,
        now: float,
        prompt_tokens: float,
        completion_tokens: float,
        ttft_ms: float | None,
        total_ms: float | None,
        ok: bool,
    ) -> bool:
        """Judge one canary probe of a ``PROBING``/``QUARANTINED`` node; returns whether it passed."""
        i = self.index_of(node)
        a = self.a
        src = NodeState(int(a["state"][i]))
        if src not in (S.PROBING, S.QUARANTINED):
            return False
        value = self.probe_value(prompt_tokens, completion_tokens, ttft_ms, total_ms) if ok else math.nan
        limit = self.probe_threshold()
        passed = bool(ok and math.isfinite(value) and value <= limit)
        detail = f"probe normalised latency {value:.3g} vs limit {limit:.3g}" if ok else "probe failed (error/timeout)"
        if passed:
            a["passes"][i] += 1
            if a["passes"][i] >= self.thresholds.canary_passes:
                self._start_recovery(i, now)
                self._set(i, S.RECOVERING, now, Reason.PROBES_PASSED, detail)
        else:
            a["passes"][i] = 0
            a["next_probe"][i] = now + self.thresholds.canary_interval_s
            if src == S.PROBING:
                self._set(i, S.QUARANTINED, now, Reason.PROBE_FAILED, detail)
        return passed

    # ---------------------------------------------------------------------------- operator actions
    def approve(self, node: str, now: float) -> None:
        """Approve a pending quarantine."""
        i = self.index_of(node)
        self._require(i, {S.PENDING_APPROVAL}, "approve")
        self._enter_quarantine(i, now)
        self._set(i, S.QUARANTINED, now, Reason.APPROVED)

    def reject(self, node: str, now: float) -> None:
        """Reject a pending quarantine: the node returns to service; its persistence count restarts."""
        i = self.index_of(node)
        self._require(i, {S.PENDING_APPROVAL}, "reject")
        self.a["over_q"][i] = 0
        self.a["over_q_evals"][i] = 0
        self.a["consec_err"][i] = 0
        self.a["tail"][i] = TailStatus.INSUFFICIENT
        self.a["tail_windows"][i] = 0
        self.a["cross_slow"][i] = 0
        self.a["pending_since"][i] = np.nan
        self._set(i, S.HEALTHY, now, Reason.REJECTED)

    def force_quarantine(self, node: str, now: float, until: float | None = None) -> None:
        i = self.index_of(node)
        self.a["override_until"][i] = np.nan if until is None else until
        if self.a["state"][i] != S.FORCED_QUARANTINE:  # forcing again only moves the expiry
            self._set(i, S.FORCED_QUARANTINE, now, Reason.OPERATOR_QUARANTINE)

    def force_active(self, node: str, now: float, until: float | None = None) -> None:
        i = self.index_of(node)
        self.a["override_until"][i] = np.nan if until is None else until
        if self.a["state"][i] != S.FORCED_ACTIVE:
            self._set(i, S.FORCED_ACTIVE, now, Reason.OPERATOR_ACTIVE)

    def release(self, node: str, now: float) -> None:
        """Return a held node to service at full weight, with fresh statistics."""
        i = self.index_of(node)
        src = NodeState(int(self.a["state"][i]))
        if src in (S.HEALTHY, S.DEGRADED):
            return
        if src == S.PENDING_APPROVAL:
            self.reject(node, now)
            return
        mask = np.arange(len(self.node_ids)) == i
        for e in self.ewma.values():
            e.reset(mask)
        self.window.clear(mask)
        self.a["override_until"][i] = np.nan
        self.a["healthy_since"][i] = now
        self.a["tail"][i] = TailStatus.INSUFFICIENT
        self.a["cross_slow"][i] = 0
        self.a["consec_err"][i] = 0
        self.a["over_q"][i] = 0
        self.a["over_q_evals"][i] = 0
        self.a["warm_samples"][i] = max(self.a["warm_samples"][i], self.thresholds.warmup_samples)
        self._set(i, S.HEALTHY, now, Reason.OPERATOR_RELEASE)

    def pin_weight(self, node: str, weight: float, now: float, until: float | None = None) -> None:
        if not (weight >= 0 and math.isfinite(weight)):
            raise ValueError(f"pinned weight must be a finite number >= 0, got {weight!r}")
        i = self.index_of(node)
        self.a["pin"][i] = weight
        self.a["pin_until"][i] = np.nan if until is None else until

    def unpin(self, node: str) -> None:
        i = self.index_of(node)
        self.a["pin"][i] = np.nan
        self.a["pin_until"][i] = np.nan

    def _require(self, i: int, states: set[NodeState], action: str) -> None:
        cur = NodeState(int(self.a["state"][i]))
        if cur not in states:
            raise ValueError(f"cannot {action} node {self.node_ids[i]!r}: it is {cur.label}")

    def _set(self, i: int, to: NodeState, now: float, reason: Reason, detail: str = "") -> None:
        src = NodeState(int(self.a["state"][i]))
        check_edge(src, to)
        self.a["state"][i] = to
        self._pending.append(
            Transition(
                node=self.node_ids[i], at=now, from_state=src, to_state=to, reason=reason.value,
                detail=detail, samples=int(self.ewma["norm"].count[i]),
                thresholds={k: getattr(self.thresholds, k) for k in _EXPLAINED},
            )
        )

    # ---------------------------------------------------------------------------- serialisation
    def to_bytes(self) -> bytes:
        """Exact snapshot (numpy ``.npz`` + JSON metadata); restore with :meth:`from_bytes`."""
        arrays: dict[str, np.ndarray] = {f"a.{k}": v for k, v in self.a.items()}
        for s, e in self.ewma.items():
            arrays[f"e.{s}.mean"], arrays[f"e.{s}.sq"], arrays[f"e.{s}.count"] = e.mean, e.sq, e.count
        arrays["w.values"], arrays["w.pos"], arrays["w.filled"] = self.window.values, self.window.pos, self.window.filled
        for k, v in self._res.columns.items():
            arrays[f"r.{k}"] = v
        fits = (("norm", self._fit_norm), ("prefill", self._fit_prefill))
        for name, fit in fits:
            if fit is not None:
                arrays[f"fit.{name}"] = fit.coef
        meta = {
            "version": STATE_FORMAT_VERSION,
            "thresholds": self.thresholds.to_dict(),
            "nodes": self.node_ids,
            "res_pos": self._res.pos,
            "res_filled": self._res.filled,
            "last_tail_at": self._last_tail_at,
            "interval_started": self._interval_started,
            "last": self._last,
            "fits": {
                name: [fit.residual_sd, fit.n_samples]
                for name, fit in fits
                if fit is not None
            },
            "pending": [tr.to_dict() for tr in self._pending],
            "rejected_total": self.rejected_total,
            "accepted_total": self.accepted_total,
        }
        buf = io.BytesIO()
        np.savez(buf, meta=np.frombuffer(json.dumps(meta).encode(), dtype=np.uint8), **arrays)
        return buf.getvalue()

    @classmethod
    def from_bytes(cls, data: bytes) -> GroupDetector:
        with np.load(io.BytesIO(data), allow_pickle=False) as z:
            meta = json.loads(z["meta"].tobytes().decode())
            if meta.get("version") != STATE_FORMAT_VERSION:
                raise ValueError(f"unsupported detector state version {meta.get('version')!r}")
            gd = cls(Thresholds.from_dict(meta["thresholds"]))
            gd.node_ids = list(meta["nodes"])
            gd._index = {n: i for i, n in enumerate(gd.node_ids)}
            gd.a = {k[2:]: z[k].copy() for k in z.files if k.startswith("a.")}
            n = len(gd.node_ids)
            for name, dtype in _NODE_ARRAYS.items():  # a snapshot from before a counter was added
                if name not in gd.a:
                    gd.a[name] = np.full(n, np.nan if name in _NAN_ARRAYS else 0, dtype=dtype)
            for s, e in gd.ewma.items():
                e.mean, e.sq, e.count = z[f"e.{s}.mean"].copy(), z[f"e.{s}.sq"].copy(), z[f"e.{s}.count"].copy()
            gd.window.values, gd.window.pos, gd.window.filled = (
                z["w.values"].copy(), z["w.pos"].copy(), z["w.filled"].copy()
            )
            for k in gd._res.columns:
                gd._res.columns[k] = z[f"r.{k}"].copy()
            for name, (sd, count) in meta["fits"].items():
                fit = CostModel(coef=z[f"fit.{name}"].copy(), residual_sd=sd, n_samples=count)
                setattr(gd, f"_fit_{name}", fit)
        gd._res.pos, gd._res.filled = meta["res_pos"], meta["res_filled"]
        gd._last_tail_at, gd._interval_started = meta["last_tail_at"], meta["interval_started"]
        gd._last = meta["last"]
        gd._pending = [_transition_from_dict(d) for d in meta["pending"]]
        gd.rejected_total = meta["rejected_total"]
        gd.accepted_total = meta["accepted_total"]
        return gd


# Per-node arrays (name -> dtype). NaN-initialised ones are listed in _NAN_ARRAYS.
_NODE_ARRAYS: dict[str, Any] = {
    "base": np.float64,
    "state": np.int8,
    "joined": np.float64,
    "last_seen": np.float64,
    "warm_samples": np.int64,
    "new_samples": np.int64,
    "new_requests": np.int64,
    "new_drained": np.int64,
    "cut_at": np.float64,
    "over_q": np.int64,
    "evidence": np.float64,
    "consec_err": np.int64,
    "int_requests": np.int64,
    "int_success": np.int64,
    "tail": np.int8,
    "tail_windows": np.int64,
    "cross_slow": np.int8,
    "p50": np.float64,
    "p99": np.float64,
    "next_probe": np.float64,
    "passes": np.int64,
    "ejections": np.int64,
    "step": np.int64,
    "step_started": np.float64,
    "pending_since": np.float64,
    "healthy_since": np.float64,
    "override_until": np.float64,
    "pin": np.float64,
    "pin_until": np.float64,
    "grace": np.int64,
    "over_d": np.int64,
    "over_q_evals": np.int64,
    "flaps": np.int64,
}
_NAN_ARRAYS = frozenset(
    {"last_seen", "p50", "p99", "next_probe", "step_started", "pending_since", "override_until", "pin", "pin_until",
     "cut_at"}
)


def _f(v: float) -> float | None:
    v = float(v)
    return None if math.isnan(v) else v


def _detail(reason: Reason, a: dict[str, np.ndarray], i: int, t: Thresholds) -> str:
    if reason is Reason.CONSECUTIVE_ERRORS:
        return f"{int(a['consec_err'][i])} errors in a row (limit {t.consecutive_errors})"
    if reason is Reason.SUCCESS_RATE:
        return f"success rate below mean - {t.success_rate_stdev} stdev of its peers"
    if reason is Reason.TAIL_RATIO:
        return f"P99/P50 above {t.tail_ratio} for {int(a['tail_windows'][i])} windows of {t.tail_window_s:g} s"
    if reason is Reason.CROSS_P50:
        return f"P50 above {t.cross_p50_ratio}x the peers' median P50"
    if reason is Reason.Z_QUARANTINE:
        return f"Z >= {t.quarantine_z} for {int(a['over_q'][i])} samples (limit {t.quarantine_persistence})"
    if reason is Reason.Z_DEGRADE and t.baseline_mode == "robust":
        return (f"evidence {float(a['evidence'][i]):.1f} sd over {t.degrade_materiality:g}x the baseline "
                f"(cut at {float(_evidence_line(t, a['flaps'][i])):g}, or at once at quarantine strength)")
    return ""


def _evidence_line(t: Thresholds, flaps: np.ndarray | np.integer) -> np.ndarray:
    """The evidence a weight cut needs: ``degrade_evidence * 2^flaps`` (flap damping, capped)."""
    return t.degrade_evidence * np.power(2.0, np.minimum(flaps, MAX_FLAP_DOUBLINGS))


def _transition_from_dict(d: dict[str, Any]) -> Transition:
    d = dict(d)
    d["from_state"] = NodeState.from_label(d["from_state"])
    d["to_state"] = NodeState.from_label(d["to_state"])
    return Transition(**d)


__all__ = ["SIGNALS", "Evaluation", "GroupDetector", "IngestResult", "PeerBaseline"]
