"""From parsed records to the per-group Redis Streams (shared by HTTP push and log tailing).

:func:`submit` validates each record (:func:`records.normalize`), resolves its group and node, drops
duplicate ``request_id`` s, appends the valid records to the group's stream (:func:`contract.keys.stream`) and counts every
refused record by reason, storing a few samples of each reason as :class:`RejectedInput` rows that
carry the count (rate-limited per source: :func:`_store`). Its cost follows the accepted records:
records are taken a chunk at a time and a refused one is dropped with its chunk.

Ingest is a trust boundary: a record names a group and a node, and neither becomes real on a
record's say alone. A group must exist (operators create groups; only a name matching one of the
operator's ``AUTO_CREATE_GROUPS`` patterns is created here, and never past ``MAX_GROUPS``): else
``unknown_group``. An unknown node is registered only with ``AUTO_REGISTER_NODES`` on, when its id is
an address inside the group's allow-list, and below ``MAX_NODES_PER_GROUP``
(:func:`~outlier_admin.control.actions.do_register_nodes_from_ingest`).

A batch is accepted record by record, never half-and-500: validation and the resolution of groups and
nodes write nothing to the streams; then, in one SQL transaction, the rejected records are inserted and
every group's rows go to Redis in **one** MULTI/EXEC — the point of acceptance. An error before it
applies nothing (the caller answers 5xx and the client retries the whole batch safely); the only
window left is a failed SQL commit after a successful EXEC.

Stream entries carry a *batch* of records: their format is :mod:`contract.stream`.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from operator import itemgetter
from typing import Any

import orjson
from django.conf import settings
from django.db import IntegrityError, transaction
from django.db.models import F
from django.utils import timezone

from contract import keys, stream
from contract.logformats import FORMATS, ParseError
from contract.names import NameError_, address_key, parse_address
from contract.topology import is_cluster
from detector.samples import REQUEST_ROW_FIELDS
from outlier_admin.control.redis_conn import get_redis
from outlier_admin.fleet.models import ModelGroup, Node, RegisteredVia
from outlier_admin.ingest.columns import CANONICAL_FIELDS, limits, normalize_many
from outlier_admin.ingest.models import IngestSource, RejectedInput

log = logging.getLogger(__name__)

MAX_ERRORS_REPORTED = 20
#: Refused records kept as samples per batch and reason (with their count): an operator needs a few
#: to see what is wrong, and a batch of one bad line repeated 500,000 times stored 500,000 rows.
SAMPLES_PER_REASON = 3
#: A sample's raw text is cut here (a log line is far shorter; a pushed record too).
REJECTED_RAW_MAX = 65536
#: Records validated at a time: numpy's per-column cost stays small against the chunk, and what a
#: chunk refuses is dropped with it (memory per accepted record, not per line).
CHUNK_RECORDS = 5000
SYSTEM_ACTOR = "system:ingest"
# A canonical record (records.CANONICAL_FIELDS): its first _ROW fields are the stream row.
_ROW = len(REQUEST_ROW_FIELDS)
_GROUP = CANONICAL_FIELDS.index("group")
_REQUEST_ID = CANONICAL_FIELDS.index("request_id")
_REFUSED = object()  # the group of a record that was refused


def _looks_like(obj: Any) -> str:
    """The log format a refused item came in: a parser's (``ParseError.fmt``, a parsed record's
    ``_format``); only names in ``FORMATS`` are kept (a pushed record may carry anything)."""
    fmt = obj.fmt if isinstance(obj, ParseError) else obj.get("_format") if isinstance(obj, dict) else None
    return fmt if isinstance(fmt, str) and fmt in FORMATS else ""


def _unknown_node_detail(node: str, group: str) -> str:
    try:
        parse_address(node)
    except NameError_:
        # HAProxy's default log names servers, not addresses: say how to key them by address.
        return (f"node {node!r} in group {group!r} is not registered, and a name is not an address: register a "
                "node by that name, or map the gateway's name to the node's address (tail_logs --node-map "
                "backend/server=HOST:PORT; the shipper reads HAProxy's map from its runtime API)")
    return f"node {node!r} in group {group!r}"


@dataclass
class IngestOutcome:
    """What happened to a batch. ``errors``: the first rejected lines ``{"line", "reason"}``;
    ``latency_only``: accepted records without token counts; ``rejected_by_reason``: every refusal
    counted by ``(reason, format it looks like)``."""

    accepted: int = 0
    rejected: int = 0
    duplicates: int = 0
    latency_only: int = 0
    errors: list[dict[str, Any]] = field(default_factory=list)
    by_group: dict[str, int] = field(default_factory=dict)
    rejected_by_reason: Counter[tuple[str, str]] = field(default_factory=Counter)

    def add(self, other: IngestOutcome) -> None:
        """Add ``other``'s counts to these (``errors`` appended)."""
        self.accepted += other.accepted
        self.rejected += other.rejected
        self.duplicates += other.duplicates
        self.latency_only += other.latency_only
        self.errors.extend(other.errors)
        for group, n in other.by_group.items():
            self.by_group[group] = self.by_group.get(group, 0) + n
        self.rejected_by_reason.update(other.rejected_by_reason)

    def to_dict(self) -> dict[str, Any]:
        return {
            "accepted": self.accepted,
            "rejected": self.rejected,
            "duplicates": self.duplicates,
            "errors": self.errors,
        }


