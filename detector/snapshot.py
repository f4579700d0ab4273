"""A group detector's exact snapshot: numpy ``.npz`` of every per-node column, EW statistic, window and
cost-model reservoir, plus JSON metadata. Columns are stored by name, so a snapshot written before a
column existed restores with that column at its initial value (:class:`~detector.nodes.NodeArrays`).

Written with ``np.savez`` and read with ``np.load`` (no pickles). Every numeric array of at least
:data:`PACK_MIN_BYTES` is stored packed, losslessly: its bytes split into planes (all first bytes, then
all second bytes, ...; an exponent byte is nearly constant across latencies, a mantissa's low bytes are
noise), each plane deflated (``zlib`` level 1) unless a probe of it shows noise, as ``z.<name>`` with
its dtype, shape and plane sizes in the metadata. The snapshot is the bulk of what a tick writes to
Redis: at 100 nodes the tail window alone is ``float32[100, 1000]`` (400 kB). Packing cuts a 100-node
snapshot with full windows from 0.80 MB to 0.42 MB (the window's latencies keep most of their bytes,
the reservoirs and sparse columns almost none) for ~6 ms more CPU to write and ~5 ms to read
(``bench/cluster_scale.py`` prints both). The control plane writes one at a checkpoint (a decision, a
new history slot, or every lease), not at every tick, and reads one only when another worker took the
group over. Version 1 snapshots (nothing packed) still load.
"""

from __future__ import annotations

import io
import json
import zlib
from typing import Any, TypeVar

import numpy as np

from detector import explain
from detector.baseline import References
from detector.nodes import NodeArrays
from detector.thresholds import Thresholds

STATE_FORMAT_VERSION = 2
#: Arrays smaller than this are stored as they are: packing saves less than its zip member's header.
PACK_MIN_BYTES = 1024
#: Fast deflate: the planes that compress (exponents, zeros, NaN padding) do so at level 1 already.
PACK_LEVEL = 1
#: A plane is deflated only if its first PROBE_BYTES shrink below PROBE_RATIO of their size.
PROBE_BYTES = 4096
PROBE_RATIO = 0.9
G = TypeVar("G")  # the group detector class (not imported: it imports this module)


def dump(gd: Any) -> bytes:
    arrays = {f"a.{k}": v for k, v in gd.a.columns().items()} | gd.signals.arrays()
    w = gd.tail.window
    arrays["w.values"], arrays["w.pos"], arrays["w.filled"] = w.values, w.pos, w.filled
    meta = {
        "version": STATE_FORMAT_VERSION, "thresholds": _thresholds_dict(gd.thresholds), "nodes": gd.a.ids,
        "last_tail_at": gd.tail.last_window_at, "interval_started": gd.errors.interval_started,
        "last": gd._last.to_dict(), "pending": [tr.to_dict() for tr in gd._pending],
        "rejected_total": gd.rejected_total, "accepted_total": gd.accepted_total, **gd.signals.meta(),
    }
    arrays, meta["packed"] = pack(arrays)
    buf = io.BytesIO()
    np.savez(buf, meta=np.frombuffer(json.dumps(meta).encode(), dtype=np.uint8), **arrays)
    return buf.getvalue()


# The thresholds of the last snapshot and their dict: ``Thresholds`` is frozen, and ``to_dict`` walks
# every field (``dataclasses.asdict``) at every checkpoint of a group whose thresholds did not change.
_last_thresholds: list[Any] = [None, None]


def _thresholds_dict(t: Thresholds) -> dict[str, Any]:
    if _last_thresholds[0] is not t:
        _last_thresholds[:] = [t, t.to_dict()]
    return _last_thresholds[1]


def load(cls: type[G], data: bytes) -> G:
    with np.load(io.BytesIO(data), allow_pickle=False) as archive:
        z = {k: archive[k] for k in archive.files}
    meta = json.loads(z["meta"].tobytes().decode())
    if meta.get("version") not in (1, STATE_FORMAT_VERSION):
        raise ValueError(f"unsupported detector state version {meta.get('version')!r}")
    z = unpack(z, meta.get("packed", {}))
    gd: Any = cls(Thresholds.from_dict(meta["thresholds"]))
    gd.a = NodeArrays.restore(meta["nodes"], {k[2:]: v for k, v in z.items() if k.startswith("a.")})
    gd.signals.restore(z, meta)
    w = gd.tail.window
    w.values, w.pos, w.filled = z["w.values"].copy(), z["w.pos"].copy(), z["w.filled"].copy()
    gd.tail.last_window_at, gd.errors.interval_started = meta["last_tail_at"], meta["interval_started"]
    gd._last = References.from_dict(meta["last"])  # an older snapshot's "fit_at" is ignored
    gd._pending = [explain.transition_from_dict(d) for d in meta["pending"]]
    gd.rejected_total = meta["rejected_total"]
    gd.accepted_total = meta["accepted_total"]
    return gd


def pack(arrays: dict[str, np.ndarray]) -> tuple[dict[str, np.ndarray], dict[str, list[Any]]]:
    """``(arrays with the large numeric ones packed as z.<name>, {name: [dtype, shape, plane sizes]})``
    (module docstring); lossless, see :func:`unpack`. A plane whose first :data:`PROBE_BYTES` do not
    deflate below :data:`PROBE_RATIO` (a mantissa's low bytes: noise) is stored as it is, size -1:
    deflating noise costs time and saves nothing."""
    out: dict[str, np.ndarray] = {}
    packed: dict[str, list[Any]] = {}
    for name, a in arrays.items():
        a = np.asarray(a)
        if a.dtype.kind not in "fiub" or a.nbytes < PACK_MIN_BYTES:
            out[name] = a
            continue
        planes = np.ascontiguousarray(a).view(np.uint8).reshape(-1, a.dtype.itemsize).T
        parts, sizes = [], []
        for plane in planes:
            raw = plane.tobytes()
            if len(zlib.compress(raw[:PROBE_BYTES], PACK_LEVEL)) > PROBE_RATIO * min(len(raw), PROBE_BYTES):
                parts.append(raw)
                sizes.append(-1)
            else:
                parts.append(zlib.compress(raw, PACK_LEVEL))
                sizes.append(len(parts[-1]))
        out[f"z.{name}"] = np.frombuffer(b"".join(parts), dtype=np.uint8)
        packed[name] = [a.dtype.str, list(a.shape), sizes]
    return out, packed


def unpack(z: dict[str, np.ndarray], packed: dict[str, list[Any]]) -> dict[str, np.ndarray]:
    """The arrays :func:`pack` was given, bit for bit."""
    out = {k: v for k, v in z.items() if not k.startswith("z.")}
    for name, (dtype_str, shape, sizes) in packed.items():
        dtype = np.dtype(dtype_str)
        blob = z[f"z.{name}"].tobytes()
        count = int(np.prod(shape, dtype=np.int64))
        planes, at = [], 0
        for size in sizes:
            if size < 0:  # stored as it is
                planes.append(blob[at:at + count])
                at += count
            else:
                planes.append(zlib.decompress(blob[at:at + size]))
                at += size
        raw = np.frombuffer(b"".join(planes), dtype=np.uint8).reshape(dtype.itemsize, count).T.copy()
        out[name] = raw.view(dtype).reshape(shape)
    return out
