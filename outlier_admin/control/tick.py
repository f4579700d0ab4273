"""One detector tick of one model group: stream -> detector -> weights in Redis -> history in SQL.

One pipeline (:func:`_tick_locked`) over a store: :class:`~outlier_admin.control.sql_store.SqlStore`
(PostgreSQL up) or :class:`~outlier_admin.control.outage_store.OutageStore` (PostgreSQL unreachable: the
group from its Redis snapshot, the SQL rows to a Redis outbox). Order of a tick (any worker can run
any group's tick; the per-group lock makes them sequential):

1. take the group's lock (:func:`contract.keys.tick_lock`) (``SET NX PX``, renewed while the tick runs); if held, skip;
2. the store loads the group and its nodes (the SQL store: one query; see its module);
3. WATCH the lock and the state (:class:`~outlier_admin.control.redis_conn.Fence`), then read in one
   round trip: the lock's value, the state's fields, the operator-input marks, whether an outbox
   waits (the SQL store then drains it first), and the new stream entries with the consumer group
   ``ticks`` (entries left pending by a dead worker are reclaimed with ``XAUTOCLAIM``, this
   consumer's own with ``XREADGROUP 0``); entries at or below the last applied id are only
   acknowledged (no sample is applied twice). The detector is this process's own copy when the
   state's ``rev`` is the one this process wrote last (no deserialisation), else the checkpoint in
   the state hash (:func:`contract.keys.state`) plus the stream entries applied since it (replayed from the stream,
   where they stay until the next checkpoint);
4. apply operator inputs (overrides, decided proposals, canary probe results) — queried only when
   some are pending (the :func:`contract.keys.inputs` counter the actions set), some node waits for
   approval, or on a new history slot — then ``evaluate(now)``;
5. **Redis first**, in one MULTI/EXEC fenced on the lock and the state's ``rev``: the weights document
   and its notification (:mod:`outlier_admin.control.publish`), the state fields, the canary probes
   due, and what the store adds (the SQL store: the outage snapshot; the outage store: the outbox
   item). The detector itself is serialised into that MULTI only at a checkpoint (see
   :func:`_checkpoint_due`); between checkpoints the stream entries are the log;
6. then SQL (SQL store): transitions, history, baselines, the node rows that changed, the group's
   version and ``last_tick_at`` in one statement, plus the operator inputs' outcomes when there are
   some (then in one transaction); if PostgreSQL fails there, the rows go to the outbox;
7. ``XACK`` the entries; at a checkpoint ``XTRIM MINID`` the ones it covers.

A steady-state tick (nothing decided, no operator input) is 2 SQL statements and 8 Redis round trips
(lock, WATCH, reads, EXEC, ack, and the lock's release); ``tests/outlier_admin/control/
test_tick_cost.py`` holds it there. With ``REDIS_MIN_REPLICAS_ACK`` one more: the ``WAIT`` after the EXEC.

The fence across a Redis failover (Sentinel promotes a replica, which may lack the primary's last writes)
-------------------------------------------------------------------------------------------------------
Two workers may then both *believe* they hold a group: A took the lock on the old primary, the lock
never reached the replica, and B took it again on the promoted one. What keeps that harmless:

* **In Redis, the check and the write are one atomic step on the server that takes the write.** Step 5's
  MULTI/EXEC runs only if the lock key holds the writer's token and the state's ``rev`` is the one the
  writer read (WATCHed up to the EXEC). A's connection to the dead primary fails; its next commands go
  to the promoted replica (the Sentinel-managed client asks the Sentinels), where the lock holds B's
  token (or nothing): A's EXEC is refused (:class:`~outlier_admin.control.redis_conn.LeaseLost`). A
  write can never be checked on one server and land on another.
* **A rolled-back state is never mistaken for a newer one.** ``rev`` is a fresh random 64-bit token per
  write, never a counter: a promoted replica that lost A's last write holds an older ``rev``, which
  labels exactly the state it came with; A's in-process copy (labelled with the lost ``rev``) no longer
  matches, so A, B, anyone reloads the checkpoint and replays the stream entries after it.
* **Nothing outside Redis acts on a commit a replica does not hold** (``REDIS_MIN_REPLICAS_ACK`` >= 1).
  After the EXEC the tick waits for the replicas (``WAIT``, :func:`~outlier_admin.control.redis_conn.
  require_replicas`); only then does it write SQL (step 6), acknowledge its entries (step 7) and keep
  its detector. Replication is one ordered stream, so a replica that acknowledged the EXEC also holds
  everything before it: this holder's lock and the new ``rev``. Sentinel promotes a replica that
  holds it (with one replica, that one; with several, the one with the greatest replication offset at
  equal ``replica-priority``), so the promoted replica carries A's lease until it lapses (B's ``SET NX``
  fails) and A's state (B starts from it). A commit no replica acknowledged raises
  :class:`~outlier_admin.control.redis_conn.NotReplicated`: the tick is dropped like a lost lease (its
  document may have gone out; the next tick's supersedes it), no SQL row records a decision the
  surviving state may not have, its entries stay pending for the next tick.
* **The document's version is fenced by PostgreSQL, which a Redis failover cannot roll back.**
  :func:`~outlier_admin.control.publish.next_version` is one more than both the Redis state's and
  ``ModelGroup.weights_version`` (only ever raised, written after an acknowledged commit): a
  promoted replica that lost ticks continues from the SQL version, so a gateway never sees the version
  go back (a lost tick's version comes again, with a newer ``generated_at``, which gateways take).

``tests/reliability/test_redis_failover.py`` kills the primary under load and checks all of it.
"""

