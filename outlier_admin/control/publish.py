"""The gateway contract: one weights document per group in Redis, and a change notification.

Key :func:`contract.keys.weights` (``outlier:{<group>}:weights:v2``, in the group's cluster
slot) holds (JSON, written with one ``SET``, so a reader sees either the old or the new document,
never half of one)::

    {"group": "llama-70b-h100", "version": 42, "generated_at": 1767225600.25, "stale_after_s": 30,
     "safeguard": false,
     "nodes": [{"node": "10.0.0.5:8000", "address": "10.0.0.5:8000", "weight": 100, "state": "healthy"},
               {"node": "10.0.0.6:8000", "address": "10.0.0.6:8000", "weight": 0, "state": "quarantined"}]}

- ``version`` increases by one at every publish (every tick), even when no weight changed: it
  doubles as a heartbeat. It is written to Redis first and then recorded in PostgreSQL
  (``ModelGroup.weights_version``, lifted by :func:`record_version` in the tick's SQL write, or by the outbox drain
  after an outage), so the decision reaches the gateways before any SQL write and the version stays
  monotonic across Redis restarts (:func:`next_version`: one more than both).
- ``weight`` is an integer on the base-weight scale; out-of-service nodes (``quarantined``,
  ``probing``, ``forced_quarantine``) have weight 0. Gateways that cannot express 0 (Envoy EDS
  weights are >= 1) must drain by ``state``.
- A gateway must ignore a document older than ``stale_after_s`` (by ``generated_at``) and use base
  weights: the control plane is down or cut off.

The document's type, JSON, defaults (base weight, stale time) and the pin range are
:mod:`contract.weights_document`; this module writes it.

After the SET, ``{"group": ..., "version": ...}`` is published (in the same MULTI/EXEC, so the
notification never precedes the document): with ``SPUBLISH`` on the group's sharded channel
(:func:`contract.keys.weights_channel`) on a Redis Cluster, with ``PUBLISH`` on
:data:`contract.keys.LEGACY_WEIGHTS_CHANNEL` otherwise. On a single Redis or Sentinel the same
MULTI also writes the document at its previous name (:func:`contract.keys.legacy_weights`), for
the agents of the previous release, for one release (the agent README's "Key migration"); a cluster
is new with this release, and an agent of the previous one cannot follow a cluster's redirections.
"""

from __future__ import annotations

import functools
import logging
from typing import Any

import orjson
from django.conf import settings
from django.db.models import QuerySet, Value
from django.db.models.functions import Greatest
from django.db.models.sql import UpdateQuery

from contract import keys
from contract.names import NameError_, parse_address
from contract.topology import queue_weights
from contract.weights_document import DEFAULT_BASE_WEIGHT, NodeWeight, WeightsDocument
from outlier_admin.control.redis_conn import get_redis
from outlier_admin.fleet.models import ModelGroup

log = logging.getLogger(__name__)


def next_version(published: int | None, stored: int) -> int:
    """The version of the next document: one more than both the last one published (the detector
    state's ``version``, or the document's) and the one stored in SQL (``ModelGroup.weights_version``,
    which outlives a Redis restart). Ticks of a group are sequential (its lock) and their Redis writes
    fenced, so this is monotonic without an SQL write before the publish."""
    return max(int(published or 0), int(stored or 0)) + 1


def _version_update(group: ModelGroup, version: int, fields: dict[str, Any]) -> tuple[QuerySet, dict[str, Any]]:
    """The rule, stated once: ``weights_version`` is only ever raised (``GREATEST``), and ``fields``
    (the tick's time, its figures) are set with it."""
    return (ModelGroup.objects.filter(pk=group.pk),
            {"weights_version": Greatest("weights_version", Value(version)), **fields})


def record_version(group: ModelGroup, version: int, **fields: Any) -> None:
    """Lift ``ModelGroup.weights_version`` to ``version`` (never lowers it) and set ``fields`` with it,
    *after* the document is in Redis. The one function that raises the stored version: the tick's
    PostgreSQL statement embeds the same UPDATE (:func:`version_update_sql`), the ORM path and the
    outage drain call this (both through :func:`outlier_admin.control.rows.write_rows`)."""
    rows, values = _version_update(group, version, fields)
    rows.update(**values)
    lifted(group, version, **fields)


