"""Ticking through a PostgreSQL outage: decide and publish from Redis, keep the SQL rows in an outbox.

The detector state, the stream and the weights documents live in Redis; PostgreSQL holds the group's
configuration and what happened (transitions, history, baselines, proposals). When PostgreSQL is
unreachable, :func:`run_degraded_tick` keeps the control loop running:

- the group and its nodes come from a snapshot (``outlier:config:<group>``, JSON) that every normal
  tick refreshes; threshold changes, overrides and proposal decisions wait for PostgreSQL (they are
  stored there) and are applied by the first normal tick after it returns;
- the weights ``version`` continues from the published document (``version + 1``; the group lock
  makes ticks of a group sequential), and :func:`drain` lifts ``ModelGroup.weights_version`` to it
  so the version stays monotonic once PostgreSQL is back;
- the rows a normal tick would write go to a Redis list ``outlier:outbox:<group>`` (one JSON item per
  tick) **in the same MULTI/EXEC as the detector state**: the samples are applied and their rows kept
  together or not at all; only then are the stream entries acknowledged.

:func:`drain` (called by the normal tick under the group lock, before anything else) writes the items
in one SQL transaction, then removes them from the list. A crash between the commit and the removal
re-drains the same items; rows are matched on their natural keys (transition: node, time, from, to;
history: node, signal, time; baseline: group, signal, time) and proposals are de-duplicated by
``do_propose_quarantine``, so nothing is written twice. The outbox is not capped: a cap would lose
rows; its size is one small item per tick and per group (history at ``HISTORY_EVERY_S`` cadence).

If PostgreSQL fails *during* a normal tick's final SQL transaction (the decision is already published
and the detector state stored), :func:`sql_or_outbox` puts that tick's rows in the outbox too, with
the operator inputs it applied (marked applied on drain, so none is applied twice).
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
from django.conf import settings
from django.db import transaction
from django.db.models import Model

from detector import GroupDetector, NodeState
from outlier_admin.control import publish
from outlier_admin.control.models import GroupBaseline, NodeHistory
from outlier_admin.control.models import Transition as TransitionRow
from outlier_admin.control.redis_conn import (
    WEIGHTS_CHANNEL,
    GroupLock,
    degraded_key,
    fenced,
    outbox_key,
    probes_key,
    snapshot_key,
    state_key,
    stream_key,
    weights_key,
)
from outlier_admin.fleet.models import ModelGroup, Node, Policy
from outlier_admin.observability.outage import DB_OUTAGE_ERRORS

log = logging.getLogger(__name__)

# What "PostgreSQL is unreachable" looks like (connection refused, reset, server gone): one owner.
DB_ERRORS = DB_OUTAGE_ERRORS
GROUPS_KEY = "outlier:groups"
_MODELS: dict[str, type[Model]] = {"transition": TransitionRow, "history": NodeHistory, "baseline": GroupBaseline}
_LABELS = {v: k for k, v in _MODELS.items()}
# Natural key of each outboxed row: how a re-drained row is recognised as already written.
_NATURAL_KEYS = {
    "transition": ("node_id", "at", "from_state", "to_state"),
    "history": ("node_id", "signal", "at"),
    "baseline": ("group_id", "signal", "at"),
}


def group_snapshot(group: ModelGroup, nodes: list[Node]) -> bytes:
    """What a degraded tick needs to know about ``group`` (JSON)."""
    return orjson.dumps({
        "id": group.pk, "name": group.name, "policy": group.policy,
        "thresholds_version": group.thresholds_version, "weights_version": group.weights_version,
        "nodes": [
            {"id": n.pk, "name": n.name, "address": n.address, "base_weight": n.base_weight,
             "retired": n.retired, "gpu_evidence": n.gpu_evidence or {}}
            for n in nodes
        ],
    })


def store_snapshot(pipe: Any, group: ModelGroup, nodes: list[Node]) -> None:
    """Queue the snapshot writes on a pipeline (the normal tick adds them to its state MULTI)."""
    pipe.set(snapshot_key(group.name), group_snapshot(group, nodes))
    pipe.sadd(GROUPS_KEY, group.name)


def load_snapshot(r: redis.Redis, name: str) -> tuple[ModelGroup, list[Node]] | None:
    """Unsaved model instances (with their real primary keys) rebuilt from the snapshot."""
    raw = r.get(snapshot_key(name))
    if raw is None:
        return None
    snap = orjson.loads(raw)
    group = ModelGroup(id=snap["id"], name=snap["name"], policy=snap["policy"],
                       thresholds_version=snap["thresholds_version"], weights_version=snap["weights_version"])
    nodes = [
        Node(id=n["id"], group_id=group.pk, name=n["name"], address=n["address"], base_weight=n["base_weight"],
             retired=n["retired"], gpu_evidence=n["gpu_evidence"])
        for n in snap["nodes"]
    ]
    return group, nodes


def known_groups(r: redis.Redis) -> list[str]:
    """Group names known to Redis (for the beat when PostgreSQL cannot list them)."""
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
    return int(r.llen(outbox_key(group)))


def drain(r: redis.Redis, group: ModelGroup, *, max_items: int = 200) -> int:
    """Write outboxed rows of ``group`` to SQL (idempotent); returns the rows inserted.

    Call under the group's tick lock. Also lifts ``weights_version`` to what degraded ticks published.
    """
    pipe = r.pipeline(transaction=False)
    pipe.get(degraded_key(group.name))
    pipe.lrange(outbox_key(group.name), 0, max_items - 1)
    flag, items = pipe.execute()
    if flag is None and not items:
        return 0
    inserted = 0
    with transaction.atomic():
        if flag is not None:
            published = int(flag)
            ModelGroup.objects.filter(pk=group.pk, weights_version__lt=published).update(weights_version=published)
            if group.weights_version < published:
                group.weights_version = published
        pending: dict[str, list[Model]] = {label: [] for label in _MODELS}
        proposals: list[dict[str, Any]] = []
        for raw in items:
            item = orjson.loads(raw)
            for row in item["rows"]:
                label, obj = _decode_row(row)
                pending[label].append(obj)
            proposals.extend(item["proposals"])
        for label, objs in pending.items():
            if not objs:
                continue
            fresh = _not_yet_written(label, objs)
            _MODELS[label].objects.bulk_create(fresh, batch_size=2000)
            inserted += len(fresh)
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
    pipe.ltrim(outbox_key(group.name), len(items), -1)
    if flag is not None:
        pipe.delete(degraded_key(group.name))
    pipe.execute()
    if items:
        log.info("outbox of %s drained: %d items, %d rows written", group.name, len(items), inserted)
    return inserted


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


def rows_of_tick(ev: Any, group: ModelGroup, by_name: dict[str, Node], transitions: list[Any], *, shadow: bool,
                 now: float, write_all: bool) -> tuple[list[Model], list[dict[str, Any]]]:
    """The SQL rows of one tick, as the normal tick writes them: transitions, history (every node on
    a new ``HISTORY_EVERY_S`` slot, else the nodes that moved) with the group baselines, and the
    detector proposals to open (policy ``approval``)."""
    from outlier_admin.control import tick as t

    rows: list[Model] = [t._transition_row(tr, group, by_name[tr.node], shadow, ev) for tr in transitions]
    proposals = [
        {"node_id": by_name[tr.node].pk, "source": "detector", "evidence": tr.to_dict(),
         "reason": f"{tr.reason}: {tr.detail}" if tr.detail else tr.reason}
        for tr in transitions if tr.to_state == NodeState.PENDING_APPROVAL and not shadow
    ]
    moved = {tr.node for tr in transitions}
    at = datetime.fromtimestamp(now, tz=UTC)
    history = t.history_rows(ev, by_name, at, None if write_all else moved)
    rows.extend(history)
    if history:  # as the normal tick: the baseline of every history write
        rows.extend(t.baseline_rows(ev, group, at))
    return rows, proposals


class sql_or_outbox:  # lower case: used like transaction.atomic
    """``transaction.atomic()`` for the normal tick's SQL writes; if PostgreSQL fails inside (the
    decision is already published and the state stored), the tick's rows and the operator inputs it
    applied go to the outbox instead and the tick goes on (its stream entries are acknowledged).

    A class, not ``@contextmanager``: a connection that fails at ``BEGIN`` must still let the body
    run (and fail on its first query) so the failure is handled in one place, ``__exit__``.
    """

    def __init__(self, r: redis.Redis, group: str,
                 rows_if_failed: Callable[[], tuple[list[Model], list[dict[str, Any]]]],
                 applied: Callable[[], dict[str, Any]]) -> None:
        self.r, self.group, self.rows_if_failed, self.applied = r, group, rows_if_failed, applied
        self._atomic = transaction.atomic()
        self._entered = False

    def __enter__(self) -> sql_or_outbox:
        try:
            self._atomic.__enter__()
            self._entered = True
        except DB_ERRORS:
            self._entered = False
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: Any) -> bool:
        if self._entered:
            try:
                self._atomic.__exit__(exc_type, exc, tb)  # commit, or roll back on an exception
            except DB_ERRORS as commit_error:
                exc_type, exc = type(commit_error), commit_error
        if exc_type is None or not issubclass(exc_type, DB_ERRORS):
            return False
        log.warning("tick of %s: PostgreSQL failed during the SQL write, rows kept in the outbox: %s",
                    self.group, exc)
        rows, proposals = self.rows_if_failed()
        self.r.rpush(outbox_key(self.group), outbox_item(rows, proposals, self.applied()))
        return True


# --- the degraded tick ------------------------------------------------------------------------------


def run_degraded_tick(r: redis.Redis, name: str, *, now: float | None, consumer: str, started: float,
                      lock: GroupLock | None = None) -> Any:
    """One tick of ``name`` without PostgreSQL (call under the group lock). Returns a
    :class:`~outlier_admin.control.tick.TickResult` or None when the group has no snapshot or
    detector state yet (a group never ticked with PostgreSQL up cannot be ticked without it)."""
    from outlier_admin.control import tick as t

    now = time.time() if now is None else now
    snap = load_snapshot(r, name)
    raw = r.hmget(state_key(name), ["detector", "last_id", "history_slot"])
    if snap is None or not raw[0]:
        log.warning("tick of %s skipped: PostgreSQL is down and Redis has no snapshot/state yet", name)
        return None
    group, nodes = snap
    gd = GroupDetector.from_bytes(raw[0])
    last_id = raw[1] or b"0-0"
    by_name = {n.name: n for n in nodes}
    t._sync_nodes(gd, nodes, now, fresh_state=False)

    skey = stream_key(name)
    t._ensure_consumer_group(r, skey)
    # Entries this consumer read in a tick that then failed on PostgreSQL are pending under its
    # name: take them back now rather than after the lock lease (XAUTOCLAIM's idle time).
    own = r.xreadgroup(t.CONSUMER_GROUP, consumer, {skey: "0"}, count=settings.TICK_MAX_ENTRIES)
    entries, ack_ids = t._read_entries(r, skey, consumer, last_id)
    floor = t._id_tuple(last_id)
    seen = {eid for eid, _ in entries}
    for _stream, items in own or []:
        for eid, fields in items:
            if fields is not None and eid not in seen and t._id_tuple(eid) > floor:
                entries.append((eid, fields))
                seen.add(eid)
            ack_ids.append(eid)
    result = t.TickResult(group=name, at=now, entries=len(entries))
    rows: list[list[Any]] = []
    for _eid, fields in entries:
        rows.extend(t.decode_entry(fields))
    if rows:
        # Samples of nodes registered after the snapshot are not in the detector: counted as
        # unknown by it (the node joins at the first normal tick).
        result.samples = gd.ingest(t._batch(rows)).accepted
    result.progress = t.apply_progress(gd, entries)
    if entries:
        last_id = max((eid for eid, _ in entries), key=t._id_tuple)

    ev = gd.evaluate(now)
    view = t.published_view(ev, group, by_name)
    current = r.get(weights_key(name))
    version = max(int(orjson.loads(current)["version"]) if current else 0, group.weights_version) + 1
    doc = publish.build_document(name, version, view, safeguard=bool(ev.safeguard), now=now,
                                 stale_after_s=settings.WEIGHTS_STALE_AFTER_S)
    result.version, result.safeguard = version, bool(ev.safeguard)
    result.weights = {v["node"]: v["weight"] for v in view}
    result.states = {v["node"]: NodeState(int(s)).label for v, s in zip(view, ev.states, strict=True)}

    shadow = group.policy == Policy.SHADOW
    transitions = [tr for tr in ev.transitions if tr.node in by_name]
    result.transitions = len(transitions)
    history_slot = int(now // settings.HISTORY_EVERY_S)
    write_all = raw[2] is None or int(raw[2]) != history_slot
    out_rows, proposals = rows_of_tick(ev, group, by_name, transitions, shadow=shadow, now=now, write_all=write_all)

    # One MULTI: the weights document + notification, the detector state and this tick's SQL rows,
    # fenced like the normal tick's state write (only while this tick still holds the group).
    def store(pipe: Any) -> None:
        pipe.set(weights_key(name), orjson.dumps(doc))
        pipe.publish(WEIGHTS_CHANNEL, orjson.dumps({"group": name, "version": version}))
        pipe.hset(state_key(name), mapping={"detector": gd.to_bytes(), "last_id": last_id,
                                            "history_slot": history_slot})
        pipe.delete(probes_key(name))
        if ev.probes_due:
            pipe.hset(probes_key(name), mapping={n: by_name[n].address for n in ev.probes_due if n in by_name})
        if out_rows or proposals:
            pipe.rpush(outbox_key(name), outbox_item(out_rows, proposals, {}))
        pipe.set(degraded_key(name), version)

    fenced(r, lock, state_key(name), raw[1], store)
    if ack_ids:
        r.xack(skey, t.CONSUMER_GROUP, *ack_ids)
        r.xdel(skey, *ack_ids)
    result.tick_ms = (time.perf_counter() - started) * 1000.0
    return result