from __future__ import annotations

import logging
import secrets
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any, NamedTuple, Protocol

import numpy as np
import redis
from django.conf import settings

from contract import keys
from contract.stream import decode_progress, decode_requests
from contract.weights_document import WeightsDocument
from detector.group import GroupDetector
from detector.samples import ProgressBatch, SampleBatch
from detector.states import NodeState, Transition
from detector.thresholds import Thresholds
from detector.weights import published
from outlier_admin.control import outage_store, publish
from outlier_admin.control.redis_conn import (
    Fence,
    GroupLock,
    LeaseLost,
    NotReplicated,
    get_redis,
    require_replicas,
    tick_lock,
)
from outlier_admin.control.rows import baseline_rows, history_rows
from outlier_admin.control.sql_store import SqlStore
from outlier_admin.fleet.models import ModelGroup, Node, Policy

log = logging.getLogger(__name__)

CONSUMER_GROUP = "ticks"
#: A due probe nobody took (no canary worker running) is forgotten after this long: the detector lists
#: a quarantined node again at its next probe time anyway.
PROBES_KEEP_S = 60
_STATE_FIELDS = ["rev", "last_id", "thresholds_version", "history_slot", "version", "checkpoint_at"]

# Re-exported: the row builders moved to control.rows (one owner for the tick and the outbox), the SQL
# store to control.sql_store.
__all__ = ["CONSUMER_GROUP", "SqlStore", "TickResult", "baseline_rows", "history_rows", "published_view", "run_tick"]


@dataclass
class TickResult:
    group: str
    at: float
    samples: int = 0
    progress: int = 0  # streamed-progress rows applied (model-server scrapes)
    entries: int = 0
    transitions: int = 0
    version: int | None = None
    publish_latency_ms: float = 0.0
    tick_ms: float = 0.0
    safeguard: bool = False
    checkpoint: bool = False  # the detector was serialised to Redis in this tick
    sql_outage: bool = False  # ticked without PostgreSQL (OutageStore)
    lag_ms: float = 0.0  # publish time - stream time of the oldest entry applied (0: none)
    weights: dict[str, int] = field(default_factory=dict)
    states: dict[str, str] = field(default_factory=dict)


@dataclass
class TickOutput:
    """What one tick decided, handed to its store."""

    group: ModelGroup
    nodes: list[Node]
    by_name: dict[str, Node]
    ev: Any
    view: list[dict[str, Any]]
    states: dict[str, str]
    transitions: list[Transition]
    version: int
    now: float
    write_all: bool
    shadow: bool
    last_seen: dict[str, float]
    inputs: tuple[list, list, list]
    marks: int  # operator-input marks seen by this tick (cleared once its inputs are stamped in SQL)
    node_ids: dict[str, int] = field(default_factory=dict)  # name -> primary key, of ``by_name``
    checkpoint: bool = False  # the detector is serialised in this tick's MULTI


