"""The ejection layer: one algorithm above every detector, which alone moves nodes between states.

Detectors say which nodes they would take out (:class:`~detector.detectors.verdict.Verdict`); this
module decides, in this order at every evaluation:

1. **Operator expiries and warm-up.** An expired forced quarantine returns under the detector's control
   through a probe (within the safeguard cap, else straight to healthy); a node that finished warming
   up gets one more warm-up's worth of samples (``grace``) before latency can quarantine it: requests
   dispatched during warm-up still complete slowly after it.
2. **Persistence.** The Z verdict needs the deciding signal at quarantine strength for
   ``quarantine_persistence_s`` seconds (robust mode) of the node's own samples, the EMA over the
   line and the tick's new samples too (a node-wide stall lasts well under a second and leaves the
   EMA over the line after it; a slow GPU stays slow), or, in seed mode, for
   ``quarantine_persistence`` samples; either is *leaky* (a tick or sample under the line takes its
   share back: a request already running at the onset completes only partly slowed and dips the EMA
   once, and restarting a run for it would throw away the evidence before it), over at least
   ``quarantine_min_evaluations`` evaluations (one tick can bring hundreds of samples of a busy node).
   A count of samples is a different time at every cadence; seconds are not.
3. **Cause priority and dry run.** Errors first (unambiguous), then success rate, Z, tail ratio, cross
   P50 (:data:`~detector.thresholds.DETECTORS`); a detector in ``dry_run`` is recorded, not acted on.
   Latency causes wait out a node's post-warm-up grace.
4. **The safeguard cap.** At most ``floor(max_quarantine_fraction * nodes)`` nodes out of service or
   pending approval (:data:`~detector.states.SAFEGUARD_COUNTED`, the one statement of that rule);
   candidates are ranked errors first, then by the deciding signal's Z, and the
   rest are held degraded at the floor weight while the group raises ``safeguard`` (a group-wide
   slowdown is not a node fault).
5. **Soft degrade.** A weight cut needs the deciding signal over the degrade line *and* the node's
   sequential evidence (:mod:`detector.evidence`) over ``degrade_evidence * 2^flaps`` — flap damping,
   as BGP's (RFC 2439): each cut the node came back from since it was last healthy for
   ``backoff_cap_s`` doubles the evidence the next one needs (per-token time grows with the batch, so
   a node cut to the floor weight looks fast, is restored and is cut again) — or quarantine strength
   over :data:`~detector.thresholds.STRONG_CUT_SAMPLES` samples (one row can be one stall).
   Leaving DEGRADED (or PENDING_APPROVAL) needs a clear margin (hysteresis) held for
   ``degrade_exit_dwell_s``, and a degraded node's weight stays under base meanwhile.
6. **Restore.** A recovering node advances one step per ``recovery_step_s`` while it stays under the
   line; a bad step sends it back to quarantine with the probe interval doubled (Envoy's ejection
   backoff, capped at ``backoff_cap_s``; the count decays after ``backoff_cap_s`` healthy).
7. **Probes due** for quarantined nodes, and **confirmation probes** for a node cut at quarantine
   strength that has no samples to confirm it with. Cut to the floor weight, a node gets a few
   percent of a round robin's requests; in a quiet group that is one request a minute, and the
   quarantine it has earned waits for it (a real llama.cpp server at 20 % of a core behind nginx: cut
   5.4 s after the onset, its one slow request over by then, quarantined at 24 s, when the next came).
   So a DEGRADED node over the quarantine line whose last sample is older than
   ``quarantine_persistence_s`` is probed (at most once per that time; one probe in flight): the probe
   is a real request, so it streams rows like any other, and its answer enters as a completed request
   (:meth:`detector.operator.NodeActions.record_probe`). It is judged like every other sample: a node
   that is fast again under the probe is restored, a slow one quarantined.

   **Release probes** for a held cut. A DEGRADED node under the quarantine line that no detector
   accuses, cut for ``degrade_exit_dwell_s``, is probed at its peers' load once per that time
   (``release_at`` marks the probe asked for). Cut to the floor weight, a node runs a batch far under
   its peers', and the decode curve reads such a row through a part of it the healthy rows no longer
   measure: a healthy llama.cpp server behind nginx, cut 25.6 s before the fault by a decode Z of
   4.2, read Z 1.1 to 3.0 for 150 s at 5 % of its share, never under the exit line for 30 s in a
   row, so never given back (``docs/peers.md``, the weight hold). Its own rows cannot
   clear it; a probe at its peers' batch can. Judged as a quarantined node's probe is
   (:meth:`detector.operator.NodeActions.record_probe`): a pass starts the stepwise restore, whose
   steps judge the node at a quarter, half and all of its share (a node slow at load is quarantined
   at the step that shows it); a slow answer leaves it held, and its rows count like any others.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from detector.detectors import zscore
from detector.detectors.cross_p50 import CrossP50Detector
from detector.detectors.errors import ErrorDetector
from detector.detectors.tail import TailDetector
from detector.detectors.verdict import Decision, Lines, Verdict
from detector.detectors.zscore import ZScoreDetector
from detector.moves import Moves, lookup
from detector.nodes import NodeArrays
from detector.states import SAFEGUARD_COUNTED, NodeState, Reason, safeguard_cap
from detector.thresholds import MAX_FLAP_DOUBLINGS, STRONG_CUT_SAMPLES, Thresholds

S = NodeState
_HELD_OUT = lookup(SAFEGUARD_COUNTED)
_ACTIVE = lookup((S.HEALTHY, S.DEGRADED))
_PROBED = lookup((S.QUARANTINED, S.PROBING))
_ERRORS = (Reason.CONSECUTIVE_ERRORS, Reason.SUCCESS_RATE)
#: Every detector's case against a node (:attr:`~detector.detectors.verdict.Detector.columns`).
_CASES = (*ErrorDetector.columns, *ZScoreDetector.columns, *TailDetector.columns, *CrossP50Detector.columns)


def cap(t: Thresholds, n: int) -> int:
    """The safeguard: how many of ``n`` nodes may be out of service or pending at once."""
    return safeguard_cap(t.max_quarantine_fraction, n)


def evidence_line(t: Thresholds, flaps: np.ndarray | np.integer) -> np.ndarray:
    """The evidence a weight cut needs: ``degrade_evidence * 2^flaps`` (flap damping, capped)."""
    return t.degrade_evidence * np.power(2.0, np.minimum(flaps, MAX_FLAP_DOUBLINGS))


def reset_verdicts(a: NodeArrays, i: int) -> None:
    """Every detector forgets its case against node ``i`` (it left service or an operator decided):
    the one list, used by quarantine, rejection and release alike."""
    a.reset(i, ("pending_since", *_CASES))


def enter_quarantine(a: NodeArrays, t: Thresholds, i: int, now: float) -> None:
    """Node ``i`` leaves service: its probe is due after ``canary_interval_s * 2^(ejections-1)``."""
    a.ejections[i] += 1
    interval = min(t.canary_interval_s * 2.0 ** (a.ejections[i] - 1), t.backoff_cap_s)
    a.next_probe[i] = now + interval
    a.passes[i] = 0
    reset_verdicts(a, i)


def expire_overrides(a: NodeArrays, t: Thresholds, now: float, moves: Moves) -> None:
    expired = np.isfinite(a.override_until) & (a.override_until <= now)
    fq = expired & (a.state == S.FORCED_QUARANTINE)
    if fq.any():
        # Back under the detector's control, which may only hold nodes out within the cap.
        held = int(_HELD_OUT[a.state].sum()) - int((a.state == S.FORCED_QUARANTINE).sum())
        stay = np.zeros(len(a), dtype=bool)
        stay[np.flatnonzero(fq)[: max(cap(t, len(a)) - held, 0)]] = True
        a.next_probe[stay] = now
        moves(stay, S.QUARANTINED, Reason.OVERRIDE_EXPIRED, "override expired: probing before restore")
        a.healthy_since[fq & ~stay] = now
        moves(fq & ~stay, S.HEALTHY, Reason.OVERRIDE_EXPIRED, "override expired; safeguard cap full")
    moves(expired & (a.state == S.FORCED_ACTIVE), S.HEALTHY, Reason.OVERRIDE_EXPIRED)
    a.override_until[expired] = np.nan
    pin_expired = np.isfinite(a.pin_until) & (a.pin_until <= now)
    a.pin[pin_expired] = np.nan
    a.pin_until[pin_expired] = np.nan


def finish_warmup(a: NodeArrays, t: Thresholds, now: float, moves: Moves) -> None:
    warmed = (a.state == S.WARMING) & (a.warm_samples >= t.warmup_samples)
    a.healthy_since[warmed] = now
    a.grace[warmed] = t.warmup_samples
    moves(warmed, S.HEALTHY, Reason.WARMED_UP)


def in_time(t: Thresholds) -> bool:
    """Persistence is measured in seconds (robust mode with ``quarantine_persistence_s > 0``)."""
    return t.baseline_mode == "robust" and t.quarantine_persistence_s > 0


def persistent_z(a: NodeArrays, t: Thresholds, d: Decision, over_q: np.ndarray, now: float) -> Verdict:
    """The Z verdict: quarantine strength held over enough evaluations, for ``quarantine_persistence_s``
    seconds of the node's samples (a leaky time) or, in seed mode, ``quarantine_persistence`` samples
    (a leaky count). In time, a tick counts only if the node's new samples are themselves over the
    quarantine line (most of them): after a stall its EMA stays over the line for a while, its
    samples do not. (A caller without the tick's samples, the preview's replay of history steps,
    leaves ``q_count`` at 0: every step with the EMA over the line counts.)"""
    new = d.new
    seen = new > 0
    timed = in_time(t)
    if timed:
        samples_over = np.where(a.q_count > 0, 2 * a.q_hits >= a.q_count, True)
        over_q = over_q & samples_over
        # The time this tick's samples cover: since the node's last evaluation with samples, at most
        # the persistence itself (the sample floor, quarantine_min_evaluations, does the rest).
        dt = np.where(np.isfinite(a.q_seen_at), np.clip(now - a.q_seen_at, 0.0, t.quarantine_persistence_s), 0.0)
        a.q_held = np.where(seen, np.where(over_q, a.q_held + dt, np.maximum(a.q_held - dt, 0.0)), a.q_held)
        a.q_seen_at = np.where(seen, now, a.q_seen_at)
    a.over_q = np.where(over_q, a.over_q + new, np.maximum(a.over_q - new, 0))
    a.over_q_evals = np.where(seen & over_q, a.over_q_evals + 1,
                              np.where(seen, np.maximum(a.over_q_evals - 1, 0), a.over_q_evals))
    if timed:
        # Duration and strength: held long enough (tolerance: tick times summed in floating point),
        # and the node's CUSUM over the quarantine line has as much evidence as a weight cut needs
        # over the degrade line: three rows of a 3x-slow node, not three noisy requests that happened
        # to read slow (a log's per-request decode varies 2-3x with prompt length).
        persisted = (a.q_held >= t.quarantine_persistence_s - 1e-6) & (a.evidence_q >= t.degrade_evidence * (1 - 1e-9))
    else:
        persisted = a.over_q >= t.quarantine_persistence
    return Verdict(Reason.Z_QUARANTINE, persisted & (a.over_q_evals >= t.quarantine_min_evaluations))


def degrade_wanted(a: NodeArrays, t: Thresholds, lines: Lines) -> np.ndarray:
    """Over the degrade line with the evidence behind it (robust mode; seed mode, which has no
    materiality, asks for ``degrade_persistence`` samples in a row), or at quarantine strength with
    :data:`~detector.thresholds.STRONG_CUT_SAMPLES` samples' evidence over the quarantine line (seed
    mode: at once)."""
    a.over_d = np.where(lines.over_d, a.over_d + a.new_samples, 0)
    if t.baseline_mode == "robust":
        # (tolerance: p capped increments of h/p sum to a hair under h in floating point)
        held = zscore.evidence(a) >= evidence_line(t, a.flaps) * (1 - 1e-9)
        per_sample = t.degrade_evidence / t.degrade_persistence  # the most one sample adds (its cap)
        strong = lines.over_q & (a.evidence_q >= STRONG_CUT_SAMPLES * per_sample * (1 - 1e-9))
    else:
        held = a.over_d >= t.degrade_persistence
        strong = lines.over_q
    return lines.over_d & (held | strong)


@dataclass
class Ejection:
    """What the cap let through this tick: ``cause`` per node (index into the verdicts, -1: none),
    the nodes held back by the cap and why."""

    cause: np.ndarray
    blocked: np.ndarray
    safeguard_reason: str | None


def enforced(v: Verdict, t: Thresholds) -> np.ndarray:
    """The nodes ``v`` may act on: none while its detector is in ``dry_run``."""
    return np.zeros(len(v.eject), dtype=bool) if v.reason.value in t.dry_run else v.eject


def eject(a: NodeArrays, t: Thresholds, now: float, verdicts: list[Verdict], d: Decision, moves: Moves,
          explain: Callable[[Reason, int], str]) -> Ejection:
    """Steps 3 and 4 of the module docstring; ``explain(reason, i)`` words a cause for the record."""
    n = len(a)
    cause = np.full(n, -1, dtype=np.int8)
    for k, v in enumerate(verdicts):
        cause[(cause < 0) & enforced(v, t)] = k
    latency = np.array([v.reason not in _ERRORS for v in verdicts] + [False])
    cause[(a.grace > 0) & latency[cause]] = -1  # latency causes wait out the post-warm-up grace
    # An operator rejected this node's latency proposal and silenced the case: it stays in service
    # (soft degrade still weighs it down) until the silence ends.
    cause[(a.silenced_until > now) & latency[cause]] = -1
    want = _ACTIVE[a.state] & (cause >= 0)
    held = int(_HELD_OUT[a.state].sum())
    slots = max(cap(t, n) - held, 0)
    cand = np.flatnonzero(want)
    errors_first = ~latency[cause[cand]]
    rank_key = np.where(errors_first, np.inf, np.nan_to_num(d.cut_z[cand], nan=0.0))
    cand = cand[np.argsort(-rank_key, kind="stable")]
    allowed, blocked = cand[:slots], cand[slots:]
    safeguard_reason = None
    if len(blocked):
        safeguard_reason = (
            f"detector wants {len(cand)} more node(s) out of service, but {held} of {n} already are "
            f"and the cap is {cap(t, n)} ({t.max_quarantine_fraction:.0%}); holding "
            f"{len(blocked)} node(s) at the floor weight: a group-wide slowdown is not a node fault"
        )
    for i in allowed:
        reason = verdicts[cause[i]].reason
        detail = explain(reason, i)
        if t.require_approval:
            a.pending_since[i] = now
            moves.one(i, S.PENDING_APPROVAL, reason, f"{detail}; awaiting operator approval")
        else:
            enter_quarantine(a, t, i, now)
            moves.one(i, S.QUARANTINED, reason, detail)
    blocked_mask = np.zeros(n, dtype=bool)
    blocked_mask[blocked] = True
    moves(blocked_mask & (a.state == S.HEALTHY), S.DEGRADED, Reason.Z_DEGRADE, "safeguard: held at floor weight",
          safeguard_hold=True)
    return Ejection(cause=cause, blocked=blocked_mask, safeguard_reason=safeguard_reason)


def soft_degrade(a: NodeArrays, t: Thresholds, now: float, degrade_now: np.ndarray, lines: Lines, ej: Ejection,
                 moves: Moves) -> None:
    """Step 5: cut, or give back, the weight of nodes in service; clear a pending proposal whose
    condition went away. Both leave only once the deciding signal has been under the exit line
    (``~lines.still_d``) for ``degrade_exit_dwell_s`` without a break (``clear_since``: when the
    current stretch under it began): a cut node runs a smaller batch and reads less slow than it is,
    and a dip of its EMA is no recovery."""
    state = a.state
    moves((state == S.HEALTHY) & degrade_now, S.DEGRADED, Reason.Z_DEGRADE)
    held = (state == S.DEGRADED) | (state == S.PENDING_APPROVAL)
    under = held & ~lines.still_d
    a.clear_since = np.where(under, np.where(np.isnan(a.clear_since), now, a.clear_since), np.nan)
    dwelt = under & (now - a.clear_since >= t.degrade_exit_dwell_s - 1e-9)
    back = (state == S.DEGRADED) & dwelt & ~ej.blocked & ~moves.moved
    a.flaps[back] += 1
    a.evidence[back] = 0.0  # back under the line: a new cut needs new evidence
    a.evidence_prefill[back] = 0.0
    a.evidence_q[back] = 0.0
    a.healthy_since[back] = now
    moves(back, S.HEALTHY, Reason.Z_RECOVERED)
    # The same margin and dwell as leaving DEGRADED: a pending node whose Z dipped under the degrade
    # line (2.99 against 3.0 at entry, then 1.8 at the floor weight) is still the slow node the
    # operator is being asked about; clearing it there put it back at full weight and superseded the
    # proposal, only to open a new one later. Its proposal stands while it waits.
    cleared = (state == S.PENDING_APPROVAL) & dwelt & (ej.cause < 0) & ~moves.moved
    a.pending_since[cleared] = np.nan
    moves(cleared, S.HEALTHY, Reason.CONDITION_CLEARED)
    a.clear_since[moves.moved] = np.nan  # a node that moved starts its next stretch afresh


def restore(a: NodeArrays, t: Thresholds, now: float, judged: np.ndarray, failing: np.ndarray,
            over_d: np.ndarray, moves: Moves) -> None:
    """Step 6: ``judged`` nodes have enough samples since their restore began; ``failing`` ones
    have an enforced verdict against them now."""
    rec = a.state == S.RECOVERING
    rec_judged = rec & judged
    step_over = rec & (now - a.step_started >= t.recovery_step_s)
    bad_step = (rec & failing) | (step_over & rec_judged & over_d)
    for i in np.flatnonzero(bad_step):
        enter_quarantine(a, t, i, now)
        interval = a.next_probe[i] - now
        moves.one(i, S.QUARANTINED, Reason.RECOVERY_STEP_FAILED,
                  f"slow again at restore step {int(a.step[i]) + 1}; next probe in {interval:g} s")
    advance = step_over & ~bad_step & (rec_judged | (a.new_samples == 0))
    a.step[advance] += 1
    a.step_started[advance] = now
    done = advance & (a.step >= len(t.recovery_steps))
    a.healthy_since[done] = now
    moves(done, S.HEALTHY, Reason.RECOVERED)
    long_ok = (a.state == S.HEALTHY) & (now - a.healthy_since >= t.backoff_cap_s)
    a.ejections[long_ok] = 0
    a.flaps[long_ok] = 0


def probes_due(a: NodeArrays, t: Thresholds, now: float, moves: Moves, strong: np.ndarray,
               accused: np.ndarray) -> np.ndarray:
    """Step 7: quarantined nodes whose probe is due move to PROBING; degraded nodes at quarantine
    strength (``strong``) with no sample for ``quarantine_persistence_s`` get a confirmation probe, and
    degraded nodes under it that no detector ``accused``, cut for ``degrade_exit_dwell_s``, a release
    probe (see the module docstring); returns the due mask."""
    due = _PROBED[a.state] & (a.next_probe <= now)
    moves(due & (a.state == S.QUARANTINED), S.PROBING, Reason.PROBE_DUE)
    a.next_probe[due] = now + t.canary_interval_s
    deg = a.state == S.DEGRADED
    with np.errstate(invalid="ignore"):
        starved = ~(now - a.last_seen < t.quarantine_persistence_s)
        free = ~(a.next_probe > now)
        confirm = deg & strong & starved & free
        release = deg & ~strong & ~accused & (now - a.cut_at >= t.degrade_exit_dwell_s - 1e-9) & free
    a.next_probe[confirm] = now + t.quarantine_persistence_s
    a.next_probe[release] = now + t.degrade_exit_dwell_s
    # Only a node still degraded can be released; a release asked for and then overtaken by a
    # confirmation (the node grew strong) is a confirmation.
    a.release_at = np.where(release, now, np.where(deg & ~confirm, a.release_at, np.nan))
    return due | confirm | release


def end_of_tick(a: NodeArrays, now: float) -> None:
    """Evidence is about a node in service: out of it (or warming) it starts again from nothing.
    ``cut_at`` remembers when the node's weight was cut, for the queue-drain rule."""
    state = a.state
    out = (state != S.HEALTHY) & (state != S.DEGRADED)
    a.evidence[out] = 0.0
    a.evidence_prefill[out] = 0.0
    a.evidence_q[out] = 0.0
    cut = (state == S.DEGRADED) | (state == S.PENDING_APPROVAL)
    a.cut_at = np.where(cut, np.where(np.isfinite(a.cut_at), a.cut_at, now), np.nan)
    # Counted in completed requests: streamed rows of a node just out of warm-up come from the slow
    # requests it was given during warm-up, and they stream for a while.
    a.grace = np.maximum(a.grace - a.new_requests, 0)
    a.new_samples[:] = 0
    a.new_requests[:] = 0
    a.new_drained[:] = 0
    a.q_hits[:] = 0
    a.q_count[:] = 0
