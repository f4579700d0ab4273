"""Threshold preview: which transitions new thresholds would have produced over recorded history.

Replays the stored per-node history (of the group's deciding signal as the tick stored it — ``decode``
once the gateway logs TTFT or the servers stream, ``prefill_time`` from their prefill histograms alone,
else ``norm`` —, with the other queue-free signal's rows: EMA, Z, evidence, recorded state; P50/P99 of
the tail window) of a group
against two :class:`detector.Thresholds` — the current ones and the proposed ones — and returns the
simulated transitions of each, so an operator sees what a change *would have done* before saving it.

Rules replayed: the detector's own, not a copy. Each history step (``HISTORY_EVERY_S``) becomes a peer
view of the recorded figures, and :func:`replay` hands it to :func:`detector.evaluation.evaluate`,
the evaluation a tick runs: the deciding signal and the queue-drain rule for groups without TTFT,
persistence in seconds held between history steps, over evaluations (the recorded evidence stands in
for the unrecorded strength over the quarantine line), the evidence gate with flap damping, cause
priority and ``dry_run``, the safeguard cap and its hold (``safeguard_blocked``: a move the cap held,
:attr:`detector.moves.Move.safeguard_hold`), soft degrade with hysteresis, approval, and the tail and
cross-P50 detectors over the recorded percentiles (:class:`detector.detectors.tail.RecordedTail`). A
change of a rule in the detector is a change of the preview.

``baseline`` at a timestamp is the detector's own, stored by the tick with the history rows
(:class:`~outlier_admin.control.models.GroupBaseline`, same ``at``); for rows written without one
(history older than that table) it falls back to the median EMA of the nodes recorded
healthy/degraded at that timestamp.

Approximations, stated so nobody over-reads the preview: the evidence is replayed as recorded, i.e.
as accumulated under the materiality and allowance in force then (a new ``degrade_evidence`` line is
replayed exactly, a new ``degrade_materiality`` only through the EMA test); a history step counts as
one sample and one evaluation (the detector counts every request and tick, so real quarantines come
sooner); errors are not recorded in the history and not replayed; recovery needs canary probes, which
are not replayed, so a simulated quarantine lasts to the end of the window; nodes the history shows
warming, probing, recovering or forced by an operator are not judged at those rows.

Who and how much: a preview reads a whole group's history into memory and replays it twice, so it
is for the roles that act on thresholds and nodes (:data:`PREVIEW_CAPABILITIES`: operator, oncall),
and it is bounded — a window of at most ``PREVIEW_MAX_WINDOW_S`` seconds, a group of at most
``PREVIEW_MAX_NODES`` nodes, at most ``PREVIEW_MAX_ROWS`` history rows read (per query). Over a bound
the preview is refused with :class:`PreviewTooLarge` naming it (a 400), never silently truncated: a
replay of part of the history would show transitions that differ from what the detector would do.
Unbounded, 10,000 nodes x 60 rows took 10-16 s and +379 MB of one web worker per request (refused
now in 0.02 s); at the default bounds' limit, 1,000 nodes x an hour (~340,000 rows), 4-14 s and
+215 MB on the shared 2-core development machine.

``PREVIEW_MAX_ROWS`` is one budget for the whole preview, not per query: a group deciding on
``decode`` with ``prefill_time`` baselines read its deciding rows, the ``norm`` rows for the tail
window, the ``prefill_time`` rows and the ``norm`` rows once more, each up to the bound — four times
the rows the bound names (issue 29, finding 10: 17-42 s a request with 8 at once). The ``norm`` rows
are now read once, and every read takes from the same budget.

And how often (:func:`admit_preview`, both the API and the dashboard): a preview costs seconds of a
web thread, so each user has a token bucket of ``PREVIEW_BURST`` previews refilled one per
``PREVIEW_REFILL_S`` seconds (in Redis, shared by every web process and pod; atomic, so eight
requests at once take at most the tokens there are), and a web process runs at most
``PREVIEW_MAX_CONCURRENT`` previews at a time, so previews never hold all of its threads. Over
either, :class:`PreviewThrottled` (a 429 with ``Retry-After``); a refused request spends no token.
Without Redis the preview is refused (503): the limiter fails closed, as the detector itself needs
Redis.
"""

from __future__ import annotations

import contextlib
import math
import threading
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

import numpy as np
import redis
from django.conf import settings
from django.utils import timezone