class _Directory:
    """Process-local cache of groups and their nodes (name/address -> node name), refreshed on a
    miss (at most once per group per batch) and every ``ttl_s`` so a node registered by another
    worker is found quickly."""

    def __init__(self, ttl_s: float = 10.0) -> None:
        self.ttl_s = ttl_s
        self._lock = threading.Lock()
        self._groups: dict[str, tuple[float, int, dict[str, tuple[str, bool]]]] = {}

    def clear(self) -> None:
        with self._lock:
            self._groups.clear()

    def _load(self, name: str) -> tuple[float, int, dict[str, tuple[str, bool]]] | None:
        group = ModelGroup.objects.filter(name=name, retired=False).only("id").first()  # retired: unknown
        if group is None:
            with self._lock:
                self._groups.pop(name, None)
            return None
        keys: dict[str, tuple[str, bool]] = {}
        rows = list(Node.objects.filter(group=group).values_list("name", "address", "retired"))
        for node_name, address, retired in rows:
            keys[address] = (node_name, retired)
            keys[node_name] = (node_name, retired)
        for node_name, address, retired in rows:  # an address as written elsewhere finds its node too
            keys.setdefault(address_key(address), (node_name, retired))
        entry = (time.monotonic(), group.pk, keys)
        with self._lock:
            self._groups[name] = entry
        return entry

    def group(self, name: str, *, fresh: bool = False) -> tuple[int, dict[str, tuple[str, bool]]] | None:
        entry = self._groups.get(name)
        if fresh or entry is None or time.monotonic() - entry[0] > self.ttl_s:
            entry = self._load(name)
        return None if entry is None else (entry[1], entry[2])

    def group_of_node(self, node: str) -> str | None:
        """The group of the node with this name/address when it is unambiguous."""
        for gname, (_, _, addresses) in list(self._groups.items()):
            if node in addresses:
                return gname
        live = Node.objects.filter(retired=False)
        rows = list(live.filter(name=node).values_list("group__name", flat=True)[:2])
        if not rows:
            rows = list(live.filter(address=node).values_list("group__name", flat=True)[:2])
        return rows[0] if len(set(rows)) == 1 else None


directory = _Directory()


