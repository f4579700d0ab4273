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


def history_rows(ev: Any, by_name: dict[str, Node], at: datetime, only: set[str] | None = None) -> list[NodeHistory]:
    """One :class:`NodeHistory` row per node (of ``by_name``; of ``only`` too when given) and signal of
    evaluation ``ev``. The tail window's P50/P99 go on the ``norm`` row, the evidence on the row of
    the signal the detector decides on."""
    rows = []
    for i, name in enumerate(ev.nodes):
        if name not in by_name or (only is not None and name not in only):
            continue
        state_label = NodeState(int(ev.states[i])).label
        for sig, ema in ev.ema.items():
            rows.append(NodeHistory(
                node=by_name[name], signal=sig, at=at, ema=finite(ema[i]), z=finite(ev.z_by_signal[sig][i]),
                p50=finite(ev.p50[i]) if sig == "norm" else None, p99=finite(ev.p99[i]) if sig == "norm" else None,
                samples=int(ev.counts[i]), weight=float(ev.weights[i]), state=state_label,
                evidence=finite(ev.evidence[i]) if sig == ev.decision_signal and len(ev.evidence) else None,
            ))
    return rows


def baseline_rows(ev: Any, group: ModelGroup, at: datetime) -> list[GroupBaseline]:
    """One :class:`GroupBaseline` per signal of ``ev``: ``ev.baseline[s]``/``ev.spread[s]`` (NaN ->
    NULL). ``peers``: the detector's own count when the evaluation carries one (``ev.peers[s]``);
    otherwise the nodes with a finite Z on ``s`` in a baseline state (healthy or degraded) *after*
    the tick, which is off by the nodes that changed state in this tick."""
    exact = getattr(ev, "peers", None)
    in_baseline = np.isin(np.asarray(ev.states, dtype=np.int64), [int(NodeState.HEALTHY), int(NodeState.DEGRADED)])
    out = []
    for sig, base in ev.baseline.items():
        z = np.asarray(ev.z_by_signal.get(sig, []), dtype=np.float64)
        if isinstance(exact, dict) and sig in exact:
            peers = int(exact[sig])
        else:
            peers = int((np.isfinite(z) & in_baseline).sum()) if z.shape == in_baseline.shape else 0
        out.append(GroupBaseline(group=group, signal=sig, at=at, baseline=finite(base),
                                 spread=finite(ev.spread.get(sig)), peers=peers))
    return out


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
    weight (``view``) or last-seen time (by ``LAST_SEEN_RESOLUTION_S`` or more) moved in this tick;
    the instances in ``by_name`` are updated to match, so an unchanged node costs no write."""
    out = []
    for v in view:
        node = by_name.get(v["node"])
        if node is None:
            continue
        state = states[v["node"]]
        seen = last_seen.get(node.name)
        new_seen = ts(seen) if seen else node.last_seen
        seen_moved = new_seen is not None and (
            node.last_seen is None or (new_seen - node.last_seen).total_seconds() >= LAST_SEEN_RESOLUTION_S)
        if node.state != state or node.weight != v["weight"] or seen_moved:
            node.state, node.weight, node.last_seen = state, v["weight"], new_seen
            out.append((node.pk, state, int(v["weight"]), new_seen))
    return out
