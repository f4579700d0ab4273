"""The SQL rows of one tick, built the same way whether they are written at once (PostgreSQL up) or
kept in the Redis outbox (:mod:`outlier_admin.control.degraded`): transitions, node history, group
baselines, detector proposals, and the node rows' new state/weight/last-seen.

One owner for these shapes, imported by the tick pipeline and by the outbox (neither imports the
other's private functions)."""

from __future__ import annotations

import math
from datetime import UTC, datetime
from typing import Any

import numpy as np

from detector import NodeState, Transition
from detector.signals import SIGNALS
from outlier_admin.control.models import GroupBaseline, NodeHistory
from outlier_admin.control.models import Transition as TransitionRow
from outlier_admin.fleet.models import ModelGroup, Node


def finite(v: Any) -> float | None:
    """``v`` as a float, or None when missing or not finite (SQL NULL)."""
    if v is None:
        return None
    v = float(v)
    return v if math.isfinite(v) else None


def ts(value: float) -> datetime:
    return datetime.fromtimestamp(value, tz=UTC)


#: Columns of a :class:`NodeHistory` row as :func:`history_records` lays them out.
HISTORY_COLUMNS = ("node_id", "signal", "at", "ema", "z", "p50", "p99", "samples", "weight", "state", "evidence",
                   "deciding", "downsampled")
#: Columns of a :class:`GroupBaseline` row as :func:`baseline_records` lays them out.
BASELINE_COLUMNS = ("group_id", "signal", "at", "baseline", "spread", "peers", "downsampled")

_LABELS = {int(s): s.label for s in NodeState}


def finite_list(values: Any) -> list[float | None]:
    """``values`` as floats, each non-finite one as None (SQL NULL): :func:`finite` over an array."""
    arr = np.asarray(values, dtype=np.float64)
    out: list[float | None] = arr.tolist()
    for i in np.flatnonzero(~np.isfinite(arr)).tolist():
        out[i] = None
    return out


def history_records(ev: Any, node_ids: dict[str, int], at: datetime, only: set[str] | None = None) -> list[tuple]:
    """One :data:`HISTORY_COLUMNS` tuple per node (of ``node_ids``, name -> primary key; of ``only`` too
    when given) and signal of evaluation ``ev``, node by node. The tail window's P50/P99 go on the
    ``norm`` row, the evidence on the row of the group's deciding signal, ``deciding`` on the row of
    the signal the node was judged on (``ev.deciding``). Built column-wise (one ``tolist`` per
    signal): at 1,000 nodes a new history slot writes 5,000 rows."""
    picked = [(i, node_ids[name]) for i, name in enumerate(ev.nodes)
              if name in node_ids and (only is None or name in only)]
    if not picked:
        return []
    idx = np.fromiter((i for i, _ in picked), dtype=np.int64, count=len(picked))
    pks = [pk for _, pk in picked]
    states = [_LABELS[c] for c in np.asarray(ev.states)[idx].astype(np.int64).tolist()]
    samples = np.asarray(ev.counts)[idx].astype(np.int64).tolist()
    weights = np.asarray(ev.weights, dtype=np.float64)[idx].tolist()
    none = [None] * len(idx)
    evidence = (finite_list(np.asarray(ev.evidence)[idx]) if len(ev.evidence) else none)
    which = np.asarray(ev.deciding)[idx] if len(ev.deciding) else np.full(len(idx), -1)
    columns = []
    for sig, ema in ev.ema.items():
        norm = sig == "norm"
        columns.append((sig, finite_list(np.asarray(ema)[idx]), finite_list(np.asarray(ev.z_by_signal[sig])[idx]),
                        finite_list(np.asarray(ev.p50)[idx]) if norm else none,
                        finite_list(np.asarray(ev.p99)[idx]) if norm else none,
                        evidence if sig == ev.decision_signal else none,
                        (which == SIGNALS.index(sig)).tolist()))
    return [(pk, sig, at, ema[k], z[k], p50[k], p99[k], samples[k], weights[k], states[k], evi[k], dec[k], False)
            for k, pk in enumerate(pks) for sig, ema, z, p50, p99, evi, dec in columns]


def history_rows(ev: Any, by_name: dict[str, Node], at: datetime, only: set[str] | None = None) -> list[NodeHistory]:
    """:func:`history_records` as unsaved :class:`NodeHistory` instances (the outbox keeps those)."""
    ids = {name: node.pk for name, node in by_name.items()}
    return [NodeHistory(**dict(zip(HISTORY_COLUMNS, rec, strict=True)))
            for rec in history_records(ev, ids, at, only)]