class TickStore(Protocol):
    """Where a tick gets its group and puts what is not Redis state (see the module docstring)."""

    outage: bool

    def load(self, r: redis.Redis) -> tuple[ModelGroup, list[Node]] | None: ...

    def drain(self, r: redis.Redis, group: ModelGroup) -> None: ...

    def late_nodes(self, group: ModelGroup, names: list[str]) -> dict[str, Node]: ...

    def apply_inputs(self, gd: GroupDetector, group: ModelGroup, now: float) -> tuple[list, list, list]: ...

    def queue(self, pipe: Any, out: TickOutput) -> None: ...

    def write(self, r: redis.Redis, out: TickOutput) -> None: ...


# --- this process's detectors -------------------------------------------------------------------------


@dataclass
class _Held:
    rev: bytes
    gd: GroupDetector
    applied: bytes  # last stream id applied to ``gd``
    checkpoint_at: float


# Per group, the detector this process stored last. Valid only while the state's ``rev`` is still the
# one it wrote (no other worker ticked since); taken out for the tick and put back after its fenced
# write, so a tick that fails half-way leaves nothing behind. At most ``_HELD_MAX`` groups, least
# recently ticked dropped first (~0.6 MB each at 100 nodes): a Celery worker may tick any group, a
# ticker (control.scheduling) holds its share.
_HELD: OrderedDict[str, _Held] = OrderedDict()
_HELD_MAX = 128


def _hold(name: str, held: _Held) -> None:
    _HELD[name] = held
    _HELD.move_to_end(name)
    while len(_HELD) > _HELD_MAX:
        _HELD.popitem(last=False)


def forget(name: str) -> None:
    """Drop this process's copy of ``name``'s detector (the group moved to another process)."""
    _HELD.pop(name, None)


def _ensure_consumer_group(r: redis.Redis, key: str) -> None:
    try:
        r.xgroup_create(key, CONSUMER_GROUP, id="0", mkstream=True)
    except redis.ResponseError as exc:
        if "BUSYGROUP" not in str(exc):
            raise


def apply_thresholds(gd: GroupDetector, wanted: Thresholds) -> None:
    """Apply a group's new thresholds to its running detector (learned state is kept)."""
    gd.set_thresholds(wanted)


def _id_tuple(entry_id: bytes) -> tuple[int, int]:
    a, _, b = entry_id.partition(b"-")
    return int(a), int(b or 0)


def _replay(r: redis.Redis, key: str, after: bytes) -> list[tuple[bytes, dict]]:
    """Stream entries after ``after`` (the checkpoint's last id): applied by ticks since the
    checkpoint (acknowledged, kept until the next one), pending, or not yet delivered."""
    return [(eid, f) for eid, f in r.xrange(key, min=b"(" + after, max="+") if f is not None]


def _restore(r: redis.Redis, group: ModelGroup, now: float,
             state: list[Any]) -> tuple[GroupDetector, bytes, list[tuple[bytes, dict]]]:
    """The group's detector, the last stream id applied to it and the entries to replay on it: none
    when this process's copy is current (the state's ``rev`` is the one it wrote), else those after
    the checkpoint (applied by ticks since it, or not applied yet)."""
    rev, last_id, tv = state[0], state[1] or b"0-0", int(state[2] or 0)
    held = _HELD.pop(group.name, None)
    replay: list[tuple[bytes, dict]] = []
    if held is not None and rev is not None and held.rev == rev:
        gd, applied = held.gd, held.applied
    else:
        raw = r.hget(keys.state(group.name), "detector")
        if raw:
            gd, applied = GroupDetector.from_bytes(raw), last_id
            replay = _replay(r, keys.stream(group.name), last_id)
        else:
            # A control plane starting against a running fleet must not slow-start every node.
            gd, applied, tv = GroupDetector(thresholds=group.thresholds(), now=now), b"0-0", group.thresholds_version
    if tv != group.thresholds_version:
        apply_thresholds(gd, group.thresholds())
    return gd, applied, replay


