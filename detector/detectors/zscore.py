"""The Z-score detector: each node's EMA of each signal against the peer baseline, and which signal
decides.

Per signal, the baseline is the median of the EMAs of the nodes that may form it (healthy or degraded,
warmed up, fresh, with more than ``min_samples`` samples, not forced) and ``Z = (EMA - baseline) /
spread`` (:mod:`detector.baseline`: robust, or seed 000's population Z in ``baseline_mode="seed"``).

**The deciding signal** is stated here and used by everything that weighs, ranks or ejects a node on
latency:

- the **queue-free** signals (:data:`~detector.signals.QUEUE_FREE`) once one has a peer baseline:
  ``decode`` (the gateway logs TTFT or the model servers stream) and ``prefill_time`` (the model
  server's own prefill histogram, or TTFT minus queue time where the log has both). Both are measured
  after the wait for a batch slot. A node is judged on the larger of their Z (a fault that slows only
  prefill, as long prompts on a node with a degraded link, is caught without looking at the queue).
  Prefill time cuts a node's weight on its evidence but is never at quarantine strength on its own
  (no quarantine, no cut at once on one strong reading; the quarantine lines read the largest Z of
  the other signals, so a prefill time further out than a decode at quarantine strength does not
  hide it: ``Decision.quarantine_z``): under chunked prefill a request's prefill
  shares each step's token budget with the decodes and with other prefills, so it also grows with
  load (in the simulator's vLLM engine, enough to quarantine healthy nodes), so it takes part only
  near its own, higher cut line (``prefill_materiality``, 1.5x; under it decode decides);
  TTFT and total latency include the queue, and near saturation a node's queue grows by chance:
  cutting it on them pushes its load onto peers whose queues then grow (a cascade a healthy fleet at
  70% load does not survive). A node without enough queue-free samples yet waits rather than be
  judged on its queue;
- otherwise the largest Z over ``norm`` and ``prefill`` (``queue_laden``): then a node is cut on it,
  but quarantined only on requests dispatched ``queue_drain_s`` after its weight was cut (a slow GPU
  stays slow once its queue has drained; a queue does not), and the tail and cross-P50 verdicts count
  only for a node cut that long ago and still over the degrade line;
- seed mode judges its one signal as it is.

``excess`` is the deciding signal's ``EMA / baseline``: the materiality lines (1.15x to cut on decode,
1.5x to cut on prefill time or to quarantine, :func:`materiality`) keep a very uniform group from
turning a 1% difference into a huge Z.

**How much** a node judged slow is cut is the one place where the queue counts: a degraded node's
weight follows the largest Z of any signal (``Decision.weight_z``), so a slow GPU that has also built a
queue gets little new work until the queue drains, as a join-shortest-queue balancer would do. A queue
alone never cuts a node (the decision above is queue-free), so this cannot start a cascade. Measured
in the simulator, weighing by the decode Z alone raised the healthy 64-node hour's false degrades from
44 to 112 and, in ``warmup-scaleout-12``, the TTFT P99 from 1.2 s to 3.4 s (a node back from warm-up
kept being fed into its backlog).

The detector also feeds each node's sequential evidence (:mod:`detector.evidence`) on each queue-free
signal (or on ``norm`` when there is none) as samples arrive: one CUSUM per queue-free signal
(``evidence``, ``evidence_prefill``); the ejection layer gates a weight cut on the larger
(:func:`evidence`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import numpy as np

from detector.baseline import References, robust_zscores, seed_zscores
from detector.detectors.verdict import Decision, Judging, Lines, PeerView, Verdict
from detector.evidence import cusum_update, excess_over_line
from detector.moves import lookup
from detector.nodes import NodeArrays
from detector.signals import QUEUE_FREE, SIGNALS, SignalModel
from detector.states import BASELINE_STATES, OUT_OF_SERVICE, NodeState, Reason
from detector.thresholds import EXIT_MATERIALITY_FRACTION, Thresholds

S = NodeState
_OUT = lookup(OUT_OF_SERVICE)
_BASELINE = lookup(BASELINE_STATES)
_FORCED = lookup((S.FORCED_ACTIVE, S.FORCED_QUARANTINE))
DECODE = SIGNALS.index("decode")
PREFILL_TIME = SIGNALS.index("prefill_time")


def fresh_nodes(a: NodeArrays, t: Thresholds, now: float) -> np.ndarray:
    return np.isfinite(a.last_seen) & (a.last_seen >= now - t.stale_after_s)


def peer_view(sig: SignalModel, a: NodeArrays, t: Thresholds, now: float, last: References) -> PeerView:
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
        ref = last.at(s)
        ref.baseline, ref.spread = pb.baseline, pb.spread
        if s != "prefill" and t.baseline_mode == "robust" and pb.peers:
            sd = np.sqrt(e.variance()[eligible])
            if s == "norm":
                ref.request_sd = float(np.median(sd))
            rel = float(np.median(sd / e.mean[eligible]))
            ref.request_rel_sd = max(rel, t.spread_floor)
    empty = np.zeros((len(SIGNALS), 0))
    return PeerView(z=np.vstack(z_rows) if n else empty, ema=np.vstack(ema_rows) if n else empty,
                    baseline=base, spread=spread, peers=peers, fresh=fresh)


def nan_max(stack: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Row-wise max over signals ignoring NaN, and which signal gave it (-1 when all NaN or none)."""
    if not len(stack):
        return np.full(stack.shape[1], np.nan), np.full(stack.shape[1], -1)
    filled = np.where(np.isnan(stack), -np.inf, stack)
    arg = filled.argmax(axis=0)
    best = filled[arg, np.arange(stack.shape[1])]
    has = np.isfinite(best)
    return np.where(has, best, np.nan), np.where(has, arg, -1)


