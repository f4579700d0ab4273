"""Single nodes moved between evaluations: canary probes and operator actions.

A quarantined node is probed after ``canary_interval_s * 2^(ejections-1)`` (capped), then every
``canary_interval_s``; a probe passes when its normalised latency is within the limit of
:func:`detector.canary.probe_limit` (the rule and its reasons are stated there). ``canary_passes`` passes in a row start a stepwise restore with fresh
statistics; a failed probe puts the node back to QUARANTINED.

Operators force nodes out (FORCED_QUARANTINE) or in (FORCED_ACTIVE), optionally until a time, release
held nodes back to service, pin weights, and approve or reject pending quarantines. Every edge taken
here is checked against :data:`~detector.states.ALLOWED_EDGES` and recorded; the records go out with
the next :class:`~detector.explain.Evaluation`.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

from detector import ejection, explain
from detector.baseline import References
from detector.canary import ProbeLimit, fmt, probe_limit
from detector.detectors.tail import TailDetector
from detector.nodes import NodeArrays
from detector.samples import SampleBatch
from detector.signals import SignalModel
from detector.states import NodeState, Reason, Transition, check_edge
from detector.thresholds import Thresholds

S = NodeState


class NodeActions:
    """The single-node moves of :class:`~detector.group.GroupDetector` (mixed into it)."""

    a: NodeArrays
    thresholds: Thresholds
    signals: SignalModel
    tail: TailDetector
    _last: References
    _pending: list[Transition]
    ingest: Callable[[SampleBatch], object]

    def index_of(self, node: str) -> int:
        return self.a.position(node)

    # ------------------------------------------------------------------------------ canary probes
    def _decode_scale(self) -> float:
        """The peers' decode baseline when probes are read on decode, else NaN.

        A probe is read on ``norm`` (its latency over the group's cost model). A group whose logs
        carry no token counts (an nginx or HAProxy access log) has no cost model, and every probe
        read "unknown" and failed: in the real drill no canary or release probe of a llama.cpp
        server ever passed, so a quarantined server stayed out until an operator released it. Its
        engines' rows still give the peers' decode time per output token, and a probe's answer
        gives its own (the engine's timings: ``outlier_admin.control.canary``); sent at the peers'
        batch (``outlier_admin.control.probe_load``), the ratio of the two is the same "x expected"."""
        if self.thresholds.normalization != "learned" or self.signals.fit_norm is not None:
            return math.nan
        base = self._last.of("decode").baseline
        return base if math.isfinite(base) and base > 0 else math.nan

    def probe_limit(self) -> ProbeLimit:
        """The pass limit of a probe now (:func:`detector.canary.probe_limit`: the rule and its reasons),
        from the peers' reference as the last evaluation left it: ``norm``, or decode relative to its
        baseline where probes are read on decode (:meth:`_decode_scale`)."""
        base = self._decode_scale()
        if math.isfinite(base):
            ref = self._last.of("decode")
            return probe_limit(1.0, ref.spread / base, ref.request_sd / base, self.thresholds)
        ref = self._last.of("norm")
        return probe_limit(ref.baseline, ref.spread, ref.request_sd, self.thresholds)

    def probe_value(self, prompt_tokens: float, completion_tokens: float, ttft_ms: float | None,
                    total_ms: float | None) -> float:
        """A probe's answer on the scale :meth:`probe_limit` states (NaN when unknown)."""
        base = self._decode_scale()
        if math.isfinite(base):
            return self.signals.probe_value(prompt_tokens, completion_tokens, ttft_ms, total_ms, "decode") / base
        return self.signals.probe_value(prompt_tokens, completion_tokens, ttft_ms, total_ms)

    def record_probe(self, node: str, now: float, prompt_tokens: float, completion_tokens: float,
                     ttft_ms: float | None, total_ms: float | None, ok: bool) -> bool | None:
        """Judge one canary probe of a ``PROBING``/``QUARANTINED`` node; returns whether it passed.
        ``canary_passes`` in a row start a stepwise restore with fresh statistics.

        A probe of a ``DEGRADED`` node (:func:`detector.ejection.probes_due`) enters as a completed
        request of the node. A confirmation probe is no verdict (``None``); a release probe of a held
        cut (``release_at`` set) is judged against the same limit, and a pass starts the stepwise
        restore with fresh statistics. A probe that failed is not an error of the node here (the error
        detectors count the gateway's own) and releases nothing. A probe answered once the node is in
        none of these states is no verdict either (``None``)."""
        i, a = self.index_of(node), self.a
        src = NodeState(int(a.state[i]))
        if src == S.DEGRADED:
            answered = ok and total_ms is not None and math.isfinite(total_ms) and total_ms > 0
            release, a.release_at[i] = math.isfinite(a.release_at[i]), math.nan
            verdict = self._judge_release(i, now, prompt_tokens, completion_tokens, ttft_ms, total_ms) \
                if release and answered else None
            if answered:
                self.ingest(SampleBatch.from_columns(
                    node=[node], ts=[now], prompt_tokens=[prompt_tokens], completion_tokens=[completion_tokens],
                    total_ms=[total_ms], ttft_ms=[math.nan if ttft_ms is None else ttft_ms], status=[200]))
            return verdict
        if src not in (S.PROBING, S.QUARANTINED):
            # Answered after the node left the canary's states (restored, released, proposed): no
            # verdict on it, so no "probe failed" beneath an incident the probe never judged.
            return None
        value = self.probe_value(prompt_tokens, completion_tokens, ttft_ms, total_ms) if ok else math.nan
        rule = self.probe_limit()
        passed = bool(ok and math.isfinite(value) and value <= rule.limit)
        text = f"probe {fmt(value, rule.unit)}, {rule.words()}" if ok else "probe failed (error/timeout)"
        if passed:
            a.passes[i] += 1
            if a.passes[i] >= self.thresholds.canary_passes:
                self._start_restore(i, now, text)
        else:
            a.passes[i] = 0
            a.next_probe[i] = now + self.thresholds.canary_interval_s
            if src == S.PROBING:
                self._set(i, S.QUARANTINED, now, Reason.PROBE_FAILED, text)
        return passed

    def _judge_release(self, i: int, now: float, prompt_tokens: float, completion_tokens: float,
                       ttft_ms: float | None, total_ms: float | None) -> bool:
        """A held cut's release probe (:mod:`detector.ejection`, step 7): within the canary's limit, the
        node starts the stepwise restore with fresh statistics (the EMA that held it was read at a
        batch far under its peers'), and counts a flap: a cut it comes back from this way doubles the
        evidence its next one needs, as any other."""
        value = self.probe_value(prompt_tokens, completion_tokens, ttft_ms, total_ms)
        rule = self.probe_limit()
        if not (math.isfinite(value) and value <= rule.limit):
            return False
        self.a.flaps[i] += 1
        self._start_restore(i, now, f"release probe at the peers' load {fmt(value, rule.unit)}, "
                                    f"{rule.words()}: the cut is given back step by step")
        return True

    def _start_restore(self, i: int, now: float, text: str) -> None:
        """Node ``i`` passed its probes: the stepwise restore starts, with fresh statistics."""
        self._forget(i)
        self.a.step[i] = 0
        self.a.step_started[i] = now
        self._set(i, S.RECOVERING, now, Reason.PROBES_PASSED, text)

    # ---------------------------------------------------------------------------- operator actions
    def approve(self, node: str, now: float) -> None:
        """Approve a pending quarantine."""
        i = self._require(node, {S.PENDING_APPROVAL}, "approve")
        ejection.enter_quarantine(self.a, self.thresholds, i, now)
        self._set(i, S.QUARANTINED, now, Reason.APPROVED)

    def reject(self, node: str, now: float) -> None:
        """Reject a pending quarantine: the node returns to service; every case against it restarts."""
        i = self._require(node, {S.PENDING_APPROVAL}, "reject")
        ejection.reset_verdicts(self.a, i)
        self._set(i, S.HEALTHY, now, Reason.REJECTED)

    def silence_latency(self, silences: dict[str, float]) -> None:
        """The nodes whose latency case an operator silenced, each until an epoch time (the whole
        set: a node not named is not silenced). Latency causes do not take them out of service."""
        a = self.a
        a.silenced_until[:] = np.nan
        for node, until in silences.items():
            if node in a.index:
                a.silenced_until[a.index[node]] = until

    def force_quarantine(self, node: str, now: float, until: float | None = None) -> None:
        i = self.index_of(node)
        self.a.override_until[i] = np.nan if until is None else until
        if self.a.state[i] != S.FORCED_QUARANTINE:  # forcing again only moves the expiry
            self._set(i, S.FORCED_QUARANTINE, now, Reason.OPERATOR_QUARANTINE)

    def force_active(self, node: str, now: float, until: float | None = None) -> None:
        i = self.index_of(node)
        self.a.override_until[i] = np.nan if until is None else until
        if self.a.state[i] != S.FORCED_ACTIVE:
            self._set(i, S.FORCED_ACTIVE, now, Reason.OPERATOR_ACTIVE)

    def release(self, node: str, now: float) -> None:
        """Return a held node to service at full weight, with fresh statistics."""
        i, a = self.index_of(node), self.a
        src = NodeState(int(a.state[i]))
        if src in (S.HEALTHY, S.DEGRADED):
            return
        if src == S.PENDING_APPROVAL:
            self.reject(node, now)
            return
        self._forget(i)
        ejection.reset_verdicts(a, i)
        a.override_until[i] = np.nan
        a.healthy_since[i] = now
        a.warm_samples[i] = max(a.warm_samples[i], self.thresholds.warmup_samples)
        self._set(i, S.HEALTHY, now, Reason.OPERATOR_RELEASE)

    def pin_weight(self, node: str, weight: float, now: float, until: float | None = None) -> None:
        if not (weight >= 0 and math.isfinite(weight)):
            raise ValueError(f"pinned weight must be a finite number >= 0, got {weight!r}")
        i = self.index_of(node)
        self.a.pin[i] = weight
        self.a.pin_until[i] = np.nan if until is None else until

    def unpin(self, node: str) -> None:
        i = self.index_of(node)
        self.a.pin[i] = np.nan
        self.a.pin_until[i] = np.nan

    def _forget(self, i: int) -> None:
        """A fresh start: statistics from before a quarantine describe the fault, not the node now."""
        mask = np.arange(len(self.a)) == i
        self.signals.forget(mask)
        self.tail.window.clear(mask)
        self.a.p50[i] = np.nan
        self.a.p99[i] = np.nan

    def _require(self, node: str, states: set[NodeState], action: str) -> int:
        i = self.index_of(node)
        cur = NodeState(int(self.a.state[i]))
        if cur not in states:
            raise ValueError(f"cannot {action} node {node!r}: it is {cur.label}")
        return i

    def _set(self, i: int, to: NodeState, now: float, reason: Reason, text: str = "") -> None:
        src = NodeState(int(self.a.state[i]))
        check_edge(src, to)
        self.a.state[i] = to
        self._pending.append(explain.operator_record(
            self.a, self.thresholds, i, src, to, now, reason, int(self.signals.ewma["norm"].count[i]), text))

