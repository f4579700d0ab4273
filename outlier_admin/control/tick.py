"""One detector tick of one model group: stream -> detector -> weights in Redis -> history in SQL.

Order of a tick (any worker can run any group's tick; the per-group lock makes them sequential):

1. take ``outlier:lock:tick:<group>`` (``SET NX PX``, renewed while the tick runs); if held, skip
   (another worker is ticking);
2. restore the detector (``GroupDetector.from_bytes``) from ``outlier:state:<group>``, or build a
   new one; sync membership with the group's nodes in the database; apply threshold changes;
3. read new stream entries with the consumer group ``ticks`` (first reclaiming entries left pending
   by a dead worker with ``XAUTOCLAIM``); entries at or below the state's ``last_id`` were already
   applied before a crash and are only acknowledged (so no sample is applied twice);
4. apply operator inputs written by :mod:`actions` (overrides, proposal decisions) and canary
   probe results, then ``evaluate(now)``;
5. publish the weights document (see :mod:`outlier_admin.control.publish`) — the decision reaches
   Redis before any SQL write, which keeps decision-to-publish latency to a few milliseconds;
6. store the detector state, then write transitions, history, proposals and node states in one
   SQL transaction; only then ``XACK`` the entries. A crash before the ack re-delivers them and the
   ``last_id`` check above skips them.
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import numpy as np
import redis
from django.conf import settings
from django.utils import timezone

from detector import GroupDetector, NodeState, ProgressBatch, SampleBatch, Thresholds, Transition
from detector.states import Traffic, traffic_of
from outlier_admin.control import degraded, operator_inputs, publish
from outlier_admin.control.models import (
    CanaryProbe,
    GroupBaseline,
    NodeHistory,
    Override,
    QuarantineProposal,
)
from outlier_admin.control.models import Transition as TransitionRow
from outlier_admin.control.redis_conn import (
    GroupLock,
    LeaseLost,
    fenced,
    get_redis,
    probes_key,
    state_key,
    stream_key,
    tick_lock,
)
from outlier_admin.fleet.models import ModelGroup, Node, Policy
from outlier_admin.ingest.pipeline import decode_entry, decode_progress

log = logging.getLogger(__name__)

CONSUMER_GROUP = "ticks"
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
    weights: dict[str, int] = field(default_factory=dict)
    states: dict[str, str] = field(default_factory=dict)


def _f(v: Any) -> float | None:
    if v is None:
        return None
    v = float(v)
    return v if math.isfinite(v) else None


def _ts(value: float) -> datetime:
    return datetime.fromtimestamp(value, tz=UTC)


def _ensure_consumer_group(r: redis.Redis, key: str) -> None:
    try:
        r.xgroup_create(key, CONSUMER_GROUP, id="0", mkstream=True)
    except redis.ResponseError as exc:
        if "BUSYGROUP" not in str(exc):
            raise


def apply_thresholds(gd: GroupDetector, wanted: Thresholds) -> None:
    """Apply a group's new thresholds to its running detector (learned state is kept)."""
    gd.set_thresholds(wanted)


def _load_detector(r: redis.Redis, group: ModelGroup, now: float) -> tuple[GroupDetector, bytes, bytes | None]:
    """The group's detector, the last stream entry it applied (``0-0``: none) and the ``last_id``
    field as stored (None: no state yet), which the tick's state write is fenced on."""
    raw = r.hmget(state_key(group.name), ["detector", "last_id", "thresholds_version"])
    if raw[0]:
        gd = GroupDetector.from_bytes(raw[0])
        last_id = raw[1] or b"0-0"
        version = int(raw[2] or 0)
    else:
        # A control plane starting against a running fleet must not slow-start every node.
        gd = GroupDetector(thresholds=group.thresholds(), now=now)
        last_id, version = b"0-0", group.thresholds_version
    if version != group.thresholds_version:
        apply_thresholds(gd, group.thresholds())
    return gd, last_id, raw[1]


def _id_tuple(entry_id: bytes) -> tuple[int, int]:
    a, _, b = entry_id.partition(b"-")
    return int(a), int(b or 0)


