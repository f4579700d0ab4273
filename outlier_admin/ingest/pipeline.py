"""From parsed records to the per-group Redis Streams (shared by HTTP push and log tailing).

:func:`submit` validates each record (:func:`records.normalize`), resolves its group and node
(creating an unknown group with default thresholds and policy ``auto``; registering an unknown node
when ``AUTO_REGISTER_NODES``), drops duplicate ``request_id`` s, appends the valid records to
``outlier:stream:<group>`` and stores every refused record as :class:`RejectedInput` with its reason.

Stream entries carry a *batch* of records (field ``rows``: orjson of
``[[node, ts, prompt_tokens, completion_tokens, ttft_ms|null, total_ms, status], ...]``), not one
record each: one XADD per group per request is what makes 20k records/s fit on two cores.
"""

from __future__ import annotations

import logging
import re
import threading
import time
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import orjson
from django.conf import settings
from django.db import IntegrityError, transaction

from outlier_admin.control.redis_conn import get_redis, stream_key
from outlier_admin.fleet.models import ModelGroup, Node, RegisteredVia
from outlier_admin.ingest.logformats import ParseError
from outlier_admin.ingest.models import IngestSource, RejectedInput
from outlier_admin.ingest.records import RecordError, normalize

log = logging.getLogger(__name__)

MAX_ERRORS_REPORTED = 20
ROWS_PER_ENTRY = 5000
# Bound the stream so a control plane whose ticks are stopped cannot fill Redis; entries are
# batches, so this is millions of records (approximate trimming keeps XADD O(1)).
STREAM_MAXLEN = 200_000
_GROUP_NAME = re.compile(r"^[-A-Za-z0-9_]{1,100}$")
SYSTEM_ACTOR = "system:ingest"


@dataclass
class IngestOutcome:
    """What happened to a batch. ``errors``: the first rejected lines ``{"line", "reason"}``."""

    accepted: int = 0
    rejected: int = 0
    duplicates: int = 0
    errors: list[dict[str, Any]] = field(default_factory=list)
    by_group: dict[str, int] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {
            "accepted": self.accepted,
            "rejected": self.rejected,
            "duplicates": self.duplicates,
            "errors": self.errors,
        }


class _Directory:
    """Process-local cache of groups and their nodes (name/address -> node name), refreshed on a
    miss and every ``ttl_s`` so a node registered by another worker is found quickly."""

    def __init__(self, ttl_s: float = 10.0) -> None:
        self.ttl_s = ttl_s
        self._lock = threading.Lock()
        self._groups: dict[str, tuple[float, int, dict[str, tuple[str, bool]]]] = {}

    def clear(self) -> None:
        with self._lock:
            self._groups.clear()

    def _load(self, name: str) -> tuple[float, int, dict[str, tuple[str, bool]]] | None:
        group = ModelGroup.objects.filter(name=name).only("id").first()
        if group is None:
            return None
        keys: dict[str, tuple[str, bool]] = {}
        for node_name, address, retired in Node.objects.filter(group=group).values_list(
            "name", "address", "retired"
        ):
            keys[address] = (node_name, retired)
            keys[node_name] = (node_name, retired)
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
        for gname, (_, _, keys) in list(self._groups.items()):
            if node in keys:
                return gname
        live = Node.objects.filter(retired=False)
        rows = list(live.filter(name=node).values_list("group__name", flat=True)[:2])
        if not rows:
            rows = list(live.filter(address=node).values_list("group__name", flat=True)[:2])
        return rows[0] if len(set(rows)) == 1 else None


directory = _Directory()


def _ensure_group(name: str) -> int:
    found = directory.group(name)
    if found is not None:
        return found[0]
    from outlier_admin.control.actions import do_create_group

    try:
        with transaction.atomic():
            do_create_group(name, actor=SYSTEM_ACTOR, reason="first record for this group", created_via="ingest")
    except IntegrityError:
        pass  # another worker created it first
    found = directory.group(name, fresh=True)
    assert found is not None
    return found[0]


def _resolve_node(group_name: str, group_id: int, node: str) -> tuple[str | None, str | None]:
    """``(node_name, None)`` or ``(None, reason)`` for a record's node in a group."""
    found = directory.group(group_name)
    keys = found[1] if found else {}
    hit = keys.get(node)
    if hit is None:
        found = directory.group(group_name, fresh=True)
        keys = found[1] if found else {}
        hit = keys.get(node)
    if hit is not None:
        return (None, "retired_node") if hit[1] else (hit[0], None)
    if not settings.AUTO_REGISTER_NODES:
        return None, "unknown_node"
    from outlier_admin.control.actions import do_register_node

    try:
        with transaction.atomic():
            do_register_node(
                ModelGroup.objects.get(pk=group_id), node, actor=SYSTEM_ACTOR,
                registered_via=RegisteredVia.INGEST, reason="first record from this node",
            )
    except IntegrityError:
        pass
    directory.group(group_name, fresh=True)
    return node, None


