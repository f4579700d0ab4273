"""The Z-score detector: each node's EMA of each signal against the peer baseline, and which signal
decides.

Per signal, the baseline is the median of the EMAs of the nodes that may form it (healthy or degraded,
warmed up, fresh, with more than ``min_samples`` samples, not forced) and ``Z = (EMA - baseline) /
spread`` (:mod:`detector.baseline`: robust, or seed 000's population Z in ``baseline_mode="seed"``).

**The deciding signal** is one per group, stated here and used by everything that weighs, ranks or
ejects a node on latency:

- ``decode`` once it has a peer baseline (the gateway logs TTFT or the model servers stream): the
  per-token time is measured after the wait for a batch slot, so it is queue-free. TTFT and total
  latency include the queue, and near saturation a node's queue grows by chance: cutting it on them
  pushes its load onto peers whose queues then grow (a cascade a healthy fleet at 70% load does not
  survive). A node without enough decode samples yet waits rather than be judged on its queue;
- otherwise the largest Z over ``norm`` and ``prefill`` (``queue_laden``): then a node is cut on it,
  but quarantined only on requests dispatched ``queue_drain_s`` after its weight was cut (a slow GPU
  stays slow once its queue has drained; a queue does not), and the tail and cross-P50 verdicts count
  only for a node cut that long ago and still over the degrade line;
- seed mode judges its one signal as it is.

``excess`` is the deciding signal's ``EMA / baseline``: the materiality lines (1.15x to degrade, 1.5x
to quarantine) keep a very uniform group from turning a 1% difference into a huge Z.

**How much** a node judged slow is cut is the one place where the queue counts: a degraded node's
weight follows the largest Z of any signal (``weight_score``), so a slow GPU that has also built a
queue gets little new work until the queue drains, as a join-shortest-queue balancer would do. A queue
alone never cuts a node (the decision above is queue-free), so this cannot start a cascade. Measured
in the simulator, weighing by the decode Z alone raised the healthy 64-node hour's false degrades from
44 to 112 and, in ``warmup-scaleout-12``, the TTFT P99 from 1.2 s to 3.4 s (a node back from warm-up
kept being fed into its backlog).

The detector also feeds each node's sequential evidence (:mod:`detector.evidence`) on the deciding
signal as samples arrive; the ejection layer gates a weight cut on it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from detector.baseline import robust_zscores, seed_zscores
from detector.detectors.verdict import Verdict
from detector.evidence import cusum_update, excess_over_line
from detector.moves import lookup
from detector.nodes import NodeArrays
from detector.signals import SIGNALS, SignalModel
from detector.states import BASELINE_STATES, OUT_OF_SERVICE, NodeState
from detector.thresholds import Thresholds

S = NodeState
_OUT = lookup(OUT_OF_SERVICE)
_BASELINE = lookup(BASELINE_STATES)
_FORCED = lookup((S.FORCED_ACTIVE, S.FORCED_QUARANTINE))
DECODE = SIGNALS.index("decode")


@dataclass
class PeerView:
    """Every signal's Z, EMA, baseline, spread and peer count, stacked ``(signal, node)``."""

    z: np.ndarray
    ema: np.ndarray
    baseline: dict[str, float]
    spread: dict[str, float]
    peers: dict[str, int]
    fresh: np.ndarray  # nodes seen within stale_after_s


def fresh_nodes(a: NodeArrays, t: Thresholds, now: float) -> np.ndarray:
    return np.isfinite(a.last_seen) & (a.last_seen >= now - t.stale_after_s)


def peer_view(sig: SignalModel, a: NodeArrays, t: Thresholds, now: float, last: dict[str, float]) -> PeerView:
    """Baselines and Z of every signal. Records in ``last`` what later samples are judged against:
    each baseline and spread, and the per-request spread of healthy peers (the median EW sd: a canary
    probe is one request, and the evidence CUSUM counts in per-request units)."""
    n = len(a)
    state = a.state
    fresh = fresh_nodes(a, t, now)
    out = _OUT[state]
    z_rows, ema_rows, base, spread, peers = [], [], {}, {}, {}
    for s in SIGNALS:
        e = sig.ewma[s]
        if t.baseline_mode == "seed":
            pb = seed_zscores(e.mean, e.count, out)
        else:
            judged = fresh & (e.count > t.min_samples) & ~out & (state != S.WARMING) & ~_FORCED[state]
            eligible = judged & _BASELINE[state]
            pb = robust_zscores(e.mean, judged, eligible, min_peers=t.min_peers, spread_floor=t.spread_floor)
        z_rows.append(pb.z)
        ema_rows.append(np.where(e.count > 0, e.mean, np.nan))
        base[s], spread[s], peers[s] = pb.baseline, pb.spread, pb.peers
        last[f"baseline:{s}"] = pb.baseline
        last[f"spread:{s}"] = pb.spread
        if s != "prefill" and t.baseline_mode == "robust" and pb.peers:
            sd = np.sqrt(e.variance()[eligible])
            if s == "norm":
                last[f"request_sd:{s}"] = float(np.median(sd))
            rel = float(np.median(sd / e.mean[eligible]))
            last[f"request_rel_sd:{s}"] = max(rel, t.spread_floor)
    empty = np.zeros((len(SIGNALS), 0))
    return PeerView(z=np.vstack(z_rows) if n else empty, ema=np.vstack(ema_rows) if n else empty,
                    baseline=base, spread=spread, peers=peers, fresh=fresh)