def _load_detector(r: redis.Redis, group: ModelGroup, now: float) -> tuple[GroupDetector, bytes, bytes | None]:
    """The group's detector with every entry applied so far, the last such entry's id (``0-0``:
    none) and the state's ``rev`` (for tests and tools: takes this process's copy, if any)."""
    state = r.hmget(keys.state(group.name), _STATE_FIELDS)
    gd, applied, replay = _restore(r, group, now, state)
    if replay:
        _apply_entries(gd, replay)
        applied = replay[-1][0]
    return gd, applied, state[0]


def _sync_nodes(gd: GroupDetector, nodes: list[Node], now: float, fresh_state: bool) -> None:
    live = {n.name: n for n in nodes if not n.retired}
    present = set(gd.nodes)  # (``gd.nodes`` builds a tuple: a lookup per node in it is O(n^2))
    for name in present - live.keys():
        gd.remove_node(name)
    for name, node in live.items():
        if name not in present:
            gd.add_node(name, base_weight=float(node.base_weight), now=now, warm=fresh_state)
        elif gd.a.base[gd.index_of(name)] != node.base_weight:  # an operator edited it (do_update_node)
            gd.set_base_weight(name, float(node.base_weight))


def _queue_entry_reads(pipe: Any, key: str, consumer: str) -> None:
    """Queue the reads of a group's new entries: reclaimed, this consumer's own pending, fresh."""
    # We hold the lock, so entries pending here belong to a tick whose lease lapsed. It lapsed at least
    # a lease after its last renewal, and renewals come every third of a lease (redis_conn.GroupLock):
    # its entries have been idle for more than 2/3 of a lease. Half a lease reclaims all of them at the
    # first tick after a crash, before ">" reads newer ones and moves ``last_id`` past them. This
    # consumer's own pending entries (a tick of ours that failed before its ack) are taken back at once.
    idle = settings.TICK_LOCK_TTL_MS // 2
    pipe.xautoclaim(key, CONSUMER_GROUP, consumer, min_idle_time=idle, start_id="0-0", count=1000)
    pipe.xreadgroup(CONSUMER_GROUP, consumer, {key: "0"}, count=settings.TICK_MAX_ENTRIES)
    pipe.xreadgroup(CONSUMER_GROUP, consumer, {key: ">"}, count=settings.TICK_MAX_ENTRIES)


def _entries_of(claimed: Any, own: Any, got: Any, last_id: bytes) -> tuple[list, list[bytes]]:
    """The replies of :func:`_queue_entry_reads` as the new entries not yet applied (in id order) and
    every id to acknowledge."""
    for reply in (own, got):
        if isinstance(reply, Exception):
            raise reply
    entries: dict[bytes, dict] = {}
    ids: list[bytes] = []
    if not isinstance(claimed, Exception):
        for e in claimed[1]:
            if e:
                ids.append(e[0])
                if e[1] is not None:
                    entries[e[0]] = e[1]
    for reply in (own, got):
        for _stream, items in reply or []:
            for eid, fields in items:
                ids.append(eid)
                if fields is not None:
                    entries[eid] = fields
    floor = _id_tuple(last_id)
    fresh = sorted(((eid, f) for eid, f in entries.items() if _id_tuple(eid) > floor), key=lambda e: _id_tuple(e[0]))
    return fresh, list(dict.fromkeys(ids))


#: How a read of a stream that has no consumer group (or no stream yet) is refused: Redis says
#: ``NOGROUP ...``; fakeredis, the demo's stand-in when no Redis is reachable, says the key must exist.
_NO_GROUP_ERRORS = ("NOGROUP", "requires the key to exist")


def _is_nogroup(reply: Any) -> bool:
    return isinstance(reply, redis.ResponseError) and any(m in str(reply) for m in _NO_GROUP_ERRORS)


def _read_entries(r: redis.Redis, key: str, consumer: str, last_id: bytes,
                  *, retry: bool = True) -> tuple[list, list[bytes]]:
    """New entries (reclaimed, this consumer's own pending, fresh) not yet applied, in id order, and
    every id to acknowledge; one round trip (two when the consumer group must be created first)."""
    pipe = r.pipeline(transaction=False)
    _queue_entry_reads(pipe, key, consumer)
    claimed, own, got = pipe.execute(raise_on_error=False)
    if retry and _is_nogroup(got):
        _ensure_consumer_group(r, key)  # a new stream, or a Redis that lost it
        return _read_entries(r, key, consumer, last_id, retry=False)
    return _entries_of(claimed, own, got, last_id)


