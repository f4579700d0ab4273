"""Ticking through a PostgreSQL outage: the Redis snapshot + outbox store of the one tick pipeline.

The detector state, the stream and the weights documents live in Redis; PostgreSQL holds the group's
configuration and what happened (transitions, history, baselines, proposals). When PostgreSQL is
unreachable, the tick (:mod:`outlier_admin.control.tick`, the same pipeline) runs over
:class:`OutageStore` instead of the SQL store:

- the group and its nodes come from a snapshot (:func:`contract.keys.config_snapshot`, JSON) that every normal
  tick refreshes; threshold changes, overrides and proposal decisions wait for PostgreSQL (they are
  stored there) and are applied by the first normal tick after it returns;
- the weights ``version`` continues from the detector state's (the group lock makes ticks of a group
  sequential), and :func:`drain` lifts ``ModelGroup.weights_version`` to it so the version stays
  monotonic once PostgreSQL is back (with the tick's own writer, :func:`~outlier_admin.control.rows.write_rows`);
- the rows a normal tick would write go to a Redis list (:func:`contract.keys.outbox`) (one JSON item per
  tick) **in the same MULTI/EXEC as the weights document and the detector state**: the samples are
  applied and their rows kept together or not at all; only then are the stream entries acknowledged.

:func:`drain` (called by the SQL store under the group lock, before anything else) writes the items
in one SQL transaction, then removes them from the list. A crash between the commit and the removal
re-drains the same items; rows are matched on their natural keys (transition: node, time, from, to;
history: node, signal, time; baseline: group, signal, time) and proposals are de-duplicated by
``do_propose_quarantine``, so nothing is written twice. The outbox is not capped: a cap would lose
rows; its size is one small item per tick and per group (history at ``HISTORY_EVERY_S`` cadence).

If PostgreSQL fails *during* a normal tick's final SQL transaction (the decision is already published
and the detector state stored), :func:`sql_or_outbox` puts that tick's rows in the outbox too, with
the operator inputs it applied (marked applied on drain, so none is applied twice).

This module does not import the tick (no circle): both use :mod:`outlier_admin.control.rows`.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import orjson
import redis
from django.db import connection, transaction
from django.db.models import Model

from contract import keys
from contract.topology import is_cluster
from detector.group import GroupDetector
from outlier_admin.control.models import GroupBaseline, NodeHistory
from outlier_admin.control.models import Transition as TransitionRow
from outlier_admin.control.rows import BASELINE_COLUMNS, HISTORY_COLUMNS, TickRows, rows_of_tick, write_rows
from outlier_admin.fleet.models import ModelGroup, Node
from outlier_admin.outage import DB_OUTAGE_ERRORS

log = logging.getLogger(__name__)

# What "PostgreSQL is unreachable" looks like (connection refused, reset, server gone): one owner.
DB_ERRORS = DB_OUTAGE_ERRORS
GROUPS_KEY = keys.GROUPS
_MODELS: dict[str, type[Model]] = {"transition": TransitionRow, "history": NodeHistory, "baseline": GroupBaseline}
_LABELS = {v: k for k, v in _MODELS.items()}
# Natural key of each outboxed row: how a re-drained row is recognised as already written.
_NATURAL_KEYS = {
    "transition": ("node_id", "at", "from_state", "to_state"),
    "history": ("node_id", "signal", "at"),
    "baseline": ("group_id", "signal", "at"),
}


def group_snapshot(group: ModelGroup, nodes: list[Node]) -> bytes:
    """What an outage tick needs to know about ``group`` (JSON)."""
    return orjson.dumps({
        "id": group.pk, "name": group.name, "policy": group.policy,
        # No weights_version: it moves at every tick; an outage tick continues from the state's.
        "thresholds_version": group.thresholds_version,
        "nodes": [
            {"id": n.pk, "name": n.name, "address": n.address, "base_weight": n.base_weight,
             "retired": n.retired, "gpu_evidence": n.gpu_evidence or {}}
            for n in nodes
        ],
    })


# The snapshot this process wrote last per group, and the key it was written under: an unchanged one
# is not written again (at 100 nodes it is ~15 KB, as much as the weights document, at every tick of
# every group), nor even built when the caller's key says its input did not change.
_written: dict[str, bytes] = {}
_written_key: dict[str, Any] = {}


def store_snapshot(pipe: Any, group: ModelGroup, nodes: list[Node], *, force: bool = True, key: Any = None) -> None:
    """Queue the snapshot writes on a pipeline (the normal tick adds them to its state MULTI); with
    ``force=False`` only if it changed since this process last wrote it (the tick forces it at its
    checkpoints, which bounds how long a Redis that lost it goes without). ``key``: a value that
    changes whenever ``group`` or ``nodes`` changes what the snapshot holds (the tick's node cache
    generation); the same key as the last write, unforced, skips building the snapshot at all."""
    if not force and key is not None and _written_key.get(group.name) == key:
        return
    snap = group_snapshot(group, nodes)
    _written_key[group.name] = key
    if not force and _written.get(group.name) == snap:
        return
    pipe.set(keys.config_snapshot(group.name), snap)
    if not is_cluster(pipe):  # on a cluster the set is another slot than this group's MULTI: see known_groups
        pipe.sadd(GROUPS_KEY, group.name)
    _written[group.name] = snap


def load_snapshot(r: redis.Redis, name: str) -> tuple[ModelGroup, list[Node]] | None:
    """Unsaved model instances (with their real primary keys) rebuilt from the snapshot."""
    raw = r.get(keys.config_snapshot(name))
    if raw is None:
        return None
    snap = orjson.loads(raw)
    group = ModelGroup(id=snap["id"], name=snap["name"], policy=snap["policy"],
                       thresholds_version=snap["thresholds_version"], weights_version=snap.get("weights_version", 0))
    nodes = [
        Node(id=n["id"], group_id=group.pk, name=n["name"], address=n["address"], base_weight=n["base_weight"],
             retired=n["retired"], gpu_evidence=n["gpu_evidence"])
        for n in snap["nodes"]
    ]
    return group, nodes


def known_groups(r: redis.Redis) -> list[str]:
    """Group names known to Redis (for the beat when PostgreSQL cannot list them): the groups' set, or on a
    Redis Cluster the groups with a snapshot (``SCAN`` of every primary; read only while PostgreSQL is down)."""
    if is_cluster(r):
        found = (keys.group_of(k) for k in r.scan_iter(match=keys.config_snapshot("*"), count=1000))
        return sorted({g for g in found if g})
    return sorted(m.decode() for m in r.smembers(GROUPS_KEY))


# --- outbox items ---------------------------------------------------------------------------------


def _encode_row(obj: Model) -> dict[str, Any]:
    fields: dict[str, Any] = {}
    for f in obj._meta.concrete_fields:
        if f.primary_key:
            continue
        value = getattr(obj, f.attname)
        fields[f.attname] = {"$dt": value.timestamp()} if isinstance(value, datetime) else value
    return {"model": _LABELS[type(obj)], "fields": fields}


def _decode_row(item: dict[str, Any]) -> tuple[str, Model]:
    fields = {
        k: datetime.fromtimestamp(v["$dt"], tz=UTC) if isinstance(v, dict) and "$dt" in v else v
        for k, v in item["fields"].items()
    }
    return item["model"], _MODELS[item["model"]](**fields)


def outbox_item(rows: list[Model], proposals: list[dict[str, Any]], applied: dict[str, Any]) -> bytes:
    """One tick's rows (transitions, history, baselines), proposals to open and the operator inputs
    it applied (``{"overrides": [pk], "proposals": [pk], "probes": [[pk, passed]]}``: marked applied
    on drain, so the next tick does not apply them again), as JSON."""
    return orjson.dumps({"id": uuid.uuid4().hex, "at": time.time(), "rows": [_encode_row(o) for o in rows],
                         "proposals": proposals, "applied": applied})


def applied_inputs(overrides: list[Any], decided: list[Any], probes: list[Any]) -> dict[str, Any]:
    return {"overrides": [o.pk for o in overrides], "proposals": [p.pk for p in decided],
            "probes": [[pr.pk, pr.passed] for pr in probes]}


def outbox_length(r: redis.Redis, group: str) -> int:
    return int(r.llen(keys.outbox(group)))


def drain(r: redis.Redis, group: ModelGroup, *, max_items: int = 200) -> int:
    """Write outboxed rows of ``group`` to SQL (idempotent); returns the rows inserted.

    Call under the group's tick lock. Also lifts ``weights_version`` to what outage ticks published.
    """
    pipe = r.pipeline(transaction=False)
    pipe.get(keys.outage_version(group.name))
    pipe.lrange(keys.outbox(group.name), 0, max_items - 1)
    flag, items = pipe.execute()
    if flag is None and not items:
        return 0
    with transaction.atomic():
        pending: dict[str, list[Model]] = {label: [] for label in _MODELS}
        proposals: list[dict[str, Any]] = []
        for raw in items:
            item = orjson.loads(raw)
            for row in item["rows"]:
                label, obj = _decode_row(row)
                pending[label].append(obj)
            proposals.extend(item["proposals"])
        fresh = {label: _not_yet_written(label, objs) if objs else [] for label, objs in pending.items()}
        rows = TickRows(fresh["transition"], _records(fresh["history"], HISTORY_COLUMNS),
                        _records(fresh["baseline"], BASELINE_COLUMNS))
        inserted = len(rows)
        if rows or flag is not None:  # the version outage ticks published, raised with the rows
            write_rows(group, int(flag or 0), rows)
        _mark_applied(items)
        if proposals:
            from outlier_admin.control.actions import do_propose_quarantine

            nodes = Node.objects.in_bulk([p["node_id"] for p in proposals])
            for p in proposals:
                node = nodes.get(p["node_id"])
                if node is not None:  # a node deleted meanwhile has nothing to propose
                    do_propose_quarantine(node, actor="system:detector", source=p["source"],
                                          reason=p["reason"], evidence=p["evidence"])
    # After the commit: a crash here re-drains these items, and _not_yet_written skips them.
    pipe = r.pipeline(transaction=True)
    pipe.ltrim(keys.outbox(group.name), len(items), -1)
    if flag is not None:
        pipe.delete(keys.outage_version(group.name))
    pipe.execute()
    if items:
        log.info("outbox of %s drained: %d items, %d rows written", group.name, len(items), inserted)
    return inserted


def _records(objs: list[Model], columns: tuple[str, ...]) -> list[tuple]:
    """Rows decoded from the outbox as the writer's records (laid out as ``columns``)."""
    return [tuple(getattr(o, c) for c in columns) for o in objs]


