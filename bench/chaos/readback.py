"""What the control plane did with the probe's records, read back from Redis: whether each group's
stream is drained, acknowledged and applied (:func:`drained`), how many records its detector holds
(:func:`applied_by_detector`) and the request ids it de-duplicated (:func:`dedup_ids`)."""

from __future__ import annotations

from typing import Any

from bench.chaos.cluster import _id_tuple
from contract import keys


def drained(r: Any, groups: list[str]) -> dict[str, dict[str, Any]]:
    """Per group: is everything in its stream delivered, acknowledged and applied?"""
    out = {}
    for g in groups:
        key = keys.stream(g)
        info = r.xinfo_stream(key)
        last = info["last-generated-id"]
        grp = next((x for x in r.xinfo_groups(key) if x["name"] in (b"ticks", "ticks")), None)
        state_last = r.hget(keys.state(g), "last_id")
        pending = grp["pending"] if grp else None
        delivered = grp["last-delivered-id"] if grp else None
        out[g] = {
            "pending": pending,
            "undelivered": grp is None or _id_tuple(delivered) < _id_tuple(last),
            "state_behind": _id_tuple(state_last) < _id_tuple(last),
            "xlen": info["length"], "entries_added": info.get("entries-added"),
            "outbox": r.llen(keys.outbox(g)),
        }
        out[g]["done"] = pending == 0 and not out[g]["undelivered"] and not out[g]["state_behind"]
    return out


def applied_by_detector(r: Any, groups: list[str]) -> tuple[dict[str, int], dict[str, int]]:
    """``({group: accepted_total}, {node: decode EMA sample count})`` from the detector states."""
    from detector.group import GroupDetector

    totals, per_node = {}, {}
    for g in groups:
        raw = r.hget(keys.state(g), "detector")
        if not raw:
            totals[g] = 0
            continue
        gd = GroupDetector.from_bytes(raw)
        totals[g] = int(gd.accepted_total)
        for name, count in zip(gd.node_ids, gd.ewma["decode"].count.tolist(), strict=True):
            per_node[name] = int(count)
    return totals, per_node


def dedup_ids(r: Any, group: str) -> set[str]:
    ids: set[str] = set()
    for key in r.scan_iter(match=keys.dedup(group, "*"), count=1000):
        ids.update(m.decode() for m in r.sscan_iter(key, count=5000))
    return ids