def _batch(rows: list[list[Any]]) -> SampleBatch:
    # null (unknown) -> NaN: a TTFT the gateway does not log; token counts of a latency-only record.
    return SampleBatch.from_rows(rows)


def apply_progress(gd: GroupDetector, entries: list[tuple[bytes, dict]]) -> int:
    """Hand the entries' streamed-progress rows to the detector; returns how many it applied."""
    rows = [row for _eid, fields in entries for row in decode_progress(fields)]
    if not rows:
        return 0
    return gd.ingest_progress(ProgressBatch.from_rows(rows)).accepted


def _apply_entries(gd: GroupDetector, entries: list[tuple[bytes, dict]]) -> None:
    """Replay: the entries' samples and progress rows, as the ticks that read them applied them."""
    rows = [row for _eid, fields in entries for row in decode_requests(fields)]
    if rows:
        gd.ingest(_batch(rows))
    apply_progress(gd, entries)


_LABELS = {int(state): state.label for state in NodeState}


def published_view(ev: Any, group: ModelGroup, nodes_by_name: dict[str, Node]) -> list[dict[str, Any]]:
    """Per node: the weight (int) and state a gateway must apply.

    The weights and states are :func:`detector.weights.published` (the ``shadow`` policy publishes
    every node the detector judges at its base weight as ``healthy``), over the group's arrays at once.
    """
    codes, weights, base = published(ev.states, ev.weights, ev.base_weights, shadow=group.policy == Policy.SHADOW)
    if not (np.isfinite(weights).all() and np.isfinite(base).all()):
        raise ValueError(f"group {group.name}: a weight is not finite")
    w, b = weights.astype(np.int64).tolist(), base.astype(np.int64).tolist()
    out = []
    for i, (name, code) in enumerate(zip(ev.nodes, codes.tolist(), strict=True)):
        node = nodes_by_name.get(name)
        out.append({"node": name, "address": node.address if node else name, "weight": w[i],
                    "state": _LABELS[code], "base_weight": b[i]})
    return out


# --- the pipeline ----------------------------------------------------------------------------------------


def run_tick(group: ModelGroup | str, *, now: float | None = None, consumer: str = "tick") -> TickResult | None:
    """Run one tick of ``group`` (a model or its name). Returns None when another worker holds the
    group's lock (that tick is skipped, not queued). With PostgreSQL unreachable the same pipeline
    runs over :class:`~outlier_admin.control.outage_store.OutageStore`; the first tick after it returns
    drains the outbox first."""
    started = time.perf_counter()
    name = group if isinstance(group, str) else group.name
    r = get_redis()
    lock = tick_lock(r, name)
    if not lock.acquire():
        return None
    try:
        try:
            store: TickStore = SqlStore(name, None if isinstance(group, str) else group)
            return _tick_locked(r, store, name, now, consumer, started, lock=lock)
        except outage_store.DB_ERRORS as exc:
            # PostgreSQL unreachable: keep deciding and publishing from Redis (see control.outage_store).
            log.warning("tick of %s without PostgreSQL: %s", name, exc)
            return _tick_locked(r, outage_store.OutageStore(name), name, now, consumer, started, lock=lock)
    except LeaseLost as exc:
        # Another worker took the group over while this tick stalled: it applied these entries (or
        # will: they stay pending); writing our older state would un-apply its work.
        log.warning("tick of %s dropped: %s", name, exc)
        return None
    except NotReplicated as exc:
        # Its write is on the primary only: a failover could take it back, so nothing outside Redis
        # may act on it (see "The fence across a Redis failover" above). The next tick goes on.
        log.warning("tick of %s not confirmed by a replica (no SQL write, entries left pending): %s", name, exc)
        return None
    finally:
        lock.release()


def _checkpoint_due(held: bool, now: float, checkpoint_at: float, *, decided: bool, new_slot: bool) -> bool:
    """Whether this tick serialises the detector into Redis. Always when this process had no copy of
    it (a first tick, or the group moved here), when something was decided (a transition, an
    operator input applied: what a failover must not decide again), on a new history slot, and at
    least every ``TICK_LOCK_TTL_MS`` — a failover happens a lease after the holder's last tick, so the
    successor replays at most about a lease of entries. Between checkpoints the detector is not
    re-serialised (at 100 nodes the snapshot is ~0.6 MB and ``to_bytes`` costs ~5 ms, a third of a
    tick); the entries stay in the stream as the log."""
    return (not held or decided or new_slot
            or now - checkpoint_at >= settings.TICK_LOCK_TTL_MS / 1000.0 or now < checkpoint_at)