def _excess(view: PeerView, base: np.ndarray, which: np.ndarray) -> np.ndarray:
    """Per node: the EMA of signal ``which`` (an index into :data:`SIGNALS`; -1: none) over its
    baseline."""
    with np.errstate(invalid="ignore", divide="ignore"):
        k = np.maximum(which, 0)
        return np.where(which >= 0, view.ema[k, np.arange(len(which))] / base[k], np.nan)


def decide(view: PeerView, a: NodeArrays, t: Thresholds, now: float) -> Decision:
    n = len(a)
    weight_z, top_which = nan_max(view.z)
    base = np.array([view.baseline[s] for s in SIGNALS])
    if t.baseline_mode == "seed":
        # Seed 000 judges its one signal as it is, with no materiality floor.
        cut_z, cut_which = weight_z, top_which
        cut_excess = np.where(top_which >= 0, np.inf, np.nan)
        quarantine_z, quarantine_excess, quarantine_which = cut_z, cut_excess, cut_which
        queue_free = np.zeros(n, dtype=bool)
    else:
        rows = np.array([SIGNALS.index(s) for s in _queue_free_with_baseline(view.baseline)], dtype=np.int64)
        queue_free = np.full(n, len(rows) > 0)
        if len(rows):
            z = view.z[rows]
            if PREFILL_TIME in rows:
                # Prefill time takes part only over its own line (prefill_materiality), or, for a node
                # already cut, over that line's exit (its hysteresis): under it, a node's prefill time
                # moves with its load, and decode speaks for it (were prefill time to decide a node
                # it has not cut, a decode over its line would be hidden behind it).
                cut = (a.state == S.DEGRADED) | (a.state == S.PENDING_APPROVAL)
                line = np.where(cut, exit_line(t.prefill_materiality), t.prefill_materiality)
                with np.errstate(invalid="ignore", divide="ignore"):
                    near = view.ema[PREFILL_TIME] / base[PREFILL_TIME] >= line
                z = z.copy()
                z[rows == PREFILL_TIME] = np.where(near, z[rows == PREFILL_TIME], np.nan)
            cut_z, arg = nan_max(z)
            cut_which = np.where(arg >= 0, rows[np.maximum(arg, 0)], -1)
        else:
            cut_z, cut_which = weight_z, top_which
        cut_excess = _excess(view, base, cut_which)
        # What may take a node out: the same signals without prefill time.
        takers = rows if len(rows) else np.arange(len(SIGNALS))
        takers = takers[takers != PREFILL_TIME]
        quarantine_z, quarantine_which = nan_max(view.z[takers])
        if len(takers):
            quarantine_which = np.where(quarantine_which >= 0, takers[np.maximum(quarantine_which, 0)], -1)
        quarantine_excess = _excess(view, base, quarantine_which)
    queue_laden = ~queue_free & (t.baseline_mode == "robust")
    cut_long = np.isfinite(a.cut_at) & (now - a.cut_at >= t.queue_drain_s)
    drained_over = (cut_long & np.isfinite(cut_z) & (cut_z >= t.degrade_z)
                    & (cut_excess >= materiality(cut_which, t)))
    return Decision(cut_z=cut_z, cut_excess=cut_excess, cut_which=cut_which, weight_z=weight_z, queue_free=queue_free,
                    queue_laden=queue_laden, new=np.where(queue_laden, a.new_drained, a.new_samples),
                    drained_over=drained_over, name=_group_signal(view, t),
                    quarantine_z=quarantine_z, quarantine_excess=quarantine_excess,
                    quarantine_which=quarantine_which)


def judged_signals(baseline: Mapping[str, float], t: Thresholds) -> tuple[str, ...]:
    """The signals among which :func:`decide` picks each node's deciding signal, given each signal's
    peer ``baseline``: in robust mode the queue-free ones that have one; without any (and in seed
    mode) every signal, of which those with a Z take part. In :data:`~detector.signals.SIGNALS` order,
    which breaks a tie; the first is the group's deciding signal."""
    queue_free = _queue_free_with_baseline(baseline) if t.baseline_mode == "robust" else ()
    return queue_free or SIGNALS


def _queue_free_with_baseline(baseline: Mapping[str, float]) -> tuple[str, ...]:
    return tuple(s for s in QUEUE_FREE if math.isfinite(baseline.get(s, math.nan)))