def baseline_records(ev: Any, group_id: int, at: datetime) -> list[tuple]:
    """One :data:`BASELINE_COLUMNS` tuple per signal of ``ev``: ``ev.baseline[s]``/``ev.spread[s]``
    (NaN -> NULL). ``peers``: the detector's own count when the evaluation carries one
    (``ev.peers[s]``); otherwise the nodes with a finite Z on ``s`` in a baseline state (healthy or
    degraded) *after* the tick, which is off by the nodes that changed state in this tick."""
    exact = getattr(ev, "peers", None)
    in_baseline = np.isin(np.asarray(ev.states, dtype=np.int64), [int(NodeState.HEALTHY), int(NodeState.DEGRADED)])
    out = []
    for sig, base in ev.baseline.items():
        z = np.asarray(ev.z_by_signal.get(sig, []), dtype=np.float64)
        if isinstance(exact, dict) and sig in exact:
            peers = int(exact[sig])
        else:
            peers = int((np.isfinite(z) & in_baseline).sum()) if z.shape == in_baseline.shape else 0
        out.append((group_id, sig, at, finite(base), finite(ev.spread.get(sig)), peers, False))
    return out


def baseline_rows(ev: Any, group: ModelGroup, at: datetime) -> list[GroupBaseline]:
    """:func:`baseline_records` as unsaved :class:`GroupBaseline` instances."""
    return [GroupBaseline(**dict(zip(BASELINE_COLUMNS, rec, strict=True))) for rec in baseline_records(ev, group.pk, at)]


def group_figures(ev: Any) -> dict[str, Any]:
    """What the tick decided for the group as a whole, for its ``ModelGroup`` row: the deciding signal
    (``""``: none, seed mode) and the safeguard's figures (:class:`detector.states.Safeguard`). The API
    and the dashboard read these; they do not derive them again."""
    cap = getattr(ev, "cap", None)
    if cap is None:
        return {}
    return {"decision_signal": ev.decision_signal or "", "safeguard_limit": cap.limit,
            "safeguard_counted": cap.counted, "safeguard_held": cap.held}


def transition_row(t: Transition, group: ModelGroup, node: Node, shadow: bool, ev: Any) -> TransitionRow:
    explanation = t.to_dict()
    explanation["policy"] = group.policy
    explanation["published"] = not shadow
    explanation["safeguard"] = bool(ev.safeguard)
    explanation["safeguard_reason"] = ev.safeguard_reason
    if node.gpu_evidence:
        explanation["gpu_evidence"] = node.gpu_evidence
    return TransitionRow(
        group=group, node=node, at=ts(t.at), from_state=t.from_state.label, to_state=t.to_state.label,
        reason=t.reason, signal=t.signal or "", z=finite(t.z), baseline=finite(t.baseline), spread=finite(t.spread),
        ema=finite(t.ema), p50=finite(t.p50), p99=finite(t.p99), samples=int(t.samples or 0),
        explanation=explanation, shadow=shadow,
    )


def proposals_of(transitions: list[Transition], by_name: dict[str, Node], *, shadow: bool) -> list[dict[str, Any]]:
    """The detector proposals to open (policy ``approval``: a node moved to ``pending_approval``)."""
    return [
        {"node_id": by_name[tr.node].pk, "source": "detector", "evidence": tr.to_dict(),
         "reason": f"{tr.reason}: {tr.detail}" if tr.detail else tr.reason}
        for tr in transitions if tr.to_state == NodeState.PENDING_APPROVAL and not shadow
    ]


def rows_of_tick(ev: Any, group: ModelGroup, by_name: dict[str, Node], transitions: list[Transition], *,
                 shadow: bool, now: float, write_all: bool) -> tuple[list[Any], list[dict[str, Any]]]:
    """The SQL rows of one tick: transitions, history (every node on a new ``HISTORY_EVERY_S`` slot,
    else the nodes that moved) with the group baselines of that write, and the proposals to open."""
    rows: list[Any] = [transition_row(tr, group, by_name[tr.node], shadow, ev) for tr in transitions]
    moved = {tr.node for tr in transitions}
    at = ts(now)
    history = history_rows(ev, by_name, at, None if write_all else moved)
    rows.extend(history)
    if history:  # the baseline every Z of this write was measured against, one row per signal
        rows.extend(baseline_rows(ev, group, at))
    return rows, proposals_of(transitions, by_name, shadow=shadow)


# ``Node.last_seen`` is for people and sorting: written when it moved this much (or with a state or
# weight change), not at every tick of every node that had a request.
LAST_SEEN_RESOLUTION_S = 5.0


def node_changes(view: list[dict[str, Any]], states: dict[str, str], by_name: dict[str, Node],
                 last_seen: dict[str, float]) -> list[tuple[int, str, int, datetime | None]]:
    """``(pk, state, weight, last_seen)`` of the nodes whose detector state (``states``), published
    weight (``view``) or last-seen time (by ``LAST_SEEN_RESOLUTION_S`` or more) moved in this tick,
    against the row as read (``by_name``: the instances are not changed; the store reads the rows
    again when they were written)."""
    out = []
    for v in view:
        name = v["node"]
        node = by_name.get(name)
        if node is None:
            continue
        state, weight, seen, old = states[name], v["weight"], last_seen.get(name), node.last_seen
        seen_moved = bool(seen) and (old is None or seen - old.timestamp() >= LAST_SEEN_RESOLUTION_S)
        if node.state != state or node.weight != weight or seen_moved:
            out.append((node.pk, state, int(weight), ts(seen) if seen else old))
    return out
