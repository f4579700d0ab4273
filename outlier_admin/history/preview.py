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

The history is read once, by the read model (:mod:`outlier_admin.history.replay`): the peer view of
each write, with the detector's stored baseline (and its one fallback for rows older than stored
baselines), is the one the heatmap reads too.

Approximations, stated so nobody over-reads the preview: a node the detector took out between two
history rows (within seconds of its cut: the detector judges every request, the replay one row every
``HISTORY_EVERY_S``) has its persistence counted as recorded at the row of its quarantine, which
the replayed thresholds' lines still decide (:func:`_as_recorded`); the evidence is replayed as recorded, i.e.
as accumulated under the materiality and allowance in force then (a new ``degrade_evidence`` line is
replayed exactly, a new ``degrade_materiality`` only through the EMA test); a history step counts as
one sample and one evaluation (the detector counts every request and tick, so real quarantines come
sooner); errors are not recorded in the history and not replayed; recovery needs canary probes, which
are not replayed, so a simulated quarantine lasts to the end of the window; nodes the history shows
warming, probing, recovering or forced by an operator are not judged at those rows.

Who and how much: a preview reads a whole group's history into memory and replays it twice, so it
is for the roles that act on thresholds and nodes (:data:`outlier_admin.fleet.roles.PREVIEW_CAPABILITIES`: operator, oncall),
and it is bounded — a window of at most ``PREVIEW_MAX_WINDOW_S`` seconds, a group of at most
``PREVIEW_MAX_NODES`` nodes, at most ``PREVIEW_MAX_ROWS`` history rows read (per query). Over a bound
the preview is refused with :class:`PreviewTooLarge` naming it (a 400), never silently truncated: a
replay of part of the history would show transitions that differ from what the detector would do.
Unbounded, 10,000 nodes x 60 rows took 10-16 s and +379 MB of one web worker per request (refused
now in 0.02 s); at the default bounds' limit, 1,000 nodes x an hour (~340,000 rows), 4-14 s and
+215 MB on the shared 2-core development machine.

``PREVIEW_MAX_ROWS`` is one budget for the whole preview: the rows of every signal it reads (the
deciding one, ``norm`` for the tail window, the other queue-free one) together, read in one query.

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
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import numpy as np
import redis
from django.conf import settings
from django.utils import timezone

from contract import keys
from detector.ejection import in_time
from detector.nodes import NodeArrays
from detector.signals import QUEUE_FREE, SIGNALS
from detector.states import JUDGED_STATES, OPERATOR_STATES, Reason
from detector.states import NodeState as S
from detector.thresholds import Thresholds
from outlier_admin.control import buckets
from outlier_admin.control.models import GroupBaseline, NodeHistory, Transition
from outlier_admin.fleet.models import ModelGroup
from outlier_admin.history.queries import decision_signal
from outlier_admin.history.replay import Frames, TooManyRows, load

#: Thresholds whose effect the replay can show (they act on stored figures).
PREVIEW_FIELDS = (
    "degrade_z", "degrade_hysteresis", "quarantine_z", "quarantine_persistence_s", "quarantine_persistence",
    "degrade_materiality",
    "quarantine_materiality", "degrade_evidence", "queue_drain_s", "tail_ratio", "cross_p50_ratio",
    "tail_windows", "max_quarantine_fraction",
)
#: Recorded states the replay always follows (membership and operator decisions, not thresholds).
FOLLOWED_STATES = OPERATOR_STATES | {S.WARMING}
#: The window the dashboard replays (the API's default is the serializer's, also an hour).
DEFAULT_WINDOW_S = 3600.0


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
REPLAYED_REASONS = tuple(r.value for r in (Reason.Z_DEGRADE, Reason.Z_QUARANTINE, Reason.TAIL_RATIO, Reason.CROSS_P50))
#: A quarantine the detector decided: proposed (awaiting approval) or taken.
QUARANTINE_LABELS = frozenset(s.label for s in (S.PENDING_APPROVAL, S.QUARANTINED))
REPLAYED_STATES = (S.DEGRADED.label, *sorted(QUARANTINE_LABELS))


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
    #: Why each missed one was not reproduced, in words: ``{(node, kind): reason}``.
    why: dict[tuple[str, str], str] = field(default_factory=dict)

    @property
    def faithful(self) -> bool:
        return not self.missed and not self.extra

    def to_dict(self) -> dict[str, Any]:
        return {"faithful": self.faithful, "recorded": self.recorded, "reproduced": self.reproduced,
                "missed": [{"node": n, "to_state": s, "why": self.why.get((n, s), "")} for n, s in self.missed],
                "extra": [{"node": n, "to_state": s} for n, s in self.extra],
                "nodes_without_rows": self.unread}