def _tick_locked(r: redis.Redis, store: TickStore, name: str, now: float | None, consumer: str, started: float,
                 *, lock: GroupLock | None = None) -> TickResult | None:
    now = time.time() if now is None else now
    loaded = store.load(r)
    if loaded is None:
        log.warning("tick of %s skipped: PostgreSQL is down and Redis has no snapshot yet", name)
        return None
    group, nodes = loaded
    skey, hkey = keys.stream(name), keys.state(name)
    fence = Fence(r, lock, hkey)
    try:
        return _tick_fenced(r, store, fence, group, nodes, name, now, consumer, started, skey, hkey)
    finally:
        fence.close()


class _Reads(NamedTuple):
    """What a tick reads of Redis in its one round trip after the fence's WATCH (:func:`_read_group`)."""

    lock_value: Any  # the lease's value, or the state's: the fence's commit checks it is still ours
    state: list[Any]  # the group's state hash, laid out as _STATE_FIELDS
    marks_raw: Any  # the actions' count of operator inputs waiting in SQL (None: none)
    outbox_waits: int  # writes queued while PostgreSQL was down (how many of its keys exist)
    entries: tuple[Any, Any, Any]  # the stream's claimed, own pending and new entries: raw replies


def _read_group(r: redis.Redis, fence: Fence, name: str, skey: str, hkey: str, consumer: str) -> _Reads:
    """Everything the tick reads from Redis, in one round trip after the fence's WATCH. A failed reply
    raises, but the entries' (a stream without its consumer group is answered by :func:`_new_entries`)."""
    pipe = r.pipeline(transaction=False)
    pipe.get(fence.lock.key if fence.lock is not None else hkey)
    pipe.hmget(hkey, _STATE_FIELDS)
    pipe.get(keys.inputs(name))
    pipe.exists(keys.outage_version(name), keys.outbox(name))
    _queue_entry_reads(pipe, skey, consumer)
    lock_value, state, marks_raw, outbox_waits, claimed, own, got = pipe.execute(raise_on_error=False)
    for reply in (lock_value, state, marks_raw, outbox_waits):
        if isinstance(reply, Exception):
            raise reply
    return _Reads(lock_value, state, marks_raw, outbox_waits, (claimed, own, got))


def _new_entries(r: redis.Redis, skey: str, consumer: str, replies: tuple[Any, Any, Any], applied: bytes,
                 replay: list[tuple[bytes, dict]]) -> tuple[list[tuple[bytes, dict]], list[bytes]]:
    """The entries this tick applies and the ids it acknowledges: the replay first (the entries after
    the checkpoint, when this process had no current copy of the detector), then those read after the
    WATCH, past the last one applied. A new stream, or a Redis that lost it, gets its consumer group
    and is read again."""
    after = replay[-1][0] if replay else applied
    claimed, own, got = replies
    if _is_nogroup(got):
        _ensure_consumer_group(r, skey)
        entries, ack_ids = _read_entries(r, skey, consumer, after, retry=False)
    else:
        entries, ack_ids = _entries_of(claimed, own, got, after)
    return replay + entries, ack_ids


def _ingest_entries(gd: GroupDetector, store: TickStore, group: ModelGroup, entries: list[tuple[bytes, dict]],
                    nodes: list[Node], by_name: dict[str, Node], now: float, result: TickResult) -> dict[str, float]:
    """Feed the entries' request records to the detector (``result.samples``: how many it accepted).
    A node the records name that was registered after this tick's membership sync (by a concurrent
    ingest) joins the detector, ``nodes`` and ``by_name``, and its records are applied again.
    Returns each node's newest record time (``TickOutput.last_seen``)."""
    rows: list[list[Any]] = []
    for _eid, fields in entries:
        rows.extend(decode_requests(fields))
    last_seen: dict[str, float] = {}
    if not rows:
        return last_seen
    batch = _batch(rows)
    res = gd.ingest(batch)
    result.samples = res.accepted
    if res.unknown_nodes:
        late = store.late_nodes(group, list(res.unknown_nodes))
        for node_name, node in late.items():
            gd.add_node(node_name, base_weight=float(node.base_weight), now=now)
            by_name[node_name] = node
            nodes.append(node)
        mask = np.isin(batch.node, list(late))
        if mask.any():
            result.samples += gd.ingest(batch.take(mask)).accepted
    get = last_seen.get
    for node_name, t in zip(batch.node.tolist(), batch.ts.tolist(), strict=True):
        if t > get(node_name, 0.0):
            last_seen[node_name] = t
    return last_seen