def _mark_applied(items: list[bytes]) -> None:
    """Operator inputs a tick applied before its SQL write failed: mark them applied now (only those
    still unmarked, so a re-drain changes nothing)."""
    from django.utils import timezone

    from outlier_admin.control.models import CanaryProbe, Override, QuarantineProposal

    stamp = timezone.now()
    for raw in items:
        applied = orjson.loads(raw).get("applied") or {}
        if applied.get("overrides"):
            Override.objects.filter(pk__in=applied["overrides"], applied_at__isnull=True).update(applied_at=stamp)
        if applied.get("proposals"):
            QuarantineProposal.objects.filter(pk__in=applied["proposals"], applied_at__isnull=True).update(
                applied_at=stamp)
        for pk, passed in applied.get("probes") or []:
            CanaryProbe.objects.filter(pk=pk, applied_at__isnull=True).update(applied_at=stamp, passed=passed)


def _not_yet_written(label: str, objs: list[Model]) -> list[Model]:
    key_fields = _NATURAL_KEYS[label]
    model = _MODELS[label]
    owner = key_fields[0]
    existing = set(
        model.objects.filter(**{
            f"{owner}__in": {getattr(o, owner) for o in objs},
            "at__gte": min(o.at for o in objs), "at__lte": max(o.at for o in objs),
        }).values_list(*key_fields)
    )
    out = []
    for o in objs:
        key = tuple(getattr(o, f) for f in key_fields)
        if key not in existing:
            existing.add(key)  # the same row twice in the outbox is written once
            out.append(o)
    return out