def _group_id(name: str) -> tuple[int | None, str | None]:
    """``(group_id, None)`` for an existing group (or one an operator pattern lets ingest create),
    ``(None, reason)`` otherwise."""
    found = directory.group(name)
    if found is not None:
        return found[0], None
    from outlier_admin.control.actions import auto_create_pattern

    pattern = auto_create_pattern(name)
    if pattern is None:
        return None, "unknown_group"
    if ModelGroup.objects.count() >= settings.MAX_GROUPS:
        return None, "too_many_groups"
    from outlier_admin.control.actions import ActionError, do_create_group

    try:
        with transaction.atomic():
            do_create_group(name, actor=SYSTEM_ACTOR, created_via="ingest",
                            reason=f"first record for this group; matches AUTO_CREATE_GROUPS pattern {pattern!r}")
    except (IntegrityError, ActionError):
        pass  # another worker created it first
    found = directory.group(name, fresh=True)
    return (found[0], None) if found is not None else (None, "unknown_group")


def _resolve_nodes(group_name: str, group_id: int, keys: set[str]) -> dict[str, tuple[str | None, str | None]]:
    """``{key: (node_name, None) | (None, reason)}`` for the node keys of a batch in one group: one
    directory refresh for all misses, one bulk registration for all new nodes (a reload per node
    would make registering n nodes O(n^2))."""
    found = directory.group(group_name)
    known = found[1] if found else {}
    if any(k not in known for k in keys):
        found = directory.group(group_name, fresh=True)
        known = found[1] if found else {}
    out: dict[str, tuple[str | None, str | None]] = {}
    missing: dict[str, str] = {}  # key -> the address's one spelling (contract.names.address_key)
    for key in keys:
        hit = known.get(key)
        if hit is None:
            # 127.0.0.1:018950, [::ffff:127.0.0.1]:18950 and 127.0.0.1:18950 are one address: one node.
            canonical = address_key(key)
            hit = known.get(canonical)
            if hit is None:
                missing[key] = canonical
                continue
        out[key] = (None, "retired_node") if hit[1] else (hit[0], None)
    if not missing:
        return out
    if not settings.AUTO_REGISTER_NODES:
        out.update((k, (None, "unknown_node")) for k in missing)
        return out
    from outlier_admin.control.actions import do_register_nodes_from_ingest

    group = ModelGroup.objects.get(pk=group_id)
    registered = do_register_nodes_from_ingest(group, sorted(set(missing.values())), actor=SYSTEM_ACTOR,
                                               registered_via=RegisteredVia.INGEST)
    for key, canonical in missing.items():
        why = registered.get(canonical, "unknown_node")
        out[key] = (canonical, None) if why is None else (None, why)
    if any(why is None for why in registered.values()):
        directory.group(group_name, fresh=True)
    return out


