"""The tick's store with PostgreSQL up (:mod:`outlier_admin.control.tick`; the outage store is
:class:`outlier_admin.control.outage_store.OutageStore`).

What a tick costs in SQL, on PostgreSQL:

- **one read**: the group's row and its nodes, the nodes as one JSON text (``json_agg``). The text
  is compared with the last one this process read for the group: equal, the :class:`Node`
  instances of the last tick serve again (no row is converted, no model instantiated); otherwise
  only the nodes whose row changed are updated. Every tick still reads: nodes are registered,
  retired and edited by other processes, and the version in SQL outlives a Redis restart;
- **one write** (:func:`outlier_admin.control.rows.write_rows`, the outage drain's writer too): the
  transitions, the node history and group baselines, the node rows that changed and the group's
  version and tick time in one statement (data-modifying ``WITH``; rows passed as one
  JSON parameter each, not one bind parameter per value), atomic by itself, so no ``BEGIN`` /
  ``COMMIT``. A tick that applied operator inputs, opens a proposal or closes one also runs the
  ORM's statements for those, then in one transaction with it.

On another database (the demo's SQLite) the same rows go through the ORM.
"""

from __future__ import annotations

import functools
import logging
from collections import OrderedDict
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import orjson
import redis
from django.db import connection
from django.utils import timezone

from contract import keys
from detector.group import GroupDetector
from detector.states import NodeState
from outlier_admin.control import operator_inputs, outage_store
from outlier_admin.control.models import CanaryProbe
from outlier_admin.control.rows import (
    TickRows,
    baseline_records,
    group_figures,
    history_records,
    node_changes,
    rows_of_tick,
    transition_row,
    ts,
    write_rows,
)
from outlier_admin.fleet.models import ModelGroup, Node

log = logging.getLogger(__name__)

# What a tick reads of a node (its labels, URLs and registration are not loaded at every tick), in the
# model's field order (``Model.from_db`` takes them so).
NODE_FIELDS = ("id", "group_id", "name", "address", "base_weight", "state", "weight", "last_seen", "gpu_evidence",
               "retired")
assert [f.attname for f in Node._meta.concrete_fields if f.attname in NODE_FIELDS] == list(NODE_FIELDS)



# --- this process's copy of the groups' rows ------------------------------------------------------------


@dataclass
class _Fleet:
    """One group's nodes as this process last read them."""

    group_id: int
    text: str  # the nodes' JSON as PostgreSQL returned it
    rows: dict[int, list[Any]]  # pk -> the node's JSON row
    nodes: list[Node]
    generation: int  # moves when a node joins, leaves or changes anything but state/weight/last-seen
    by_pk: dict[int, Node] = field(default_factory=dict)


_FLEETS: OrderedDict[str, _Fleet] = OrderedDict()
_FLEETS_MAX = 1024  # groups; the least recently ticked dropped first (~100 KB per 100 nodes)
_generations = iter(range(1, 1 << 62))


def _config_of(row: list[Any]) -> tuple[Any, ...]:
    """The part of a node's JSON row a tick does not write (all but state, weight, last-seen): when it
    changes, what is built from it (the outage snapshot) is built again."""
    pk, name, address, base_weight, _state, _weight, _seen, gpu, retired = row
    return pk, name, address, base_weight, gpu, retired


def _seen(epoch: float | None) -> datetime | None:
    return None if epoch is None else datetime.fromtimestamp(epoch, tz=UTC)


def _node(alias: str, group_id: int, row: list[Any]) -> Node:
    pk, name, address, base_weight, state, weight, seen, gpu, retired = row
    return Node.from_db(alias, NODE_FIELDS,
                        (pk, group_id, name, address, base_weight, state, weight, _seen(seen), gpu or {}, retired))


