"""Stored history as the detector's peer views: the one place where history rows become Z's, baselines
and a deciding signal again.

The tick stores, per node, signal and history write (``HISTORY_EVERY_S``), the EMA and Z the detector
computed, the state after the tick, the evidence, and which row decided (``NodeHistory.deciding``);
per group, signal and write, the peer baseline (``GroupBaseline``). :func:`load` reads a window of
those rows once and lays them out as the detector lays out a group: :class:`Frames`, one column per
node and write, one row per signal (:data:`~detector.signals.SIGNALS`). Readers take from it:

- the threshold preview (:mod:`outlier_admin.history.preview`): the columns of each write as a
  :class:`~detector.detectors.verdict.PeerView` (:meth:`Frames.view`), handed to
  :func:`detector.evaluation.evaluate`;
- the heatmap and the nodes table: each column's :func:`reading`, the node's Z on its deciding signal,
  picked by :func:`detector.detectors.zscore.decide` over that write's peer view, and where it stands
  against :func:`detector.detectors.zscore.lines`.

**The baseline** of a write is the detector's own, stored with the rows. A stored NULL means the
detector had none (too few peers): the signal is not judged at that write. Rows written before
baselines were stored (no ``GroupBaseline`` row at all for the write) take the median EMA of the
write's nodes in a baseline state (:data:`detector.states.BASELINE_STATES`), the nearest estimate
of what the detector took the median of.

**A node's Z at a write** is its deciding signal's Z; a node the detector decided nothing on (no Z on
a judged signal, e.g. its prefill time under its own line with no decode yet) shows the Z of the
group's deciding signal at that write, if it has one, as the nodes table does
(:func:`outlier_admin.history.queries.with_latest_figures`, which reads the row the tick flagged):
it is under every line by construction, since the detector did not judge it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from django.db import connection

from detector.detectors import zscore
from detector.detectors.verdict import PeerView
from detector.nodes import NodeArrays
from detector.signals import QUEUE_FREE, SIGNALS
from detector.states import BASELINE_STATES, NodeState
from detector.thresholds import Thresholds
from outlier_admin.control.models import GroupBaseline, NodeHistory
from outlier_admin.fleet.models import Node

#: A reading's level against the detector's lines (the heatmap's colours).
AT_OR_UNDER, SLOWER, OVER_DEGRADE, OVER_QUARANTINE = 0, 1, 2, 3
_CODES = {s.label: int(s) for s in NodeState}
_BASELINE_CODES = np.array(sorted(int(s) for s in BASELINE_STATES))
_SIGNAL = {s: k for k, s in enumerate(SIGNALS)}


class TooManyRows(ValueError):
    """More history rows in the window than the reader allowed (``limit``)."""

    def __init__(self, limit: int) -> None:
        super().__init__(f"more than {limit} history rows")
        self.limit = limit


def epoch(at: object) -> float:
    """A stored timestamp as epoch seconds, microseconds exact (the key of a history write)."""
    return round(at if isinstance(at, float) else at.timestamp(), 6)  # type: ignore[attr-defined]


@dataclass(frozen=True)
class Frames:
    """A group's stored history in a window: one column per node and history write, in time order
    (then node), one row per signal of :data:`~detector.signals.SIGNALS` (NaN where not recorded)."""

    node_ids: list[int]  # the nodes with rows, by column index ``col_node``
    names: list[str]
    writes: np.ndarray  # (W,) epoch seconds, ascending
    col_node: np.ndarray  # (C,)
    col_write: np.ndarray  # (C,)
    state: np.ndarray  # (C,) NodeState code as recorded (-1: a label this version does not know)
    z: np.ndarray  # (len(SIGNALS), C)
    ema: np.ndarray  # (len(SIGNALS), C)
    present: np.ndarray  # (len(SIGNALS), C) bool: a row of that signal was written
    p50: np.ndarray  # (C,) the tail window's, recorded on the norm row
    p99: np.ndarray
    evidence: np.ndarray  # (C,) recorded on the row of the group's deciding signal (NaN: none)
    deciding: np.ndarray  # (C,) index of the row the tick flagged as deciding (-1: none)
    baseline: np.ndarray  # (len(SIGNALS), W) the peers' baseline (see the module docstring)
    rows: dict[str, int]  # history rows read, by signal

    @property
    def columns(self) -> int:
        return len(self.col_node)

    def bounds(self) -> list[tuple[int, int]]:
        """``[(first, end)]`` column range of each write."""
        cuts = np.searchsorted(self.col_write, np.arange(len(self.writes) + 1))
        return list(zip(cuts[:-1].tolist(), cuts[1:].tolist(), strict=True))

    def baselines(self, k: int, signals: Sequence[str] = SIGNALS) -> dict[str, float]:
        """Write ``k``'s baseline of each of ``signals`` (NaN for the others)."""
        return {s: float(self.baseline[_SIGNAL[s], k]) if s in signals else math.nan for s in SIGNALS}

    def view(self, k: int, signals: Sequence[str], judged: np.ndarray, peers: int,
             slot: np.ndarray | None = None) -> PeerView:
        """The peer view of write ``k`` over ``len(judged)`` nodes (this object's node ``j`` at
        ``slot[j]``, default ``j``): the ``judged`` nodes' Z and EMA on ``signals`` (NaN elsewhere),
        the write's baselines of ``signals``, ``peers`` nodes in the baseline."""
        lo, hi = np.searchsorted(self.col_write, [k, k + 1])
        cols = np.arange(lo, hi)
        nodes = self.col_node[cols] if slot is None else slot[self.col_node[cols]]
        keep = judged[nodes]
        rows = np.array([_SIGNAL[s] for s in signals], dtype=np.int64)
        size = len(judged)
        z, ema = np.full((len(SIGNALS), size), np.nan), np.full((len(SIGNALS), size), np.nan)
        z[np.ix_(rows, nodes[keep])] = self.z[np.ix_(rows, cols[keep])]
        ema[np.ix_(rows, nodes[keep])] = self.ema[np.ix_(rows, cols[keep])]
        return PeerView(z=z, ema=ema, baseline=self.baselines(k, signals), spread=dict.fromkeys(SIGNALS, math.nan),
                        peers=dict.fromkeys(SIGNALS, peers), fresh=judged.copy())


