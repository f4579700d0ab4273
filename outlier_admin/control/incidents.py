"""Incidents: a node's episode out of full service, told once.

**One incident** runs from the transition that takes a node out of full service (a cut, a proposal, a
quarantine: into any state of :data:`OUT`) to the transition that ends its restore (back to
``healthy``, or forced into service by an operator). Between the two, the canary's cycles
(``quarantined -> probing -> quarantined``), restore steps, approvals and overrides are the
incident's, not new ones: they are the node's rows in ``[started_at, ended_at]``. A retired node's
open incident ends with it (:func:`close_retired`). A ``shadow`` group's transitions publish nothing,
so they open none.

**Its cause** is the transition that opened it: the reason, the signal it was decided on, the Z,
the node's EMA and the peers' baseline in the signal's unit (:func:`detector.signals.unit_of`). A
probe that fails later is not a new cause: it is counted (``probes_failed``) beneath it.

**Its outcome**, when it ends:

- ``fault_confirmed``: a canary probe or a restore step found the node slow at the peers' load;
- ``operator``: an operator took or returned it (forced quarantine, release, a rejected proposal,
  forced into service) and nothing confirmed a fault;
- ``no_fault_found`` — *cut and restored: no fault found*: the detector cut or quarantined the node
  and it came back without any probe or restore step finding it slow (it recovered while cut, or
  its first probes passed). Either the node was slow only for a while or the cut was false; the
  dashboard says so where the operator looks, so that it is not read as a fault.
- ``retired``: the node was retired while out.

**One writer**: :func:`follow` is called by :func:`outlier_admin.control.rows.write_rows`, the one
writer of transitions (the tick and the outage drain), in the same transaction as the transitions it
reads; :func:`close_retired` by ``do_retire_node``, in the transaction of its audit event.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from django.utils import timezone

from detector.signals import SIGNAL_NAMES, unit_of
from detector.states import NodeState as S
from detector.states import Reason
from outlier_admin.control.models import Incident, IncidentOutcome, Transition
from outlier_admin.fleet.models import Node

#: The states out of full service: a transition into one opens an incident (or continues the open one).
OUT = frozenset(s.label for s in (S.DEGRADED, S.PENDING_APPROVAL, S.QUARANTINED, S.PROBING, S.RECOVERING,
                                  S.FORCED_QUARANTINE))
#: How far out each state is; ``worst_state`` keeps the first of the highest.
SEVERITY = {S.DEGRADED.label: 1, S.RECOVERING.label: 1, S.PENDING_APPROVAL.label: 2, S.QUARANTINED.label: 3,
            S.PROBING.label: 3, S.FORCED_QUARANTINE.label: 3}
#: States without traffic: the first transition into one is the incident's ``quarantined_at``.
DRAINED = frozenset({S.QUARANTINED.label, S.PROBING.label, S.FORCED_QUARANTINE.label})
#: The canary's edges within an incident: each a probe outcome, counted by the canary's own counters
#: (``outlier_canary_probes_total``), not as a new quarantine.
CANARY_CYCLE = frozenset({Reason.PROBE_DUE.value, Reason.PROBE_FAILED.value, Reason.RECOVERY_STEP_FAILED.value})
#: Reasons that are an operator's decision.
BY_OPERATOR = frozenset({Reason.OPERATOR_QUARANTINE.value, Reason.OPERATOR_RELEASE.value, Reason.OPERATOR_ACTIVE.value,
                         Reason.REJECTED.value})


def _opening(inc: Incident, t: Transition, thresholds_of: Any) -> None:
    """Copy the deciding cause of ``t`` onto ``inc`` (see the module docstring)."""
    inc.first_state = inc.worst_state = t.to_state
    inc.reason = t.reason
    inc.signal = t.signal or ""
    inc.unit = unit_of(t.signal, thresholds_of(t.group_id).normalization) if t.signal else ""
    inc.z, inc.ema, inc.baseline = t.z, t.ema, t.baseline
    inc.detail = str((t.explanation or {}).get("detail", ""))[:2000]


def _step(inc: Incident, t: Transition) -> None:
    """A transition within the open incident ``inc``: counters, the first drain, the worst state."""
    if t.reason == Reason.PROBE_FAILED:
        inc.probes_failed += 1
    elif t.reason == Reason.RECOVERY_STEP_FAILED:
        inc.restore_steps_failed += 1
    if t.to_state in DRAINED and inc.quarantined_at is None:
        inc.quarantined_at = t.at
    if SEVERITY.get(t.to_state, 0) > SEVERITY.get(inc.worst_state, 0):
        inc.worst_state = t.to_state


def outcome_of(inc: Incident, closing_reason: str) -> str:
    """How ``inc`` ended, closed by a transition of ``closing_reason`` (the module docstring's rule)."""
    if inc.probes_failed or inc.restore_steps_failed:
        return IncidentOutcome.FAULT_CONFIRMED
    if closing_reason in BY_OPERATOR or inc.reason in BY_OPERATOR:
        return IncidentOutcome.OPERATOR
    return IncidentOutcome.NO_FAULT_FOUND


def follow(transitions: Iterable[Transition]) -> list[Incident]:
    """Open, continue and close the incidents of ``transitions`` (saved rows, in time order); call in
    their transaction. Returns the incidents written."""
    rows = [t for t in transitions if not t.shadow]
    if not rows:
        return []
    node_ids = {t.node_id for t in rows}
    open_ = {i.node_id: i for i in Incident.objects.filter(node_id__in=node_ids, ended_at__isnull=True)}
    cache: dict[int, Any] = {}

    def thresholds_of(group_id: int) -> Any:
        if group_id not in cache:
            cache[group_id] = next(t for t in rows if t.group_id == group_id).group.thresholds()
        return cache[group_id]

    touched: dict[int, Incident] = {}
    for t in rows:
        inc = open_.get(t.node_id)
        if t.to_state in OUT:
            if inc is None:
                inc = Incident(group_id=t.group_id, node_id=t.node_id, opened_by=t, started_at=t.at)
                opener = t if t.from_state not in OUT else _last_opener(t)
                if opener is not t:
                    inc.started_at, inc.opened_by = opener.at, opener
                _opening(inc, opener, thresholds_of)
                open_[t.node_id] = inc
            _step(inc, t)
        elif inc is not None:
            inc.ended_at, inc.closed_by = t.at, t
            inc.outcome = outcome_of(inc, t.reason)
            del open_[t.node_id]
        else:
            continue
        touched[id(inc)] = inc
    for inc in touched.values():
        inc.save()
    return list(touched.values())


def _last_opener(t: Transition) -> Transition:
    """The transition that took ``t``'s node out of full service, for a node already out when no
    incident was open (its history predates incidents): the last one from a state in full service, or
    ``t`` itself when there is none."""
    return (Transition.objects.filter(node_id=t.node_id, shadow=False, at__lte=t.at, to_state__in=list(OUT))
            .exclude(from_state__in=list(OUT)).order_by("-at", "-pk").first() or t)


def close_retired(node: Node) -> Incident | None:
    """End ``node``'s open incident as ``retired`` (call in the retirement's transaction)."""
    inc = Incident.objects.filter(node=node, ended_at__isnull=True).first()
    if inc is None:
        return None
    inc.ended_at, inc.outcome = timezone.now(), IncidentOutcome.RETIRED
    inc.save(update_fields=["ended_at", "outcome"])
    return inc


# --- words -------------------------------------------------------------------------------------------

#: Transition reason codes (:class:`detector.states.Reason`) in words.
CAUSE_WORDS = {
    "warmed_up": "warm-up finished",
    "z_degrade": "slower than its peers",
    "z_recovered": "back in line with its peers",
    "z_quarantine": "much slower than its peers, for long enough to quarantine",
    "tail_ratio": "its slowest requests are far slower than its median (P99/P50 test)",
    "cross_p50": "its median latency is over twice its peers'",
    "consecutive_errors": "consecutive errors",
    "success_rate": "success rate far below its peers'",
    "probe_due": "quarantined; a canary probe is due",
    "probe_failed": "a canary probe failed",
    "probes_passed": "canary probes passed; restoring its weight step by step",
    "recovery_step_failed": "slow again while its weight was being restored",
    "recovered": "fully restored",
    "approved": "an operator approved its quarantine",
    "rejected": "an operator rejected its quarantine",
    "condition_cleared": "the condition that proposed its quarantine cleared",
    "operator_quarantine": "quarantined by an operator",
    "operator_active": "forced into service by an operator",
    "operator_release": "released by an operator",
    "override_expired": "an operator's override expired",
}


def cause_in_words(reason: str, signal: str = "") -> str:
    """A reason code in words; with ``signal``, the signal it was decided on, by its name."""
    words = CAUSE_WORDS.get(reason, reason.replace("_", " "))
    return f"{words} on {SIGNAL_NAMES.get(signal, signal)}" if signal else words


def figure(value: float | None, unit: str) -> str:
    """A figure in its unit: ``1.92x expected``, ``30.9 ms/token``."""
    if value is None:
        return "–"
    return f"{value:.2f}x expected" if unit == "x expected" else f"{value:.3g} {unit}".rstrip()


def evidence_words(reason: str, signal: str = "", z: float | None = None, ema: float | None = None,
                   baseline: float | None = None, unit: str = "") -> str:
    """A decision in one line, with its signal and units: ``slower than its peers on decode time per
    token: Z 18.4, EMA 30.9 ms/token vs peer baseline 16.1 ms/token (1.92x)``; without a signal
    (errors, an operator), its reason's words."""
    words = cause_in_words(reason, signal)
    if not signal:
        return words
    parts = []
    if z is not None:
        parts.append(f"Z {z:.1f}")
    if ema is not None and baseline is not None:
        ratio = f" ({ema / baseline:.2f}x)" if baseline > 0 else ""
        parts.append(f"EMA {figure(ema, unit)} vs peer baseline {figure(baseline, unit)}{ratio}")
    return f"{words}: {', '.join(parts)}" if parts else words


def cause_text(inc: Incident) -> str:
    """The incident's deciding cause in one line (:func:`evidence_words`)."""
    return evidence_words(inc.reason, inc.signal, inc.z, inc.ema, inc.baseline, inc.unit)


def probe_summary(probes: list[Any], now: Any, unit: str = "x expected") -> str:
    """The incident's probes in one line, newest first in ``probes``, their latency and limit in
    ``unit`` (the ``norm`` signal's): ``3 probes failed, last 11 s ago: 2.70x expected, limit 1.50x
    expected`` ("" without a judged probe)."""
    judged = [p for p in probes if p.passed is not None]
    if not judged:
        return ""
    last = judged[0]
    failed = sum(1 for p in judged if not p.passed)
    passed = len(judged) - failed
    counts = ", ".join(f"{n} probe{'s' if n != 1 else ''} {word}" for n, word in ((failed, "failed"), (passed, "passed"))
                       if n)
    ago = max(0, int((now - last.at).total_seconds()))
    if last.ok and last.normalised_latency is not None:
        what = f"{figure(last.normalised_latency, unit)}, limit {figure(last.limit, unit)}"
    else:
        what = f"no answer ({last.error or f'HTTP {last.status}'})"
    return f"{counts}, last {ago} s ago: {what}"


# --- what happened beneath an incident --------------------------------------------------------------


@dataclass
class Story:
    """An incident and everything beneath it, in time order: ``steps`` are its transitions other than
    the canary's cycles, its overrides and its proposals (``(at, kind, row)``, kind ``transition`` /
    ``override`` / ``proposal``); ``probes`` its canary probes (newest first) and ``cycles`` the
    transitions of the canary's cycles (each a probe outcome, told by its probe)."""

    incident: Incident
    steps: list[tuple[Any, str, Any]] = field(default_factory=list)
    probes: list[Any] = field(default_factory=list)
    cycles: int = 0

    @property
    def probes_failed(self) -> int:
        return sum(1 for p in self.probes if p.passed is False)

    @property
    def probes_passed(self) -> int:
        return sum(1 for p in self.probes if p.passed)


def story(inc: Incident, *, limit: int = 500) -> Story:
    """What happened beneath ``inc`` (see :class:`Story`): four queries, each bounded by ``limit``."""
    from outlier_admin.control.models import CanaryProbe, Override, QuarantineProposal

    end = inc.ended_at or timezone.now()
    out = Story(inc)
    window = {"node_id": inc.node_id}
    for t in Transition.objects.filter(**window, at__gte=inc.started_at, at__lte=end).order_by("at", "pk")[:limit]:
        if t.reason in CANARY_CYCLE:
            out.cycles += 1
        else:
            out.steps.append((t.at, "transition", t))
    for o in Override.objects.filter(**window, created_at__gte=inc.started_at, created_at__lte=end)[:limit]:
        out.steps.append((o.created_at, "override", o))
    for p in QuarantineProposal.objects.filter(**window, created_at__gte=inc.started_at, created_at__lte=end)[:limit]:
        out.steps.append((p.created_at, "proposal", p))
    out.steps.sort(key=lambda s: s[0])
    out.probes = list(CanaryProbe.objects.filter(**window, at__gte=inc.started_at, at__lte=end).order_by("-at")[:limit])
    return out
