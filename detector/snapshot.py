"""A group detector's exact snapshot: numpy ``.npz`` of every per-node column, EW statistic, window and
cost-model reservoir, plus JSON metadata. Columns are stored by name, so a snapshot written before a
column existed restores with that column at its initial value (:class:`~detector.nodes.NodeArrays`).

The archive is a standard ``.npz`` (``np.load`` reads it), written and read here without ``np.savez``
/ ``np.load``: the control plane serialises a group at every checkpoint (~0.8 MB at 100 nodes), and
those spend most of their time per member, not per byte (``np.savez`` ~5 ms at 100 nodes, 18 ms at
1,000; ``np.load`` parses every ``.npy`` header with ``ast.literal_eval``). Members are stored
uncompressed with their CRC-32, as ``np.savez`` does; an archive this module cannot take apart
(compressed, ZIP64) is read with ``np.load``.
"""

from __future__ import annotations

import io
import json
import struct
import zlib
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
        "version": STATE_FORMAT_VERSION, "thresholds": _thresholds_dict(gd.thresholds), "nodes": gd.a.ids,
        "last_tail_at": gd.tail.last_window_at, "interval_started": gd.errors.interval_started,
        "last": gd._last, "pending": [tr.to_dict() for tr in gd._pending],
        "rejected_total": gd.rejected_total, "accepted_total": gd.accepted_total, **gd.signals.meta(),
    }
    return write_npz({"meta": np.frombuffer(json.dumps(meta).encode(), dtype=np.uint8), **arrays})


# The thresholds of the last snapshot and their dict: ``Thresholds`` is frozen, and ``to_dict`` walks
# every field (``dataclasses.asdict``) at every checkpoint of a group whose thresholds did not change.
_last_thresholds: list[Any] = [None, None]


def _thresholds_dict(t: Thresholds) -> dict[str, Any]:
    if _last_thresholds[0] is not t:
        _last_thresholds[:] = [t, t.to_dict()]
    return _last_thresholds[1]


def load(cls: type[G], data: bytes) -> G:
    z = read_npz(data)
    meta = json.loads(z["meta"].tobytes().decode())
    if meta.get("version") != STATE_FORMAT_VERSION:
        raise ValueError(f"unsupported detector state version {meta.get('version')!r}")
    gd: Any = cls(Thresholds.from_dict(meta["thresholds"]))
    # Every restore below copies what it keeps: the arrays read here may be views of ``data``.
    gd.a = NodeArrays.restore(meta["nodes"], {k[2:]: v for k, v in z.items() if k.startswith("a.")})
    gd.signals.restore(z, meta)
    w = gd.tail.window
    w.values, w.pos, w.filled = z["w.values"].copy(), z["w.pos"].copy(), z["w.filled"].copy()
    gd.tail.last_window_at, gd.errors.interval_started = meta["last_tail_at"], meta["interval_started"]
    gd._last = meta["last"]
    gd._last.pop("fit_at", None)  # kept by the signal model now
    gd._pending = [explain.transition_from_dict(d) for d in meta["pending"]]
    gd.rejected_total = meta["rejected_total"]
    gd.accepted_total = meta["accepted_total"]
    return gd


# --- the .npz archive -----------------------------------------------------------------------------------

_LOCAL = struct.Struct("<IHHHHHIIIHH")  # local file header (30 bytes), then the name
_CENTRAL = struct.Struct("<IHHHHHHIIIHHHHHII")  # central directory entry (46 bytes), then the name
_END = struct.Struct("<IHHHHIIH")  # end of central directory (22 bytes)
_LOCAL_SIG, _CENTRAL_SIG, _END_SIG = 0x04034B50, 0x02014B50, 0x06054B50
_DOS_DATE = (0 << 9) | (1 << 5) | 1  # 1980-01-01: the archive's content, not its time, is what matters
_ZIP_LIMIT = 0xFFFFFFFF  # above it a member or offset needs ZIP64: left to np.savez

# ``.npy`` headers by (dtype, shape) and back: a snapshot's few dozen members repeat the same handful
# (one set per group size). Emptied when large, so a process that saw many sizes does not grow.
_npy_headers: dict[tuple[str, tuple[int, ...]], bytes] = {}
_npy_layouts: dict[bytes, tuple[np.dtype, tuple[int, ...], bool]] = {}
_HEADERS_MAX = 4096


def _npy_header(arr: np.ndarray) -> bytes:
    key = (arr.dtype.str, arr.shape)
    header = _npy_headers.get(key)
    if header is None:
        if len(_npy_headers) >= _HEADERS_MAX:
            _npy_headers.clear()
        buf = io.BytesIO()
        # C order always: the data below is written in C order whatever the array's layout.
        d = {"descr": np.lib.format.dtype_to_descr(arr.dtype), "fortran_order": False, "shape": arr.shape}
        try:
            np.lib.format.write_array_header_1_0(buf, d)
        except ValueError:  # a header too long for format 1.0 (a huge structured dtype)
            buf = io.BytesIO()
            np.lib.format.write_array_header_2_0(buf, d)
        header = _npy_headers.setdefault(key, buf.getvalue())
    return header


