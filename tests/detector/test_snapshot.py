"""The detector's snapshot encoding (detector/snapshot.py): large arrays packed losslessly (byte planes,
deflate), about half the bytes of the unpacked archive once the tail windows are full, every array
restored bit for bit, and version 1 snapshots (nothing packed) still load."""

from __future__ import annotations

import io
import json

import numpy as np

from detector import snapshot as snap
from detector.group import GroupDetector
from detector.thresholds import Thresholds
from harness.fleet import Fleet, run


def _full_windows() -> GroupDetector:
    """10 nodes whose 1000-request tail windows are full (2000 requests/s for 6 s)."""
    fleet = Fleet(10, seed=21, rate=2000)
    gd = GroupDetector(Thresholds(), fleet.nodes)
    run(gd, fleet, 0, 6)
    assert (gd.tail.window.filled == gd.tail.window.size).all()
    return gd


def _archive(data: bytes) -> dict[str, np.ndarray]:
    with np.load(io.BytesIO(data), allow_pickle=False) as z:
        return {k: z[k] for k in z.files}


def _version_1(gd: GroupDetector) -> bytes:
    """The snapshot as version 1 wrote it: every array as it is."""
    z = _archive(gd.to_bytes())
    meta = json.loads(z.pop("meta").tobytes().decode())
    arrays = snap.unpack(z, meta.pop("packed"))
    meta["version"] = 1
    buf = io.BytesIO()
    np.savez(buf, meta=np.frombuffer(json.dumps(meta).encode(), dtype=np.uint8), **arrays)
    return buf.getvalue()


def test_pack_then_unpack_is_bit_for_bit_for_every_dtype():
    rng = np.random.default_rng(4)
    arrays = {
        "f32": rng.lognormal(6, 0.5, (7, 300)).astype(np.float32),
        "nan": np.where(rng.random(2000) < 0.5, np.nan, -0.0),
        "i64": rng.integers(-(2**62), 2**62, 500),
        "bool": rng.random(3000) < 0.1,
        "small": np.arange(3, dtype=np.float64),  # under PACK_MIN_BYTES: stored as it is
    }
    packed, spec = snap.pack(arrays)
    assert set(spec) == {"f32", "nan", "i64", "bool"} and "small" in packed
    out = snap.unpack(packed, spec)
    for name, a in arrays.items():
        assert out[name].dtype == a.dtype and out[name].shape == a.shape
        assert out[name].tobytes() == a.tobytes(), name  # NaN payloads and -0.0 included


def test_full_windows_pack_to_about_half_and_restore_every_array_exactly():
    gd = _full_windows()
    packed, unpacked = gd.to_bytes(), _version_1(gd)
    assert len(packed) < 0.6 * len(unpacked), (len(packed), len(unpacked))
    clone = GroupDetector.from_bytes(packed)
    original = snap.unpack(*(lambda z: (z, json.loads(z.pop("meta").tobytes().decode())["packed"]))(_archive(packed)))
    restored = _archive(clone.to_bytes())
    restored = snap.unpack(restored, json.loads(restored.pop("meta").tobytes().decode())["packed"])
    assert original.keys() == restored.keys()
    for name in original:
        assert original[name].tobytes() == restored[name].tobytes(), name
    np.testing.assert_array_equal(clone.tail.window.values, gd.tail.window.values)


def test_a_version_1_snapshot_still_loads_and_decides_the_same():
    gd = _full_windows()
    old = GroupDetector.from_bytes(_version_1(gd))
    new = GroupDetector.from_bytes(gd.to_bytes())
    f1, f2 = Fleet(10, seed=22, rate=2000), Fleet(10, seed=22, rate=2000)
    f1.slow[2] = f2.slow[2] = 2.5
    for a, b in zip(run(old, f1, 6, 4), run(new, f2, 6, 4), strict=True):
        np.testing.assert_array_equal(a.states, b.states)
        np.testing.assert_array_equal(a.weights, b.weights)