from detector.thresholds import Thresholds
from outlier_admin import keys
from outlier_admin.api.permissions import CAPABILITIES, user_can
from outlier_admin.api.queries import decision_signal
from outlier_admin.control import buckets
from outlier_admin.control.models import GroupBaseline, NodeHistory, Transition
from outlier_admin.fleet.models import ModelGroup

#: Thresholds whose effect the replay can show (they act on stored figures).
PREVIEW_FIELDS = (
    "degrade_z", "degrade_hysteresis", "quarantine_z", "quarantine_persistence_s", "quarantine_persistence",
    "degrade_materiality",
    "quarantine_materiality", "degrade_evidence", "queue_drain_s", "tail_ratio", "cross_p50_ratio",
    "tail_windows", "max_quarantine_fraction",
)
JUDGED = frozenset({"healthy", "degraded", "pending_approval"})
#: Recorded states the replay always follows (membership and operator decisions, not thresholds).
FOLLOWED = frozenset({"warming", "forced_quarantine", "forced_active"})
#: Capabilities that allow a preview (any one): ``tune`` (operator) and ``override`` (oncall).
PREVIEW_CAPABILITIES = ("tune", "override")
#: The window the dashboard replays (the API's default is the serializer's, also an hour).
DEFAULT_WINDOW_S = 3600.0


def may_preview(user: Any) -> bool:
    """True if ``user`` may run a threshold preview (see :data:`PREVIEW_CAPABILITIES`)."""
    return any(user_can(user, cap) for cap in PREVIEW_CAPABILITIES)


def preview_roles() -> list[str]:
    """The role names that may preview, sorted (for the 403 messages)."""
    return sorted(set().union(*(CAPABILITIES[cap] for cap in PREVIEW_CAPABILITIES)))