def _sync_nodes(gd: GroupDetector, nodes: list[Node], now: float, fresh_state: bool) -> None:
    live = {n.name: n for n in nodes if not n.retired}
    for name in list(gd.nodes):
        if name not in live:
            gd.remove_node(name)
    for name, node in live.items():
        if name not in gd.nodes:
            gd.add_node(name, base_weight=float(node.base_weight), now=now, warm=fresh_state)


def _read_entries(r: redis.Redis, key: str, consumer: str, last_id: bytes) -> tuple[list, list[bytes]]:
    """New entries (reclaimed + fresh) not yet applied, and every id to acknowledge."""
    entries: list[tuple[bytes, dict]] = []
    # We hold the lock, so entries pending here belong to a tick whose lease lapsed. It lapsed at least
    # a lease after its last renewal, and renewals come every third of a lease (redis_conn.GroupLock):
    # its entries have been idle for more than 2/3 of a lease. Half a lease reclaims all of them at the
    # first tick after a crash, before ">" reads newer ones and moves ``last_id`` past them.
    idle = settings.TICK_LOCK_TTL_MS // 2
    try:
        claimed = r.xautoclaim(key, CONSUMER_GROUP, consumer, min_idle_time=idle, start_id="0-0", count=1000)
        entries.extend(e for e in claimed[1] if e and e[1] is not None)
    except redis.ResponseError:
        pass
    got = r.xreadgroup(CONSUMER_GROUP, consumer, {key: ">"}, count=settings.TICK_MAX_ENTRIES)
    for _stream, items in got or []:
        entries.extend(items)
    ids = [eid for eid, _ in entries]
    floor = _id_tuple(last_id)
    fresh = [(eid, fields) for eid, fields in entries if _id_tuple(eid) > floor]
    return fresh, ids


def _batch(rows: list[list[Any]]) -> SampleBatch:
    # null (unknown) -> NaN: a TTFT the gateway does not log; token counts of a latency-only record.
    return SampleBatch.from_rows(rows)


def published_view(ev: Any, group: ModelGroup, nodes_by_name: dict[str, Node]) -> list[dict[str, Any]]:
    """Per node: the weight (int) and state a gateway must apply.

    ``shadow`` policy: the detector's decisions are recorded but every node is published at its base
    weight as ``healthy`` — except operator-forced states, which an operator asked for explicitly.
    """
    forced = {NodeState.FORCED_QUARANTINE, NodeState.FORCED_ACTIVE}
    out = []
    for i, name in enumerate(ev.nodes):
        state = NodeState(int(ev.states[i]))
        weight = round(float(ev.weights[i]))
        if group.policy == Policy.SHADOW and state not in forced:
            state, weight = NodeState.HEALTHY, round(float(ev.base_weights[i]))
        if traffic_of(state) is Traffic.DRAIN:
            weight = 0
        node = nodes_by_name.get(name)
        out.append(
            {
                "node": name,
                "address": node.address if node else name,
                "weight": weight,
                "state": state.label,
                "base_weight": round(float(ev.base_weights[i])),
            }
        )
    return out


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
                node=by_name[name], signal=sig, at=at, ema=_f(ema[i]), z=_f(ev.z_by_signal[sig][i]),
                p50=_f(ev.p50[i]) if sig == "norm" else None, p99=_f(ev.p99[i]) if sig == "norm" else None,
                samples=int(ev.counts[i]), weight=float(ev.weights[i]), state=state_label,
                evidence=_f(ev.evidence[i]) if sig == ev.decision_signal and len(ev.evidence) else None,
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
        out.append(GroupBaseline(group=group, signal=sig, at=at, baseline=_f(base),
                                 spread=_f(ev.spread.get(sig)), peers=peers))
    return out


def _transition_row(t: Transition, group: ModelGroup, node: Node, shadow: bool, ev: Any) -> TransitionRow:
    explanation = t.to_dict()
    explanation["policy"] = group.policy
    explanation["published"] = not shadow
    explanation["safeguard"] = bool(ev.safeguard)
    explanation["safeguard_reason"] = ev.safeguard_reason
    if node.gpu_evidence:
        explanation["gpu_evidence"] = node.gpu_evidence
    return TransitionRow(
        group=group, node=node, at=_ts(t.at), from_state=t.from_state.label, to_state=t.to_state.label,
        reason=t.reason, signal=t.signal or "", z=_f(t.z), baseline=_f(t.baseline), spread=_f(t.spread),
        ema=_f(t.ema), p50=_f(t.p50), p99=_f(t.p99), samples=int(t.samples or 0),
        explanation=explanation, shadow=shadow,
    )


