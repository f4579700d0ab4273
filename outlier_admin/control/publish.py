"""The gateway contract: one weights document per group in Redis, and a change notification.

Key ``outlier:weights:<group>`` holds (JSON, written with one ``SET``, so a reader sees either the
old or the new document, never half of one)::

    {"group": "llama-70b-h100", "version": 42, "generated_at": 1767225600.25, "stale_after_s": 30,
     "safeguard": false,
     "nodes": [{"node": "10.0.0.5:8000", "address": "10.0.0.5:8000", "weight": 100, "state": "healthy"},
               {"node": "10.0.0.6:8000", "address": "10.0.0.6:8000", "weight": 0, "state": "quarantined"}]}

- ``version`` increases by one at every publish (every tick), even when no weight changed: it
  doubles as a heartbeat. It is kept in PostgreSQL (``ModelGroup.weights_version``), so it stays
  monotonic across Redis restarts.
- ``weight`` is an integer on the base-weight scale; out-of-service nodes (``quarantined``,
  ``probing``, ``forced_quarantine``) have weight 0. Gateways that cannot express 0 (Envoy EDS
  weights are >= 1) must drain by ``state``.
- A gateway must ignore a document older than ``stale_after_s`` (by ``generated_at``) and use base
  weights: the control plane is down or cut off.

After the SET, ``{"group": ..., "version": ...}`` is published on channel ``outlier:weights``
(in the same MULTI/EXEC, so the notification never precedes the document).
"""

from __future__ import annotations

from typing import Any

import orjson
from django.conf import settings
from django.db.models import F

from outlier_admin.control.redis_conn import WEIGHTS_CHANNEL, get_redis, weights_key
from outlier_admin.fleet.models import ModelGroup


def next_version(group: ModelGroup) -> int:
    """Bump and return the group's weights version (atomic in SQL: safe against any concurrency)."""
    ModelGroup.objects.filter(pk=group.pk).update(weights_version=F("weights_version") + 1)
    version = ModelGroup.objects.filter(pk=group.pk).values_list("weights_version", flat=True).get()
    group.weights_version = version
    return version


def build_document(group: str, version: int, nodes: list[dict[str, Any]], *, safeguard: bool,
                   now: float, stale_after_s: float) -> dict[str, Any]:
    return {
        "group": group,
        "version": version,
        "generated_at": round(now, 3),
        "stale_after_s": stale_after_s,
        "safeguard": safeguard,
        "nodes": [
            {
                "node": n["node"],
                "address": n["address"],
                "weight": int(n["weight"]),
                "state": n["state"],
                "base_weight": int(n.get("base_weight", 100)),
            }
            for n in nodes
        ],
    }


def publish_weights(group: ModelGroup, nodes: list[dict[str, Any]], *, safeguard: bool, now: float) -> int:
    """Write the group's weights document and notify; returns the new version."""
    version = next_version(group)
    doc = build_document(group.name, version, nodes, safeguard=safeguard, now=now,
                         stale_after_s=settings.WEIGHTS_STALE_AFTER_S)
    pipe = get_redis().pipeline(transaction=True)
    pipe.set(weights_key(group.name), orjson.dumps(doc))
    pipe.publish(WEIGHTS_CHANNEL, orjson.dumps({"group": group.name, "version": version}))
    pipe.execute()
    return version


def read_weights(group: str) -> dict[str, Any] | None:
    """The current document of ``group`` (for the dashboard and tests), or None."""
    raw = get_redis().get(weights_key(group))
    return None if raw is None else orjson.loads(raw)
