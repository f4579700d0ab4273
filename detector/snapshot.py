"""A group detector's exact snapshot: numpy ``.npz`` of every per-node column, EW statistic, window and
cost-model reservoir, plus JSON metadata. Columns are stored by name, so a snapshot written before a
column existed restores with that column at its initial value (:class:`~detector.nodes.NodeArrays`)."""

from __future__ import annotations

import io
import json
from typing import Any, TypeVar

import numpy as np

from detector import explain
from detector.nodes import NodeArrays
from detector.thresholds import Thresholds

STATE_FORMAT_VERSION = 1
G = TypeVar("G")  # the group detector class (not imported: it imports this module)


def dump(gd: Any) -> bytes:
    arrays = {f"a.{k}": v for k, v in gd.a.columns().items()} | gd.signals.arrays()
    w = gd.tail.window
    arrays["w.values"], arrays["w.pos"], arrays["w.filled"] = w.values, w.pos, w.filled
    meta = {
        "version": STATE_FORMAT_VERSION, "thresholds": gd.thresholds.to_dict(), "nodes": gd.a.ids,
        "last_tail_at": gd.tail.last_window_at, "interval_started": gd.errors.interval_started,
        "last": gd._last, "pending": [tr.to_dict() for tr in gd._pending],
        "rejected_total": gd.rejected_total, "accepted_total": gd.accepted_total, **gd.signals.meta(),
    }
    buf = io.BytesIO()
    np.savez(buf, meta=np.frombuffer(json.dumps(meta).encode(), dtype=np.uint8), **arrays)
    return buf.getvalue()


def load(cls: type[G], data: bytes) -> G:
    with np.load(io.BytesIO(data), allow_pickle=False) as z:
        meta = json.loads(z["meta"].tobytes().decode())
        if meta.get("version") != STATE_FORMAT_VERSION:
            raise ValueError(f"unsupported detector state version {meta.get('version')!r}")
        gd: Any = cls(Thresholds.from_dict(meta["thresholds"]))
        gd.a = NodeArrays.restore(meta["nodes"], {k[2:]: z[k] for k in z.files if k.startswith("a.")})
        gd.signals.restore({k: z[k] for k in z.files}, meta)
        w = gd.tail.window
        w.values, w.pos, w.filled = z["w.values"].copy(), z["w.pos"].copy(), z["w.filled"].copy()
    gd.tail.last_window_at, gd.errors.interval_started = meta["last_tail_at"], meta["interval_started"]
    gd._last = meta["last"]
    gd._last.pop("fit_at", None)  # kept by the signal model now
    gd._pending = [explain.transition_from_dict(d) for d in meta["pending"]]
    gd.rejected_total = meta["rejected_total"]
    gd.accepted_total = meta["accepted_total"]
    return gd