class sql_or_outbox:  # lower case: used like transaction.atomic
    """``transaction.atomic()`` for the normal tick's SQL writes; if PostgreSQL fails inside (the
    decision is already published and the state stored), the tick's rows and the operator inputs it
    applied go to the outbox instead and the tick goes on (its stream entries are acknowledged).

    A class, not ``@contextmanager``: a connection that fails at ``BEGIN`` must still let the body
    run (and fail on its first query) so the failure is handled in one place, ``__exit__``.
    """

    def __init__(self, r: redis.Redis, group: str,
                 rows_if_failed: Callable[[], tuple[list[Model], list[dict[str, Any]]]],
                 applied: Callable[[], dict[str, Any]], *, version: int | None = None,
                 atomic: bool = True) -> None:
        self.r, self.group, self.rows_if_failed, self.applied = r, group, rows_if_failed, applied
        self.version = version  # the published version, recorded in SQL by the drain
        # ``atomic=False``: the body is one statement (atomic by itself); BEGIN and COMMIT would be two
        # more round trips to PostgreSQL. Inside a caller's transaction a savepoint still isolates a
        # failed statement, so the caller's transaction stays usable.
        self._atomic = transaction.atomic() if atomic or connection.in_atomic_block else None
        self._entered = False

    def __enter__(self) -> sql_or_outbox:
        if self._atomic is None:
            return self
        try:
            self._atomic.__enter__()
            self._entered = True
        except DB_ERRORS:
            self._entered = False
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: Any) -> bool:
        if self._entered and self._atomic is not None:
            try:
                self._atomic.__exit__(exc_type, exc, tb)  # commit, or roll back on an exception
            except DB_ERRORS as commit_error:
                exc_type, exc = type(commit_error), commit_error
        if exc_type is None or not issubclass(exc_type, DB_ERRORS):
            return False
        log.warning("tick of %s: PostgreSQL failed during the SQL write, rows kept in the outbox: %s",
                    self.group, exc)
        rows, proposals = self.rows_if_failed()
        pipe = self.r.pipeline(transaction=True)
        pipe.rpush(keys.outbox(self.group), outbox_item(rows, proposals, self.applied()))
        if self.version is not None:
            pipe.set(keys.outage_version(self.group), self.version)
        pipe.execute()
        return True