def judged_in(group_id: int, start: object, end: object) -> tuple[str, ...]:
    """The signals to read to judge every write of ``[start, end)`` as the detector did: the
    queue-free ones when each write with a stored baseline had one of them (two counts on the
    baselines' index), else every signal (a write before ``decode`` had a baseline was judged on
    ``norm`` and ``prefill``)."""
    stored = GroupBaseline.objects.filter(group_id=group_id, at__gte=start, at__lt=end)
    writes = stored.values("at").distinct().count()
    queue_free = stored.filter(signal__in=QUEUE_FREE, baseline__isnull=False).values("at").distinct().count()
    return QUEUE_FREE if writes and writes == queue_free else SIGNALS


def load(group_id: int, start: object, end: object, signals: Sequence[str], *, node_ids: Sequence[int] | None = None,
         max_rows: int | None = None, tails: bool = True) -> Frames:
    """The ``signals`` history rows of group ``group_id`` (or of ``node_ids``) in ``[start, end)`` and
    the group's stored baselines there, as :class:`Frames`: two queries. ``max_rows``: raise
    :class:`TooManyRows` rather than read more (the read itself is capped at one row over it);
    ``tails=False``: without the P50/P99 and evidence (NaN), which only the preview reads."""
    rows = _rows(group_id, node_ids, signals, start, end, max_rows, tails)
    if max_rows is not None and len(rows) > max_rows:
        raise TooManyRows(max_rows)
    stored = list(GroupBaseline.objects.filter(group_id=group_id, signal__in=list(signals), at__gte=start, at__lt=end)
                  .values_list("at", "signal", "baseline"))
    ids = sorted({r[0] for r in rows})
    names = dict(Node.objects.filter(pk__in=ids).values_list("pk", "name"))
    return build(rows, stored, names)