def _refresh(fleet: _Fleet | None, group_id: int, text: str) -> _Fleet:
    """The group's nodes from their JSON text, reusing the instances of the nodes that did not change."""
    if fleet is not None and fleet.group_id == group_id and fleet.text == text:
        return fleet
    same_group = fleet is not None and fleet.group_id == group_id
    old_rows = fleet.rows if same_group else {}
    old_nodes = fleet.by_pk if same_group else {}
    rows: dict[int, list[Any]] = {}
    by_pk: dict[int, Node] = {}
    config_moved = not same_group
    alias = connection.alias
    for row in orjson.loads(text):
        pk = row[0]
        rows[pk] = row
        before, node = old_rows.get(pk), old_nodes.get(pk)
        if before == row and node is not None:
            by_pk[pk] = node
        elif node is not None and _config_of(before) == _config_of(row):
            # Only what the ticks write moved (a tick's own write, read back): updated in place.
            node.state, node.weight, node.last_seen = row[4], row[5], _seen(row[6])
            by_pk[pk] = node
        else:
            config_moved = True
            by_pk[pk] = _node(alias, group_id, row)
    config_moved = config_moved or len(rows) != len(old_rows)
    generation = next(_generations) if config_moved or fleet is None else fleet.generation
    return _Fleet(group_id, text, rows, list(by_pk.values()), generation, by_pk)


# One statement: the group's row and its nodes (ordered as ``Node.Meta.ordering`` orders a group's).
_LOAD = """
SELECT {group_columns},
       (SELECT coalesce(json_agg(json_build_array(n.id, n.name, n.address, n.base_weight, n.state, n.weight,
                                                  extract(epoch FROM n.last_seen), n.gpu_evidence, n.retired)
                                 ORDER BY n.name), '[]')::text
        FROM {node_table} AS n WHERE n.group_id = g.id)
FROM {group_table} AS g WHERE g.name = %s
"""


@functools.cache
def _converters() -> list[tuple[Any, list[Any]]]:
    """Per ``ModelGroup`` column: the converters the ORM applies to what the driver returns."""
    out = []
    for f in ModelGroup._meta.concrete_fields:
        col = f.get_col(ModelGroup._meta.db_table)
        out.append((col, connection.ops.get_db_converters(col) + col.get_db_converters(connection)))
    return out


_GROUP_ATTNAMES = [f.attname for f in ModelGroup._meta.concrete_fields]


@functools.cache
def _load_sql() -> str:
    qn = connection.ops.quote_name
    return _LOAD.format(group_columns=", ".join(f"g.{qn(f.column)}" for f in ModelGroup._meta.concrete_fields),
                        node_table=qn(Node._meta.db_table), group_table=qn(ModelGroup._meta.db_table))


def load_group(name: str) -> tuple[ModelGroup, str]:
    """The group's row as a model, and its nodes' JSON text, in one query (PostgreSQL)."""
    with connection.cursor() as cur:
        cur.execute(_load_sql(), [name])
        row = cur.fetchone()
    if row is None:
        raise ModelGroup.DoesNotExist(f"ModelGroup {name!r} does not exist")
    values = list(row[:-1])
    for i, (col, convs) in enumerate(_converters()):
        for conv in convs:
            values[i] = conv(values[i], col, connection)
    return ModelGroup.from_db(connection.alias, _GROUP_ATTNAMES, values), row[-1]


# --- writing a tick's rows in one statement -----------------------------------------------------------