class PreviewTooLarge(ValueError):
    """A preview over one of its bounds; ``field`` is the input at fault (``window_s``, or ``group``
    for the group's size and history)."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field


class PreviewThrottled(Exception):
    """A preview refused for how often or how many at once, not for what it asks: ``status`` 429
    (``retry_after_s`` until a token or a slot is free) or 503 (the limiter's Redis unreachable)."""

    def __init__(self, message: str, retry_after_s: int, status: int = 429) -> None:
        super().__init__(message)
        self.retry_after_s = max(int(retry_after_s), 1)
        self.status = status


def rate_key(user_id: int) -> str:
    """The token bucket of a user's previews: hash ``tokens``, ``at`` (Redis time, seconds)."""
    return keys.preview_ratelimit(user_id)


_slots_lock = threading.Lock()
_slots: dict[str, int] = {"running": 0}


def take_token(user_id: int) -> int:
    """Take one of the user's preview tokens: 0 if taken, else the milliseconds until one is there."""
    return buckets.take(rate_key(user_id), cap=settings.PREVIEW_BURST, rate_per_s=1 / settings.PREVIEW_REFILL_S)


@contextlib.contextmanager
def admit_preview(user: Any) -> Iterator[None]:
    """Run a preview of ``user`` inside: a slot of this process (``PREVIEW_MAX_CONCURRENT``) and a token
    of the user's bucket (``PREVIEW_BURST``, one back per ``PREVIEW_REFILL_S``), or raise
    :class:`PreviewThrottled`. The slot is taken first, so a request refused for a busy process
    spends no token."""
    limit = settings.PREVIEW_MAX_CONCURRENT
    with _slots_lock:
        if _slots["running"] >= limit:
            raise PreviewThrottled(
                f"{limit} threshold preview(s) already running on this server (PREVIEW_MAX_CONCURRENT={limit}): "
                "retry in a few seconds", retry_after_s=5)
        _slots["running"] += 1
    try:
        try:
            wait_ms = take_token(user.pk)
        except redis.RedisError as exc:
            raise PreviewThrottled(f"the preview's rate limiter (Redis) is unreachable: {type(exc).__name__}",
                                   retry_after_s=10, status=503) from exc
        if wait_ms:
            raise PreviewThrottled(
                f"threshold previews are limited to {settings.PREVIEW_BURST} at once and one per "
                f"{settings.PREVIEW_REFILL_S} s per user (PREVIEW_BURST, PREVIEW_REFILL_S): retry in "
                f"{math.ceil(wait_ms / 1000)} s", retry_after_s=math.ceil(wait_ms / 1000))
        yield
    finally:
        with _slots_lock:
            _slots["running"] -= 1


class RowBudget:
    """What is left of ``PREVIEW_MAX_ROWS`` for one preview's history reads (every query takes from it)."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.left = limit


@dataclass(frozen=True)
class SimTransition:
    node: str
    at: datetime
    from_state: str
    to_state: str
    rule: str

    def to_dict(self) -> dict[str, Any]:
        return {"node": self.node, "at": self.at.isoformat(), "from_state": self.from_state,
                "to_state": self.to_state, "rule": self.rule}


#: The detector's own cuts and quarantines, which a replay of history can make: what the replay of
#: the current thresholds is checked against (operators' moves, probes and restores are not replayed).
REPLAYED_REASONS = ("z_degrade", "z_quarantine", "tail_ratio", "cross_p50")
REPLAYED_STATES = ("degraded", "pending_approval", "quarantined")


@dataclass(frozen=True)
class Fidelity:
    """How well the replay of the **current** thresholds reproduces what the detector recorded in the
    window, by node and decision (a cut, or a quarantine: :func:`_kind`): a preview whose replay of today
    disagrees with what happened cannot say what a change would do (the replay reads history rows one
    every ``HISTORY_EVERY_S``, not the samples the detector read), and must say so rather than show
    "no difference". ``unread``: nodes with recorded cuts but no history rows in the window."""

    recorded: int
    reproduced: int
    missed: list[tuple[str, str]]
    extra: list[tuple[str, str]]
    unread: list[str]

    @property
    def faithful(self) -> bool:
        return not self.missed and not self.extra

    def to_dict(self) -> dict[str, Any]:
        return {"faithful": self.faithful, "recorded": self.recorded, "reproduced": self.reproduced,
                "missed": [{"node": n, "to_state": s} for n, s in self.missed],
                "extra": [{"node": n, "to_state": s} for n, s in self.extra],
                "nodes_without_rows": self.unread}


def _kind(state: str) -> str:
    """``degraded`` (a cut), or ``quarantine`` for either way out: the replay cannot know what an
    operator decided, so a quarantine the detector proposed (``pending_approval``) and one it took or an
    operator approved (``quarantined``) are the same decision of the detector."""
    return "quarantine" if state in ("pending_approval", "quarantined") else state


def fidelity(recorded: list[tuple[str, str]], current: list[SimTransition], replayed_nodes: set[str]) -> Fidelity:
    """Compare the recorded (node, cut or quarantine) with the current-threshold replay's (see :class:`Fidelity`)."""
    rec = {(n, _kind(st)) for n, st in recorded}
    sim = {(t.node, _kind(t.to_state)) for t in current
           if t.to_state in REPLAYED_STATES and t.rule in REPLAYED_REASONS}
    missed, extra = sorted(rec - sim), sorted(sim - rec)
    return Fidelity(recorded=len(rec), reproduced=len(rec & sim), missed=missed, extra=extra,
                    unread=sorted({n for n, _ in missed if n not in replayed_nodes}))


@dataclass
class Preview:
    rows: int
    nodes: int
    start: datetime
    end: datetime
    current: list[SimTransition] = field(default_factory=list)
    proposed: list[SimTransition] = field(default_factory=list)
    signal: str = "norm"  # the history replayed: the signal the detector decides on
    fidelity: Fidelity | None = None

    @staticmethod
    def _keys(ts: list[SimTransition]) -> set[tuple[str, str, str]]:
        return {(t.node, t.to_state, t.rule) for t in ts}

    @property
    def added(self) -> list[SimTransition]:
        """Transitions the proposed thresholds produce that the current ones do not (by node/state/rule)."""
        old = self._keys(self.current)
        return [t for t in self.proposed if (t.node, t.to_state, t.rule) not in old]

    @property
    def removed(self) -> list[SimTransition]:
        new = self._keys(self.proposed)
        return [t for t in self.current if (t.node, t.to_state, t.rule) not in new]

    def to_dict(self) -> dict[str, Any]:
        return {
            "rows": self.rows, "nodes": self.nodes, "signal": self.signal,
            "start": self.start.isoformat(), "end": self.end.isoformat(),
            "current": [t.to_dict() for t in self.current], "proposed": [t.to_dict() for t in self.proposed],
            "added": [t.to_dict() for t in self.added], "removed": [t.to_dict() for t in self.removed],
            "fidelity": self.fidelity.to_dict() if self.fidelity is not None else None,
        }


# at, node, z, ema, p50, p99, state, evidence
Row = tuple[datetime, str, float | None, float | None, float | None, float | None, str, float | None]
_PAD = "\x00pad"  # nodes of the group without history rows: they count toward the safeguard's cap


def replay(
    rows: list[Row], t: Thresholds, node_count: int, baselines: dict[datetime, float] | None = None, *,
    signal: str = "decode", also: dict[str, tuple[list[Row], dict[datetime, float]]] | None = None,
) -> list[SimTransition]:
    """Simulated transitions of ``rows`` (sorted by ``at``) under thresholds ``t``, decided by the
    detector's own ejection layer (:mod:`detector.ejection`): the recorded figures of each history
    step become a peer view, and the same functions that decide in a tick decide here — the deciding
    signal and the queue-drain rule (:func:`detector.detectors.zscore.decide`), persistence (in
    seconds, ``quarantine_persistence_s``, measured between history steps; or, set to 0 and in seed
    mode, the leaky count), the evidence gate with flap damping, tail and cross-P50 verdicts, cause priority and
    ``dry_run``, the safeguard cap, soft degrade and hysteresis, approval: :func:`detector.evaluation.evaluate`,
    without restores and probes (not recorded). Pure function.

    ``node_count`` sizes the safeguard (the group's nodes, not only those with history);
    ``baselines``: the detector's stored baseline per timestamp (missing: median-EMA estimate);
    ``signal``: the rows' signal, the group's deciding one as the tick stored it (``norm`` in a group
    without a queue-free signal: its latency includes the queue); ``also``: the other queue-free
    signals' rows and stored baselines (``prefill_time`` next to ``decode``): the replay judges each
    node on the larger Z, as the detector does."""
    from detector.detectors import zscore
    from detector.detectors.cross_p50 import CrossP50Detector
    from detector.detectors.tail import RecordedTail
    from detector.detectors.zscore import ZScoreDetector
    from detector.evaluation import evaluate
    from detector.moves import Moves
    from detector.nodes import NodeArrays
    from detector.signals import SIGNALS
    from detector.states import NodeState

    baselines = baselines or {}
    by_at: dict[datetime, list[Row]] = defaultdict(list)
    for r in rows:
        by_at[r[0]].append(r)
    others = {SIGNALS.index(sig): ({(r[0], r[1]): (r[2], r[3]) for r in sig_rows}, sig_base)
              for sig, (sig_rows, sig_base) in (also or {}).items()}
    names = sorted({r[1] for r in rows})
    a = NodeArrays(names + [f"{_PAD}{k}" for k in range(max(node_count - len(names), 0))])
    a.state[:] = NodeState.HEALTHY
    seen: set[str] = set()
    k = SIGNALS.index(signal)
    out: list[SimTransition] = []
    for at in sorted(by_at):
        now = at.timestamp()
        z, ema, p50, p99, evidence = (np.full(len(a), np.nan) for _ in range(5))
        has = np.zeros(len(a), dtype=bool)
        for _, node, rz, rema, rp50, rp99, recorded, rev in by_at[at]:
            i = a.index[node]
            cur = NodeState(int(a.state[i])).label
            if node not in seen or (recorded not in JUDGED and (cur not in JUDGED or recorded in FOLLOWED)):
                # Warming, forced by an operator, or in the detector's quarantine path: follow the
                # record, except that a node the replay keeps in service stays there.
                a.state[i] = NodeState.from_label(recorded)
                seen.add(node)
            if recorded not in JUDGED:
                continue
            has[i] = True
            z[i], ema[i], p50[i], p99[i] = (np.nan if v is None else v for v in (rz, rema, rp50, rp99))
            evidence[i] = np.inf if rev is None else rev  # rows from before evidence was recorded: not gated
        judged = has & (a.state != NodeState.QUARANTINED)
        peers = judged & ((a.state == NodeState.HEALTHY) | (a.state == NodeState.DEGRADED))
        baseline = baselines.get(at)
        if baseline is None and np.isfinite(ema[peers]).any():
            baseline = float(np.nanmedian(ema[peers]))
        base = {s: math.nan for s in SIGNALS}
        base[SIGNALS[k]] = math.nan if baseline is None else baseline
        stack_z, stack_ema = np.full((len(SIGNALS), len(a)), np.nan), np.full((len(SIGNALS), len(a)), np.nan)
        stack_z[k], stack_ema[k] = np.where(judged, z, np.nan), np.where(judged, ema, np.nan)
        for k2, (recorded_at, sig_base) in others.items():
            for i in np.flatnonzero(judged):
                z2, ema2 = recorded_at.get((at, a.ids[i]), (None, None))
                stack_z[k2, i] = np.nan if z2 is None else z2
                stack_ema[k2, i] = np.nan if ema2 is None else ema2
            b2 = sig_base.get(at)
            if b2 is None and np.isfinite(stack_ema[k2][peers]).any():
                b2 = float(np.nanmedian(stack_ema[k2][peers]))
            base[SIGNALS[k2]] = math.nan if b2 is None else b2
        view = zscore.PeerView(z=stack_z, ema=stack_ema, baseline=base, spread=dict.fromkeys(SIGNALS, math.nan),
                               peers={s: int(peers.sum()) for s in SIGNALS}, fresh=has)
        a.evidence = np.where(judged, evidence, a.evidence)
        # The strength half of the time rule (the CUSUM over the quarantine line) is not recorded: the
        # recorded evidence over the degrade line, which is never smaller, stands in for it.
        a.evidence_q = np.where(judged, evidence, a.evidence_q)
        a.new_samples = judged.astype(np.int64)  # one sample per history step
        with np.errstate(invalid="ignore"):
            a.new_drained = (judged & (now >= a.cut_at + t.queue_drain_s)).astype(np.int64)
        moves = Moves(a.state)
        # Errors are not recorded in the history: the replay's detectors are the latency ones.
        evaluate(a, t, now, view, (ZScoreDetector(), RecordedTail(p50, p99, judged & np.isfinite(p50)),
                                   CrossP50Detector()), moves)
        for m in moves.taken:
            if not a.ids[m.i].startswith(_PAD):
                rule = "safeguard_blocked" if m.safeguard_hold else m.reason.value
                out.append(SimTransition(a.ids[m.i], at, m.src.label, m.dst.label, rule))
    return out


def history_rows(
    group: ModelGroup, start: datetime, end: datetime, signal: str = "norm", *,
    max_rows: int | RowBudget | None = None, tail: dict[tuple[datetime, str], tuple[Any, Any]] | None = None,
) -> list[Row]:
    """The group's ``signal`` history rows in ``[start, end)`` as replay input, sorted by time. The
    tail window's P50/P99 are recorded on the ``norm`` rows: other signals' rows take them from there
    (``tail``: those already read, ``{(at, node): (p50, p99)}``; filled when empty).
    ``max_rows``: raise :class:`PreviewTooLarge` rather than read more than that many rows — an int
    per call, a :class:`RowBudget` across calls (each read takes from it). A count capped at the rows
    left + 1 (in the database) refuses before any row is loaded — reading rows only to refuse cost
    2.2 s and +62 MB at 100,000 rows —, and the read itself is capped as well, for rows written by a
    tick between the count and the read."""
    budget = RowBudget(max_rows) if isinstance(max_rows, int) else max_rows

    def rows(sig: str) -> list[Row]:
        in_window = NodeHistory.objects.filter(node__group=group, signal=sig, at__gte=start, at__lt=end)
        qs = in_window.order_by("at", "node_id").values_list(
            "at", "node__name", "z", "ema", "p50", "p99", "state", "evidence")
        if budget is None:
            return list(qs)
        left = budget.left
        too_many = PreviewTooLarge(
            "group", f"the preview would read more than PREVIEW_MAX_ROWS={budget.limit} history rows of "
                     f"group {group.name!r} ({sig} rows in the window, {budget.limit - left} read before): "
                     "preview a shorter window")
        if in_window.order_by()[: left + 1].count() > left:
            raise too_many
        out = list(qs[: left + 1])
        if len(out) > left:
            raise too_many
        budget.left -= len(out)
        return out

    out = rows(signal)
    if signal != "norm":
        if tail is None:
            tail = {}
        if not tail:
            tail.update({(r[0], r[1]): (r[4], r[5]) for r in rows("norm")})
        out = [(r[0], r[1], r[2], r[3], *tail.get((r[0], r[1]), (None, None)), r[6], r[7]) for r in out]
    return out


def stored_baselines(group: ModelGroup, start: datetime, end: datetime, signal: str = "norm") -> dict[datetime, float]:
    """``{at: baseline}`` of the detector's stored ``signal`` baselines of ``group`` in ``[start, end)``."""
    return dict(GroupBaseline.objects.filter(group=group, signal=signal, at__gte=start, at__lt=end,
                                             baseline__isnull=False).values_list("at", "baseline"))


def preview_thresholds(
    group: ModelGroup, changes: dict[str, Any], *, window_s: float | None = None, now: datetime | None = None,
    user: Any = None,
) -> Preview:
    """Replay the last ``window_s`` seconds (default: an hour, or ``PREVIEW_MAX_WINDOW_S`` if shorter)
    of ``group``'s history under its current thresholds and under ``current.replace(**changes)``.
    Raises ``ThresholdError`` for an invalid change, :class:`PreviewTooLarge` over a bound (each is
    checked before any history row is loaded). ``user``: the requester, admitted by
    :func:`admit_preview` once the input is checked (a refused input spends no token) and before any
    history is read; the API and the dashboard always pass it, only scripts and tests go without."""
    max_window = settings.PREVIEW_MAX_WINDOW_S
    if window_s is None:
        window_s = min(DEFAULT_WINDOW_S, max_window)
    if window_s > max_window:
        raise PreviewTooLarge("window_s", f"window_s={window_s:g} is over PREVIEW_MAX_WINDOW_S={max_window} "
                                          "seconds: preview a shorter window")
    current = group.thresholds()
    proposed = current.replace(**changes)
    n = group.nodes.filter(retired=False).count()
    if n > settings.PREVIEW_MAX_NODES:
        raise PreviewTooLarge("group", f"group {group.name!r} has {n} nodes, over PREVIEW_MAX_NODES="
                                       f"{settings.PREVIEW_MAX_NODES}: too large to replay here")
    with admit_preview(user) if user is not None else contextlib.nullcontext():
        return _replay_window(group, current, proposed, n, window_s, now)


def _replay_window(group: ModelGroup, current: Thresholds, proposed: Thresholds, n: int, window_s: float,
                   now: datetime | None) -> Preview:
    """:func:`preview_thresholds` once its input is checked and the preview admitted: the reads and replays."""
    end = now or timezone.now()
    start = end - timedelta(seconds=window_s)
    signal = decision_signal(group)
    others = []
    if signal != "norm":
        from detector.signals import QUEUE_FREE

        others = [other for other in QUEUE_FREE if other != signal and GroupBaseline.objects.filter(
            group=group, signal=other, at__gte=start, at__lt=end, baseline__isnull=False).exists()]
    # Every signal the preview reads, counted (each capped in the database) before any row is loaded:
    # a refusal costs a few counts, not the reads before the one over the bound (2.1 s at 1,000 nodes).
    budget = RowBudget(settings.PREVIEW_MAX_ROWS)
    left = budget.limit
    for sig in dict.fromkeys([signal, "norm", *others]):
        left -= NodeHistory.objects.filter(node__group=group, signal=sig, at__gte=start, at__lt=end).order_by()[
            : max(left, 0) + 1].count()
        if left < 0:
            raise PreviewTooLarge(
                "group", f"the preview would read more than PREVIEW_MAX_ROWS={budget.limit} history rows of "
                         f"group {group.name!r} ({', '.join(dict.fromkeys([signal, 'norm', *others]))} rows in "
                         "the window): preview a shorter window")
    tail: dict[tuple[datetime, str], tuple[Any, Any]] = {}  # the norm rows' P50/P99, read once
    rows = history_rows(group, start, end, signal, max_rows=budget, tail=tail)  # every read takes from it
    baselines = stored_baselines(group, start, end, signal)
    also = {other: (history_rows(group, start, end, other, max_rows=budget, tail=tail),
                    stored_baselines(group, start, end, other)) for other in others}
    now_replay = replay(rows, current, n, baselines, signal=signal, also=also)
    recorded = list(Transition.objects.filter(
        group=group, at__gte=start, at__lt=end, shadow=False, reason__in=REPLAYED_REASONS,
        to_state__in=REPLAYED_STATES).values_list("node__name", "to_state")[:10_000])
    return Preview(
        rows=len(rows), nodes=len({r[1] for r in rows}), start=start, end=end, current=now_replay,
        proposed=replay(rows, proposed, n, baselines, signal=signal, also=also), signal=signal,
        fidelity=fidelity(recorded, now_replay, {r[1] for r in rows}),
    )