def run_tick(group: ModelGroup | str, *, now: float | None = None, consumer: str = "tick") -> TickResult | None:
    """Run one tick of ``group`` (a model or its name). Returns None when another worker holds the
    group's lock (that tick is skipped, not queued). With PostgreSQL unreachable the tick runs from
    Redis alone (:func:`outlier_admin.control.degraded.run_degraded_tick`); the first tick after it
    returns drains the outbox first."""
    started = time.perf_counter()
    name = group if isinstance(group, str) else group.name
    r = get_redis()
    lock = tick_lock(r, name)
    if not lock.acquire():
        return None
    try:
        try:
            if isinstance(group, str):
                group = ModelGroup.objects.get(name=group)
            # Rows kept in Redis while PostgreSQL was down are written before this tick's own.
            degraded.drain(r, group)
            return _tick_locked(r, group, now, consumer, started, lock=lock)
        except degraded.DB_ERRORS as exc:
            # PostgreSQL unreachable: keep deciding and publishing from Redis (see control.degraded).
            log.warning("tick of %s without PostgreSQL: %s", name, exc)
            return degraded.run_degraded_tick(r, name, now=now, consumer=consumer, started=started, lock=lock)
    except LeaseLost as exc:
        # Another worker took the group over while this tick stalled: it applied these entries (or
        # will: they stay pending); writing our older state would un-apply its work.
        log.warning("tick of %s dropped: %s", name, exc)
        return None
    finally:
        lock.release()


def apply_progress(gd: GroupDetector, entries: list[tuple[bytes, dict]]) -> int:
    """Hand the entries' streamed-progress rows to the detector; returns how many it applied."""
    rows = [row for _eid, fields in entries for row in decode_progress(fields)]
    if not rows:
        return 0
    return gd.ingest_progress(ProgressBatch.from_rows(rows)).accepted