class OutageStore:
    """The tick's store while PostgreSQL is down: the group from its Redis snapshot, no operator
    inputs (they wait in SQL), the tick's rows to the outbox in the tick's own MULTI."""

    outage = True

    def __init__(self, name: str) -> None:
        self.name = name

    def load(self, r: redis.Redis) -> tuple[ModelGroup, list[Node]] | None:
        return load_snapshot(r, self.name)

    def drain(self, r: redis.Redis, group: ModelGroup) -> None:
        """Nothing: the outbox waits for PostgreSQL."""

    def late_nodes(self, group: ModelGroup, names: list[str]) -> dict[str, Node]:
        # Nodes registered after the snapshot join at the first normal tick; their samples are
        # counted as unknown by the detector meanwhile.
        return {}

    def apply_inputs(self, gd: GroupDetector, group: ModelGroup, now: float) -> tuple[list, list, list]:
        return [], [], []

    def queue(self, pipe: Any, out: Any) -> None:
        """Add the tick's SQL rows (outbox) and its published version to the fenced MULTI."""
        rows, proposals = rows_of_tick(out.ev, out.group, out.by_name, out.transitions,
                                       shadow=out.shadow, now=out.now, write_all=out.write_all)
        if rows or proposals:
            pipe.rpush(keys.outbox(self.name), outbox_item(rows, proposals, {}))
        pipe.set(keys.outage_version(self.name), out.version)

    def write(self, r: redis.Redis, out: Any) -> None:
        """Nothing: the rows went to the outbox with the state."""
