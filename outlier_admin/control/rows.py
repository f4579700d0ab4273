"""The SQL rows of one tick, built the same way whether they are written at once (PostgreSQL up) or
kept in the Redis outbox (:mod:`outlier_admin.control.outage_store`): transitions, node history, group
baselines, detector proposals, and the node rows' new state/weight/last-seen.

One owner for these shapes, imported by the tick pipeline and by the outbox (neither imports the
other's private functions), and the one writer of them (:func:`write_rows`)."""

from __future__ import annotations

import contextlib
import functools
import math
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import numpy as np
import orjson
from django.db import connection, transaction
from django.db.models import Model

from detector.signals import SIGNALS
from detector.states import NodeState, Transition
from outlier_admin.control import incidents
from outlier_admin.control.models import GroupBaseline, NodeHistory
from outlier_admin.control.models import Transition as TransitionRow
from outlier_admin.control.publish import lifted, record_version, version_update_sql
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


# --- the one writer ---------------------------------------------------------------------------------


@functools.cache
def _insert(model: type[Model], columns: tuple[str, ...], alias: str) -> str:
    """``INSERT INTO <model> (columns) SELECT ...`` from a JSON array parameter of rows laid out as
    ``columns``, in the array's order (``RETURNING id`` then returns them in that order)."""
    qn = connection.ops.quote_name
    fields = {f.column: f for f in model._meta.concrete_fields}
    exprs = []
    for k, column in enumerate(columns):
        f = fields[column]
        kind = f.db_type(connection)
        if f.get_internal_type() in ("CharField", "TextField", "SlugField"):
            exprs.append(f"{alias}.v->>{k}")  # no cast: a value too long fails as the ORM's insert would
        elif kind == "jsonb":
            exprs.append(f"({alias}.v->{k})::jsonb")
        else:
            exprs.append(f"({alias}.v->>{k})::{kind}")
    return (f"INSERT INTO {qn(model._meta.db_table)} ({', '.join(qn(c) for c in columns)}) "
            f"SELECT {', '.join(exprs)} FROM json_array_elements(%s::json) WITH ORDINALITY AS {alias}(v, k) "
            f"ORDER BY {alias}.k")


_TRANSITION_COLUMNS = tuple(f.column for f in TransitionRow._meta.concrete_fields if not f.primary_key)
_TRANSITION_ATTNAMES = tuple(f.attname for f in TransitionRow._meta.concrete_fields if not f.primary_key)
_JSON = orjson.OPT_SERIALIZE_NUMPY | orjson.OPT_NON_STR_KEYS


def _json(rows: list[Any]) -> str:
    return orjson.dumps(rows, option=_JSON).decode()


@dataclass
class TickRows:
    """What one tick (or one drain of the outbox) writes to SQL: transition rows, history and baseline
    records (:data:`HISTORY_COLUMNS`, :data:`BASELINE_COLUMNS`) and node changes ``(pk, state,
    weight, last_seen)``."""

    transitions: list[TransitionRow] = field(default_factory=list)
    history: list[tuple] = field(default_factory=list)
    baselines: list[tuple] = field(default_factory=list)
    nodes: list[tuple[int, str, int, datetime | None]] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.transitions) + len(self.history) + len(self.baselines)


def write_rows(group: ModelGroup, version: int, rows: TickRows, **fields: Any) -> list[int]:
    """The one writer of a tick's rows, for the tick (:class:`~outlier_admin.control.sql_store.SqlStore`)
    and the outage drain (:func:`~outlier_admin.control.outage_store.drain`): insert the transitions,
    history and baselines, open and close the incidents the transitions begin and end
    (:func:`outlier_admin.control.incidents.follow`), update the node rows that moved, and raise the
    group's version with ``fields`` set (:func:`~outlier_admin.control.publish.record_version`: the tick's time and
    figures). On PostgreSQL one statement (no ``BEGIN``/``COMMIT`` needed); elsewhere (the demo's
    SQLite) through the ORM. Returns the transitions' primary keys, in order."""
    if connection.vendor != "postgresql":
        return _write_rows_orm(group, version, rows, fields)
    transitions, history, baselines, nodes = rows.transitions, rows.history, rows.baselines, rows.nodes
    qn = connection.ops.quote_name
    ctes: list[str] = []
    params: list[Any] = []
    if history:
        ctes.append(f"history AS ({_insert(NodeHistory, HISTORY_COLUMNS, 'h')})")
        params.append(_json(history))
    if baselines:
        ctes.append(f"baselines AS ({_insert(GroupBaseline, BASELINE_COLUMNS, 'b')})")
        params.append(_json(baselines))
    if nodes:
        ctes.append(f"nodes AS (UPDATE {qn(Node._meta.db_table)} AS n SET state = u.v->>1, "
                    "weight = (u.v->>2)::integer, last_seen = (u.v->>3)::timestamptz "
                    "FROM json_array_elements(%s::json) AS u(v) WHERE n.id = (u.v->>0)::bigint)")
        params.append(_json(nodes))
    group_update, group_params = version_update_sql(group, version, **fields)
    if transitions:
        ctes.append(f"tick AS ({group_update})")
        params += group_params
        primary = f"{_insert(TransitionRow, _TRANSITION_COLUMNS, 't')} RETURNING id"
        params.append(_json([[getattr(t, a) for a in _TRANSITION_ATTNAMES] for t in transitions]))
    else:
        primary = group_update
        params += group_params
    sql = (f"WITH {', '.join(ctes)} " if ctes else "") + primary
    # With transitions, their incidents in the same transaction (a tick without any stays one statement).
    with transaction.atomic(savepoint=False) if transitions else contextlib.nullcontext():
        with connection.cursor() as cur:
            cur.execute(sql, params)
            ids = [r[0] for r in cur.fetchall()] if transitions else []
        for row, pk in zip(transitions, ids, strict=True):
            row.pk = pk
        incidents.follow(transitions)
    lifted(group, version, **fields)
    return ids


def _write_rows_orm(group: ModelGroup, version: int, rows: TickRows, fields: dict[str, Any]) -> list[int]:
    """:func:`write_rows` through the ORM (a database other than PostgreSQL: the demo's SQLite)."""
    with transaction.atomic(savepoint=False):  # the incidents with their transitions
        transitions, history, baselines, nodes = rows.transitions, rows.history, rows.baselines, rows.nodes
        TransitionRow.objects.bulk_create(transitions)
        incidents.follow(transitions)
        NodeHistory.objects.bulk_create([NodeHistory(**dict(zip(HISTORY_COLUMNS, h, strict=True))) for h in history],
                                        batch_size=500)
        GroupBaseline.objects.bulk_create([GroupBaseline(**dict(zip(BASELINE_COLUMNS, b, strict=True)))
                                           for b in baselines])
        Node.objects.bulk_update([Node(id=pk, state=state, weight=weight, last_seen=seen)
                                  for pk, state, weight, seen in nodes], ["state", "weight", "last_seen"], batch_size=500)
        record_version(group, version, **fields)
        return [t.pk for t in transitions]