def _operator_inputs(store: TickStore, gd: GroupDetector, group: ModelGroup, now: float, *, marks: int,
                     write_all: bool) -> tuple[list, list, list]:
    """Apply the operators' inputs (overrides, approvals, silences: SQL rows) to the detector, and
    whether to look at all: only when the actions marked some, when a node waits for an approval (or
    for its silence to release it), or once per history slot (the bound on a lost mark)."""
    waiting = bool(np.any(np.asarray(gd.a.state) == int(NodeState.PENDING_APPROVAL)))
    return store.apply_inputs(gd, group, now) if (marks > 0 or waiting or write_all) else ([], [], [])


def _next_document(r: redis.Redis, name: str, group: ModelGroup, ev: Any, view: list[dict[str, Any]],
                   stored_version: Any, now: float) -> tuple[int, WeightsDocument]:
    """The version and the weights document this tick publishes: one more than the stored version
    (state written before the version field: the published document's) and the group's in SQL."""
    if stored_version is None:  # state written before the version field: continue from the document
        current = r.get(keys.weights(name))
        stored_version = WeightsDocument.from_json(current).version if current else None
    version = publish.next_version(int(stored_version) if stored_version is not None else None,
                                   group.weights_version)
    doc = publish.build_document(name, version, view, safeguard=bool(ev.safeguard), now=now,
                                 stale_after_s=settings.WEIGHTS_STALE_AFTER_S)
    return version, doc


def _commit(r: redis.Redis, store: TickStore, fence: Fence, reads: _Reads, out: TickOutput, doc: WeightsDocument,
            gd: GroupDetector, *, name: str, hkey: str, applied: bytes, history_slot: int,
            last_checkpoint: float) -> None:
    """Write the tick's Redis state in one fenced MULTI: the document and its notification, the state hash (with the detector when ``out.checkpoint``), the canary
    probes due, and the store's own part; then wait for the replicas (raises ``NotReplicated``) and
    keep the detector in this process under the new ``rev``. Raises ``LeaseLost`` when another tick
    took the group while this one ran (a stalled tick must not overwrite its successor's)."""
    ev, by_name, checkpoint = out.ev, out.by_name, out.checkpoint
    new_rev = secrets.token_hex(8).encode()

    def queue(p: Any) -> None:
        # Redis first: the document (and its notification) go out before any SQL write.
        publish.queue_document(p, doc)
        mapping: dict[str, Any] = {"rev": new_rev, "version": out.version,
                                   "thresholds_version": out.group.thresholds_version, "history_slot": history_slot}
        if checkpoint:
            mapping.update(detector=gd.to_bytes(), last_id=applied, checkpoint_at=out.now)
        p.hset(hkey, mapping=mapping)
        # Canary probes due now, for the canary task, which takes each one out as it sends it: a probe is
        # due in one tick only, and a tick that replaced the list could drop it before the canary's
        # next round (a second apart, like the ticks). Left over, an entry is one more probe, no harm.
        if ev.probes_due:
            p.hset(keys.probes(name), mapping={n: by_name[n].address for n in ev.probes_due if n in by_name})
            p.expire(keys.probes(name), PROBES_KEEP_S)
        store.queue(p, out)

    fence.commit(reads.lock_value, reads.state[0], queue)
    # Durable before anything acts on it (REDIS_MIN_REPLICAS_ACK; no round trip when 0): raises NotReplicated.
    require_replicas(r)
    _hold(name, _Held(rev=new_rev, gd=gd, applied=applied, checkpoint_at=out.now if checkpoint else last_checkpoint))