def write_npz(arrays: dict[str, np.ndarray]) -> bytes:
    """``arrays`` as an uncompressed ``.npz`` archive that ``np.load`` reads (members ``<name>.npy``
    in C order, stored with their CRC-32, as ``np.savez`` writes them); input that would need ZIP64
    goes to ``np.savez``."""
    parts: list[Any] = []
    central: list[bytes] = []
    offset = 0
    for name, value in arrays.items():
        arr = np.asarray(value)
        if not arr.flags.c_contiguous:  # (np.ascontiguousarray would turn a 0-d array into 1-d)
            arr = arr.copy(order="C")
        if arr.dtype.hasobject:
            raise ValueError(f"{name}: object arrays are not stored")
        header, data = _npy_header(arr), arr.reshape(-1).view(np.uint8).data  # no copy: joined once below
        size = len(header) + len(data)
        fname = f"{name}.npy".encode()
        if size > _ZIP_LIMIT or offset > _ZIP_LIMIT:
            buf = io.BytesIO()
            np.savez(buf, **arrays)
            return buf.getvalue()
        crc = zlib.crc32(data, zlib.crc32(header))
        parts += [_LOCAL.pack(_LOCAL_SIG, 20, 0, 0, 0, _DOS_DATE, crc, size, size, len(fname), 0), fname, header, data]
        central += [_CENTRAL.pack(_CENTRAL_SIG, 20, 20, 0, 0, 0, _DOS_DATE, crc, size, size, len(fname), 0, 0, 0, 0,
                                  0o600 << 16, offset), fname]
        offset += _LOCAL.size + len(fname) + size
    directory = b"".join(central)
    parts += [directory, _END.pack(_END_SIG, 0, 0, len(arrays), len(arrays), len(directory), offset, 0)]
    return b"".join(parts)


def read_npz(data: bytes) -> dict[str, np.ndarray]:
    """The arrays of an ``.npz`` archive by name (read-only views of ``data`` when its members are
    stored uncompressed; every member's CRC-32 is checked, as ``np.load`` does)."""
    try:
        return _read_stored(memoryview(data))
    except (ValueError, struct.error, KeyError):
        with np.load(io.BytesIO(data), allow_pickle=False) as z:
            return {k: z[k] for k in z.files}


def _read_stored(buf: memoryview) -> dict[str, np.ndarray]:
    end = len(buf) - _END.size
    if end < 0 or _END.unpack_from(buf, end)[0] != _END_SIG:  # an archive comment: np.load finds it
        raise ValueError("no end of central directory at the end")
    count, cd_offset = _END.unpack_from(buf, end)[4], _END.unpack_from(buf, end)[6]
    out: dict[str, np.ndarray] = {}
    pos = cd_offset
    for _ in range(count):
        (sig, _made, _need, _flags, method, _time, _date, crc, csize, usize, nlen, xlen, clen,
         _disk, _iattr, _xattr, local) = _CENTRAL.unpack_from(buf, pos)
        if sig != _CENTRAL_SIG:
            raise ValueError("bad central directory entry")
        if method != 0 or csize != usize or _ZIP_LIMIT in (csize, usize, local):
            raise ValueError("a compressed or ZIP64 member")
        name = bytes(buf[pos + _CENTRAL.size:pos + _CENTRAL.size + nlen]).decode()
        pos += _CENTRAL.size + nlen + xlen + clen
        head = _LOCAL.unpack_from(buf, local)
        if head[0] != _LOCAL_SIG:
            raise ValueError("bad local header")
        start = local + _LOCAL.size + head[9] + head[10]  # + its name and extra field
        member = buf[start:start + usize]
        if zlib.crc32(member) != crc:
            raise ValueError(f"bad CRC-32 of {name}")  # np.load then raises its own BadZipFile
        out[name.removesuffix(".npy")] = _npy_array(member)
    return out


def _npy_array(member: memoryview) -> np.ndarray:
    if bytes(member[:6]) != b"\x93NUMPY":
        raise ValueError("not an .npy member")
    major = member[6]
    if major == 1:
        hlen, skip = struct.unpack_from("<H", member, 8)[0], 10
    elif major == 2:
        hlen, skip = struct.unpack_from("<I", member, 8)[0], 12
    else:  # 3.0 (a UTF-8 header): np.load
        raise ValueError(f".npy version {major} is left to np.load")
    header = bytes(member[:skip + hlen])
    layout = _npy_layouts.get(header)
    if layout is None:
        if len(_npy_layouts) >= _HEADERS_MAX:
            _npy_layouts.clear()
        layout = _npy_layouts.setdefault(header, _parse_header(header, major))
    dtype, shape, fortran = layout
    if dtype.hasobject:
        raise ValueError("object arrays are not read")
    count = int(np.prod(shape)) if shape else 1
    arr = np.frombuffer(member, dtype=dtype, count=count, offset=skip + hlen)
    return arr.reshape(shape[::-1]).T if fortran else arr.reshape(shape)


def _parse_header(raw: bytes, major: int) -> tuple[np.dtype, tuple[int, ...], bool]:
    """numpy's own parser of a ``.npy`` header (``ast.literal_eval``: run once per distinct header)."""
    fp = io.BytesIO(raw)
    np.lib.format.read_magic(fp)
    read = np.lib.format.read_array_header_1_0 if major == 1 else np.lib.format.read_array_header_2_0
    shape, fortran, dtype = read(fp)
    return dtype, tuple(shape), bool(fortran)