def _kind(state: str) -> str:
    """``degraded`` (a cut), or ``quarantine`` for either way out: the replay cannot know what an
    operator decided, so a quarantine the detector proposed (``pending_approval``) and one it took or an
    operator approved (``quarantined``) are the same decision of the detector."""
    return "quarantine" if state in QUARANTINE_LABELS else state


#: Why a recorded cut or quarantine was not replayed (see :func:`fidelity`).
WHY_NO_ROWS = "no history rows of this node in the window"
WHY_OUT_AT_START = "already out of service at its first row in the window (its way out began before it)"
WHY_BETWEEN_ROWS = {
    "quarantine": "its recorded figures are under the current quarantine line at every row (a Z or tail "
                  "reading the detector saw between two history rows, one every HISTORY_EVERY_S)",
    "degraded": "a cut made between two history rows (one every HISTORY_EVERY_S) that its rows do not show",
}


def fidelity(recorded: list[tuple[str, str]], current: list[SimTransition], replayed_nodes: set[str],
             out_at_start: set[str] | frozenset[str] = frozenset()) -> Fidelity:
    """Compare the recorded (node, cut or quarantine) with the current-threshold replay's (see
    :class:`Fidelity`), and say why each missed one was missed: no rows of the node, the node already
    out at its first row in the window (``out_at_start``), or between two rows."""
    rec = {(n, _kind(st)) for n, st in recorded}
    sim = {(t.node, _kind(t.to_state)) for t in current
           if t.to_state in REPLAYED_STATES and t.rule in REPLAYED_REASONS}
    missed, extra = sorted(rec - sim), sorted(sim - rec)
    why = {(n, k): WHY_NO_ROWS if n not in replayed_nodes else WHY_OUT_AT_START if n in out_at_start
           else WHY_BETWEEN_ROWS.get(k, WHY_BETWEEN_ROWS["quarantine"]) for n, k in missed}
    return Fidelity(recorded=len(rec), reproduced=len(rec & sim), missed=missed, extra=extra,
                    unread=sorted({n for n, _ in missed if n not in replayed_nodes}), why=why)


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


_PAD = "\x00pad"  # nodes of the group without history rows: they count toward the safeguard's cap



def _lut(states: object) -> np.ndarray:
    """A membership table indexed by state code (the read model's -1, an unknown label: the last
    entry, never a member): ``_lut(s)[codes]`` is ``np.isin(codes, s)`` without a sort per call."""
    out = np.zeros(len(S) + 1, dtype=bool)
    out[[int(x) for x in states]] = True
    return out


_JUDGED = _lut(JUDGED_STATES)
_JUDGED_OR_WARMING = _lut(JUDGED_STATES | {S.WARMING})
_FOLLOWED = _lut(FOLLOWED_STATES)
_QUARANTINE = _lut(S.from_label(x) for x in QUARANTINE_LABELS)