def _group_signal(view: PeerView, t: Thresholds) -> str | None:
    """The group's deciding signal, for the explanation (None in seed mode, which judges every node
    on its own largest Z)."""
    if t.baseline_mode == "seed":
        return None
    return judged_signals(view.baseline, t)[0]


def materiality(which: np.ndarray, t: Thresholds) -> np.ndarray:
    """Each node's cut line on its deciding signal (``which``, an index into
    :data:`~detector.signals.SIGNALS`): ``prefill_materiality`` on prefill time, else
    ``degrade_materiality``."""
    return np.where(which == PREFILL_TIME, t.prefill_materiality, t.degrade_materiality)


def exit_line(m: float | np.ndarray) -> float | np.ndarray:
    """The excess under which a cut node counts as back (:data:`EXIT_MATERIALITY_FRACTION` of the way
    from its peers to its cut line ``m``)."""
    return 1.0 + EXIT_MATERIALITY_FRACTION * (m - 1.0)


def lines(d: Decision, t: Thresholds) -> Lines:
    finite = np.isfinite(d.cut_z)
    m = materiality(d.cut_which, t)
    return Lines(
        over_q=np.isfinite(d.quarantine_z) & (d.quarantine_z >= t.quarantine_z) & (d.quarantine_excess >= t.quarantine_materiality),
        over_d=finite & (d.cut_z >= t.degrade_z) & (d.cut_excess >= m),
        still_d=finite & (d.cut_z >= t.degrade_z - t.degrade_hysteresis) & (d.cut_excess >= exit_line(m)),
    )


class ZScoreDetector:
    """The Z verdict (a :class:`~detector.detectors.verdict.Detector`): the deciding signal at
    quarantine strength this evaluation (:attr:`Lines.over_q`). It is a wish of one tick: the ejection
    layer asks it to persist (:func:`detector.ejection.persistent_z`, which keeps the columns below)
    before it takes a node out."""

    columns = ("over_q", "over_q_evals", "q_held", "q_seen_at")
    gated = False

    def verdicts(self, a: NodeArrays, t: Thresholds, now: float, judging: Judging) -> tuple[Verdict, ...]:
        return (Verdict(Reason.Z_QUARANTINE, judging.lines.over_q),)


# --- sequential evidence on the deciding signal ------------------------------------------------------


def evidence_signals(t: Thresholds, last: References) -> tuple[str, ...]:
    """The signals whose samples feed the evidence CUSUMs: the queue-free ones with a baseline, else
    ``norm`` (robust mode only; seed mode has no evidence)."""
    if t.baseline_mode != "robust":
        return ()
    qf = tuple(s for s in QUEUE_FREE if math.isfinite(last.of(s).baseline))
    return qf or ("norm",)


def evidence(a: NodeArrays) -> np.ndarray:
    """Each node's evidence toward a weight cut: the larger of its CUSUMs."""
    return np.maximum(a.evidence, a.evidence_prefill)


def feed_evidence(a: NodeArrays, t: Thresholds, last: References, node: np.ndarray, v: np.ndarray, s: str,
                  sigma: float | np.ndarray | None = None, comparable: np.ndarray | None = None) -> None:
    """Feed each sample's excess over its signal's cut line (:func:`materiality`) into its node's CUSUM of signal
    ``s`` (``evidence_prefill`` for ``prefill_time``, ``evidence`` otherwise), against the last
    tick's baseline, in units of ``sigma`` (default: the group's per-request spread of ``s``; per
    sample when an array). ``node`` is grouped by node, time order within."""
    base = last.of(s).baseline
    if sigma is None:
        sigma = last.of(s).request_rel_sd
    sigma = np.broadcast_to(np.asarray(sigma, dtype=np.float64), v.shape)
    if not (math.isfinite(base) and base > 0):
        return
    ok = np.isfinite(v) & (v > 0) & np.isfinite(sigma) & (sigma > 0)
    cap = t.degrade_evidence / t.degrade_persistence + t.evidence_allowance
    if s != "prefill_time":  # the samples that may hold a node at quarantine strength
        n = len(a)
        # A sample not ``comparable`` (a row of a node running far fewer streams than its peers:
        # thresholds.COMPARABLE_LOAD_FRACTION) counts as a sample, never as one over the quarantine
        # line: a node cut to a few streams while its peers ran full batches (a surge) read 1.7x slow
        # for the cut itself, and was quarantined for it.
        comp = ok if comparable is None else ok & comparable
        a.q_count += np.bincount(node[ok], minlength=n)
        a.q_hits += np.bincount(node[comp & (v >= base * t.quarantine_materiality)], minlength=n)
        x_q = excess_over_line(v[comp], base, t.quarantine_materiality, sigma[comp])
        a.evidence_q = cusum_update(a.evidence_q, node[comp], x_q, allowance=t.evidence_allowance, cap=cap)
    line = t.prefill_materiality if s == "prefill_time" else t.degrade_materiality
    x = excess_over_line(v[ok], base, line, sigma[ok])
    column = "evidence_prefill" if s == "prefill_time" else "evidence"
    setattr(a, column, cusum_update(getattr(a, column), node[ok], x, allowance=t.evidence_allowance, cap=cap))