class SqlStore:
    """The tick's store with PostgreSQL up (see the module docstring)."""

    outage = False

    def __init__(self, name: str, group: ModelGroup | None = None) -> None:
        self.name, self.group = name, group
        self.generation: int | None = None  # the node cache's, when it served this tick

    def load(self, r: redis.Redis) -> tuple[ModelGroup, list[Node]]:
        if connection.vendor != "postgresql":
            group = self.group or ModelGroup.objects.get(name=self.name)
            if self.group is not None:
                group.refresh_from_db()
            return group, list(Node.objects.filter(group=group).only(*NODE_FIELDS))
        group, text = load_group(self.name)
        if self.group is not None:  # the caller's instance, brought up to date (as refresh_from_db)
            for attname in _GROUP_ATTNAMES:
                setattr(self.group, attname, getattr(group, attname))
            group = self.group
        fleet = _refresh(_FLEETS.pop(self.name, None), group.pk, text)
        _FLEETS[self.name] = fleet
        while len(_FLEETS) > _FLEETS_MAX:
            _FLEETS.popitem(last=False)
        self.generation = fleet.generation
        # A copy: the tick appends nodes registered while it ran (late_nodes).
        return group, list(fleet.nodes)

    def snapshot_key(self, group: ModelGroup) -> Any:
        """What the outage snapshot is built from, as one comparable value (None: unknown)."""
        if self.generation is None:
            return None
        return (group.pk, group.name, group.policy, group.thresholds_version, self.generation)

    def drain(self, r: redis.Redis, group: ModelGroup) -> None:
        # Rows kept in Redis while PostgreSQL was down are written before this tick's own.
        outage_store.drain(r, group)

    def late_nodes(self, group: ModelGroup, names: list[str]) -> dict[str, Node]:
        return {n.name: n for n in Node.objects.filter(group=group, name__in=names).only(*NODE_FIELDS)
                if not n.retired}

    def apply_inputs(self, gd: GroupDetector, group: ModelGroup, now: float) -> tuple[list, list, list]:
        return operator_inputs.apply(gd, group, now)

    def queue(self, pipe: Any, out: Any) -> None:
        # What a tick needs to run while PostgreSQL is down (control.outage_store): when it changed, and
        # at every checkpoint.
        outage_store.store_snapshot(pipe, out.group, out.nodes, force=out.checkpoint, key=self.snapshot_key(out.group))

    def write(self, r: redis.Redis, out: Any) -> None:
        group, by_name, transitions = out.group, out.by_name, out.transitions
        overrides, decided, probes = out.inputs
        stamp = timezone.now()
        pending = NodeState.PENDING_APPROVAL
        # More than the one statement (so a transaction around them): operator inputs to stamp,
        # proposals to open (policy approval) or to supersede (a node left pending_approval).
        more = bool(overrides or decided or probes) or any(
            (t.to_state == pending and not out.shadow) or t.from_state == pending for t in transitions)
        # If PostgreSQL fails inside, the rows go to the Redis outbox and the tick goes on (control.outage_store).
        with outage_store.sql_or_outbox(
            r, group.name,
            lambda: rows_of_tick(out.ev, group, by_name, transitions, shadow=out.shadow, now=out.now,
                                 write_all=out.write_all),
            lambda: outage_store.applied_inputs(overrides, decided, probes),
            version=out.version, atomic=more,
        ):
            transition_rows = [transition_row(t, group, by_name[t.node], out.shadow, out.ev) for t in transitions]
            at = ts(out.now)
            moved = {t.node for t in transitions}
            history = history_records(out.ev, out.node_ids, at, None if out.write_all else moved)
            # The baseline every Z of this write was measured against, one row per signal.
            baselines = baseline_records(out.ev, group.pk, at) if history else []
            rows = TickRows(transition_rows, history, baselines,
                            node_changes(out.view, out.states, by_name, out.last_seen))
            ids = write_rows(group, out.version, rows, last_tick_at=stamp, **group_figures(out.ev))
            for row, pk in zip(transition_rows, ids, strict=True):
                row.pk = pk
            for t in transitions:
                if t.to_state == pending and not out.shadow:
                    operator_inputs.open_detector_proposal(by_name[t.node], t)
            # Outcomes and the transitions they caused; pending proposals whose node left pending_approval.
            operator_inputs.record_applied(overrides, decided, transition_rows, stamp)
            for pr in probes:
                pr.applied_at = stamp
            if probes:
                CanaryProbe.objects.bulk_update(probes, ["passed", "normalised_latency", "limit", "applied_at"])
        if out.marks:
            # Stamped applied above, or by the drain if the write went to the outbox.
            clear_marks(r, group.name, out.marks)


def clear_marks(r: redis.Redis, name: str, seen: int) -> None:
    """Subtract the operator-input marks a tick saw (their rows are stamped applied now); marks set
    meanwhile stay, so the next tick looks again. Never below zero (a Redis restart resets it)."""
    key = keys.inputs(name)
    with r.pipeline(transaction=True) as pipe:
        try:
            pipe.watch(key)
            left = max(int(pipe.get(key) or 0) - seen, 0)
            pipe.multi()
            if left:
                pipe.set(key, left)
            else:
                pipe.delete(key)
            pipe.execute()
        except redis.WatchError:
            pass  # a new mark arrived: keep them all, the next tick queries once more