def build(rows: Sequence[tuple], stored: Sequence[tuple], names: dict | None = None) -> Frames:
    """:class:`Frames` of rows ``(node, epoch, signal, z, ema, p50, p99, state, evidence, deciding)``
    (``node``: its primary key, named by ``names``, or its name) and stored baselines ``(at, signal,
    baseline)``; pure."""
    n_sig = len(SIGNALS)
    if not rows:
        empty = np.zeros(0)
        return Frames([], [], empty, empty.astype(np.int64), empty.astype(np.int64), empty.astype(np.int64),
                      np.zeros((n_sig, 0)), np.zeros((n_sig, 0)), np.zeros((n_sig, 0), dtype=bool), empty, empty,
                      empty, empty.astype(np.int64), np.zeros((n_sig, 0)), {})
    nid, ts, sig, z, ema, p50, p99, state, evidence, deciding = zip(*rows, strict=True)
    ts_a = np.round(np.asarray(ts, dtype=np.float64), 6)
    node_a = np.asarray(nid)
    sig_a = np.array([_SIGNAL.get(s, -1) for s in sig], dtype=np.int64)
    ok = sig_a >= 0
    writes, write_of = np.unique(ts_a, return_inverse=True)
    nodes, node_of = np.unique(node_a, return_inverse=True)
    # Columns in (write, node) order: a write's nodes are contiguous.
    keys, col_of = np.unique(write_of * len(nodes) + node_of, return_inverse=True)
    c = len(keys)
    col_write, col_node = keys // len(nodes), keys % len(nodes)
    zz, ee = np.full((n_sig, c), np.nan), np.full((n_sig, c), np.nan)
    zz[sig_a[ok], col_of[ok]] = np.array(z, dtype=np.float64)[ok]
    ee[sig_a[ok], col_of[ok]] = np.array(ema, dtype=np.float64)[ok]
    present = np.zeros((n_sig, c), dtype=bool)
    present[sig_a[ok], col_of[ok]] = True
    st = np.full(c, -1, dtype=np.int64)
    st[col_of] = [_CODES.get(x, -1) for x in state]
    norm = sig_a == _SIGNAL["norm"]
    p50_c, p99_c, ev_c = np.full(c, np.nan), np.full(c, np.nan), np.full(c, np.nan)
    p50_c[col_of[norm]] = np.array(p50, dtype=np.float64)[norm]
    p99_c[col_of[norm]] = np.array(p99, dtype=np.float64)[norm]
    ev = np.array(evidence, dtype=np.float64)
    has_ev = np.isfinite(ev)
    ev_c[col_of[has_ev]] = ev[has_ev]
    dec = np.full(c, -1, dtype=np.int64)
    flagged = np.asarray(deciding, dtype=bool) & ok
    dec[col_of[flagged]] = sig_a[flagged]
    base = _baselines(stored, writes, st, ee, col_write)
    names = names or {}
    counts = {s: int(n) for s, n in zip(*np.unique(np.asarray(sig, dtype=str), return_counts=True), strict=True)}
    return Frames(node_ids=nodes.tolist(), names=[str(names.get(i, i)) for i in nodes.tolist()], writes=writes,
                  col_node=col_node, col_write=col_write, state=st, z=zz, ema=ee, present=present, p50=p50_c, p99=p99_c,
                  evidence=ev_c, deciding=dec, baseline=base, rows=counts)


def _baselines(stored: list[tuple], writes: np.ndarray, state: np.ndarray, ema: np.ndarray,
               col_write: np.ndarray) -> np.ndarray:
    """``(signal, write)`` baselines: stored (NULL: NaN), else the median EMA of the write's nodes in a
    baseline state (see the module docstring)."""
    base = np.full((len(SIGNALS), len(writes)), np.nan)
    has = np.zeros(base.shape, dtype=bool)
    at_write = {float(w): k for k, w in enumerate(writes.tolist())}
    for at, sig, b in stored:
        k = at_write.get(epoch(at))
        if k is not None and sig in _SIGNAL:
            has[_SIGNAL[sig], k] = True
            base[_SIGNAL[sig], k] = b if b is not None and b > 0 else np.nan
    serving = np.isin(state, _BASELINE_CODES)
    for s_i, k in zip(*np.nonzero(~has), strict=True):
        peers = ema[s_i, serving & (col_write == k)]
        peers = peers[np.isfinite(peers)]
        if len(peers) and np.median(peers) > 0:
            base[s_i, k] = float(np.median(peers))
    return base


def _rows(group_id: int, node_ids: Sequence[int] | None, signals: Sequence[str], start: object, end: object,
          max_rows: int | None, tails: bool = True) -> list[tuple]:
    """``(node_id, epoch, signal, z, ema, p50, p99, state, evidence, deciding)`` of the window's rows.
    On PostgreSQL the time is read as a number (a datetime per row was most of the cost of 36,000
    rows); elsewhere (the demo's SQLite) through the ORM."""
    cols = ("node_id", "at", "signal", "z", "ema", "p50", "p99", "state", "evidence", "deciding")
    limit = None if max_rows is None else max_rows + 1
    if connection.vendor != "postgresql":
        qs = NodeHistory.objects.filter(signal__in=list(signals), at__gte=start, at__lt=end)
        qs = qs.filter(node_id__in=list(node_ids)) if node_ids is not None else qs.filter(node__group_id=group_id)
        qs = qs.order_by("at", "node_id").values_list(*cols)[:limit]
        return [(i, epoch(at), *rest) for i, at, *rest in qs]
    table, nodes = (connection.ops.quote_name(m._meta.db_table) for m in (NodeHistory, Node))
    where = ("h.node_id = ANY(%s)" if node_ids is not None
             else f"h.node_id IN (SELECT id FROM {nodes} WHERE group_id = %s)")
    # No ORDER BY: build() lays the rows out itself (sorting 36,000 rows in the database cost a third
    # of the heatmap's read); a capped read is refused whole, so which rows it cut does not matter.
    p50, p99, evidence = ("h.p50", "h.p99", "h.evidence") if tails else ("NULL::float8",) * 3
    sql = (f"SELECT h.node_id, round(EXTRACT(EPOCH FROM h.at)::numeric, 6)::float8, h.signal, h.z, h.ema, {p50}, "
           f"{p99}, h.state, {evidence}, h.deciding FROM {table} h WHERE {where} AND h.signal = ANY(%s) "
           f"AND h.at >= %s AND h.at < %s" + ("" if limit is None else f" LIMIT {int(limit)}"))
    with connection.cursor() as cur:
        cur.execute(sql, [list(node_ids) if node_ids is not None else group_id, list(signals), start, end])
        return cur.fetchall()