def _nan_max(stack: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Row-wise max over signals ignoring NaN, and which signal gave it (-1 when all NaN)."""
    filled = np.where(np.isnan(stack), -np.inf, stack)
    arg = filled.argmax(axis=0)
    best = filled[arg, np.arange(stack.shape[1])]
    has = np.isfinite(best)
    return np.where(has, best, np.nan), np.where(has, arg, -1)


@dataclass
class Decision:
    """The deciding signal per node (see the module docstring): its Z (``score``, which decides and
    ranks the safeguard's candidates), its ``excess`` over the baseline and its index in
    :data:`~detector.signals.SIGNALS` (``which``, -1: none yet)."""

    score: np.ndarray
    excess: np.ndarray
    which: np.ndarray
    weight_score: np.ndarray  # the largest Z of any signal: how far a degraded node's weight is cut
    queue_free: np.ndarray  # judged on decode
    decode_excess: np.ndarray
    queue_laden: np.ndarray  # judged on a signal that includes the queue
    new: np.ndarray  # this tick's samples that count toward persistence
    drained_over: np.ndarray  # cut queue_drain_s ago and still over the degrade line
    name: str | None  # the group's deciding signal, for the explanation

    def gate(self, v: Verdict, t: Thresholds) -> Verdict:
        """A latency verdict (tail, cross-P50) stands only where the deciding signal agrees: over the
        degrade materiality on decode, or, queue-laden, for a node whose queue has drained."""
        keep = (~self.queue_free | (self.decode_excess >= t.degrade_materiality))
        keep &= ~self.queue_laden | self.drained_over
        return Verdict(v.reason, v.eject & keep)


def decide(view: PeerView, a: NodeArrays, t: Thresholds, now: float) -> Decision:
    n = len(a)
    score, which = _nan_max(view.z)
    base = np.array([view.baseline[s] for s in SIGNALS])
    cols = np.arange(n)
    with np.errstate(invalid="ignore", divide="ignore"):
        excess = np.where(which >= 0, view.ema[np.maximum(which, 0), cols] / base[np.maximum(which, 0)], np.nan)
        dec_excess = view.ema[DECODE] / base[DECODE] if t.baseline_mode == "robust" else np.full(n, np.inf)
    if t.baseline_mode == "seed":
        excess = np.where(np.isnan(excess), np.nan, np.inf)  # the seed has no materiality floor
        queue_free = np.zeros(n, dtype=bool)  # seed 000 judges its one signal as it is
    else:
        queue_free = np.full(n, math.isfinite(view.baseline["decode"]))
    q_score = np.where(queue_free, view.z[DECODE], score)
    q_excess = np.where(queue_free, dec_excess, excess)
    q_which = np.where(queue_free & np.isfinite(q_score), DECODE, np.where(queue_free, -1, which))
    queue_laden = ~queue_free & (t.baseline_mode == "robust")
    cut_long = np.isfinite(a.cut_at) & (now - a.cut_at >= t.queue_drain_s)
    drained_over = cut_long & np.isfinite(q_score) & (q_score >= t.degrade_z) & (q_excess >= t.degrade_materiality)
    name = None if t.baseline_mode == "seed" else "decode" if queue_free.any() else "norm"
    return Decision(score=q_score, excess=q_excess, which=q_which, weight_score=score, queue_free=queue_free,
                    decode_excess=dec_excess, queue_laden=queue_laden,
                    new=np.where(queue_laden, a.new_drained, a.new_samples), drained_over=drained_over, name=name)


@dataclass
class Lines:
    """Where each node's deciding signal stands against the lines, this tick."""

    over_q: np.ndarray  # at quarantine strength (Z and materiality)
    over_d: np.ndarray  # over the degrade line
    still_d: np.ndarray  # not clearly back under it (hysteresis: leaving DEGRADED needs a margin)


def lines(d: Decision, t: Thresholds) -> Lines:
    finite = np.isfinite(d.score)
    return Lines(
        over_q=finite & (d.score >= t.quarantine_z) & (d.excess >= t.quarantine_materiality),
        over_d=finite & (d.score >= t.degrade_z) & (d.excess >= t.degrade_materiality),
        still_d=finite & (d.score >= t.degrade_z - t.degrade_hysteresis)
        & (d.excess >= 1.0 + (t.degrade_materiality - 1.0) / 2),
    )


# --- sequential evidence on the deciding signal ------------------------------------------------------


def evidence_signal(t: Thresholds, last: dict[str, float]) -> str | None:
    """The signal the evidence CUSUM follows: decode once its baseline exists, else norm (robust mode
    only; seed mode has no evidence)."""
    if t.baseline_mode != "robust":
        return None
    return "decode" if math.isfinite(last.get("baseline:decode", math.nan)) else "norm"


def feed_evidence(a: NodeArrays, t: Thresholds, last: dict[str, float], node: np.ndarray, v: np.ndarray, s: str,
                  sigma: float | np.ndarray | None = None) -> None:
    """Feed each sample's excess over the degrade materiality line into its node's CUSUM, against the
    last tick's baseline, in units of ``sigma`` (default: the group's per-request spread of ``s``;
    per sample when an array). ``node`` is grouped by node, time order within."""
    base = last.get(f"baseline:{s}", math.nan)
    if sigma is None:
        sigma = last.get(f"request_rel_sd:{s}", math.nan)
    sigma = np.broadcast_to(np.asarray(sigma, dtype=np.float64), v.shape)
    if not (math.isfinite(base) and base > 0):
        return
    ok = np.isfinite(v) & (v > 0) & np.isfinite(sigma) & (sigma > 0)
    x = excess_over_line(v[ok], base, t.degrade_materiality, sigma[ok])
    a.evidence = cusum_update(a.evidence, node[ok], x, allowance=t.evidence_allowance,
                              cap=t.degrade_evidence / t.degrade_persistence + t.evidence_allowance)