def replay(f: Frames, t: Thresholds, node_count: int, *, signal: str = "decode",
           also: Sequence[str] = ()) -> list[SimTransition]:
    """Simulated transitions of the stored history ``f`` (:mod:`outlier_admin.history.replay`) under
    thresholds ``t``, decided by the detector's own ejection layer (:mod:`detector.ejection`): the
    recorded figures of each history write become a peer view (:meth:`Frames.view`), and the same
    functions that decide in a tick decide here — the deciding signal and the queue-drain rule
    (:func:`detector.detectors.zscore.decide`), persistence (in seconds, ``quarantine_persistence_s``,
    measured between history steps; or, set to 0 and in seed mode, the leaky count), the evidence
    gate with flap damping, tail and cross-P50 verdicts, cause priority and ``dry_run``, the safeguard
    cap, soft degrade and hysteresis, approval: :func:`detector.evaluation.evaluate`, without restores
    and probes (not recorded). Pure function.

    ``node_count`` sizes the safeguard (the group's nodes, not only those with history); ``signal``:
    the group's deciding one as the tick stored it (``norm`` in a group without a queue-free signal:
    its latency includes the queue); ``also``: the other queue-free signals with a stored baseline
    (``prefill_time`` next to ``decode``): the replay judges each node on the larger Z, as the
    detector does. Nodes are judged only at writes they were recorded in a judged state
    (:data:`detector.states.JUDGED_STATES`); a recorded warming or operator state
    (:data:`FOLLOWED_STATES`) is followed."""
    from detector.detectors.cross_p50 import CrossP50Detector
    from detector.detectors.tail import RecordedTail
    from detector.detectors.zscore import ZScoreDetector
    from detector.evaluation import evaluate
    from detector.moves import Moves

    names = sorted(f.names)
    a = NodeArrays(names + [f"{_PAD}{k}" for k in range(max(node_count - len(names), 0))])
    a.state[:] = S.HEALTHY
    slot = np.array([a.index[n] for n in f.names], dtype=np.int64)  # f's node index -> a's
    seen = np.zeros(len(a), dtype=bool)
    last = np.full(len(a), -1, dtype=np.int64)  # each node's recorded state at its previous row
    timed = in_time(t)
    signals = (signal, *also)
    k_sig = SIGNALS.index(signal)  # a node is judged at a write with a row of the deciding signal
    out: list[SimTransition] = []
    for k, when in enumerate(f.writes.tolist()):
        lo, hi = np.searchsorted(f.col_write, [k, k + 1])
        cols = np.arange(lo, hi)
        cols = cols[f.present[k_sig, cols]]  # the nodes with a row of the deciding signal
        if not len(cols):
            continue  # a write of other signals only: no step of the deciding signal's history
        i = slot[f.col_node[cols]]
        has, entering = _follow_records(a, seen, last, i, f.state[cols])
        judged, p50, p99 = _load_figures(a, f, t, cols, i, has, when)
        peers = judged & ((a.state == S.HEALTHY) | (a.state == S.DEGRADED))
        view = f.view(k, signals, judged, int(peers.sum()), slot)
        _as_recorded(a, t, i[entering], when, timed)
        moves = Moves(a.state)
        # Errors are not recorded in the history: the replay's detectors are the latency ones.
        evaluate(a, t, when, view, (ZScoreDetector(), RecordedTail(p50, p99, judged & np.isfinite(p50)),
                                    CrossP50Detector()), moves)
        out += _transitions(a, moves, when)
    return out