def _tick_locked(r: redis.Redis, group: ModelGroup, now: float | None, consumer: str, started: float,
                 *, lock: GroupLock | None = None) -> TickResult:
    group.refresh_from_db()
    now = time.time() if now is None else now
    skey = stream_key(group.name)
    _ensure_consumer_group(r, skey)
    gd, last_id, started_from = _load_detector(r, group, now)
    fresh_state = last_id == b"0-0" and not gd.nodes
    nodes = list(Node.objects.filter(group=group))
    by_name = {n.name: n for n in nodes}
    _sync_nodes(gd, nodes, now, fresh_state)

    entries, ack_ids = _read_entries(r, skey, consumer, last_id)
    result = TickResult(group=group.name, at=now, entries=len(entries))
    rows: list[list[Any]] = []
    for _eid, fields in entries:
        rows.extend(decode_entry(fields))
    last_seen: dict[str, float] = {}
    if rows:
        batch = _batch(rows)
        res = gd.ingest(batch)
        result.samples = res.accepted
        if res.unknown_nodes:
            # Registered after our membership sync (by a concurrent ingest): add and re-apply.
            fresh_nodes = {n.name: n for n in Node.objects.filter(group=group, name__in=res.unknown_nodes)}
            for name, node in fresh_nodes.items():
                if not node.retired:
                    gd.add_node(name, base_weight=float(node.base_weight), now=now)
                    by_name[name] = node
            mask = np.isin(batch.node, list(fresh_nodes))
            if mask.any():
                result.samples += gd.ingest(batch.take(mask)).accepted
        for name, ts in zip(batch.node.tolist(), batch.ts.tolist(), strict=True):
            if ts > last_seen.get(name, 0.0):
                last_seen[name] = ts
    result.progress = apply_progress(gd, entries)
    if entries:
        last_id = max((eid for eid, _ in entries), key=_id_tuple)

    overrides, decided, probes = operator_inputs.apply(gd, group, now)
    ev = gd.evaluate(now)
    decided_at = time.perf_counter()

    view = published_view(ev, group, by_name)
    if lock is not None and not lock.still_held():
        raise LeaseLost(f"{lock.key}: lease lost before publishing")
    version = publish.publish_weights(group, view, safeguard=bool(ev.safeguard), now=now)
    result.publish_latency_ms = (time.perf_counter() - decided_at) * 1000.0
    result.version = version
    result.safeguard = bool(ev.safeguard)
    result.weights = {v["node"]: v["weight"] for v in view}
    result.states = {v["node"]: NodeState(int(s)).label for v, s in zip(view, ev.states, strict=True)}

    history_slot = int(now // settings.HISTORY_EVERY_S)
    stored_slot = r.hget(state_key(group.name), "history_slot")

    def store(pipe: Any) -> None:
        pipe.hset(
            state_key(group.name),
            mapping={
                "detector": gd.to_bytes(),
                "last_id": last_id,
                "thresholds_version": group.thresholds_version,
                "history_slot": history_slot,
            },
        )
        # What a tick needs to run while PostgreSQL is down (control.degraded).
        degraded.store_snapshot(pipe, group, nodes)
        # Canary probes due now, for the canary task (replaced every tick).
        pipe.delete(probes_key(group.name))
        if ev.probes_due:
            pipe.hset(probes_key(group.name), mapping={n: by_name[n].address for n in ev.probes_due if n in by_name})

    # Only while this tick still holds the group (a stalled tick must not overwrite its successor's).
    fenced(r, lock, state_key(group.name), started_from, store)

    shadow = group.policy == Policy.SHADOW
    transitions = [t for t in ev.transitions if t.node in by_name]
    result.transitions = len(transitions)
    moved = {t.node for t in transitions}
    write_all = stored_slot is None or int(stored_slot) != history_slot
    stamp = timezone.now()
    # If PostgreSQL fails inside, the rows go to the Redis outbox and the tick goes on (control.degraded).
    with degraded.sql_or_outbox(
        r, group.name,
        lambda: degraded.rows_of_tick(ev, group, by_name, transitions, shadow=shadow, now=now, write_all=write_all),
        lambda: degraded.applied_inputs(overrides, decided, probes),
    ):
        TransitionRow.objects.bulk_create([_transition_row(t, group, by_name[t.node], shadow, ev) for t in transitions])
        for t in transitions:
            if t.to_state == NodeState.PENDING_APPROVAL and not shadow:
                operator_inputs.open_detector_proposal(by_name[t.node], t)
        at = _ts(now)
        history = history_rows(ev, by_name, at, None if write_all else moved)
        NodeHistory.objects.bulk_create(history, batch_size=2000)
        if history:
            # The baseline every Z of this write was measured against, one row per signal.
            GroupBaseline.objects.bulk_create(baseline_rows(ev, group, at))
        changed = []
        for v in view:
            node = by_name.get(v["node"])
            if node is None:
                continue
            state_label = result.states[v["node"]]
            seen = last_seen.get(node.name)
            new_seen = _ts(seen) if seen else node.last_seen
            if node.state != state_label or node.weight != v["weight"] or new_seen != node.last_seen:
                node.state, node.weight, node.last_seen = state_label, v["weight"], new_seen
                changed.append(node)
        if changed:
            Node.objects.bulk_update(changed, ["state", "weight", "last_seen"])
        if overrides:
            Override.objects.filter(pk__in=[o.pk for o in overrides]).update(applied_at=stamp)
        if decided:
            QuarantineProposal.objects.filter(pk__in=[p.pk for p in decided]).update(applied_at=stamp)
        for pr in probes:
            pr.applied_at = stamp
        if probes:
            CanaryProbe.objects.bulk_update(probes, ["passed", "normalised_latency", "applied_at"])
        ModelGroup.objects.filter(pk=group.pk).update(last_tick_at=stamp)
    if ack_ids:
        r.xack(stream_key(group.name), CONSUMER_GROUP, *ack_ids)
        # Acknowledged entries are no longer needed: delete them so the stream stays small.
        r.xdel(stream_key(group.name), *ack_ids)
    result.tick_ms = (time.perf_counter() - started) * 1000.0
    return result