def _dedup_keys(group: str) -> tuple[str, str]:
    """The request-id sets of the current and the previous de-duplication window."""
    slot = int(time.time() // settings.INGEST_DEDUP_WINDOW_S)
    return keys.dedup(group, slot), keys.dedup(group, slot - 1)


def _append(r: Any, per_group: dict[str, list[tuple[Any, ...]]]) -> dict[str, tuple[int, int, int]]:
    """Append each group's records to its stream in one MULTI/EXEC; returns ``{group: (accepted,
    duplicates, latency_only)}``.

    A ``request_id`` seen in this or the previous de-duplication window of its group (or earlier in
    the batch) is a duplicate. The check, the stream writes and the marking of the new ids form one
    optimistic transaction (WATCH the id sets, read, MULTI, write, EXEC; retried if another request
    changed the sets meanwhile): two concurrent requests carrying the same id cannot both get
    through, and a client retrying after a Redis failure is neither lost (ids are marked only with
    their rows) nor counted twice. Every group's rows land together or none do (on a Redis Cluster: each
    group's).
    """
    per_group = {g: recs for g, recs in per_group.items() if recs}
    result: dict[str, tuple[int, int, int]] = {}
    if not per_group:
        return result
    dedup = {g: _dedup_keys(g) for g in per_group}

    def attempt(pipe: Any) -> None:
        plan = []
        for group, recs in per_group.items():
            cur, prev = dedup[group]
            ids = list(dict.fromkeys(filter(None, map(itemgetter(_REQUEST_ID), recs))))
            batch_ids: set[str] = set()
            if not ids:  # the common case: rows as they are, no per-record work
                rows = [rec[:_ROW] for rec in recs]
            else:
                in_cur, in_prev = pipe.smismember(cur, ids), pipe.smismember(prev, ids)
                seen = {rid for rid, a, b in zip(ids, in_cur, in_prev, strict=True) if a or b}
                rows = []
                for rec in recs:
                    rid = rec[_REQUEST_ID]
                    if rid and (rid in seen or rid in batch_ids):
                        continue
                    if rid:
                        batch_ids.add(rid)
                    rows.append(rec[:_ROW])
            plan.append((group, rows, batch_ids, len(recs)))
        pipe.multi()
        for group, rows, batch_ids, n in plan:
            stream.queue_requests(pipe, group, rows)
            if batch_ids:
                cur = dedup[group][0]
                pipe.sadd(cur, *batch_ids)
                pipe.expire(cur, 2 * settings.INGEST_DEDUP_WINDOW_S)
            result[group] = (len(rows), n - len(rows), list(map(itemgetter(2), rows)).count(None))

    if is_cluster(r) and len(per_group) > 1:
        # A Redis Cluster runs a transaction within one slot (one group) only: one per group. A failure
        # part-way answers an error after some groups landed; the client's retry is safe for records
        # with a request_id (de-duplicated), as after any failed request.
        for group, recs in per_group.items():
            result.update(_append(r, {group: recs}))
        return result
    if any(any(map(itemgetter(_REQUEST_ID), recs)) for recs in per_group.values()):
        r.transaction(attempt, *(k for pair in dedup.values() for k in pair))
    else:  # no ids to check: a plain MULTI, nothing to watch
        pipe = r.pipeline(transaction=True)
        attempt(pipe)
        pipe.execute()
    return result


def _dump(obj: Any) -> str:
    """A refused record as text; what orjson cannot write (a lone surrogate, an int over 64 bits)
    is written with its escapes by the standard library."""
    try:
        return orjson.dumps(obj, default=str).decode()
    except (orjson.JSONEncodeError, TypeError):
        return json.dumps(obj, default=str)


def _pg_text(text: str) -> str:
    # PostgreSQL text cannot hold NUL; a rejected record keeps everything else verbatim.
    return text.replace("\x00", "\\u0000")


def _text(raw: str | bytes) -> str:
    return raw.decode("utf-8", "replace") if isinstance(raw, bytes) else raw


class _Refusals:
    """The refusals of one batch, counted per ``(reason, looks_like)`` with at most
    :data:`SAMPLES_PER_REASON` distinct samples each: memory and stored rows grow with the distinct
    reasons, never with the refused lines. A sample is ``[line, detail, obj, raw, count]``; ``count``
    is how many refusals it stands for (itself and identical ones; the last kept sample also counts
    the refusals of its reason whose text was not kept), so the rows' counts add up to the refusals."""

    def __init__(self) -> None:
        self.total = 0
        self.counts: Counter[tuple[str, str]] = Counter()
        self.samples: dict[tuple[str, str], list[list[Any]]] = {}
        self._first: list[tuple[int, str]] = []

    def add(self, line: int, reason: str, detail: str, obj: Any, raw: str | bytes | None, looks_like: str) -> None:
        key = (reason, looks_like)
        self.total += 1
        self.counts[key] += 1
        kept = self.samples.get(key)
        if kept is None:
            self.samples[key] = [[line, detail, obj, raw, 1]]
        else:
            for sample in kept:  # an identical refusal (a shipper resending a line) adds to its count
                if sample[3] == raw and (raw is not None or sample[2] == obj):
                    sample[4] += 1
                    break
            else:
                if len(kept) < SAMPLES_PER_REASON:
                    kept.append([line, detail, obj, raw, 1])
                else:
                    kept[-1][4] += 1
        first = self._first
        first.append((line, reason))
        if len(first) >= 4 * MAX_ERRORS_REPORTED:  # keep the lowest lines: refusals come mostly in order
            first.sort(key=itemgetter(0))
            del first[MAX_ERRORS_REPORTED:]

    def errors(self) -> list[dict[str, Any]]:
        """The first :data:`MAX_ERRORS_REPORTED` refusals by line, as the response lists them."""
        first = sorted(self._first, key=itemgetter(0))[:MAX_ERRORS_REPORTED]
        return [{"line": line, "reason": reason} for line, reason in first]

    def rows(self, *, source: str, source_ref: IngestSource | None) -> list[RejectedInput]:
        """One row per kept sample, the first sample of every reason first (see :func:`_store`)."""
        rows = []
        for rank in range(SAMPLES_PER_REASON):
            for (reason, looks_like), kept in self.samples.items():
                if rank < len(kept):
                    line, detail, obj, raw, count = kept[rank]
                    rows.append(RejectedInput(
                        source=source[:100], source_ref=source_ref, line=line, reason=reason[:64],
                        looks_like=looks_like, detail=_pg_text(detail[:2000]), count=count,
                        raw=_pg_text((_text(raw) if raw is not None else _dump(obj))[:REJECTED_RAW_MAX]),
                    ))
        return rows


def _store(r: Any, refusals: _Refusals, *, source: str, source_ref: IngestSource | None) -> None:
    """Store a batch's refusals (inside the caller's transaction), at most
    ``INGEST_REJECTED_ROWS_PER_HOUR`` new rows per source and clock hour (a Redis counter). Past it a
    refusal is counted, not stored: its count is added to the newest row of its source and reason
    in the hour, so the counts by reason stay whole while the table grows by at most the budget plus
    one row per distinct reason and hour. A misbehaving gateway (or a stolen token) could otherwise
    fill the table at the rate it can send: 10 MiB of rows per 0.64 s request, kept for
    ``INGEST_REJECTED_KEEP_DAYS``."""
    rows = refusals.rows(source=source, source_ref=source_ref)
    if not rows:
        return
    budget = settings.INGEST_REJECTED_ROWS_PER_HOUR
    slot = int(time.time() // 3600)
    key = keys.rejected_rows(source[:100], slot)
    pipe = r.pipeline(transaction=False)
    pipe.incrby(key, len(rows))
    pipe.expire(key, 7200)
    used = pipe.execute()[0]
    room = max(0, budget - (used - len(rows)))
    if room >= len(rows):
        RejectedInput.objects.bulk_create(rows, batch_size=1000)
        return
    kept, over = rows[:room], rows[room:]
    folded: dict[tuple[str, str], RejectedInput] = {}
    for row in over:  # one per reason: the first sample, carrying the count of all the rest
        first = folded.setdefault((row.reason, row.looks_like), row)
        if first is not row:
            first.count += row.count
    since = timezone.now().replace(minute=0, second=0, microsecond=0)
    for (reason, looks_like), row in folded.items():
        sibling = next((k for k in kept if (k.reason, k.looks_like) == (reason, looks_like)), None)
        if sibling is not None:  # a sample of this reason is stored with this batch: it carries the count
            sibling.count += row.count
            continue
        newest = RejectedInput.objects.filter(source=row.source, reason=reason, looks_like=looks_like,
                                              received_at__gte=since).order_by("-id").values_list("pk", flat=True).first()
        if newest is None:
            kept.append(row)  # the reason's first row in this hour
        else:
            RejectedInput.objects.filter(pk=newest).update(count=F("count") + row.count)
    if kept:
        RejectedInput.objects.bulk_create(kept, batch_size=1000)
    log.warning("rejected input of %s over %d rows this hour: counted, samples not stored", source[:100], budget)


def submit(
    items: Iterable[tuple[int, Any, str | bytes | None]],
    *,
    source: str,
    source_ref: IngestSource | None = None,
    default_group: str | None = None,
    now: float | None = None,
    group_scope: frozenset[str] | None = None,
) -> IngestOutcome:
    """Validate and enqueue records (see the module docstring for what is accepted and when).

    ``items``: ``(line_number, record_or_ParseError, raw_text_or_None)``, consumed lazily, at most
    :data:`CHUNK_RECORDS` at a time: a refused record is counted in its chunk and dropped (a few
    samples of each reason are kept, :class:`_Refusals`), so memory grows with the accepted records
    only. The raw text (``str`` or ``bytes``) is kept for refused records (``None``: the record is
    re-serialised). An exception raised by ``items`` propagates, with nothing applied.
    ``group_scope``: the groups the pushing token may write (:meth:`ApiToken.group_scope
    <outlier_admin.fleet.models.ApiToken.group_scope>`); a record of another group is refused
    (``group_out_of_scope``) and the rest of the batch goes on. None: every group.

    Returns the counts; refused records are stored as :class:`RejectedInput` (``source`` names the
    origin, e.g. ``http:<token>``; see :func:`_store` for the rate limit). Raises (and applies
    nothing) when Redis or PostgreSQL fails before acceptance.
    """
    now = time.time() if now is None else now
    admission = _Admission(now=now, bounds=limits(), default_group=default_group, group_scope=group_scope)
    chunk: list[tuple[int, Any, Any]] = []
    for item in items:
        obj = item[1]
        if type(obj) is not dict and isinstance(obj, ParseError):  # refused by its parser: counted here
            line, _, raw = item
            admission.refusals.add(line, obj.reason, obj.detail, None, raw, _looks_like(obj))
            continue
        chunk.append(item)
        if len(chunk) >= CHUNK_RECORDS:
            admission.take(chunk)
            chunk = []
    if chunk:
        admission.take(chunk)
        chunk = []
    out = _accept(admission, source=source, source_ref=source_ref)
    _observe(out, admission.refusals, source=source)
    return out


class _Admission:
    """One batch's records on their way to acceptance, a chunk at a time: the rows kept per group, the
    refusals, and the per-batch look-ups (one per group, one resolution per node)."""

    def __init__(self, *, now: float, bounds: dict[str, Any], default_group: str | None,
                 group_scope: frozenset[str] | None) -> None:
        self.now = now
        self.bounds = bounds
        self.default_group = default_group
        self.group_scope = group_scope
        self.refusals = _Refusals()
        self.accepted_recs: dict[str, list[tuple[Any, ...]]] = {}
        self.group_ids: dict[str, tuple[int | None, str | None]] = {}
        self.nodes_of: dict[str, dict[str, tuple[str | None, str | None]]] = {}
        self.group_of_node: dict[str, str | None] = {}

    def refuse(self, item: tuple[int, Any, Any], reason: str, detail: str) -> None:
        line, obj, raw = item
        self.refusals.add(line, reason, detail, obj, raw, _looks_like(obj))

    def take(self, chunk: list[tuple[int, Any, Any]]) -> None:
        """Check a chunk and keep its records by group (or refuse them)."""
        # Canonical tuples (columns.CANONICAL_FIELDS: the stream row, then group and request id) or
        # the refusal, for the chunk at once (normalize_many: columns, each name checked once).
        checked = normalize_many([obj for _, obj, _ in chunk], now=self.now, **self.bounds)
        for group, indices in self._by_group(chunk, checked).items():
            self._admit(group, indices, chunk, checked)

    def _by_group(self, chunk: list[tuple[int, Any, Any]], checked: list[Any]) -> dict[str, list[int]]:
        """The chunk's valid records' indices by group (given, the default, or the node's registered
        group); a refused record, or one with no group to be found, is refused here."""
        groups = [rec[_GROUP] if type(rec) is tuple else _REFUSED for rec in checked]
        distinct = set(groups)
        per_group: dict[str, list[int]] = {}
        if len(distinct) == 1 and next(iter(distinct)) not in (None, _REFUSED):
            per_group[next(iter(distinct))] = list(range(len(chunk)))  # most chunks: one group throughout
            return per_group
        for i, (rec, group) in enumerate(zip(checked, groups, strict=True)):
            if group is _REFUSED:
                self.refuse(chunk[i], rec.reason, rec.detail)
                continue
            if group is None:
                group = self.default_group
            if group is None:
                node = rec[0]
                if node not in self.group_of_node:
                    self.group_of_node[node] = directory.group_of_node(node)
                group = self.group_of_node[node]
            if group is None:
                self.refuse(chunk[i], "no_group", "no group given and the node is not registered")
                continue
            per_group.setdefault(group, []).append(i)
        return per_group

    def _admit(self, group: str, indices: list[int], chunk: list[tuple[int, Any, Any]], checked: list[Any]) -> None:
        """Keep one group's records of the chunk: the group within the token's scope and existing,
        each node resolved to its registered name (or refused)."""
        if self.group_scope is not None and group not in self.group_scope:
            detail = (f"group {group!r} is outside this token's scope (it may push for "
                      f"{', '.join(sorted(self.group_scope))})")
            for i in indices:
                self.refuse(chunk[i], "group_out_of_scope", detail)
            return
        if group not in self.group_ids:
            self.group_ids[group] = _group_id(group)
        group_id, why = self.group_ids[group]
        if group_id is None:
            detail = f"group {group!r} does not exist (operators create groups)"
            for i in indices:
                self.refuse(chunk[i], why or "unknown_group", detail)
            return
        recs: list[tuple[Any, ...]] = [checked[i] for i in indices]
        resolved = self.nodes_of.setdefault(group, {})
        keys = set(map(itemgetter(0), recs))
        new = keys.difference(resolved)
        if new:
            resolved.update(_resolve_nodes(group, group_id, new))
        kept = self.accepted_recs.setdefault(group, [])
        if all(resolved[key][0] == key for key in keys):
            kept.extend(recs)  # every node known by its own name: the rows as they are
            return
        for i, rec in zip(indices, recs, strict=True):
            name, why = resolved[rec[0]]
            if name is None:
                self.refuse(chunk[i], why or "unknown_node", _unknown_node_detail(rec[0], group))
            else:
                kept.append(rec if name == rec[0] else (name, *rec[1:]))


def _accept(admission: _Admission, *, source: str, source_ref: IngestSource | None) -> IngestOutcome:
    """Store the refusals and append the kept rows: the point of acceptance; the batch's counts."""
    out = IngestOutcome()
    refusals = admission.refusals
    r = get_redis()
    with transaction.atomic():
        _store(r, refusals, source=source, source_ref=source_ref)
        # The point of acceptance: every group's rows in one MULTI/EXEC, inside the transaction that
        # stores the rejections (a Redis failure rolls them back: the client retries the whole batch).
        for group, (accepted, duplicates, latency_only) in _append(r, admission.accepted_recs).items():
            out.duplicates += duplicates
            out.latency_only += latency_only
            if accepted:
                out.accepted += accepted
                out.by_group[group] = accepted
    out.rejected = refusals.total
    out.rejected_by_reason = refusals.counts
    out.errors = refusals.errors()
    return out


def _observe(out: IngestOutcome, refusals: _Refusals, *, source: str) -> None:
    """The batch's metrics (a no-op if disabled); a fault here never fails the accepted batch."""
    try:
        from outlier_admin.observability.hooks import observe_ingest  # a no-op if disabled

        by_reason: Counter[str] = Counter()
        for (reason, _), n in refusals.counts.items():
            by_reason[reason] += n
        observe_ingest(out, source=source, rejected_by_reason=by_reason)
    except Exception:  # the batch is accepted: a metrics fault must not turn it into a 5xx
        log.exception("ingest metrics hook failed")