def _acknowledge(r: redis.Redis, skey: str, ack_ids: list[bytes], checkpoint: bool, applied: bytes) -> None:
    """Acknowledge the entries read, and at a checkpoint trim the stream up to ``applied``: the
    checkpoint covers every entry up to it, the stream no longer needs them."""
    pipe = r.pipeline(transaction=False)
    if ack_ids:
        pipe.xack(skey, CONSUMER_GROUP, *ack_ids)
    if checkpoint and applied != b"0-0":
        ms, seq = _id_tuple(applied)
        pipe.xtrim(skey, minid=f"{ms}-{seq + 1}", approximate=False)
    pipe.execute()


def _tick_fenced(r: redis.Redis, store: TickStore, fence: Fence, group: ModelGroup, nodes: list[Node], name: str,
                 now: float, consumer: str, started: float, skey: str, hkey: str) -> TickResult | None:
    """One tick inside the fence: read, restore the detector, apply the new entries and the operators'
    inputs, evaluate, publish (Redis, fenced), then write SQL and acknowledge the entries."""
    reads = _read_group(r, fence, name, skey, hkey, consumer)
    rev, _last_id, _tv, stored_slot, stored_version, checkpoint_at = reads.state
    if store.outage and rev is None and not r.hexists(hkey, "detector"):
        log.warning("tick of %s skipped: PostgreSQL is down and Redis has no detector state yet", name)
        return None
    if reads.outbox_waits:
        store.drain(r, group)
    held_before = name in _HELD and _HELD[name].rev == rev and rev is not None
    gd, applied, replay = _restore(r, group, now, reads.state)
    fresh_state = applied == b"0-0" and not gd.nodes
    by_name = {n.name: n for n in nodes}
    _sync_nodes(gd, nodes, now, fresh_state)

    entries, ack_ids = _new_entries(r, skey, consumer, reads.entries, applied, replay)
    result = TickResult(group=name, at=now, entries=len(entries), sql_outage=store.outage)
    last_seen = _ingest_entries(gd, store, group, entries, nodes, by_name, now, result)
    result.progress = apply_progress(gd, entries)
    if entries:
        applied = entries[-1][0]

    history_slot = int(now // settings.HISTORY_EVERY_S)
    write_all = stored_slot is None or int(stored_slot) != history_slot
    marks = int(reads.marks_raw or 0)
    inputs = _operator_inputs(store, gd, group, now, marks=marks, write_all=write_all)
    ev = gd.evaluate(now)
    decided_at = time.perf_counter()

    view = published_view(ev, group, by_name)
    version, doc = _next_document(r, name, group, ev, view, stored_version, now)
    transitions = [t for t in ev.transitions if t.node in by_name]
    states = dict(zip(ev.nodes, [_LABELS[c] for c in np.asarray(ev.states).astype(np.int64).tolist()], strict=True))
    out = TickOutput(group=group, nodes=nodes, by_name=by_name, ev=ev, view=view, states=states,
                     transitions=transitions, version=version, now=now, write_all=write_all,
                     shadow=group.policy == Policy.SHADOW, last_seen=last_seen, inputs=inputs, marks=marks,
                     node_ids={n: node.pk for n, node in by_name.items()})
    last_checkpoint = float(checkpoint_at or 0.0)
    out.checkpoint = _checkpoint_due(held_before, now, last_checkpoint,
                                     decided=bool(ev.transitions) or any(inputs), new_slot=write_all)
    _commit(r, store, fence, reads, out, doc, gd, name=name, hkey=hkey, applied=applied,
            history_slot=history_slot, last_checkpoint=last_checkpoint)

    result.publish_latency_ms = (time.perf_counter() - decided_at) * 1000.0
    if entries:  # an entry id's first part is its XADD time (Redis clock, ms)
        result.lag_ms = max(time.time() * 1000.0 - min(_id_tuple(e[0])[0] for e in entries), 0.0)
    result.version, result.safeguard, result.checkpoint = version, bool(ev.safeguard), out.checkpoint
    result.weights = {v["node"]: v["weight"] for v in view}
    result.states = states
    result.transitions = len(transitions)

    store.write(r, out)
    _acknowledge(r, skey, ack_ids, out.checkpoint, applied)
    result.tick_ms = (time.perf_counter() - started) * 1000.0
    return result