def _follow_records(a: NodeArrays, seen: np.ndarray, last: np.ndarray, i: np.ndarray,
                    recorded: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The replay's states at one history write (nodes ``i`` of ``a``, recorded in states
    ``recorded``): a node seen for the first time, warming, forced by an operator or in the
    detector's quarantine path follows its record, except that a node the replay keeps in service
    stays there. Returns ``(has, entering)``: where a node is judged on this write's row (recorded in
    a judged state, or entering), and which of ``i`` the detector took out at this write (its row
    is the evaluation that did it) while the replay still has it in service: judged on that row, its
    persistence as the detector recorded it (:func:`_as_recorded`). Updates ``seen`` and ``last``
    (each node's recorded state at its previous row)."""
    rec_judged = _JUDGED[recorded]
    cur_judged = _JUDGED[a.state[i]]
    follow = ~seen[i] | (~rec_judged & (~cur_judged | _FOLLOWED[recorded]))
    entering = _QUARANTINE[recorded] & _JUDGED[last[i]] & cur_judged & seen[i]
    a.state[i[follow]] = recorded[follow]
    seen[i] = True
    last[i] = recorded
    has = np.zeros(len(a), dtype=bool)
    has[i[rec_judged | entering]] = True
    return has, entering


def _load_figures(a: NodeArrays, f: Frames, t: Thresholds, cols: np.ndarray, i: np.ndarray, has: np.ndarray,
                  when: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The recorded figures of one history write (rows ``cols`` of ``f``, nodes ``i`` of ``a``) as the
    evaluation reads them: the evidence (a row from before evidence was recorded is not gated), one
    new sample per judged node, the queue drained ``queue_drain_s`` after a cut. Returns
    ``(judged, p50, p99)``: the nodes judged (those with a row, but the quarantined) and the recorded
    percentiles for the tail and cross-P50 verdicts."""
    p50, p99, evidence = (np.full(len(a), np.nan) for _ in range(3))
    p50[i], p99[i] = f.p50[cols], f.p99[cols]
    evidence[i] = np.where(np.isnan(f.evidence[cols]), np.inf, f.evidence[cols])
    judged = has & (a.state != S.QUARANTINED)
    a.evidence = np.where(judged, evidence, a.evidence)
    # The strength half of the time rule (the CUSUM over the quarantine line) is not recorded: the
    # recorded evidence over the degrade line, which is never smaller, stands in for it.
    a.evidence_q = np.where(judged, evidence, a.evidence_q)
    a.new_samples = judged.astype(np.int64)  # one sample per history step
    with np.errstate(invalid="ignore"):
        a.new_drained = (judged & (when >= a.cut_at + t.queue_drain_s)).astype(np.int64)
    return judged, p50, p99


def _transitions(a: NodeArrays, moves: Any, when: float) -> list[SimTransition]:
    """The moves an evaluation took, as transitions (the padding nodes' left out; a move the safeguard
    held, as ``safeguard_blocked``)."""
    at = datetime.fromtimestamp(when, tz=UTC)
    return [SimTransition(a.ids[m.i], at, m.src.label, m.dst.label,
                          "safeguard_blocked" if m.safeguard_hold else m.reason.value)
            for m in moves.taken if not a.ids[m.i].startswith(_PAD)]


def _as_recorded(a: NodeArrays, t: Thresholds, nodes: np.ndarray, now: float, timed: bool) -> None:
    """Nodes the detector took out at this history write: count their quarantine strength as held for
    as long as the thresholds ask, one evaluation short of enough. The detector judged every request
    and tick between two history rows (10 s apart; a 3x-slow node is out within a few seconds of its
    cut), the replay one row each: without this it never saw enough rows to reproduce the quarantine.
    The evaluation of this write still decides: the node goes only if its recorded figures are over
    the quarantine line of the thresholds replayed (and the evidence gate, the cap, approval and
    ``dry_run`` allow it), so a higher ``quarantine_z`` or materiality still shows as a quarantine that
    would not happen; a longer persistence does not, for these nodes (stated in the module docstring)."""
    if not len(nodes):
        return
    if timed:
        a.q_held[nodes] = t.quarantine_persistence_s
        a.q_seen_at[nodes] = now
    else:
        a.over_q[nodes] = max(t.quarantine_persistence - 1, 0)
    a.over_q_evals[nodes] = t.quarantine_min_evaluations - 1


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
    """:func:`preview_thresholds` once its input is checked and the preview admitted: one read of the
    window's history (:func:`outlier_admin.history.replay.load`: the deciding signal's rows, the other
    queue-free signals' with a stored baseline, the ``norm`` rows for the tail window) and two replays."""
    end = now or timezone.now()
    start = end - timedelta(seconds=window_s)
    signal = decision_signal(group)
    others: list[str] = []
    if signal != "norm":
        others = [other for other in QUEUE_FREE if other != signal and GroupBaseline.objects.filter(
            group=group, signal=other, at__gte=start, at__lt=end, baseline__isnull=False).exists()]
    signals = list(dict.fromkeys([signal, "norm", *others]))
    # Counted (capped in the database) before any row is loaded: a refusal costs a count, not a read.
    limit = settings.PREVIEW_MAX_ROWS
    too_many = PreviewTooLarge(
        "group", f"the preview would read more than PREVIEW_MAX_ROWS={limit} history rows of group {group.name!r} "
                 f"({', '.join(signals)} rows in the window): preview a shorter window")
    in_window = NodeHistory.objects.filter(node__group=group, signal__in=signals, at__gte=start, at__lt=end)
    if in_window.order_by()[: limit + 1].count() > limit:
        raise too_many
    try:
        f = load(group.pk, start, end, signals, max_rows=limit)  # capped too: rows a tick wrote meanwhile
    except TooManyRows:
        raise too_many from None
    now_replay = replay(f, current, n, signal=signal, also=others)
    recorded = list(Transition.objects.filter(
        group=group, at__gte=start, at__lt=end, shadow=False, reason__in=REPLAYED_REASONS,
        to_state__in=REPLAYED_STATES).values_list("node__name", "to_state")[:10_000])
    rows = f.rows.get(signal, 0)
    return Preview(
        rows=rows, nodes=len(f.names), start=start, end=end, current=now_replay,
        proposed=replay(f, proposed, n, signal=signal, also=others), signal=signal,
        fidelity=fidelity(recorded, now_replay, set(f.names), _out_at_start(f)),
    )


def _out_at_start(f: Frames) -> set[str]:
    """The nodes whose first row in the window records them in neither a judged nor a warming state."""
    first = np.unique(f.col_node, return_index=True)[1]  # columns are in time order
    judged = _JUDGED_OR_WARMING[f.state[first]]
    return {f.names[int(j)] for j in f.col_node[first][~judged].tolist()}