def version_update_sql(group: ModelGroup, version: int, **fields: Any) -> tuple[str, tuple[Any, ...]]:
    """:func:`record_version`'s UPDATE as SQL and its parameters, for a caller that runs it inside one
    statement of its own (the tick's write on PostgreSQL); it calls :func:`lifted` once it ran."""
    rows, values = _version_update(group, version, fields)
    query = rows.query.chain(UpdateQuery)
    query.add_update_values(values)
    return query.get_compiler(rows.db).as_sql()


def lifted(group: ModelGroup, version: int, **fields: Any) -> None:
    """``group`` (the instance) brought to what :func:`record_version` wrote to its row."""
    group.weights_version = max(group.weights_version, version)
    for name, value in fields.items():
        setattr(group, name, value)


def build_document(group: str, version: int, nodes: list[dict[str, Any]], *, safeguard: bool,
                   now: float, stale_after_s: float) -> WeightsDocument:
    """The document (:meth:`WeightsDocument.build`, the gateways' own check): a node a gateway would
    refuse is left out, with its reason logged, and never published.

    The check is a function of the node list: the list of the last document built for ``group`` is
    kept with its verdict, and an equal list (most ticks: no weight or state moved) reuses it; the
    document's own fields (version, time) are checked at every call."""
    last = _last_checked.get(group)
    if last is not None and last[0] == nodes:
        head = WeightsDocument.head(group, version, safeguard=safeguard, now=now, stale_after_s=stale_after_s)
        return head.with_nodes(last[1])
    doc = WeightsDocument.build(group, version, [
        {
            "node": n["node"],
            "address": _hostport(n["address"]),
            "weight": int(n["weight"]),
            "state": n["state"],
            "base_weight": int(n.get("base_weight", DEFAULT_BASE_WEIGHT)),
        }
        for n in nodes
    ], safeguard=safeguard, now=now, stale_after_s=stale_after_s)
    if doc.skipped and _last_skipped.get(group) != doc.skipped:  # logged when it changes, not at every tick
        for why in doc.skipped:
            log.error("weights of group %s: node left out of the document: %s", group, why)
    _last_skipped[group] = doc.skipped
    _last_checked[group] = ([dict(n) for n in nodes], doc.nodes)  # a copy: the caller's list may change
    return doc


_last_skipped: dict[str, tuple[str, ...]] = {}
# Per group: the node list last built into a document, and the nodes that passed the contract check.
_last_checked: dict[str, tuple[list[dict[str, Any]], tuple[NodeWeight, ...]]] = {}


@functools.lru_cache(maxsize=65536)  # the same addresses are published at every tick
def _hostport(address: str) -> str:
    """``host:port`` of a node's address (a registered ``http://h:p`` included); an invalid one as it
    is, for the contract check to refuse with its reason."""
    try:
        return parse_address(address).hostport
    except NameError_:
        return address


def queue_document(pipe: Any, doc: WeightsDocument) -> None:
    """Queue the document's ``SET`` and then its notification on ``pipe`` (a MULTI: the tick adds
    them to its fenced state write, so a gateway never hears of a version before it can read it)."""
    group, body = doc.group, doc.to_json()
    note = orjson.dumps({"group": group, "version": doc.version})
    queue_weights(pipe, group, body, note)


def publish_weights(group: ModelGroup, nodes: list[dict[str, Any]], *, safeguard: bool, now: float) -> int:
    """Write the group's weights document and notify, outside a tick; returns the new version.
    Redis first, then SQL (:func:`record_version`), as in the tick."""
    r = get_redis()
    current = read_weights(group.name)
    version = next_version(current["version"] if current else None, group.weights_version)
    doc = build_document(group.name, version, nodes, safeguard=safeguard, now=now,
                         stale_after_s=settings.WEIGHTS_STALE_AFTER_S)
    pipe = r.pipeline(transaction=True)
    queue_document(pipe, doc)
    pipe.execute()
    record_version(group, version)
    return version


def read_weights(group: str) -> dict[str, Any] | None:
    """The current document of ``group`` as the gateways read it (:meth:`WeightsDocument.from_json`),
    as a dict (for the dashboard and tests), or None."""
    raw = get_redis().get(keys.weights(group))
    return None if raw is None else WeightsDocument.from_json(raw).to_dict()