def _dedup_keys(group: str) -> tuple[str, str]:
    """The request-id sets of the current and the previous de-duplication window."""
    slot = int(time.time() // settings.INGEST_DEDUP_WINDOW_S)
    return f"outlier:dedup:{group}:{slot}", f"outlier:dedup:{group}:{slot - 1}"


def _append(r: Any, group: str, recs: list[dict[str, Any]]) -> tuple[int, int]:
    """Append ``recs`` to the group's stream; returns ``(accepted, duplicates)``.

    A ``request_id`` seen in this or the previous de-duplication window (or earlier in the batch) is
    a duplicate. The check, the stream write and the marking of the new ids form one optimistic
    transaction (WATCH the id sets, read, MULTI, write, EXEC; retried if another request changed the
    sets meanwhile): two concurrent requests carrying the same id cannot both get through, and a
    client retrying after a Redis failure is neither lost (ids are marked only with their rows) nor
    counted twice.
    """
    cur, prev = _dedup_keys(group)
    result = (0, 0)

    def attempt(pipe: Any) -> None:
        nonlocal result
        ids = list(dict.fromkeys(rec["request_id"] for rec in recs if rec["request_id"]))
        seen: set[str] = set()
        if ids:
            in_cur, in_prev = pipe.smismember(cur, ids), pipe.smismember(prev, ids)
            seen = {rid for rid, a, b in zip(ids, in_cur, in_prev, strict=True) if a or b}
        rows, batch_ids = [], set()
        for rec in recs:
            rid = rec["request_id"]
            if rid and (rid in seen or rid in batch_ids):
                continue
            if rid:
                batch_ids.add(rid)
            rows.append([rec["node"], rec["ts"], rec["prompt_tokens"], rec["completion_tokens"],
                         rec["ttft_ms"], rec["total_ms"], rec["status"]])
        pipe.multi()
        for start in range(0, len(rows), ROWS_PER_ENTRY):
            chunk = rows[start : start + ROWS_PER_ENTRY]
            pipe.xadd(stream_key(group), {"rows": orjson.dumps(chunk)}, maxlen=STREAM_MAXLEN, approximate=True)
        if batch_ids:
            pipe.sadd(cur, *batch_ids)
            pipe.expire(cur, 2 * settings.INGEST_DEDUP_WINDOW_S)
        result = (len(rows), len(recs) - len(rows))

    if not recs:
        return result
    if any(rec["request_id"] for rec in recs):
        r.transaction(attempt, cur, prev)
    else:  # no ids to check: a plain MULTI, nothing to watch
        pipe = r.pipeline(transaction=True)
        attempt(pipe)
        pipe.execute()
    return result


def submit(
    items: Iterable[tuple[int, Any, str | None]],
    *,
    source: str,
    source_ref: IngestSource | None = None,
    default_group: str | None = None,
    now: float | None = None,
) -> IngestOutcome:
    """Validate and enqueue records.

    ``items``: ``(line_number, record_or_ParseError, raw_text_or_None)``; the raw text is kept for
    rejected records (``None``: the record is re-serialised). Returns the counts; refused records
    are stored as :class:`RejectedInput` (``source`` names the origin, e.g. ``http:<token>``).
    """
    now = time.time() if now is None else now
    out = IngestOutcome()
    rejects: list[tuple[int, str, str, Any, str | None]] = []
    per_group: dict[str, list[tuple[int, dict[str, Any], Any, str | None]]] = {}
    max_future, retention = settings.INGEST_MAX_FUTURE_S, settings.INGEST_RETENTION_S

    for line, obj, raw in items:
        if isinstance(obj, ParseError):
            rejects.append((line, obj.reason, obj.detail, None, raw))
            continue
        try:
            rec = normalize(obj, now=now, max_future_s=max_future, retention_s=retention)
        except RecordError as exc:
            rejects.append((line, exc.reason, exc.detail, obj, raw))
            continue
        group = rec["group"] or default_group or directory.group_of_node(rec["node"])
        if group is None:
            rejects.append((line, "no_group", "no group given and the node is not registered", obj, raw))
            continue
        if not _GROUP_NAME.match(group):
            rejects.append((line, "bad_group", "group must match [-A-Za-z0-9_]{1,100}", obj, raw))
            continue
        per_group.setdefault(group, []).append((line, rec, obj, raw))

    r = get_redis()
    for group, recs in per_group.items():
        group_id = _ensure_group(group)
        resolved: dict[str, tuple[str | None, str | None]] = {}
        kept: list[tuple[int, dict[str, Any], Any, str | None]] = []
        for item in recs:
            line, rec, obj, raw = item
            key = rec["node"]
            if key not in resolved:
                resolved[key] = _resolve_node(group, group_id, key)
            name, why = resolved[key]
            if name is None:
                rejects.append((line, why or "unknown_node", f"node {key!r} in group {group!r}", obj, raw))
                continue
            rec["node"] = name
            kept.append(item)
        accepted, duplicates = _append(r, group, [rec for _, rec, _, _ in kept])
        out.duplicates += duplicates
        if accepted:
            out.accepted += accepted
            out.by_group[group] = out.by_group.get(group, 0) + accepted

    if rejects:
        rejects.sort(key=lambda x: x[0])
        out.rejected = len(rejects)
        out.errors = [{"line": line, "reason": reason} for line, reason, *_ in rejects[:MAX_ERRORS_REPORTED]]
        RejectedInput.objects.bulk_create(
            [
                RejectedInput(
                    source=source, source_ref=source_ref, line=line, reason=reason, detail=detail[:2000],
                    raw=(raw if raw is not None else orjson.dumps(obj, default=str).decode())[:65536],
                )
                for line, reason, detail, obj, raw in rejects
            ],
            batch_size=1000,
        )
    from outlier_admin.observability.hooks import observe_ingest  # the hook is a no-op if disabled

    observe_ingest(out, source=source, rejected_by_reason=Counter(r[1] for r in rejects))
    return out


def decode_entry(fields: dict[bytes, bytes]) -> list[list[Any]]:
    """The request rows of one stream entry (see module docstring); none for a progress entry."""
    raw = fields.get(b"rows")
    return orjson.loads(raw) if raw is not None else []


def decode_progress(fields: dict[bytes, bytes]) -> list[list[Any]]:
    """The streamed-progress rows ``[node, ts, interval_s, tokens, token_ms]`` of one stream entry
    (written by :mod:`outlier_admin.ingest.modelserver`); none for a request entry."""
    raw = fields.get(b"progress")
    return orjson.loads(raw) if raw is not None else []
