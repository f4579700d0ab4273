"""What an evaluation tells the world: the :class:`Evaluation` of a tick and, for every state edge
taken, a :class:`~detector.states.Transition` record with the evidence behind it — the deciding
signal, its Z, EMA, baseline and spread, the node's percentiles, the thresholds in force and a
sentence for a person."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from detector import ejection
from detector.detectors import zscore
from detector.detectors.verdict import Decision, PeerView
from detector.moves import Move
from detector.nodes import NodeArrays
from detector.signals import SIGNALS
from detector.states import NodeState, Reason, Safeguard, Transition
from detector.thresholds import STRONG_CUT_SAMPLES, Thresholds

# The thresholds shown with every transition (the ones that decide states).
EXPLAINED = (
    "degrade_z",
    "quarantine_z",
    "quarantine_persistence",
    "quarantine_persistence_s",
    "degrade_materiality",
    "prefill_materiality",
    "quarantine_materiality",
    "degrade_exit_dwell_s",
    "spread_floor",
    "tail_ratio",
    "cross_p50_ratio",
    "consecutive_errors",
    "max_quarantine_fraction",
    "canary_tolerance_sigma",
)


@dataclass
class Evaluation:
    """The outcome of one tick for every node of the group (arrays aligned with ``nodes``).

    ``z`` is the deciding signal's Z (what weighs and ranks a node); ``z_by_signal`` every signal's;
    ``deciding`` which signal that is, per node (index into :data:`~detector.signals.SIGNALS`, -1: none
    yet; :meth:`deciding_signal`). ``verdicts``: each ejecting detector's verdict per node before dry
    run and the cap (a detector in dry run shows here and nowhere else). ``cap``: the safeguard's
    figures after this tick (:class:`~detector.states.Safeguard`)."""

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
    # Per node: the sequential evidence that gates a weight cut, as the tick's verdicts saw it (robust
    # mode; see detector.evidence and detector.evaluation.Outcome),
    # measured on ``decision_signal`` (decode once the gateway logs TTFT or streams, else norm; None in
    # seed mode, which judges the highest Z of any signal).
    evidence: np.ndarray = field(default_factory=lambda: np.zeros(0))
    decision_signal: str | None = None
    verdicts: dict[str, np.ndarray] = field(default_factory=dict)
    deciding: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    cap: Safeguard | None = None

    def index(self, node: str) -> int:
        return self.nodes.index(node)

    def deciding_signal(self, i: int) -> str | None:
        """The signal node ``i`` was judged on (None: no Z on any yet)."""
        w = int(self.deciding[i]) if len(self.deciding) else -1
        return SIGNALS[w] if w >= 0 else None

    def row(self, node: str) -> dict[str, Any]:
        """JSON-able summary of one node (NaN -> None)."""
        i = self.index(node)
        return {
            "node": node,
            "state": NodeState(int(self.states[i])).label,
            "weight": float(self.weights[i]),
            "base_weight": float(self.base_weights[i]),
            "z": nan_to_none(self.z[i]),
            "z_by_signal": {s: nan_to_none(v[i]) for s, v in self.z_by_signal.items()},
            "ema": {s: nan_to_none(v[i]) for s, v in self.ema.items()},
            "p50": nan_to_none(self.p50[i]),
            "p99": nan_to_none(self.p99[i]),
            "samples": int(self.counts[i]),
            "evidence": nan_to_none(self.evidence[i]) if len(self.evidence) else None,
            "decision_signal": self.decision_signal,
            "signal": self.deciding_signal(i),
        }


def nan_to_none(v: float) -> float | None:
    v = float(v)
    return None if math.isnan(v) else v


def detail(reason: Reason, a: NodeArrays, i: int, t: Thresholds) -> str:
    """The sentence for a cause, with the node's own numbers."""
    if reason is Reason.CONSECUTIVE_ERRORS:
        return f"{int(a.consec_err[i])} errors in a row (limit {t.consecutive_errors})"
    if reason is Reason.SUCCESS_RATE:
        return f"success rate below mean - {t.success_rate_stdev} stdev of its peers"
    if reason is Reason.TAIL_RATIO:
        return f"P99/P50 above {t.tail_ratio} for {int(a.tail_windows[i])} windows of {t.tail_window_s:g} s"
    if reason is Reason.CROSS_P50:
        return f"P50 above {t.cross_p50_ratio}x the peers' median P50"
    if reason is Reason.Z_QUARANTINE:
        if ejection.in_time(t):
            return (f"Z >= {t.quarantine_z} held {float(a.q_held[i]):.2f} s over {int(a.over_q_evals[i])} "
                    f"evaluations (limit {t.quarantine_persistence_s:g} s)")
        return f"Z >= {t.quarantine_z} for {int(a.over_q[i])} samples (limit {t.quarantine_persistence})"
    if reason is Reason.Z_DEGRADE and t.baseline_mode == "robust":
        return (f"evidence {float(zscore.evidence(a)[i]):.1f} sd over its signal's cut line (decode "
                f"{t.degrade_materiality:g}x, prefill time {t.prefill_materiality:g}x the baseline) "
                f"(cut at {float(ejection.evidence_line(t, a.flaps[i])):g}, or after {STRONG_CUT_SAMPLES} samples "
                "at quarantine strength)")
    return ""


def transitions(moves: list[Move], a: NodeArrays, t: Thresholds, now: float, view: PeerView, d: Decision,
                counts: dict[str, np.ndarray], weights: np.ndarray) -> list[Transition]:
    """One record per edge taken, with the evidence of the signal that decided: for a quarantine on Z,
    the signal the quarantine lines read (:attr:`Decision.quarantine_which`: a node cut on its prefill time is
    quarantined on its decode), else the deciding signal."""
    thr = {k: getattr(t, k) for k in EXPLAINED}
    out = []
    for m in moves:
        i = m.i
        w = int(d.quarantine_which[i] if m.reason is Reason.Z_QUARANTINE else d.cut_which[i])
        sig = SIGNALS[w] if w >= 0 else None
        out.append(Transition(
            node=a.ids[i], at=now, from_state=m.src, to_state=m.dst, reason=m.reason.value, signal=sig,
            z=nan_to_none(view.z[w, i]) if sig else None, baseline=nan_to_none(view.baseline[sig]) if sig else None,
            spread=nan_to_none(view.spread[sig]) if sig else None, ema=nan_to_none(view.ema[w, i]) if sig else None,
            p50=nan_to_none(a.p50[i]), p99=nan_to_none(a.p99[i]),
            samples=int(counts[sig][i]) if sig else 0, weight=float(weights[i]),
            detail=m.detail or detail(m.reason, a, i, t), thresholds=thr, safeguard_hold=m.safeguard_hold,
        ))
    return out


def operator_record(a: NodeArrays, t: Thresholds, i: int, src: NodeState, to: NodeState, now: float,
                    reason: Reason, samples: int, text: str = "") -> Transition:
    """The record of an edge taken outside an evaluation (operator action, canary probe)."""
    return Transition(node=a.ids[i], at=now, from_state=src, to_state=to, reason=reason.value, detail=text,
                      samples=samples, thresholds={k: getattr(t, k) for k in EXPLAINED})


def transition_from_dict(d: dict[str, Any]) -> Transition:
    d = dict(d)
    d["from_state"] = NodeState.from_label(d["from_state"])
    d["to_state"] = NodeState.from_label(d["to_state"])
    return Transition(**d)