@dataclass(frozen=True)
class Readings:
    """Per column of :class:`Frames`: the node's Z on its deciding signal (NaN: none), that signal's
    index (-1), its EMA over the peers' baseline, its level (:data:`OVER_QUARANTINE`... ; -1: no Z)."""

    z: np.ndarray
    which: np.ndarray
    excess: np.ndarray
    level: np.ndarray


def reading(f: Frames, t: Thresholds, signal: str | None = None) -> Readings:
    """Every column's reading: on its **deciding** signal (``signal=None``), picked by
    :func:`detector.detectors.zscore.decide` among the signals the detector judged at that write
    (:func:`~detector.detectors.zscore.judged_signals` over the write's baselines: ``norm`` before
    ``decode`` had a baseline), and its place against :func:`~detector.detectors.zscore.lines`; or
    on one ``signal``. Vectorised: one decision per distinct set of judged signals in the window.

    Each column is a node of one peer view whose baseline is 1 on the judged signals (the EMAs are
    divided by their own write's baseline), so ``EMA / baseline`` is each column's own excess; its
    recorded state is the node's state (a cut node's prefill time is judged against its exit line,
    as in the tick)."""
    c = f.columns
    z_out, which_out = np.full(c, np.nan), np.full(c, -1, dtype=np.int64)
    excess_out, level_out = np.full(c, np.nan), np.full(c, -1, dtype=np.int64)
    with np.errstate(invalid="ignore", divide="ignore"):
        excess = f.ema / f.baseline[:, f.col_write]
    if signal is not None:
        judged = [(signal,)] * len(f.writes)
    else:
        judged = [zscore.judged_signals(f.baselines(k), t) for k in range(len(f.writes))]
    for signals in dict.fromkeys(judged):
        writes = np.array([k for k, j in enumerate(judged) if j == signals], dtype=np.int64)
        cols = np.flatnonzero(np.isin(f.col_write, writes))
        # The signals of the set that had a baseline at these writes (the others have no Z there).
        based = tuple(s for s in signals if np.isfinite(f.baseline[_SIGNAL[s], writes]).any())
        z, w, x, lv = _decide(f, t, cols, based or signals[:1], excess[:, cols])
        z_out[cols], which_out[cols], excess_out[cols], level_out[cols] = z, w, x, lv
    return Readings(z=z_out, which=which_out, excess=excess_out, level=level_out)


def _decide(f: Frames, t: Thresholds, cols: np.ndarray, signals: Sequence[str],
            excess: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """:func:`reading` of columns ``cols``, all judged on ``signals``."""
    c = len(cols)
    keep = np.array([s in signals for s in SIGNALS])
    z = np.where(keep[:, None], f.z[:, cols], np.nan)
    view = PeerView(z=z, ema=np.where(keep[:, None], excess, np.nan),
                    baseline={s: 1.0 if keep[k] else math.nan for k, s in enumerate(SIGNALS)},
                    spread=dict.fromkeys(SIGNALS, math.nan), peers=dict.fromkeys(SIGNALS, 0),
                    fresh=np.ones(c, dtype=bool))
    a = NodeArrays(map(str, range(c)))
    a.state[:] = np.where(f.state[cols] >= 0, f.state[cols], int(NodeState.HEALTHY))
    with np.errstate(invalid="ignore", divide="ignore"):
        d = zscore.decide(view, a, t, now=0.0)
        over = zscore.lines(d, t)
        level = np.where(over.over_q, OVER_QUARANTINE, np.where(over.over_d, OVER_DEGRADE,
                                                                np.where(d.cut_z > 0, SLOWER, AT_OR_UNDER)))
        decided = np.isfinite(d.cut_z)
        # No deciding Z: the group's deciding signal's Z, under every line (see the module docstring).
        group_k = _SIGNAL.get(signals[0], -1)
        fallback = z[group_k] if group_k >= 0 else np.full(c, np.nan)
        shown = np.where(decided, d.cut_z, fallback)
        which = np.where(decided, d.cut_which, np.where(np.isfinite(fallback), group_k, -1))
        ratio = np.where(which >= 0, view.ema[np.maximum(which, 0), np.arange(c)], np.nan)
        level = np.where(decided, level, np.where(np.isfinite(shown), np.where(shown > 0, SLOWER, AT_OR_UNDER), -1))
    return shown, which, ratio, level
